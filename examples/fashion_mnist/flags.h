// The command line of the fashion_mnist example (main.cpp): its flags, their defaults and their
// checks, read through the examples' shared FlagReader, the gradient modes, and the checks of
// the job's size against them.
#pragma once

#include <cstdint>
#include <string>

#include "common/error.h"
#include "data/data.h"
#include "examples/common/app.h"
#include "examples/fashion_mnist_mlp/mlp.h"

namespace weft::examples::fashion_mnist {

namespace mlp = weft::examples::fashion_mnist_mlp;

inline constexpr const char* kProgram = "fashion_mnist";

// ddp: DistributedDataParallel; allreduce: the gradients averaged by hand after backward;
// zero1: DDP with the optimizer state sharded (ZeroRedundancyOptimizer); zero2: gradients and
// optimizer state sharded (ShardedDataParallel); local: one process without any process group.
enum class Mode { Ddp, AllReduce, Zero1, Zero2, Local };

inline const char* modeName(Mode m) {
  switch (m) {
    case Mode::Ddp: return "ddp";
    case Mode::AllReduce: return "allreduce";
    case Mode::Zero1: return "zero1";
    case Mode::Zero2: return "zero2";
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

[[noreturn]] inline void usage(const std::string& err) {
  app::exitWithUsage(kProgram, err, "weftrun -n W",
                     "[--mode ddp|allreduce|zero1|zero2|local] [--epochs N] [--batch-size N] [--lr X]\n"
                     "          [--momentum X] [--seed N] [--max-batches N] [--log-interval N] [--metrics PATH]\n"
                     "          [--save PATH] [--threads N] [--bucket-cap-mb X] [--timeout S] [--check-calls 1|0] [--data-dir DIR]\n"
                     "  (--batch-size is the global batch: each of the W processes takes batch / W of it)\n");
}

inline Flags parseFlags(int argc, char** argv) {
  Flags f;
  app::FlagReader args(argc, argv, usage);
  while (args.next()) {
    const std::string& a = args.flag();
    const std::string& v = args.value();
    if (a == "--mode") {
      if (v == "ddp") f.mode = Mode::Ddp;
      else if (v == "allreduce") f.mode = Mode::AllReduce;
      else if (v == "zero1") f.mode = Mode::Zero1;
      else if (v == "zero2") f.mode = Mode::Zero2;
      else if (v == "local") f.mode = Mode::Local;
      else usage("unknown mode '" + v + "' (ddp, allreduce, zero1, zero2 or local)");
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

// The checks of the job against the flags: --mode local only in a world of one, and a global
// batch that splits evenly over the processes (Error naming the problem otherwise).
inline void checkWorld(const Flags& flags, int world) {
  if (flags.mode == Mode::Local && world != 1) {
    throw Error(std::string("--mode local is the single-process baseline; this job has ") + std::to_string(world) +
                " processes (use --mode ddp, allreduce, zero1 or zero2, or weftrun -n 1)");
  }
  if (flags.batchSize % world != 0) {
    throw Error("--batch-size " + std::to_string(flags.batchSize) + " is the global batch and must split evenly over the " +
                std::to_string(world) + " processes (each takes batch / " + std::to_string(world) + ")");
  }
}

}  // namespace weft::examples::fashion_mnist
