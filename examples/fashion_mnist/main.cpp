// fashion_mnist: the MLP of examples/fashion_mnist_mlp (784-256-128-10, SGD lr 0.01 momentum 0.9,
// global batch 64) trained data parallel over the processes of a weftrun job.
//
//   ./build/tools/weftrun/weftrun -n 2 ./build/examples/fashion_mnist/fashion_mnist
//       [--mode ddp|allreduce|zero1|zero2|local] [--epochs 2] [--batch-size 64] [--lr 0.01] [--momentum 0.9]
//       [--seed 0] [--max-batches N] [--log-interval 100] [--metrics fashion_mnist_metrics.csv]
//       [--save PATH] [--threads N] [--bucket-cap-mb 25] [--timeout 120] [--check-calls 1] [--data-dir DIR]
//
// Roles, and what lives where: every process is alike. Each holds a replica of the model, reads
// its own shard of each epoch through DistributedSampler and takes batch / W examples of the
// global batch, so that a step of W processes is the same computation as a step of one process
// on the whole batch. Rank 0 also serves the rendezvous store, prints the progress and the
// summary and writes the metrics CSV; every rank ends with "rank R: shut down cleanly".
// Modes: `ddp` wraps the model in collectives::DistributedDataParallel (bucketed allreduces that
// overlap backward); `allreduce` averages the gradients by hand after backward (replicas.h);
// `zero1` is DDP with collectives::ZeroRedundancyOptimizer (each process keeps the momentum of its
// share of the parameters); `zero2` is collectives::ShardedDataParallel (gradients reduce-scattered,
// each process keeps its slice of gradients and momentum);
// `local` is the single-process baseline without any process group (a world of one only).
// README.md describes the output, the measured speed-up and the equivalence with one process.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/init.h"
#include "collectives/sharded_ddp.h"
#include "collectives/zero.h"
#include "data/data.h"
#include "kernels/cpu/parallel.h"
#include "nn/nn.h"
#include "rpc/options.h"
#include "examples/common/data_files.h"
#include "examples/common/metrics.h"

#include "flags.h"
#include "progress.h"
#include "replicas.h"

using namespace weft;
using namespace weft::examples::fashion_mnist;
namespace app = weft::examples::app;
using app::say;

int main(int argc, char** argv) {
  const Flags flags = parseFlags(argc, argv);
  try {
    const rpc::Options options = rpc::Options::fromEnv();
    const int world = options.worldSize, rank = options.rank;
    checkWorld(flags, world);
    const int64_t localBatch = flags.batchSize / world;
    app::checkFashionMnistFiles(flags.dataDir);
    const int threads = threadsPerProcess(flags.threads, kernels::cpu::numThreads());
    kernels::cpu::setNumThreads(threads);
    // The process group, with the rendezvous store rank 0 serves, in one call; none in local mode.
    std::unique_ptr<collectives::ProcessGroup> pg;
    Progress progress(flags, rank, world, pg);  // rank 0 opens its metrics file before the group
    if (flags.mode != Mode::Local) {
      const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.timeoutSeconds * 1000));
      pg = collectives::init(options, {.timeout = timeout, .checkCalls = flags.checkCalls, .name = "fashion_mnist"});
    }
    auto train = std::make_shared<data::TensorDataset>(mlp::loadSplit(flags.dataDir, data::Split::Train));
    const data::TensorDataset test = mlp::loadSplit(flags.dataDir, data::Split::Test);

    // The replica: DDP, or rank 0's parameters broadcast by hand (allreduce), or alone (local).
    manualSeed(flags.seed);
    auto model = mlp::makeModel();
    const int64_t bucketCapBytes = static_cast<int64_t>(flags.bucketCapMb * 1024 * 1024);
    std::optional<collectives::DistributedDataParallel> ddp;
    if (flags.mode == Mode::Ddp || flags.mode == Mode::Zero1) {
      ddp.emplace(model, *pg, collectives::DistributedDataParallel::Options{.bucketCapBytes = bucketCapBytes});
    }
    if (flags.mode == Mode::AllReduce) broadcastParameters(model->parameters(), *pg);
    const std::vector<Tensor> params = model->parameters();
    const nn::optim::SGDOptions sgd{.lr = flags.lr, .momentum = flags.momentum};
    // The optimizer: plain, its state sharded (zero1), or inside the sharded data parallel (zero2).
    std::optional<nn::optim::SGD> plain;
    std::optional<collectives::ZeroRedundancyOptimizer> zero1;
    std::optional<collectives::ShardedDataParallel> zero2;
    if (flags.mode == Mode::Zero1) {
      zero1.emplace(params, sgd, *pg);
    } else if (flags.mode == Mode::Zero2) {
      zero2.emplace(model, std::vector<nn::optim::ParamGroup>{{params, sgd}}, *pg,
                    collectives::ShardedDataParallel::Options{.bucketCapBytes = bucketCapBytes});
    } else {
      plain.emplace(params, sgd);
    }

    // This process's shard of each epoch.
    auto sampler = std::make_shared<data::DistributedSampler>(
        train->size(),
        data::DistributedSamplerOptions{.numReplicas = world, .rank = rank, .seed = static_cast<int64_t>(flags.seed)});
    data::DataLoader loader(train, {.batchSize = localBatch}, sampler);
    const int64_t perEpoch = flags.maxBatches > 0 ? std::min(loader.numBatches(), flags.maxBatches) : loader.numBatches();
    if (rank == 0) {
      say("fashion_mnist: MLP 784-256-128-10, mode %s, %d process(es) x %d thread(s), global batch %" PRId64
          " (%" PRId64 " per process), SGD lr %g momentum %g, %" PRId64 " steps per epoch, %" PRId64 " epoch(s)\n",
          modeName(flags.mode), world, threads, flags.batchSize, localBatch, flags.lr, flags.momentum, perEpoch,
          flags.epochs);
    }

    double testAccuracy = 0;
    for (int64_t epoch = 1; epoch <= flags.epochs; ++epoch) {
      sampler->setEpoch(epoch - 1);
      progress.startEpoch();
      int64_t batch = 0;
      for (const data::Example& example : loader) {
        if (batch == perEpoch) break;
        ++batch;
        const auto t0 = app::Clock::now();
        Tensor logits = ddp ? ddp->forward(example.data) : model->forward(example.data);
        Tensor loss = crossEntropy(logits, example.target);
        if (zero1) zero1->zeroGrad();
        else if (zero2) zero2->zeroGrad();
        else plain->zeroGrad();
        loss.backward();
        if (flags.mode == Mode::AllReduce) averageGradients(params, *pg);
        if (zero1) zero1->step();
        else if (zero2) zero2->step();
        else plain->step();
        const double lossValue = loss.item<float>(), correct = app::correctPredictions(logits, example.target);
        progress.step(epoch, batch, perEpoch, lossValue, correct, static_cast<double>(example.target.numel()),
                      app::secondsSince(t0));
      }
      progress.endEpoch();
      // Each rank tests its own slice of the test split; the counts are summed over the group.
      testAccuracy = groupTestAccuracy(*model, test, rank, world, pg.get());
      progress.printEpoch(epoch, batch, testAccuracy);
    }

    const WeightSummary weights = checkReplicas(*model, pg.get());  // bit for bit against rank 0's
    if (rank == 0 && !flags.save.empty()) {
      nn::saveStateDict(model->stateDict(), flags.save);
      say("saved the final weights to %s\n", flags.save.c_str());
    }
    progress.finish(weights, threads, testAccuracy);
    zero2.reset();
    zero1.reset();
    ddp.reset();
    // The job's end: the group closes, and rank 0 serves the store until every other rank has left.
    pg.reset();
    say("rank %d: shut down cleanly\n", rank);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
