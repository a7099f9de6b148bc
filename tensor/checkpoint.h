// Activation checkpointing: trade compute for memory. A checkpointed function
// runs without recording in forward, so none of its intermediate activations
// is kept; only its inputs and the random generators' states are saved. Its
// backward restores those states, runs the function again with grad enabled
// and backpropagates through the recomputed graph.
//
//   Tensor h = x;
//   for (auto& block : blocks) {
//     h = weft::checkpoint([&block](const Tensor& t) { return block->forward(t); }, h);
//   }
//   loss(h).backward();   // each block's activations live only while its
//                         // own backward runs
//
// Contract:
// - fn must compute the same function when called again: same ops on the
//   same inputs and parameters. Random draws repeat because the default
//   generator's state (and that of every generator in
//   CheckpointOptions::generators) is set back to what it was at forward
//   before the recomputation; afterwards the caller's states are restored, so
//   backward does not advance any generator as seen from outside. A
//   recomputation returning a different number of tensors is a StateError.
//   The recomputation also runs under the autocast state of the forward
//   (tensor/autocast.h), so a segment checkpointed inside a bfloat16 scope is
//   recomputed in bfloat16 although backward itself runs with autocast off.
// - Gradients: the inputs' flow into the outer graph like any op's; those of
//   parameters fn uses (tensors it captures) are handed to the running
//   backward pass as if they had reached the parameters' AccumulateGrad nodes
//   there: into .grad for a local backward, into the context inside a
//   distributed autograd backward, through the pre-hooks DDP registers, and
//   to autograd::grad's captures (autograd::nestedBackward, tensor/autograd.h).
// - Recording: a node is recorded only when grad mode is on and some input
//   requires grad. When grad mode is on but no input requires grad, fn runs
//   plainly (recording as usual, nothing saved on memory), so that parameters
//   inside it still get their gradients. Under NoGradGuard fn just runs.
// - Outputs: floating outputs require grad when the node is recorded; others
//   (indices, masks) never do. An output of the recomputation that does not
//   require grad receives no gradient; its incoming one is dropped.
// - Inputs saved for backward are checked like any op's: modifying one in
//   place before backward is a StateError naming "checkpoint".
// - Lifetimes: the node keeps a copy of fn until backward (or the graph) is
//   gone; whatever fn captures by reference must live that long. A parameter
//   used both inside and outside a checkpointed function gets both
//   contributions; its AccumulateGrad node (and the hooks on it) may then run
//   twice in one pass.
// - Threading: another thread drawing from the default generator between the
//   forward and its recomputation changes nothing here (the state is saved),
//   but draws it makes while the recomputation runs interleave with it.
#pragma once

#include <functional>
#include <vector>

#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace weft {

struct CheckpointOptions {
  // Besides the default generator, the generators fn draws from; each must
  // outlive the backward pass.
  std::vector<Generator*> generators;
  // False: no generator state is saved or restored (fn draws nothing random).
  bool preserveRngState = true;
};

std::vector<Tensor> checkpoint(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                               const std::vector<Tensor>& inputs, CheckpointOptions o = {});
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input, CheckpointOptions o = {});

}  // namespace weft
