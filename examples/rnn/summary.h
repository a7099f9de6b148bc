// What the rnn example (main.cpp) prints about its run besides the progress lines: the model and
// task lines at the start, and the mean losses of the first and the last window of iterations
// behind the "final loss" line.
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <vector>

#include "rpc/agent.h"
#include "rref/rref.h"
#include "examples/common/app.h"

#include "flags.h"

namespace weft::examples::rnn {

// "<me>: model built: ..." and "<me>: task ...".
inline void printModel(rpc::Agent& agent, const Flags& flags, const std::vector<RRef<Tensor>>& params) {
  int64_t scalars = 0;
  for (const RRef<Tensor>& p : params) scalars += p.toHere().numel();
  app::say("%s: model built: embedding %" PRId64 "x%" PRId64 " and decoder %" PRId64 "->%" PRId64
           " on ps, LSTM %" PRId64 "->%" PRId64 " x%" PRId64 " layers here; %zu parameter tensors (%" PRId64
           " values), dropout %.2f, %s\n",
           agent.name().c_str(), flags.ntoken, flags.ninp, flags.nhid, flags.ntoken, flags.ninp, flags.nhid,
           flags.nlayers, params.size(), scalars, flags.dropout, flags.dtype.c_str());
  app::say("%s: task %s, %" PRId64 " iterations of %" PRId64 " steps x %" PRId64 " sequences, SGD lr %g%s\n",
           agent.name().c_str(),
           flags.upstream ? "random tokens (upstream sizes; nothing to learn)" : "periodic sequence with noise",
           flags.iterations, flags.bptt, flags.batchSize, flags.lr,
           flags.checkGradients ? ", checking gradients against local autograd" : "");
}

// The mean loss of the first and of the last `window` iterations (window: the log interval, at
// most the run's length).
struct LossWindows {
  LossWindows(int64_t iterations, int64_t logInterval)
      : iterations(iterations), window(std::min(logInterval, iterations)) {}

  void add(int64_t iteration, double loss) {
    if (iteration <= window) first += loss / static_cast<double>(window);
    if (iteration > iterations - window) last += loss / static_cast<double>(window);
  }

  int64_t iterations;
  int64_t window;
  double first = 0;
  double last = 0;
};

}  // namespace weft::examples::rnn
