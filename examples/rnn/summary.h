// What the rnn example (main.cpp) records and prints about its run: the model and task lines at
// the start; then, in a TrainingLog, the metrics rows, the progress lines, the mean losses of the
// first and the last window of iterations and the closing lines ("final loss ...", and the
// gradient check's with --check-gradients).
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "rpc/agent.h"
#include "rref/rref.h"
#include "examples/common/app.h"
#include "examples/common/metrics.h"

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

// The trainer's record of its iterations: "iteration,loss,seconds[,max_rel_diff]" rows, a
// progress line every --log-interval iterations and after the last, and the closing lines.
class TrainingLog {
 public:
  TrainingLog(const std::string& name, const Flags& flags, bool checked)
      : name_(name),
        flags_(flags),
        checked_(checked),
        csv_(flags.metrics, checked ? "iteration,loss,seconds,max_rel_diff" : "iteration,loss,seconds"),
        losses_(flags.iterations, flags.logInterval) {
    csv_.setPrecision(8);
  }

  // Iteration `it`: its loss, its time and (checked) its largest relative gradient difference.
  void add(int64_t it, double loss, double seconds, double diff) {
    trainSeconds_ += seconds;
    maxDiff_ = std::max(maxDiff_, diff);
    if (checked_) csv_.row(it, loss, seconds, diff);
    else csv_.row(it, loss, seconds);
    window_.add(loss, 0, 0);
    if (it % flags_.logInterval == 0 || it == flags_.iterations) {
      app::say("%s: iteration %" PRId64 "/%" PRId64 " loss %.4f %.1f iterations/s%s\n", name_.c_str(), it,
               flags_.iterations, window_.meanLoss(), window_.batchesPerSecond(),
               checked_ ? (" max relative gradient difference " + std::to_string(maxDiff_)).c_str() : "");
      window_.reset();
    }
    losses_.add(it, loss);
  }

  // Closes the metrics file; "final loss ..." and, checked, "gradient check: ..." over
  // `paramTensors` parameter tensors.
  void finish(size_t paramTensors) {
    csv_.close();
    const double chance = std::log(static_cast<double>(flags_.ntoken));
    app::say("final loss %.4f (mean of the last %" PRId64 " iterations; first %" PRId64
             ": %.4f; ln(ntoken) %.4f; ratio to ln(ntoken) %.3f), %" PRId64
             " iterations, %.5f s/iteration; metrics in %s\n",
             losses_.last, losses_.window, losses_.window, losses_.first, chance, losses_.last / chance,
             flags_.iterations, trainSeconds_ / static_cast<double>(flags_.iterations), flags_.metrics.c_str());
    if (checked_) {
      app::say("gradient check: max relative difference %.3e between distributed and local autograd over %zu "
               "parameter tensors and %" PRId64 " iterations (%s)\n",
               maxDiff_, paramTensors, flags_.iterations, flags_.dtype.c_str());
    }
  }

 private:
  std::string name_;
  const Flags& flags_;
  bool checked_;
  app::CsvFile csv_;
  LossWindows losses_;
  app::Window window_;
  double trainSeconds_ = 0;
  double maxDiff_ = 0;
};

}  // namespace weft::examples::rnn
