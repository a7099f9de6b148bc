// The trainer's inputs in the rnn example (main.cpp): the task its batches come from (task.h),
// the hidden state it starts from, and the
// state it carries from one batch to the next.
#pragma once

#include <variant>

#include "nn/rnn.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

#include "flags.h"
#include "task.h"

namespace weft::examples::rnn {

// --upstream: random tokens, nothing to learn (upstream's task); otherwise the periodic sequence
// with noise.
inline std::variant<PeriodicTask, RandomTask> makeTask(const Flags& flags) {
  if (flags.upstream) return RandomTask(flags.ntoken, flags.batchSize, flags.seed + 3);
  return PeriodicTask(flags.ntoken, flags.batchSize, flags.noise, flags.seed + 3);
}

// --upstream starts from a random state, as upstream does; otherwise the LSTM's zero state
// (undefined tensors).
inline nn::LstmState initialState(const Flags& flags, DType dtype) {
  if (!flags.upstream) return {};
  Generator g(flags.seed + 4);
  const TensorOptions o{.dtype = dtype};
  Tensor h = randn({flags.nlayers, flags.batchSize, flags.nhid}, o, &g);
  Tensor c = randn({flags.nlayers, flags.batchSize, flags.nhid}, o, &g);
  return {h, c};
}

// The state carried from the previous batch, detached: backward stops at the batch it starts.
inline nn::LstmState detached(const nn::LstmState& s) {
  return {s.h.defined() ? s.h.detach() : Tensor(), s.c.defined() ? s.c.detach() : Tensor()};
}

}  // namespace weft::examples::rnn
