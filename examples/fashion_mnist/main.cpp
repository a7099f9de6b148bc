// fashion_mnist: the MLP of examples/fashion_mnist_mlp (784-256-128-10, SGD lr 0.01 momentum 0.9,
// global batch 64) trained data parallel over the processes of a weftrun job. Every process holds
// a replica of the model and reads its own shard of each epoch through DistributedSampler; the
// global batch is split evenly, batch / W examples per process, so that a step of W processes is
// the same computation as a step of one process on the whole batch.
//
//   ./build/tools/weftrun/weftrun -n 2 ./build/examples/fashion_mnist/fashion_mnist
//       [--mode ddp|allreduce|local] [--epochs 2] [--batch-size 64] [--lr 0.01] [--momentum 0.9]
//       [--seed 0] [--max-batches N] [--log-interval 100] [--metrics fashion_mnist_metrics.csv]
//       [--save PATH] [--threads N] [--bucket-cap-mb 25] [--timeout 120] [--check-calls 1] [--data-dir DIR]
//
// Modes: `ddp` wraps the model in collectives::DistributedDataParallel (bucketed allreduces that
// overlap backward); `allreduce` averages the gradients by hand after backward, one
// ProcessGroup::allReduce (ReduceOp::Avg) per parameter; `local` is the single-process baseline
// without any process group (a world of one only). Rank 0 prints the progress and the summary
// and writes the metrics CSV; every rank ends with "rank R: shut down cleanly". README.md
// describes the output, the measured speed-up and the equivalence with one process.

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/init.h"
#include "common/error.h"
#include "data/data.h"
#include "examples/fashion_mnist_mlp/mlp.h"
#include "kernels/cpu/parallel.h"
#include "nn/nn.h"
#include "rpc/options.h"
#include "examples/common/app.h"

using namespace weft;
namespace mlp = weft::examples::fashion_mnist_mlp;
using collectives::ProcessGroup;
using collectives::ReduceOp;
using collectives::Work;
using Clock = std::chrono::steady_clock;

namespace app = weft::examples::app;

namespace {

using app::say;

constexpr const char* kProgram = "fashion_mnist";

enum class Mode { Ddp, AllReduce, Local };

const char* modeName(Mode m) {
  switch (m) {
    case Mode::Ddp: return "ddp";
    case Mode::AllReduce: return "allreduce";
    case Mode::Local: return "local";
  }
  return "?";
}

struct Flags {
  Mode mode = Mode::Ddp;
  int64_t epochs = mlp::kDefaults.epochs;
  int64_t batchSize = mlp::kDefaults.batchSize;  // global: split evenly over the processes
  double lr = mlp::kDefaults.lr;
  double momentum = mlp::kDefaults.momentum;
  uint64_t seed = 0;
  int64_t maxBatches = -1;  // steps per epoch; -1 = the whole epoch
  int64_t logInterval = 100;
  std::string metrics = "fashion_mnist_metrics.csv";
  std::string save;
  int64_t threads = 0;  // kernel threads per process; 0 = the machine's share of this process
  double bucketCapMb = 25;
  double timeoutSeconds = 120;
  bool checkCalls = true;  // the process group's call-header check before each collective
  std::string dataDir = data::kFashionMnistDir;
};

[[noreturn]] void usage(const std::string& err) {
  app::exitWithUsage(kProgram, err, "weftrun -n W",
                     "[--mode ddp|allreduce|local] [--epochs N] [--batch-size N] [--lr X]\n"
                     "          [--momentum X] [--seed N] [--max-batches N] [--log-interval N] [--metrics PATH]\n"
                     "          [--save PATH] [--threads N] [--bucket-cap-mb X] [--timeout S] [--check-calls 1|0] [--data-dir DIR]\n"
                     "  (--batch-size is the global batch: each of the W processes takes batch / W of it)\n");
}

Flags parseFlags(int argc, char** argv) {
  Flags f;
  app::FlagReader args(argc, argv, usage);
  while (args.next()) {
    const std::string& a = args.flag();
    const std::string& v = args.value();
    if (a == "--mode") {
      if (v == "ddp") f.mode = Mode::Ddp;
      else if (v == "allreduce") f.mode = Mode::AllReduce;
      else if (v == "local") f.mode = Mode::Local;
      else usage("unknown mode '" + v + "' (ddp, allreduce or local)");
    } else if (a == "--epochs") f.epochs = args.integer();
    else if (a == "--batch-size") f.batchSize = args.integer();
    else if (a == "--lr") f.lr = args.real(true);
    else if (a == "--momentum") f.momentum = args.real(true);
    else if (a == "--seed") f.seed = static_cast<uint64_t>(args.integer());
    else if (a == "--max-batches") f.maxBatches = args.integer();
    else if (a == "--log-interval") f.logInterval = args.integer();
    else if (a == "--metrics") f.metrics = v;
    else if (a == "--save") f.save = v;
    else if (a == "--threads") f.threads = args.integer();
    else if (a == "--bucket-cap-mb") f.bucketCapMb = args.real(true);
    else if (a == "--timeout") f.timeoutSeconds = args.real(true);
    else if (a == "--check-calls") {
      if (v != "0" && v != "1") usage("--check-calls takes 1 (on) or 0 (off), not '" + v + "'");
      f.checkCalls = v == "1";
    }
    else if (a == "--data-dir") f.dataDir = v;
    else args.unknown();
  }
  if (f.epochs < 1) usage("--epochs must be at least 1");
  if (f.batchSize < 1) usage("--batch-size must be at least 1");
  if (f.maxBatches < -1 || f.maxBatches == 0) usage("--max-batches must be positive (or -1: whole epochs)");
  if (f.logInterval < 1) usage("--log-interval must be at least 1");
  if (!(f.lr > 0)) usage("--lr must be positive");
  if (f.momentum < 0) usage("--momentum must not be negative");
  if (f.threads < 0) usage("--threads must be positive (or 0: the machine's cores shared among the processes)");
  if (!(f.bucketCapMb > 0)) usage("--bucket-cap-mb must be positive");
  if (!(f.timeoutSeconds > 0)) usage("--timeout must be positive");
  return f;
}

// Every rank checks the four data files before joining the job, so a missing one stops the job at
// once, with the same message on every rank.
void checkDataFiles(const std::string& dir) {
  const std::string hint =
      "Fashion-MNIST comes from the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist, "
      "or scripts/setup.sh); or pass --data-dir DIR with the four IDX files";
  for (const char* stem : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"}) {
    data::findIdxFile(dir, stem, hint);
  }
}

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The reduction of `values` over the group's ranks, in place; `values` itself without a group
// (local mode).
void reduceValues(ProcessGroup* group, std::vector<double>& values, ReduceOp op) {
  if (group == nullptr) return;
  Tensor t = empty({static_cast<int64_t>(values.size())}, {.dtype = DType::Float64});
  std::copy(values.begin(), values.end(), t.data<double>());
  group->allReduce(t, op).wait();
  std::copy(t.data<double>(), t.data<double>() + t.numel(), values.begin());
}

// allreduce mode: the gradient of every parameter replaced by its average over the ranks, one
// allReduce per parameter, all issued before the first is awaited.
void averageGradients(const std::vector<Tensor>& params, ProcessGroup& group) {
  std::vector<Work> works;
  works.reserve(params.size());
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    WEFT_ENFORCE(g.defined() && g.isContiguous(), StateError,
                 "a parameter has no contiguous gradient after backward; cannot average it");
    works.push_back(group.allReduce(g, ReduceOp::Avg));
  }
  for (Work& w : works) w.wait();
}

// All parameters, flattened into one float32 tensor (a copy).
Tensor flatParameters(nn::Module& model) {
  std::vector<Tensor> flat;
  for (const Tensor& p : model.parameters()) flat.push_back(p.detach().flatten());
  return cat(flat).contiguous();
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = parseFlags(argc, argv);
  try {
    rpc::Options options = rpc::Options::fromEnv();
    const int world = options.worldSize;
    const int rank = options.rank;
    if (flags.mode == Mode::Local && world != 1) {
      throw Error(std::string("--mode local is the single-process baseline; this job has ") + std::to_string(world) +
                  " processes (use --mode ddp or --mode allreduce, or weftrun -n 1)");
    }
    if (flags.batchSize % world != 0) {
      throw Error("--batch-size " + std::to_string(flags.batchSize) + " is the global batch and must split evenly over the " +
                  std::to_string(world) + " processes (each takes batch / " + std::to_string(world) + ")");
    }
    const int64_t localBatch = flags.batchSize / world;
    checkDataFiles(flags.dataDir);

    // The machine's cores are shared by the processes on it.
    int threads = static_cast<int>(flags.threads);
    if (threads == 0) {
      int local = 1;
      if (const char* s = std::getenv("WEFT_LOCAL_WORLD_SIZE")) local = std::max(1, std::atoi(s));
      else if (const char* t = std::getenv("LOCAL_WORLD_SIZE")) local = std::max(1, std::atoi(t));
      threads = std::max(1, weft::kernels::cpu::numThreads() / local);
    }
    weft::kernels::cpu::setNumThreads(threads);

    std::ofstream csv;
    if (rank == 0) {
      csv.open(flags.metrics);
      if (!csv) throw Error("cannot write the metrics file '" + flags.metrics + "'");
      csv << "iteration,epoch,loss,accuracy,seconds\n";
    }

    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.timeoutSeconds * 1000));
    // The process group, with the rendezvous store rank 0 serves, in one call; none in local mode.
    std::unique_ptr<collectives::ProcessGroup> pg;
    if (flags.mode != Mode::Local) {
      pg = collectives::init(options, {.timeout = timeout, .checkCalls = flags.checkCalls, .name = "fashion_mnist"});
    }

    auto train = std::make_shared<data::TensorDataset>(mlp::loadSplit(flags.dataDir, data::Split::Train));
    const data::TensorDataset test = mlp::loadSplit(flags.dataDir, data::Split::Test);

    manualSeed(flags.seed);
    auto model = mlp::makeModel();
    std::optional<collectives::DistributedDataParallel> ddp;
    if (flags.mode == Mode::Ddp) {
      ddp.emplace(model, *pg,
                  collectives::DistributedDataParallel::Options{
                      .bucketCapBytes = static_cast<int64_t>(flags.bucketCapMb * 1024 * 1024)});
    } else if (flags.mode == Mode::AllReduce) {
      // As DDP does: every replica starts from rank 0's parameters.
      std::vector<Work> works;
      for (const Tensor& p : model->parameters()) works.push_back(pg->broadcast(p.detach(), 0));
      for (Work& w : works) w.wait();
    }
    const std::vector<Tensor> params = model->parameters();
    nn::optim::SGD opt(params, {.lr = flags.lr, .momentum = flags.momentum});

    auto sampler = std::make_shared<data::DistributedSampler>(
        train->size(),
        data::DistributedSamplerOptions{.numReplicas = world, .rank = rank, .seed = static_cast<int64_t>(flags.seed)});
    data::DataLoader loader(train, {.batchSize = localBatch}, sampler);
    int64_t perEpoch = loader.numBatches();
    if (flags.maxBatches > 0) perEpoch = std::min(perEpoch, flags.maxBatches);

    if (rank == 0) {
      say("fashion_mnist: MLP 784-256-128-10, mode %s, %d process(es) x %d thread(s), global batch %" PRId64
          " (%" PRId64 " per process), SGD lr %g momentum %g, %" PRId64 " steps per epoch, %" PRId64 " epoch(s)\n",
          modeName(flags.mode), world, threads, flags.batchSize, localBatch, flags.lr, flags.momentum, perEpoch,
          flags.epochs);
    }

    int64_t iteration = 0;
    std::vector<double> stepSeconds;  // this rank's, every step: forward to optimizer step
    double trainSeconds = 0, trainSamples = 0, testAccuracy = 0;
    for (int64_t epoch = 1; epoch <= flags.epochs; ++epoch) {
      sampler->setEpoch(epoch - 1);
      int64_t batch = 0;
      double epochLoss = 0, epochCorrect = 0, epochSeen = 0;
      std::vector<double> window(3, 0.0);  // loss sum (per batch), correct, seen: this rank's
      auto epochStart = Clock::now();
      auto windowStart = epochStart;
      for (const data::Example& example : loader) {
        if (batch == perEpoch) break;
        ++batch;
        ++iteration;
        auto t0 = Clock::now();
        Tensor logits = ddp ? ddp->forward(example.data) : model->forward(example.data);
        Tensor loss = crossEntropy(logits, example.target);
        opt.zeroGrad();
        loss.backward();
        if (flags.mode == Mode::AllReduce) averageGradients(params, *pg);
        opt.step();
        const double lossValue = loss.item<float>();
        int64_t correct = 0;
        {
          NoGradGuard ng;
          correct = eq(argmax(logits, 1), example.target).sum().item<int64_t>();
        }
        const double seen = static_cast<double>(example.target.numel());
        const double seconds = secondsSince(t0);
        stepSeconds.push_back(seconds);
        if (rank == 0) {
          csv << iteration << ',' << epoch << ',' << lossValue << ',' << static_cast<double>(correct) / seen << ','
              << seconds << '\n';
        }
        window[0] += lossValue;
        window[1] += static_cast<double>(correct);
        window[2] += seen;
        const int64_t windowBatches = (batch - 1) % flags.logInterval + 1;
        if (windowBatches == flags.logInterval || batch == perEpoch) {
          // Every rank reaches the same batch numbers (the sampler pads the shards to equal length).
          const double elapsed = secondsSince(windowStart);
          reduceValues(pg.get(), window, ReduceOp::Sum);
          epochLoss += window[0];
          epochCorrect += window[1];
          epochSeen += window[2];
          if (rank == 0) {
            say("epoch %" PRId64 " step %" PRId64 "/%" PRId64 " loss %.4f accuracy %.3f %.0f samples/s\n", epoch, batch,
                perEpoch, window[0] / static_cast<double>(windowBatches * world), window[1] / window[2],
                window[2] / elapsed);
          }
          std::fill(window.begin(), window.end(), 0.0);
          windowStart = Clock::now();
        }
      }
      // The epoch's training time is the slowest rank's; the samples are everyone's.
      std::vector<double> slowest{secondsSince(epochStart)};
      reduceValues(pg.get(), slowest, ReduceOp::Max);
      trainSeconds += slowest[0];
      trainSamples += epochSeen;

      // Each rank tests its own slice of the test split; the counts are summed.
      const int64_t n = test.size();
      const int64_t begin = n * rank / world, end = n * (rank + 1) / world;
      std::vector<double> counts{static_cast<double>(mlp::countCorrect(*model, test, begin, end - begin))};
      reduceValues(pg.get(), counts, ReduceOp::Sum);
      testAccuracy = counts[0] / static_cast<double>(n);
      if (rank == 0) {
        say("epoch %" PRId64 ": loss %.4f  train accuracy %.4f  test accuracy %.4f  time %.2f s (%.0f samples/s)\n",
            epoch, epochLoss / static_cast<double>(std::max<int64_t>(batch, 1) * world),
            epochCorrect / std::max(epochSeen, 1.0), testAccuracy, slowest[0], epochSeen / slowest[0]);
      }
    }

    // The replicas must be identical: compare each with rank 0's, bit for bit.
    Tensor mine = flatParameters(*model);
    double checksum = 0, norm2 = 0;
    for (int64_t i = 0; i < mine.numel(); ++i) {
      const double v = mine.data<float>()[i];
      checksum += v;
      norm2 += v * v;
    }
    if (pg != nullptr) {
      Tensor first = mine.clone();
      pg->broadcast(first, 0).wait();
      std::vector<double> differing{0};
      for (int64_t i = 0; i < mine.numel(); ++i) differing[0] += mine.data<float>()[i] != first.data<float>()[i];
      reduceValues(pg.get(), differing, ReduceOp::Sum);
      if (differing[0] != 0) {
        throw Error("the replicas differ after training: " + std::to_string(static_cast<int64_t>(differing[0])) +
                    " parameter values differ from rank 0's (summed over the ranks)");
      }
    }
    if (rank == 0) {
      if (!flags.save.empty()) {
        nn::saveStateDict(model->stateDict(), flags.save);
        say("saved the final weights to %s\n", flags.save.c_str());
      }
      csv.close();
      if (!csv) throw Error("could not write the metrics file '" + flags.metrics + "'");
      const double throughput = trainSamples / std::max(trainSeconds, 1e-9);
      // The median step is little disturbed by other work on the machine, unlike the total.
      std::nth_element(stepSeconds.begin(), stepSeconds.begin() + stepSeconds.size() / 2, stepSeconds.end());
      const double median = stepSeconds[stepSeconds.size() / 2];
      say("weights: %" PRId64 " values, sum %.9g, L2 norm %.9g; %s\n", mine.numel(), checksum, std::sqrt(norm2),
          world == 1 ? "one replica" : ("identical on all " + std::to_string(world) + " replicas").c_str());
      say("throughput: %.0f samples/s (%d process(es) x %d thread(s), mode %s, %" PRId64
          " steps in %.2f s); median step %.3f ms, %.0f samples/s\n",
          throughput, world, threads, modeName(flags.mode), iteration, trainSeconds, median * 1e3,
          static_cast<double>(flags.batchSize) / median);
      say("metrics written to %s\n", flags.metrics.c_str());
      say("final test accuracy: %.4f\n", testAccuracy);
    }
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
