// ddp_rpc: a model split between data parallelism and a remote embedding table (after PyTorch's
// examples/distributed/rpc/ddp_rpc). Four processes: "trainer0" and "trainer1" (ranks 0 and 1)
// each hold a replica of a Linear(16, 8) under DistributedDataParallel over a two-process Gloo
// group; "master" (rank 2) builds an EmbeddingBag(100, 16, sum) on "ps" (rank 3) as a
// RemoteModule and starts the training on both trainers by RPC, handing them the RemoteModule.
//
//   ./build/tools/weftrun/weftrun -n 4 ./build/examples/ddp_rpc/ddp_rpc
//       [--epochs 100] [--batches 10] [--seed 0] [--target learnable|random] [--log-interval 10]
//       [--metrics ddp_rpc_metrics.csv]
//
// Per batch, on each trainer, inside a distributed autograd context: the remote EmbeddingBag's
// forward on ps, the DDP Linear here, cross-entropy, distributed backward (DDP averages the
// Linear's gradients over the two trainers into the context; the table's gradient goes to ps),
// DistributedOptimizer step (SGD, lr 0.05) over the table's parameter RRef and the RRefs of this
// trainer's Linear weight and bias. At the end the trainers compare their Linear replicas byte for
// byte and the master compares the table with its initial copy. README.md explains the target,
// the flags and the output.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/gloo/process_group_gloo.h"
#include "common/error.h"
#include "common/future.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "nn/embedding.h"
#include "nn/functional.h"
#include "nn/linear.h"
#include "rpc/agent.h"
#include "rpc/codec.h"
#include "rpc/options.h"
#include "rref/remote_module.h"
#include "rref/rref.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "examples/common/rpc_app.h"

#include "batch.h"

using namespace weft;
using namespace std::chrono_literals;
using weft::examples::ddp_rpc::Batch;
using weft::examples::ddp_rpc::kClasses;
using weft::examples::ddp_rpc::kEmbeddingDim;
using weft::examples::ddp_rpc::kNumEmbeddings;
using weft::examples::ddp_rpc::TargetMode;
using weft::examples::ddp_rpc::Teacher;
using Clock = std::chrono::steady_clock;
using RemoteTable = RemoteModule<nn::EmbeddingBag>;

namespace weft::examples::ddp_rpc {

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

}  // namespace weft::examples::ddp_rpc

using weft::examples::ddp_rpc::TrainerReport;

namespace app = weft::examples::app;

namespace {

using app::say;

constexpr const char* kProgram = "ddp_rpc";
constexpr int kWorld = 4;
constexpr int kMaster = 2;
constexpr int kPs = 3;
constexpr double kLr = 0.05;

struct Flags {
  int64_t epochs = 100;
  int64_t batches = 10;  // per epoch and trainer
  uint64_t seed = 0;
  TargetMode target = TargetMode::Learnable;
  int64_t logInterval = 10;  // epochs between progress lines
  std::string metrics = "ddp_rpc_metrics.csv";
};

[[noreturn]] void usage(const std::string& err) {
  app::exitWithUsage(kProgram, err, "weftrun -n 4",
                     "[--epochs N] [--batches N] [--seed N] [--target learnable|random]\n"
                     "          [--log-interval N] [--metrics PATH]\n"
                     "  (ranks 0, 1: trainer0, trainer1; rank 2: master; rank 3: ps)\n");
}

Flags parseFlags(int argc, char** argv) {
  Flags f;
  app::FlagReader args(argc, argv, usage);
  while (args.next()) {
    const std::string& a = args.flag();
    const std::string& v = args.value();
    if (a == "--epochs") f.epochs = args.integer();
    else if (a == "--batches") f.batches = args.integer();
    else if (a == "--seed") f.seed = static_cast<uint64_t>(args.integer());
    else if (a == "--target") {
      try {
        f.target = examples::ddp_rpc::parseTargetMode(v);
      } catch (const Error& e) {
        usage(e.what());
      }
    } else if (a == "--log-interval") f.logInterval = args.integer();
    else if (a == "--metrics") f.metrics = v;
    else args.unknown();
  }
  if (f.epochs < 1) usage("--epochs must be at least 1");
  if (f.batches < 1) usage("--batches must be at least 1");
  if (f.logInterval < 1) usage("--log-interval must be at least 1");
  return f;
}

std::string roleName(int rank) {
  switch (rank) {
    case 0:
      return "trainer0";
    case 1:
      return "trainer1";
    case kMaster:
      return "master";
    default:
      return "ps";
  }
}

// The metrics file of a trainer: PATH itself for trainer0, PATH with ".trainer1" before its
// extension for trainer1.
std::string metricsPath(const std::string& path, int rank) {
  if (rank == 0) return path;
  const std::string tag = ".trainer" + std::to_string(rank);
  size_t slash = path.find_last_of('/');
  size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

// splitmix64 of (seed, salt): independent seeds for the trainers' data and initial weights.
uint64_t mixSeed(uint64_t seed, uint64_t salt) {
  uint64_t z = seed ^ (salt * 0x9e3779b97f4a7c15ULL);
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const Tensor& t) {
  Tensor c = t.contiguous();
  auto* bytes = static_cast<const unsigned char*>(c.rawData());
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < c.nbytes(); ++i) {
    h ^= bytes[i];
    h *= 1099511628211ULL;
  }
  return h;
}

// The job's own messages, bound before the agent starts.
inline const Function<TrainerReport(RemoteTable, Tensor)> runTrainer{"ddp_rpc.runTrainer"};

// What the master hands a trainer: the table and its initial value.
struct Start {
  RemoteTable table;
  Tensor initialTable;
};

// What the other ranks tell this one.
struct Signals {
  Promise<Start> start;            // trainers: the master's call arrived
  Promise<TrainerReport> report;   // trainers: the answer to that call, set when training is over
};

void bind(rpc::Agent& agent, Signals& signals) {
  if (agent.rank() < kMaster) {
    agent.registry().impl(runTrainer, [&signals](RemoteTable table, Tensor initial) -> Future<TrainerReport> {
      WEFT_ENFORCE(signals.start.trySetValue(Start{std::move(table), std::move(initial)}), StateError,
                   "the training was started twice");
      return signals.report.getFuture();
    });
  }
}

std::vector<int> othersThan(int rank) {
  std::vector<int> out;
  for (int r = 0; r < kWorld; ++r) {
    if (r != rank) out.push_back(r);
  }
  return out;
}

// After the graceful shutdown: nothing of the job may be left in this process.
void checkShutdown(rpc::Agent& agent, const rpc::ShutdownReport& report) {
  app::checkShutdown(agent, report,
                     {app::layerCounts("RRefs", rref::debugCounts(agent)),
                      app::layerCounts("autograd", dist_autograd::debugCounts(agent)),
                      app::layerCounts("optimizer", dist_optim::debugCounts(agent))});
}

// One trainer's training, from the master's call to the replica check.
TrainerReport train(rpc::Agent& agent, collectives::ProcessGroup& group, const Flags& flags, const Start& start) {
  const int rank = agent.rank();
  const std::string name = agent.name();

  // Each trainer draws its own initial Linear; DDP's construction replaces it with trainer0's.
  Generator init(mixSeed(flags.seed, 100 + static_cast<uint64_t>(rank)));
  auto fc = std::make_shared<nn::Linear>(kEmbeddingDim, kClasses);
  fc->resetParameters(&init);
  collectives::DistributedDataParallel ddp(fc, group);

  std::vector<RRef<Tensor>> params = start.table.remoteParameters();
  params.push_back(makeRRef(agent, fc->weight()));
  params.push_back(makeRRef(agent, fc->bias()));
  dist_optim::DistributedOptimizer optimizer(agent, nn::optim::SgdOptions{.lr = kLr}, params);

  Teacher teacher(start.initialTable, flags.seed);
  Generator data(mixSeed(flags.seed, static_cast<uint64_t>(rank)));

  const std::string csvPath = metricsPath(flags.metrics, rank);
  std::ofstream csv(csvPath);
  if (!csv) throw Error("cannot write the metrics file '" + csvPath + "'");
  csv << "iteration,epoch,loss,accuracy,seconds\n";
  say("%s: training with %s on %s, DDP over %d trainers, %" PRId64 " epochs x %" PRId64 " batches, target %s\n",
      name.c_str(), "EmbeddingBag(100, 16, sum)", start.table.placement().c_str(), group.size(), flags.epochs,
      flags.batches, examples::ddp_rpc::targetModeName(flags.target));

  TrainerReport report;
  report.rank = rank;
  std::vector<int64_t> classCounts(static_cast<size_t>(kClasses), 0);
  int64_t iteration = 0;
  double trainSeconds = 0;
  double windowLoss = 0, windowCorrect = 0, windowBags = 0;
  int64_t windowBatches = 0;
  auto windowStart = Clock::now();
  for (int64_t epoch = 1; epoch <= flags.epochs; ++epoch) {
    double epochLoss = 0, epochCorrect = 0, epochBags = 0;
    for (int64_t b = 0; b < flags.batches; ++b) {
      ++iteration;
      Batch batch = examples::ddp_rpc::makeBatch(data, flags.target, &teacher);
      auto t0 = Clock::now();
      double lossValue = 0;
      int64_t correct = 0;
      {
        dist_autograd::Context ctx(agent);
        Tensor bags = start.table.forward(batch.indices, batch.offsets);
        Tensor logits = ddp.forward(bags);
        Tensor loss = nn::functional::crossEntropy(logits, batch.target);
        ctx.backward({loss});
        optimizer.step(ctx);
        lossValue = loss.item<float>();
        NoGradGuard noGrad;
        correct = eq(argmax(logits, 1), batch.target).sum().item<int64_t>();
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      trainSeconds += seconds;
      const int64_t* targets = batch.target.data<int64_t>();
      for (int64_t i = 0; i < batch.bags; ++i) ++classCounts[static_cast<size_t>(targets[i])];
      const double accuracy = static_cast<double>(correct) / static_cast<double>(batch.bags);
      csv << iteration << ',' << epoch << ',' << lossValue << ',' << accuracy << ',' << seconds << '\n';
      epochLoss += lossValue;
      epochCorrect += static_cast<double>(correct);
      epochBags += static_cast<double>(batch.bags);
      windowLoss += lossValue;
      windowCorrect += static_cast<double>(correct);
      windowBags += static_cast<double>(batch.bags);
      ++windowBatches;
    }
    if (epoch == 1) report.firstEpochLoss = epochLoss / static_cast<double>(flags.batches);
    if (epoch == flags.epochs) {
      report.lastEpochLoss = epochLoss / static_cast<double>(flags.batches);
      report.lastEpochAccuracy = epochCorrect / epochBags;
    }
    if (epoch % flags.logInterval == 0 || epoch == flags.epochs) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - windowStart).count();
      say("%s: epoch %" PRId64 "/%" PRId64 " iteration %" PRId64 " loss %.4f accuracy %.3f %.1f iterations/s\n",
          name.c_str(), epoch, flags.epochs, iteration, windowLoss / static_cast<double>(windowBatches),
          windowCorrect / windowBags, static_cast<double>(windowBatches) / elapsed);
      windowLoss = windowCorrect = windowBags = 0;
      windowBatches = 0;
      windowStart = Clock::now();
    }
  }
  csv.close();
  if (!csv) throw Error("could not write the metrics file '" + csvPath + "'");
  report.iterations = iteration;
  report.secondsPerIteration = trainSeconds / static_cast<double>(iteration);
  report.targetEntropy = examples::ddp_rpc::classEntropy(classCounts);

  // The replicas, byte for byte: every trainer gathers every trainer's weight and bias.
  Tensor mine = cat({fc->weight().detach().contiguous().view({-1}), fc->bias().detach().contiguous().view({-1})}, 0);
  std::vector<Tensor> all(static_cast<size_t>(group.size()));
  group.allGather(all, mine).wait();
  report.replicasIdentical = true;
  for (const Tensor& other : all) {
    report.replicasIdentical = report.replicasIdentical && other.nbytes() == mine.nbytes() &&
                               std::memcmp(other.rawData(), mine.rawData(), mine.nbytes()) == 0;
  }
  report.replicaHash = static_cast<int64_t>(fnv1a(mine) >> 1);
  say("%s: trained %" PRId64 " iterations in %.2f s (%.5f s/iteration); Linear replica %s (hash %016" PRIx64
      "); metrics in %s\n",
      name.c_str(), iteration, trainSeconds, report.secondsPerIteration,
      report.replicasIdentical ? "identical to the other trainer's" : "DIFFERS from the other trainer's",
      static_cast<uint64_t>(report.replicaHash), csvPath.c_str());
  return report;
}

int runTrainerRank(rpc::Agent& agent, const Flags& flags, Signals& signals) {
  const int rank = agent.rank();
  {
    // The two trainers' own group, made from the job's store under its own name.
    auto group = collectives::createGlooGroup(agent.store(), rank, kMaster,
                                              {.timeout = 60s, .name = "ddp_rpc_trainers"});
    Start start = app::awaitPeers(agent, signals.start.getFuture(), othersThan(rank), "waiting for the master");
    try {
      signals.report.setValue(train(agent, *group, flags, start));
    } catch (...) {
      signals.report.setError(std::current_exception());
      throw;
    }
    group->barrier().wait();
  }
  checkShutdown(agent, agent.shutdown());
  return 0;
}

int runMaster(rpc::Agent& agent, const Flags& flags) {
  {
    RemoteTable table(agent, "ps/cpu", kNumEmbeddings, kEmbeddingDim, EmbeddingBagMode::Sum);
    RRef<Tensor> weight = table.remoteParameters().at(0);
    Tensor initial = weight.toHere();
    say("master: built EmbeddingBag(%" PRId64 ", %" PRId64 ", sum) on ps; starting trainer0 and trainer1\n",
        kNumEmbeddings, kEmbeddingDim);
    auto t0 = Clock::now();
    std::vector<Future<TrainerReport>> calls;
    for (int r = 0; r < kMaster; ++r) calls.push_back(agent.async(r, runTrainer, {.timeout = 0ms}, table, initial));
    std::vector<TrainerReport> reports;
    for (auto& call : calls) reports.push_back(app::awaitPeers(agent, call, othersThan(kMaster), "waiting for the trainers"));
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();

    Tensor now = weight.toHere();
    Tensor diff = abs(now - initial).contiguous();
    const double maxChange = max(diff).item<float>();
    int64_t changedRows = 0;
    const float* d = diff.data<float>();
    for (int64_t row = 0; row < kNumEmbeddings; ++row) {
      changedRows += std::any_of(d + row * kEmbeddingDim, d + (row + 1) * kEmbeddingDim, [](float x) { return x > 0; });
    }
    const bool identical = reports[0].replicasIdentical && reports[1].replicasIdentical &&
                           reports[0].replicaHash == reports[1].replicaHash;
    say("final: loss %.4f -> %.4f (trainer0), %.4f -> %.4f (trainer1), last-epoch accuracy %.3f / %.3f, target %s "
        "(entropy %.3f, ln 8 = %.3f); %" PRId64 " iterations per trainer, %.5f s/iteration, wall %.1f s; replicas %s; "
        "table changed in %" PRId64 " of %" PRId64 " rows (max change %.4f)\n",
        reports[0].firstEpochLoss, reports[0].lastEpochLoss, reports[1].firstEpochLoss, reports[1].lastEpochLoss,
        reports[0].lastEpochAccuracy, reports[1].lastEpochAccuracy, examples::ddp_rpc::targetModeName(flags.target),
        reports[0].targetEntropy, std::log(static_cast<double>(kClasses)), reports[0].iterations,
        (reports[0].secondsPerIteration + reports[1].secondsPerIteration) / 2, wall,
        identical ? "bit-identical" : "DIFFERENT", changedRows, kNumEmbeddings, maxChange);
    if (!identical) throw Error("the trainers' Linear replicas differ");
    if (changedRows == 0) throw Error("the embedding table on ps did not change");
  }
  checkShutdown(agent, agent.shutdown());
  return 0;
}

// ps only hosts the table: its shutdown serves the others until the whole job ends.
int runPs(rpc::Agent& agent) {
  say("ps: serving the embedding table\n");
  checkShutdown(agent, agent.shutdown());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = parseFlags(argc, argv);
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
    Signals signals;
    bind(agent, signals);
    agent.start();
    if (options.rank < kMaster) return runTrainerRank(agent, flags, signals);
    if (options.rank == kMaster) return runMaster(agent, flags);
    return runPs(agent);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
