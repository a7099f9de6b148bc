// The command line of the fashion_mnist_mlp example (main.cpp): its flags, their defaults and
// their checks, read through the examples' shared FlagReader.
#pragma once

#include <cstdint>
#include <string>

#include "data/data.h"
#include "examples/common/app.h"

#include "mlp.h"

namespace weft::examples::fashion_mnist_mlp {

inline constexpr const char* kProgram = "fashion_mnist_mlp";

struct Flags {
  int64_t epochs = kDefaults.epochs;
  int64_t batchSize = kDefaults.batchSize;
  double lr = kDefaults.lr;
  double momentum = kDefaults.momentum;
  uint64_t seed = 0;
  std::string dataDir = data::kFashionMnistDir;
  std::string csv = "fashion_mnist_mlp.csv";
  int64_t maxBatches = -1;  // per epoch; -1 = all
  std::string save;
  std::string device = "cpu";  // cpu, cuda or cuda:N
};

[[noreturn]] inline void usage(const std::string& err) {
  app::exitWithUsage(kProgram, err, "",
                     "[--epochs N] [--batch-size N] [--lr X] [--momentum X] [--seed N] [--data-dir DIR]\n"
                     "          [--csv PATH] [--max-batches N] [--save PATH] [--device cpu|cuda|cuda:N]\n");
}

inline Flags parseFlags(int argc, char** argv) {
  Flags f;
  app::FlagReader args(argc, argv, usage);
  while (args.next()) {
    const std::string& a = args.flag();
    const std::string& v = args.value();
    if (a == "--epochs") f.epochs = args.integer();
    else if (a == "--batch-size") f.batchSize = args.integer();
    else if (a == "--lr") f.lr = args.real();
    else if (a == "--momentum") f.momentum = args.real();
    else if (a == "--seed") f.seed = static_cast<uint64_t>(args.integer());
    else if (a == "--data-dir") f.dataDir = v;
    else if (a == "--csv") f.csv = v;
    else if (a == "--max-batches") f.maxBatches = args.integer();
    else if (a == "--save") f.save = v;
    else if (a == "--device") f.device = v;
    else args.unknown();
  }
  if (f.epochs < 1 || f.batchSize < 1) usage("--epochs and --batch-size must be positive");
  try {
    (void)Device::parse(f.device);
  } catch (const Error&) {
    usage("invalid value '" + f.device + "' for --device (cpu, cuda, cuda:N)");
  }
  return f;
}

}  // namespace weft::examples::fashion_mnist_mlp
