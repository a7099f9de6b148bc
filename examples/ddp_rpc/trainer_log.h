// A ddp_rpc trainer's record of its run (main.cpp): the metrics rows, a progress line every
// --log-interval epochs, the classes of the bags it saw, and the losses and accuracy its
// TrainerReport carries to the master.
//
//   TrainerLog log(path, agent.name(), flags);
//   log.add(epoch, batch, loss, correct, seconds);   // every batch
//   log.endEpoch(epoch);                             // every epoch
//   TrainerReport report = log.finish();             // closes the metrics file
//   log.printTrained(report);                        // once the replicas are compared
#pragma once

#include <cinttypes>
#include <cstdint>
#include <string>
#include <vector>

#include "examples/common/app.h"
#include "examples/common/metrics.h"

#include "batch.h"
#include "flags.h"
#include "report.h"

namespace weft::examples::ddp_rpc {

class TrainerLog {
 public:
  TrainerLog(const std::string& path, const std::string& name, const Flags& flags)
      : name_(name), flags_(flags), batches_(path), classCounts_(static_cast<size_t>(kClasses), 0) {}

  // One batch: `correct` of its bags classified right, in `seconds`.
  void add(int64_t epoch, const Batch& batch, double loss, double correct, double seconds) {
    const auto bags = static_cast<double>(batch.bags);
    batches_.add(epoch, loss, correct, bags, seconds);
    epoch_.add(loss, correct, bags);
    for (int64_t i = 0; i < batch.bags; ++i) ++classCounts_[static_cast<size_t>(batch.target.data<int64_t>()[i])];
  }

  // "<name>: epoch E/N iteration I loss L accuracy A R iterations/s" every --log-interval epochs
  // and after the last, over the batches since the previous line.
  void endEpoch(int64_t epoch) {
    if (epoch == 1) report_.firstEpochLoss = epoch_.meanLoss();
    if (epoch == flags_.epochs) {
      report_.lastEpochLoss = epoch_.meanLoss();
      report_.lastEpochAccuracy = epoch_.accuracy();
    }
    epoch_.reset();
    if (epoch % flags_.logInterval != 0 && epoch != flags_.epochs) return;
    const app::Window& w = batches_.window;
    app::say("%s: epoch %" PRId64 "/%" PRId64 " iteration %" PRId64 " loss %.4f accuracy %.3f %.1f iterations/s\n",
             name_.c_str(), epoch, flags_.epochs, batches_.iterations, w.meanLoss(), w.accuracy(),
             w.batchesPerSecond());
    batches_.window.reset();
  }

  // Closes the metrics file; the report's figures but the replicas' (compareReplicas).
  TrainerReport finish(int rank) {
    batches_.close();
    report_.rank = rank;
    report_.iterations = batches_.iterations;
    report_.secondsPerIteration = batches_.secondsPerIteration();
    report_.targetEntropy = classEntropy(classCounts_);
    return report_;
  }

  // "<name>: trained N iterations in S s (... s/iteration); Linear replica ...; metrics in P".
  void printTrained(const TrainerReport& report) const {
    app::say("%s: trained %" PRId64 " iterations in %.2f s (%.5f s/iteration); Linear replica %s (hash %016" PRIx64
             "); metrics in %s\n",
             name_.c_str(), report.iterations, batches_.trainSeconds, report.secondsPerIteration,
             report.replicasIdentical ? "identical to the other trainer's" : "DIFFERS from the other trainer's",
             static_cast<uint64_t>(report.replicaHash), batches_.csv.path().c_str());
  }

 private:
  std::string name_;
  const Flags& flags_;
  app::BatchLog batches_;
  app::Window epoch_;  // this epoch's batches
  std::vector<int64_t> classCounts_;
  TrainerReport report_;
};

}  // namespace weft::examples::ddp_rpc
