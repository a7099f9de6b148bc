// What the master and the trainers of the ddp_rpc example (main.cpp) exchange, and the checks
// behind the final line: the master starts each trainer with one call, runTrainer(table, initial
// table), whose answer is the trainer's TrainerReport once its training is over; the trainers
// compare their Linear replicas byte for byte; the master measures how the table on ps changed.
//
//   TrainerCall call;
//   bindTrainerCall(agent, call);                                  // trainers, before agent.start()
//   Start start = app::awaitPeers(agent, call.start.getFuture(), ...);
//   call.answer([&] { return train(...); });                       // answers the master's call
//   bool identical = printSummary(reports[0], reports[1], target, wall, tableChange(initial, now));  // master
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#include "collectives/process_group.h"
#include "common/error.h"
#include "common/future.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "rpc/agent.h"
#include "rpc/codec.h"
#include "rref/remote_module.h"
#include "tensor/ops.h"
#include "examples/common/app.h"

#include "batch.h"

namespace weft::examples::ddp_rpc {

using RemoteTable = RemoteModule<nn::EmbeddingBag>;

// What a trainer reports to the master when its training is over.
struct TrainerReport {
  int64_t rank = 0;
  int64_t iterations = 0;
  double firstEpochLoss = 0;      // mean loss of the first epoch's batches
  double lastEpochLoss = 0;       // ... and of the last epoch's
  double lastEpochAccuracy = 0;   // fraction of the last epoch's bags classified right
  double secondsPerIteration = 0;
  double targetEntropy = 0;       // of the classes of every bag this trainer saw (nats)
  int64_t replicaHash = 0;        // FNV-1a of the Linear's weight and bias bytes
  bool replicasIdentical = false; // this replica's bytes equal the other trainer's
};
WEFT_CODEC_FIELDS(TrainerReport, rank, iterations, firstEpochLoss, lastEpochLoss, lastEpochAccuracy,
                  secondsPerIteration, targetEntropy, replicaHash, replicasIdentical);

inline const Function<TrainerReport(RemoteTable, Tensor)> runTrainer{"ddp_rpc.runTrainer"};

// What the master hands a trainer: the table and its initial value.
struct Start {
  RemoteTable table;
  Tensor initialTable;
};

// A trainer's side of the master's call: the call's arguments, and the answer it waits for.
struct TrainerCall {
  Promise<Start> start;           // set when the master's call arrives
  Promise<TrainerReport> report;  // the call's answer, set when the training is over

  // Answers the master's call with what `train()` returns, or with the error it throws (which
  // is then thrown on here too).
  template <class Train>
  void answer(Train&& train) {
    try {
      report.setValue(train());
    } catch (...) {
      report.setError(std::current_exception());
      throw;
    }
  }
};

inline void bindTrainerCall(rpc::Agent& agent, TrainerCall& call) {
  agent.registry().impl(runTrainer, [&call](RemoteTable table, Tensor initial) -> Future<TrainerReport> {
    WEFT_ENFORCE(call.start.trySetValue(Start{std::move(table), std::move(initial)}), StateError,
                 "the training was started twice");
    return call.report.getFuture();
  });
}

inline uint64_t fnv1a(const Tensor& t) {
  Tensor c = t.contiguous();
  auto* bytes = static_cast<const unsigned char*>(c.rawData());
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < c.nbytes(); ++i) {
    h ^= bytes[i];
    h *= 1099511628211ULL;
  }
  return h;
}

// The replicas, byte for byte: every trainer gathers every trainer's weight and bias into
// `report` (replicasIdentical, replicaHash).
inline void compareReplicas(collectives::ProcessGroup& group, nn::Linear& fc, TrainerReport& report) {
  Tensor mine = cat({fc.weight().detach().contiguous().view({-1}), fc.bias().detach().contiguous().view({-1})}, 0);
  std::vector<Tensor> all(static_cast<size_t>(group.size()));
  group.allGather(all, mine).wait();
  report.replicasIdentical = true;
  for (const Tensor& other : all) {
    report.replicasIdentical = report.replicasIdentical && other.nbytes() == mine.nbytes() &&
                               std::memcmp(other.rawData(), mine.rawData(), mine.nbytes()) == 0;
  }
  report.replicaHash = static_cast<int64_t>(fnv1a(mine) >> 1);
}

// How the embedding table moved from `initial` to `now`.
struct TableChange {
  int64_t changedRows = 0;
  double maxChange = 0;
};

inline TableChange tableChange(const Tensor& initial, const Tensor& now) {
  Tensor diff = abs(now - initial).contiguous();
  TableChange change;
  change.maxChange = max(diff).item<float>();
  const float* d = diff.data<float>();
  for (int64_t row = 0; row < kNumEmbeddings; ++row) {
    change.changedRows +=
        std::any_of(d + row * kEmbeddingDim, d + (row + 1) * kEmbeddingDim, [](float x) { return x > 0; });
  }
  return change;
}

// The master's "final: ..." line over both trainers' reports; whether their replicas are
// bit-identical.
inline bool printSummary(const TrainerReport& r0, const TrainerReport& r1, TargetMode target, double wall,
                         const TableChange& change) {
  const bool identical = r0.replicasIdentical && r1.replicasIdentical && r0.replicaHash == r1.replicaHash;
  app::say("final: loss %.4f -> %.4f (trainer0), %.4f -> %.4f (trainer1), last-epoch accuracy %.3f / %.3f, target %s "
           "(entropy %.3f, ln 8 = %.3f); %" PRId64 " iterations per trainer, %.5f s/iteration, wall %.1f s; replicas "
           "%s; table changed in %" PRId64 " of %" PRId64 " rows (max change %.4f)\n",
           r0.firstEpochLoss, r0.lastEpochLoss, r1.firstEpochLoss, r1.lastEpochLoss, r0.lastEpochAccuracy,
           r1.lastEpochAccuracy, targetModeName(target), r0.targetEntropy, std::log(static_cast<double>(kClasses)),
           r0.iterations, (r0.secondsPerIteration + r1.secondsPerIteration) / 2, wall,
           identical ? "bit-identical" : "DIFFERENT", change.changedRows, kNumEmbeddings, change.maxChange);
  return identical;
}

}  // namespace weft::examples::ddp_rpc
