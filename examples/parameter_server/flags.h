// The command line of the parameter_server example (main.cpp): its flags, their defaults and
// their checks, read through the examples' shared FlagReader.
#pragma once

#include <cstdint>
#include <string>

#include "common/error.h"
#include "data/data.h"
#include "examples/common/app.h"

#include "server.h"

namespace weft::examples::parameter_server {

inline constexpr const char* kProgram = "parameter_server";

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

[[noreturn]] inline void usage(const std::string& err) {
  app::exitWithUsage(kProgram, err, "weftrun -n W",
                     "[--epochs N] [--max-batches N] [--seed N] [--update serialized|snapshot]\n"
                     "          [--lr X] [--batch-size N] [--log-interval N] [--metrics PATH] [--data-dir DIR]\n"
                     "  (W >= 2: rank 0 is the parameter server, ranks 1..W-1 the trainers)\n");
}

inline Flags parseFlags(int argc, char** argv) {
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
        f.update = parseUpdateMode(v);
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

}  // namespace weft::examples::parameter_server
