// The command line and the roles of the ddp_rpc example (main.cpp): its flags, their defaults and
// checks, read through the examples' shared FlagReader; the rank of each role; the run's seeds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "examples/common/app.h"
#include "examples/common/seed.h"

#include "batch.h"

namespace weft::examples::ddp_rpc {

inline constexpr const char* kProgram = "ddp_rpc";
inline constexpr int kWorld = 4;
inline constexpr int kMaster = 2;  // ranks 0 and 1 are the trainers
inline constexpr int kPs = 3;
inline constexpr double kLr = 0.05;

// "trainer0", "trainer1", "master", "ps".
inline std::string roleName(int rank) {
  if (rank < kMaster) return "trainer" + std::to_string(rank);
  return rank == kMaster ? "master" : "ps";
}

// Every rank but `rank`: the peers a rank waits on.
inline std::vector<int> othersThan(int rank) {
  std::vector<int> out;
  for (int r = 0; r < kWorld; ++r) {
    if (r != rank) out.push_back(r);
  }
  return out;
}

// Independent seeds for the trainers' data and initial weights and the table, from the run's seed.
inline uint64_t mixSeed(uint64_t seed, uint64_t salt) { return app::splitmix64(seed ^ (salt * app::kGolden)); }

struct Flags {
  int64_t epochs = 100;
  int64_t batches = 10;  // per epoch and trainer
  uint64_t seed = 0;
  TargetMode target = TargetMode::Learnable;
  int64_t logInterval = 10;  // epochs between progress lines
  std::string metrics = "ddp_rpc_metrics.csv";
  double timeoutSeconds = 60;  // the trainers' Gloo group: rendezvous and each collective
};

[[noreturn]] inline void usage(const std::string& err) {
  app::exitWithUsage(kProgram, err, "weftrun -n 4",
                     "[--epochs N] [--batches N] [--seed N] [--target learnable|random]\n"
                     "          [--log-interval N] [--metrics PATH] [--timeout S]\n"
                     "  (ranks 0, 1: trainer0, trainer1; rank 2: master; rank 3: ps)\n");
}

inline Flags parseFlags(int argc, char** argv) {
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
        f.target = parseTargetMode(v);
      } catch (const Error& e) {
        usage(e.what());
      }
    } else if (a == "--log-interval") f.logInterval = args.integer();
    else if (a == "--metrics") f.metrics = v;
    else if (a == "--timeout") f.timeoutSeconds = args.real(true);
    else args.unknown();
  }
  if (f.epochs < 1) usage("--epochs must be at least 1");
  if (f.batches < 1) usage("--batches must be at least 1");
  if (f.logInterval < 1) usage("--log-interval must be at least 1");
  if (!(f.timeoutSeconds > 0)) usage("--timeout must be positive");
  return f;
}

}  // namespace weft::examples::ddp_rpc
