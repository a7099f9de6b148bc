// The transformer blocks of a parallel GPT run as nn::GPT::features runs its
// own: in order, and while grad mode is on with a checkpointing policy, cut
// into segments at the blocks where CheckpointPolicy::at() is true, each
// segment under weft::checkpoint (tensor/checkpoint.h). The recomputation in
// backward runs a segment's forward collectives again, at the same point of
// every rank's backward. Each block is called through nn::Module::operator(),
// so that its forward hooks run (FullyShardedDataParallel's units).
#pragma once

#include <memory>
#include <vector>

#include "nn/transformer.h"
#include "tensor/autograd.h"
#include "tensor/checkpoint.h"

namespace weft::collectives::detail {

template <class Block>
Tensor runBlocks(const std::vector<std::shared_ptr<Block>>& blocks, const nn::CheckpointPolicy& policy, Tensor x) {
  const int n = static_cast<int>(blocks.size());
  const bool checkpointing = policy.enabled() && GradMode::enabled();
  for (int b = 0; b < n;) {
    if (!checkpointing) {
      x = (*blocks[static_cast<size_t>(b++)])(x);
      continue;
    }
    int e = b + 1;
    while (e < n && !policy.at(e, n)) ++e;
    std::vector<std::shared_ptr<Block>> segment(blocks.begin() + b, blocks.begin() + e);
    x = checkpoint(
        [segment](const Tensor& in) {
          Tensor y = in;
          for (const auto& blk : segment) y = (*blk)(y);
          return y;
        },
        x);
    b = e;
  }
  return x;
}

}  // namespace weft::collectives::detail
