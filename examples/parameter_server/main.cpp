// parameter_server: a convolutional network trained on Fashion-MNIST by several trainers through
// one parameter server, with RPC, distributed autograd and a DistributedOptimizer (after
// PyTorch's examples/distributed/rpc/parameter_server). Rank 0 is "parameter_server"; ranks
// 1..W-1 are "trainer_1".."trainer_<W-1>", each training on its own shard of the data.
//
//   ./build/tools/weftrun/weftrun -n 3 ./build/examples/parameter_server/parameter_server
//       [--epochs 1] [--max-batches N] [--seed 0] [--update serialized|snapshot] [--lr 0.03]
//       [--batch-size 32] [--log-interval 100] [--metrics parameter_server_metrics.csv] [--data-dir DIR]
//
// Per batch, on each trainer, inside a distributed autograd context: forward on the server by
// RPC, NLL loss here, distributed backward, DistributedOptimizer step (SGD) over the model's 8
// parameter RRefs. At the end trainer_1 has the server evaluate the model on the test split (eval
// mode) and prints "final test accuracy: A ...". README.md explains the roles, the update modes
// and the output.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "data/data.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "nn/functional.h"
#include "rpc/agent.h"
#include "rpc/options.h"
#include "rref/rref.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"
#include "examples/common/rpc_app.h"

#include "server.h"

using namespace weft;
using namespace std::chrono_literals;
using weft::examples::parameter_server::kMean;
using weft::examples::parameter_server::kNetParameters;
using weft::examples::parameter_server::kNetParameterTensors;
using weft::examples::parameter_server::kStd;
using weft::examples::parameter_server::ParameterServer;
using weft::examples::parameter_server::UpdateMode;
using Clock = std::chrono::steady_clock;

namespace app = weft::examples::app;

namespace {

using app::say;

constexpr const char* kProgram = "parameter_server";

struct Flags {
  int64_t epochs = 1;
  int64_t maxBatches = -1;  // per epoch and trainer; -1 = the whole shard
  uint64_t seed = 0;
  UpdateMode update = UpdateMode::Serialized;
  double lr = 0.03;
  int64_t batchSize = 32;
  int64_t logInterval = 100;
  std::string metrics = "parameter_server_metrics.csv";
  std::string dataDir = data::kFashionMnistDir;
};

[[noreturn]] void usage(const std::string& err) {
  app::exitWithUsage(kProgram, err, "weftrun -n W",
                     "[--epochs N] [--max-batches N] [--seed N] [--update serialized|snapshot]\n"
                     "          [--lr X] [--batch-size N] [--log-interval N] [--metrics PATH] [--data-dir DIR]\n"
                     "  (W >= 2: rank 0 is the parameter server, ranks 1..W-1 the trainers)\n");
}

Flags parseFlags(int argc, char** argv) {
  Flags f;
  app::FlagReader args(argc, argv, usage);
  while (args.next()) {
    const std::string& a = args.flag();
    const std::string& v = args.value();
    if (a == "--epochs") f.epochs = args.integer();
    else if (a == "--max-batches") f.maxBatches = args.integer();
    else if (a == "--seed") f.seed = static_cast<uint64_t>(args.integer());
    else if (a == "--update") {
      try {
        f.update = examples::parameter_server::parseUpdateMode(v);
      } catch (const Error& e) {
        usage(e.what());
      }
    } else if (a == "--lr") f.lr = args.real();
    else if (a == "--batch-size") f.batchSize = args.integer();
    else if (a == "--log-interval") f.logInterval = args.integer();
    else if (a == "--metrics") f.metrics = v;
    else if (a == "--data-dir") f.dataDir = v;
    else args.unknown();
  }
  if (f.epochs < 1) usage("--epochs must be at least 1");
  if (f.maxBatches < -1 || f.maxBatches == 0) usage("--max-batches must be positive (or -1: the whole shard)");
  if (f.batchSize < 1) usage("--batch-size must be at least 1");
  if (f.logInterval < 1) usage("--log-interval must be at least 1");
  if (!(f.lr > 0)) usage("--lr must be positive");
  return f;
}

// Every rank checks the four data files before joining the job, so a missing one stops the job
// at once, with the same message on every rank.
void checkDataFiles(const std::string& dir) {
  const std::string hint =
      "Fashion-MNIST comes from the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist, "
      "or scripts/setup.sh); or pass --data-dir DIR with the four IDX files";
  for (const char* stem : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"}) {
    data::findIdxFile(dir, stem, hint);
  }
}

// The metrics file of trainer r: PATH itself for trainer_1, PATH with ".trainer_<r>" before its
// extension for the others.
std::string metricsPath(const std::string& path, int rank) {
  if (rank == 1) return path;
  const std::string tag = ".trainer_" + std::to_string(rank);
  size_t slash = path.find_last_of('/');
  size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

// splitmix64: the dropout seed of one batch, from the run's seed, the trainer and the batch.
int64_t batchSeed(uint64_t seed, int rank, int64_t iteration) {
  uint64_t z = seed ^ (static_cast<uint64_t>(rank) << 40) ^ static_cast<uint64_t>(iteration);
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<int64_t>((z ^ (z >> 31)) >> 1);
}

// The job's own messages, bound on every rank before it starts.
inline const Function<void(RRef<ParameterServer>)> handOver{"parameter_server.handOver"};
inline const Function<void(int64_t)> trainerDone{"parameter_server.trainerDone"};

// What the other ranks tell this one.
struct Signals {
  Promise<RRef<ParameterServer>> server;  // trainers 2..: trainer_1's handle to the model
  Promise<void> trainersDone;             // trainer_1: every other trainer finished
  std::mutex mutex;
  int64_t doneCount = 0;
};

void bind(rpc::Agent& agent, Signals& signals) {
  const int trainers = agent.worldSize() - 1;
  agent.registry().impl(handOver, [&signals](RRef<ParameterServer> ps) {
    WEFT_ENFORCE(signals.server.trySetValue(std::move(ps)), StateError, "the model was handed over twice");
  });
  agent.registry().impl(trainerDone, [&signals, trainers](int64_t) {
    std::lock_guard<std::mutex> guard(signals.mutex);
    if (++signals.doneCount == trainers - 1) signals.trainersDone.setValue();
  });
  if (trainers == 1) signals.trainersDone.setValue();
}

std::vector<int> ranksBut(const rpc::Agent& agent, std::initializer_list<int> skip) {
  std::vector<int> out;
  for (int r = 0; r < agent.worldSize(); ++r) {
    bool skipped = false;
    for (int s : skip) skipped = skipped || s == r;
    if (!skipped) out.push_back(r);
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

// The server only hosts the model: its shutdown serves the trainers until the whole job ends.
int runServer(rpc::Agent& agent) {
  say("%s: serving %d trainer(s)\n", agent.name().c_str(), agent.worldSize() - 1);
  checkShutdown(agent, agent.shutdown());
  return 0;
}

int runTrainer(rpc::Agent& agent, const Flags& flags, Signals& signals) {
  const int rank = agent.rank();
  const int trainers = agent.worldSize() - 1;
  const std::string name = agent.name();
  const bool serialized = flags.update == UpdateMode::Serialized;
  auto train = std::make_shared<data::TensorDataset>(data::loadFashionMnist(
      {.root = flags.dataDir, .split = data::Split::Train, .normalize = data::Normalization{kMean, kStd}}));
  {
    RRef<ParameterServer> ps;
    if (rank == 1) {
      ps = agent.remote<ParameterServer>("parameter_server", static_cast<int64_t>(flags.seed),
                                         std::string(updateModeName(flags.update)), flags.dataDir);
      const int64_t count = ps.rpcSync(&ParameterServer::parameterCount);
      if (count != kNetParameters) {
        throw Error("the server's model has " + std::to_string(count) + " parameters, expected " +
                    std::to_string(kNetParameters));
      }
      say("%s: built the model on parameter_server (%" PRId64 " parameters), update mode %s\n", name.c_str(), count,
          updateModeName(flags.update));
      for (int r = 2; r <= trainers; ++r) agent.sync(r, handOver, ps);
    } else {
      ps = app::awaitPeers(agent, signals.server.getFuture(), {0, 1}, "waiting for trainer_1 to build the model");
    }
    const int64_t tensors = ps.rpcSync(&ParameterServer::parameterTensorCount);
    if (tensors != static_cast<int64_t>(kNetParameterTensors)) {
      throw Error("the server's model has " + std::to_string(tensors) + " parameter tensors, expected 8");
    }
    std::vector<RRef<Tensor>> params;
    for (int64_t i = 0; i < tensors; ++i) params.push_back(ps.remote(&ParameterServer::parameter, i));
    dist_optim::DistributedOptimizer optimizer(agent, nn::optim::SgdOptions{.lr = flags.lr}, params);

    auto sampler = std::make_shared<data::DistributedSampler>(
        train->size(), data::DistributedSamplerOptions{
                           .numReplicas = trainers, .rank = rank - 1, .seed = static_cast<int64_t>(flags.seed)});
    data::DataLoader loader(train, {.batchSize = flags.batchSize}, sampler);
    int64_t perEpoch = loader.numBatches();
    if (flags.maxBatches > 0) perEpoch = std::min(perEpoch, flags.maxBatches);

    const std::string csvPath = metricsPath(flags.metrics, rank);
    std::ofstream csv(csvPath);
    if (!csv) throw Error("cannot write the metrics file '" + csvPath + "'");
    csv << "iteration,epoch,loss,accuracy,seconds\n";

    say("%s: %" PRId64 " of %" PRId64 " training images, %" PRId64 " batches of %" PRId64 " per epoch, %" PRId64
        " epoch(s)\n",
        name.c_str(), sampler->size(), train->size(), perEpoch, flags.batchSize, flags.epochs);
    int64_t iteration = 0;
    double trainSeconds = 0;
    for (int64_t epoch = 1; epoch <= flags.epochs; ++epoch) {
      sampler->setEpoch(epoch - 1);
      int64_t batch = 0;
      double windowLoss = 0, windowCorrect = 0, windowSeen = 0;
      auto windowStart = Clock::now();
      for (const data::Example& example : loader) {
        if (batch == perEpoch) break;
        ++batch;
        ++iteration;
        auto t0 = Clock::now();
        double lossValue = 0;
        int64_t correct = 0;
        {
          dist_autograd::Context ctx(agent);
          if (serialized) ps.rpcSync(&ParameterServer::lockForward);
          Tensor logProbs =
              ps.rpcSync(&ParameterServer::forward, example.data, batchSeed(flags.seed, rank, iteration));
          Tensor loss = nn::functional::nllLoss(logProbs, example.target);
          ctx.backward({loss});
          ps.rpcSync(&ParameterServer::beginUpdate, serialized);
          optimizer.step(ctx);
          ps.rpcSync(&ParameterServer::endUpdate);
          lossValue = loss.item<float>();
          NoGradGuard noGrad;
          correct = eq(argmax(logProbs, 1), example.target).sum().item<int64_t>();
        }
        const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        trainSeconds += seconds;
        const int64_t seen = example.target.numel();
        csv << iteration << ',' << epoch << ',' << lossValue << ','
            << static_cast<double>(correct) / static_cast<double>(seen) << ',' << seconds << '\n';
        windowLoss += lossValue;
        windowCorrect += static_cast<double>(correct);
        windowSeen += static_cast<double>(seen);
        const int64_t windowBatches = (batch - 1) % flags.logInterval + 1;
        if (windowBatches == flags.logInterval || batch == perEpoch) {
          const double elapsed = std::chrono::duration<double>(Clock::now() - windowStart).count();
          say("%s: epoch %" PRId64 " iteration %" PRId64 " batch %" PRId64 "/%" PRId64
              " loss %.4f accuracy %.3f %.2f batches/s\n",
              name.c_str(), epoch, iteration, batch, perEpoch, windowLoss / static_cast<double>(windowBatches),
              windowCorrect / windowSeen, static_cast<double>(windowBatches) / elapsed);
          windowLoss = windowCorrect = windowSeen = 0;
          windowStart = Clock::now();
        }
      }
    }
    csv.close();
    if (!csv) throw Error("could not write the metrics file '" + csvPath + "'");
    const double perBatch = trainSeconds / static_cast<double>(std::max<int64_t>(iteration, 1));
    say("%s: trained %" PRId64 " batches in %.1f s (%.4f s/batch); metrics in %s\n", name.c_str(), iteration,
        trainSeconds, perBatch, csvPath.c_str());

    if (rank == 1) {
      app::awaitPeers(agent, signals.trainersDone.getFuture(), ranksBut(agent, {1}),
            "waiting for the other trainers to finish");
      auto t0 = Clock::now();
      const double accuracy = ps.rpcSync(&ParameterServer::testAccuracy);
      const double evalSeconds = std::chrono::duration<double>(Clock::now() - t0).count();
      const int64_t forwards = ps.rpcSync(&ParameterServer::forwardCount);
      say("final test accuracy: %.4f (trainers %d, update %s, %" PRId64 " batches per trainer, %" PRId64
          " forwards on the server, %.4f s/batch on trainer_1, evaluation %.1f s)\n",
          accuracy, trainers, updateModeName(flags.update), iteration, forwards, perBatch, evalSeconds);
    } else {
      agent.sync(1, trainerDone, static_cast<int64_t>(rank));
    }
  }
  checkShutdown(agent, agent.shutdown());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = parseFlags(argc, argv);
  try {
    rpc::Options options = rpc::Options::fromEnv();
    if (options.worldSize < 2) {
      throw Error("needs at least 2 processes (rank 0: the parameter server, ranks 1..: trainers), got a world of " +
                  std::to_string(options.worldSize) + "; start it with weftrun -n 3 " + kProgram);
    }
    checkDataFiles(flags.dataDir);
    options.name = options.rank == 0 ? "parameter_server" : "trainer_" + std::to_string(options.rank);
    // Each trainer has at most one call at a time on the server, and in snapshot mode a forward
    // may wait there for a step to finish: the server needs a handler thread per trainer, plus
    // one for the steps and releases.
    if (options.rank == 0) options.numWorkerThreads = std::max(options.numWorkerThreads, options.worldSize + 2);
    options.validate();
    rpc::Agent agent(options);
    Signals signals;
    bind(agent, signals);
    agent.start();
    return options.rank == 0 ? runServer(agent) : runTrainer(agent, flags, signals);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
