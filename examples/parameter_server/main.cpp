// parameter_server: a convolutional network trained on Fashion-MNIST by several trainers through
// one parameter server, with RPC, distributed autograd and a DistributedOptimizer (after
// PyTorch's examples/distributed/rpc/parameter_server).
//
//   ./build/tools/weftrun/weftrun -n 3 ./build/examples/parameter_server/parameter_server
//       [--epochs 1] [--max-batches N] [--seed 0] [--update serialized|snapshot] [--lr 0.03]
//       [--batch-size 32] [--log-interval 100] [--metrics parameter_server_metrics.csv] [--data-dir DIR]
//
// Roles, and what lives where:
//   rank 0     "parameter_server": the model (a ParameterServer, server.h) and the test split;
//              it only serves: its shutdown() answers the trainers until the job ends.
//   rank 1..   "trainer_<r>": its shard of the training split, the DistributedOptimizer, the
//              loss. trainer_1 builds the model on the server and hands it to the others
//              (handover.h); at the end it has the server evaluate the model on the test split.
// Per batch, on each trainer, inside a distributed autograd context: forward on the server by
// RPC, NLL loss here, distributed backward, DistributedOptimizer step (SGD) over the model's 8
// parameter RRefs. README.md explains the update modes and the output.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "data/data.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "nn/functional.h"
#include "rpc/options.h"
#include "tensor/ops.h"
#include "examples/common/data_files.h"
#include "examples/common/dist_app.h"
#include "examples/common/metrics.h"

#include "flags.h"
#include "handover.h"
#include "remote_model.h"

using namespace weft;
using namespace weft::examples::parameter_server;
namespace app = weft::examples::app;
using app::say;

namespace {

void runTrainer(rpc::Agent& agent, const Flags& flags, Handover& handover) {
  const int rank = agent.rank(), trainers = agent.worldSize() - 1;
  const char* name = agent.name().c_str();  // the agent's own string, alive as long as the agent
  const bool serialized = flags.update == UpdateMode::Serialized;
  auto train = std::make_shared<data::TensorDataset>(data::loadFashionMnist(
      {.root = flags.dataDir, .split = data::Split::Train, .normalize = data::Normalization{kMean, kStd}}));

  // The model lives on the server: trainer_1 builds it there, the others get its RRef from trainer_1.
  RRef<ParameterServer> ps =
      rank == 1 ? buildModel(agent, flags.seed, flags.update, flags.dataDir) : awaitModel(agent, handover);
  for (int r = 2; rank == 1 && r <= trainers; ++r) agent.sync(r, handOver, ps);
  dist_optim::DistributedOptimizer optimizer(agent, nn::optim::SGDOptions{.lr = flags.lr}, parameterRRefs(ps));

  // This trainer's shard of the data.
  auto sampler = std::make_shared<data::DistributedSampler>(
      train->size(), data::DistributedSamplerOptions{
                         .numReplicas = trainers, .rank = rank - 1, .seed = static_cast<int64_t>(flags.seed)});
  data::DataLoader loader(train, {.batchSize = flags.batchSize}, sampler);
  const int64_t perEpoch = flags.maxBatches > 0 ? std::min(loader.numBatches(), flags.maxBatches) : loader.numBatches();
  app::CsvFile csv(app::taggedPath(flags.metrics, rank == 1 ? "" : ".trainer_" + std::to_string(rank)),
                   "iteration,epoch,loss,accuracy,seconds");
  say("%s: %" PRId64 " of %" PRId64 " training images, %" PRId64 " batches of %" PRId64 " per epoch, %" PRId64
      " epoch(s)\n", name, sampler->size(), train->size(), perEpoch, flags.batchSize, flags.epochs);

  int64_t iteration = 0;
  double trainSeconds = 0;
  for (int64_t epoch = 1; epoch <= flags.epochs; ++epoch) {
    sampler->setEpoch(epoch - 1);
    int64_t batch = 0;
    app::Window window;
    for (const data::Example& example : loader) {
      if (batch == perEpoch) break;
      ++batch;
      ++iteration;
      const auto t0 = app::Clock::now();
      double lossValue = 0;
      int64_t correct = 0;
      {
        dist_autograd::Context ctx(agent);
        if (serialized) ps.rpcSync(&ParameterServer::lockForward);
        Tensor logProbs = ps.rpcSync(&ParameterServer::forward, example.data, batchSeed(flags.seed, rank, iteration));
        Tensor loss = nn::functional::nllLoss(logProbs, example.target);
        ctx.backward({loss});
        ps.rpcSync(&ParameterServer::beginUpdate, serialized);
        optimizer.step(ctx);
        ps.rpcSync(&ParameterServer::endUpdate);
        lossValue = loss.item<float>();
        NoGradGuard noGrad;
        correct = eq(argmax(logProbs, 1), example.target).sum().item<int64_t>();
      }
      const double seconds = app::secondsSince(t0);
      trainSeconds += seconds;
      const auto seen = static_cast<double>(example.target.numel());
      csv.row(iteration, epoch, lossValue, static_cast<double>(correct) / seen, seconds);
      window.add(lossValue, static_cast<double>(correct), seen);
      if (window.batches == flags.logInterval || batch == perEpoch) {
        say("%s: epoch %" PRId64 " iteration %" PRId64 " batch %" PRId64 "/%" PRId64
            " loss %.4f accuracy %.3f %.2f batches/s\n",
            name, epoch, iteration, batch, perEpoch, window.meanLoss(), window.accuracy(), window.batchesPerSecond());
        window.reset();
      }
    }
  }
  csv.close();
  const double perBatch = trainSeconds / static_cast<double>(std::max<int64_t>(iteration, 1));
  say("%s: trained %" PRId64 " batches in %.1f s (%.4f s/batch); metrics in %s\n", name, iteration, trainSeconds,
      perBatch, csv.path().c_str());

  // The other trainers report to trainer_1, which evaluates the model once all have finished.
  if (rank != 1) {
    agent.sync(1, trainerDone, static_cast<int64_t>(rank));
    return;
  }
  awaitOtherTrainers(agent, handover);
  const auto t0 = app::Clock::now();
  const double accuracy = ps.rpcSync(&ParameterServer::testAccuracy);
  const double evalSeconds = app::secondsSince(t0);
  say("final test accuracy: %.4f (trainers %d, update %s, %" PRId64 " batches per trainer, %" PRId64
      " forwards on the server, %.4f s/batch on trainer_1, evaluation %.1f s)\n",
      accuracy, trainers, updateModeName(flags.update), iteration, ps.rpcSync(&ParameterServer::forwardCount),
      perBatch, evalSeconds);
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parseFlags(argc, argv);
  try {
    rpc::Options options = rpc::Options::fromEnv();
    if (options.worldSize < 2) {
      throw Error("needs at least 2 processes (rank 0: the parameter server, ranks 1..: trainers), got a world of " +
                  std::to_string(options.worldSize) + "; start it with weftrun -n 3 " + kProgram);
    }
    app::checkFashionMnistFiles(flags.dataDir);
    options.name = options.rank == 0 ? "parameter_server" : "trainer_" + std::to_string(options.rank);
    // Each trainer has at most one call at a time on the server, and in snapshot mode a forward
    // may wait there for a step to finish: the server needs a handler thread per trainer, plus
    // one for the steps and releases.
    if (options.rank == 0) options.numWorkerThreads = std::max(options.numWorkerThreads, options.worldSize + 2);
    options.validate();
    rpc::Agent agent(options);
    Handover handover;
    bindHandover(agent, handover);
    agent.start();
    if (options.rank == 0) {
      say("%s: serving %d trainer(s)\n", agent.name().c_str(), agent.worldSize() - 1);
    } else {
      runTrainer(agent, flags, handover);
    }
    app::shutdownCleanly(agent);  // the job's end: every rank's objects released, every call answered
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
