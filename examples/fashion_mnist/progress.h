// One process's record of its training in the fashion_mnist example (main.cpp): rank 0's metrics
// rows, the progress lines over every rank's batches (every --log-interval steps and at the end
// of an epoch), the epoch lines, and the totals behind rank 0's closing lines (summary.h). The
// progress lines and the epochs' ends reduce over the group (none in local mode), so every rank
// calls step() and endEpoch() at the same points; the DistributedSampler pads the shards to equal
// length, so every rank reaches the same batch numbers.
//
//   Progress progress(flags, rank, world, pg);                   // rank 0 opens the metrics file
//   progress.startEpoch();
//   progress.step(epoch, batch, perEpoch, loss, correct, seen, seconds);   // every step
//   progress.endEpoch();                                         // the slowest rank's time
//   progress.printEpoch(epoch, batches, testAccuracy);           // rank 0 prints
//   progress.finish(weights, threads, testAccuracy);             // rank 0: the closing lines
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/process_group.h"
#include "examples/common/app.h"
#include "examples/common/metrics.h"

#include "flags.h"
#include "replicas.h"
#include "summary.h"

namespace weft::examples::fashion_mnist {

class Progress {
 public:
  // `group` may still be empty here and be set before the first step (null in local mode).
  Progress(const Flags& flags, int rank, int world, const std::unique_ptr<collectives::ProcessGroup>& group)
      : flags_(flags), rank_(rank), world_(world), group_(group) {
    if (rank == 0) log_ = app::BatchLog(flags.metrics);
  }

  void startEpoch() {
    epochStart_ = app::Clock::now();
    epochSums_.assign(3, 0.0);
    log_.window.reset();
  }

  // One step of this rank: `correct` of its `seen` examples classified right, in `seconds`
  // (forward to optimizer step). Every --log-interval steps and after the epoch's last: "epoch E
  // step S/N loss L accuracy A R samples/s" over every rank's steps since the previous line.
  void step(int64_t epoch, int64_t batch, int64_t perEpoch, double loss, double correct, double seen, double seconds) {
    stepSeconds_.push_back(seconds);
    log_.add(epoch, loss, correct, seen, seconds);
    const app::Window& w = log_.window;
    if (w.batches != flags_.logInterval && batch != perEpoch) return;
    const double elapsed = app::secondsSince(w.start);
    std::vector<double> sums{w.loss, w.correct, w.seen};
    reduceValues(group_.get(), sums, collectives::ReduceOp::Sum);
    for (size_t k = 0; k < 3; ++k) epochSums_[k] += sums[k];
    if (rank_ == 0) {
      app::say("epoch %" PRId64 " step %" PRId64 "/%" PRId64 " loss %.4f accuracy %.3f %.0f samples/s\n", epoch, batch,
               perEpoch, sums[0] / static_cast<double>(w.batches * world_), sums[1] / sums[2], sums[2] / elapsed);
    }
    log_.window.reset();
  }

  // The epoch's training is over: its time is the slowest rank's, its samples everyone's.
  void endEpoch() {
    std::vector<double> slowest{app::secondsSince(epochStart_)};
    reduceValues(group_.get(), slowest, collectives::ReduceOp::Max);
    epochSeconds_ = slowest[0];
    trainSeconds_ += epochSeconds_;
    trainSamples_ += epochSums_[2];
  }

  // Rank 0: "epoch E: loss L  train accuracy A  test accuracy T  time S s (R samples/s)".
  void printEpoch(int64_t epoch, int64_t batches, double testAccuracy) const {
    if (rank_ != 0) return;
    app::say("epoch %" PRId64 ": loss %.4f  train accuracy %.4f  test accuracy %.4f  time %.2f s (%.0f samples/s)\n",
             epoch, epochSums_[0] / static_cast<double>(std::max<int64_t>(batches, 1) * world_),
             epochSums_[1] / std::max(epochSums_[2], 1.0), testAccuracy, epochSeconds_, epochSums_[2] / epochSeconds_);
  }

  // Rank 0: closes the metrics file and prints the closing lines (summary.h) and "final test
  // accuracy: A".
  void finish(const WeightSummary& weights, int threads, double testAccuracy) {
    if (rank_ != 0) return;
    log_.close();
    printSummary(weights, world_, threads, flags_, log_.iterations, trainSamples_, trainSeconds_, stepSeconds_);
    app::say("final test accuracy: %.4f\n", testAccuracy);
  }

 private:
  const Flags& flags_;
  int rank_;
  int world_;
  const std::unique_ptr<collectives::ProcessGroup>& group_;
  app::BatchLog log_;               // rank 0 writes the metrics file
  std::vector<double> stepSeconds_;  // this rank's, every step
  std::vector<double> epochSums_;    // this epoch: loss (per batch), correct, seen: all ranks'
  app::Clock::time_point epochStart_;
  double epochSeconds_ = 0;
  double trainSeconds_ = 0;
  double trainSamples_ = 0;
};

}  // namespace weft::examples::fashion_mnist
