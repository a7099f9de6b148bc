// ddp_rpc: a model split between data parallelism and a remote embedding table (after PyTorch's
// examples/distributed/rpc/ddp_rpc).
//
//   ./build/tools/weftrun/weftrun -n 4 ./build/examples/ddp_rpc/ddp_rpc
//       [--epochs 100] [--batches 10] [--seed 0] [--target learnable|random] [--log-interval 10]
//       [--metrics ddp_rpc_metrics.csv] [--timeout 60]
//
// Roles, and what lives where:
//   ranks 0, 1  "trainer0", "trainer1": a replica of a Linear(16, 8) each, under
//               DistributedDataParallel over the two trainers' own Gloo group; the data (batch.h).
//   rank 2      "master": builds an EmbeddingBag(100, 16, sum) on ps as a RemoteModule and starts
//               both trainers by RPC, handing them the table (report.h); prints the final line.
//   rank 3      "ps": holds the table; it only serves: its shutdown() answers until the job ends.
// Per batch, on each trainer, inside a distributed autograd context: the remote EmbeddingBag's
// forward on ps, the DDP Linear here, cross-entropy, distributed backward (DDP averages the
// Linear's gradients over the two trainers; the table's gradient goes to ps), DistributedOptimizer
// step (SGD, lr 0.05) over the table's parameter RRef and this trainer's Linear weight and bias.
// At the end the trainers compare their replicas byte for byte and the master compares the table
// with its initial copy. README.md explains the target, the flags and the output.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/gloo/process_group_gloo.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "nn/functional.h"
#include "rpc/options.h"
#include "tensor/generator.h"
#include "examples/common/dist_app.h"
#include "examples/common/metrics.h"

#include "flags.h"
#include "report.h"
#include "trainer_log.h"

using namespace weft;
using namespace weft::examples::ddp_rpc;
using namespace std::chrono_literals;
namespace app = weft::examples::app;
using app::say;

namespace {

// One trainer's training, from the master's call to the replica check.
TrainerReport train(rpc::Agent& agent, collectives::ProcessGroup& group, const Flags& flags, const Start& start) {
  const int rank = agent.rank();
  const char* name = agent.name().c_str();  // the agent's own string, alive as long as the agent
  // Each trainer draws its own initial Linear; DDP's construction replaces it with trainer0's.
  Generator init(mixSeed(flags.seed, 100 + static_cast<uint64_t>(rank)));
  auto fc = std::make_shared<nn::Linear>(kEmbeddingDim, kClasses);
  fc->resetParameters(&init);
  collectives::DistributedDataParallel ddp(fc, group);
  std::vector<RRef<Tensor>> params = start.table.remoteParameters();  // on ps
  params.push_back(makeRRef(agent, fc->weight()));                     // here
  params.push_back(makeRRef(agent, fc->bias()));
  dist_optim::DistributedOptimizer optimizer(agent, nn::optim::SGDOptions{.lr = kLr}, params);

  Teacher teacher(start.initialTable, flags.seed);
  Generator data(mixSeed(flags.seed, static_cast<uint64_t>(rank)));
  TrainerLog log(app::taggedPath(flags.metrics, rank == 0 ? "" : ".trainer" + std::to_string(rank)), name, flags);
  say("%s: training with %s on %s, DDP over %d trainers, %" PRId64 " epochs x %" PRId64 " batches, target %s\n",
      name, "EmbeddingBag(100, 16, sum)", start.table.placement().c_str(), group.size(), flags.epochs, flags.batches,
      targetModeName(flags.target));

  for (int64_t epoch = 1; epoch <= flags.epochs; ++epoch) {
    for (int64_t b = 0; b < flags.batches; ++b) {
      Batch batch = makeBatch(data, flags.target, &teacher);
      const auto t0 = app::Clock::now();
      double lossValue = 0, correct = 0;
      {
        dist_autograd::Context ctx(agent);
        Tensor bags = start.table.forward(batch.indices, batch.offsets);
        Tensor logits = ddp.forward(bags);
        Tensor loss = nn::functional::crossEntropy(logits, batch.target);
        ctx.backward({loss});
        optimizer.step(ctx);
        lossValue = loss.item<float>();
        correct = app::correctPredictions(logits, batch.target);
      }
      log.add(epoch, batch, lossValue, correct, app::secondsSince(t0));
    }
    log.endEpoch(epoch);
  }
  TrainerReport report = log.finish(rank);
  compareReplicas(group, *fc, report);
  log.printTrained(report);
  return report;
}

void runTrainerRank(rpc::Agent& agent, const Flags& flags, TrainerCall& call) {
  // The two trainers' own group, made from the job's store under its own name.
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.timeoutSeconds * 1000));
  auto group = collectives::createGlooGroup(agent.store(), agent.rank(), kMaster,
                                            {.timeout = timeout, .name = "ddp_rpc_trainers"});
  Start start = app::awaitPeers(agent, call.start.getFuture(), othersThan(agent.rank()), "waiting for the master");
  call.answer([&] { return train(agent, *group, flags, start); });
  group->barrier().wait();
}

void runMaster(rpc::Agent& agent, const Flags& flags) {
  RemoteTable table(agent, "ps/cpu", kNumEmbeddings, kEmbeddingDim, EmbeddingBagMode::Sum);
  RRef<Tensor> weight = table.remoteParameters().at(0);
  Tensor initial = weight.toHere();
  say("master: built EmbeddingBag(%" PRId64 ", %" PRId64 ", sum) on ps; starting trainer0 and trainer1\n",
      kNumEmbeddings, kEmbeddingDim);
  const auto t0 = app::Clock::now();
  std::vector<Future<TrainerReport>> calls;
  for (int r = 0; r < kMaster; ++r) calls.push_back(agent.callAsync(r, runTrainer, {.timeout = 0ms}, table, initial));
  std::vector<TrainerReport> reports;
  for (auto& c : calls) reports.push_back(app::awaitPeers(agent, c, othersThan(kMaster), "waiting for the trainers"));
  const double wall = app::secondsSince(t0);

  const TableChange change = tableChange(initial, weight.toHere());
  const bool identical = printSummary(reports[0], reports[1], flags.target, wall, change);
  if (!identical) throw Error("the trainers' Linear replicas differ");
  if (change.changedRows == 0) throw Error("the embedding table on ps did not change");
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parseFlags(argc, argv);
  try {
    rpc::Options options = rpc::Options::fromEnv();
    if (options.worldSize != kWorld) {
      throw Error("needs exactly 4 processes (trainer0, trainer1, master, ps), got a world of " +
                  std::to_string(options.worldSize) + "; start it with weftrun -n 4 " + kProgram);
    }
    options.name = roleName(options.rank);
    options.validate();
    // The table is drawn on ps from the process's default generator when the master builds it.
    if (options.rank == kPs) manualSeed(mixSeed(flags.seed, 200));
    rpc::Agent agent(options);
    TrainerCall call;
    if (options.rank < kMaster) bindTrainerCall(agent, call);
    agent.start();
    if (options.rank < kMaster) runTrainerRank(agent, flags, call);
    if (options.rank == kMaster) runMaster(agent, flags);
    if (options.rank == kPs) say("ps: serving the embedding table\n");
    app::shutdownCleanly(agent);  // the job's end: every rank's objects released, every call answered
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
