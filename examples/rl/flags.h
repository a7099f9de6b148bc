// The command line of the rl example (main.cpp): its flags, their defaults and their checks, read
// through the examples' shared FlagReader.
#pragma once

#include <cstdint>
#include <string>

#include "examples/common/app.h"

namespace weft::examples::rl {

inline constexpr const char* kProgram = "rl";

struct Flags {
  int64_t maxEpisodes = 2000;
  uint64_t seed = 543;
  double lr = 1e-2;
  double gamma = 0.99;
  int64_t logInterval = 10;
  std::string metrics = "rl_metrics.csv";
};

[[noreturn]] inline void usage(const std::string& err) {
  app::exitWithUsage(kProgram, err, "weftrun -n W",
                     "[--max-episodes N] [--seed N] [--lr X] [--gamma X] [--log-interval N]\n"
                     "          [--metrics PATH]\n"
                     "  (W >= 2: rank 0 is the agent, ranks 1..W-1 the observers)\n");
}

inline Flags parseFlags(int argc, char** argv) {
  Flags f;
  app::FlagReader args(argc, argv, usage);
  while (args.next()) {
    const std::string& a = args.flag();
    const std::string& v = args.value();
    if (a == "--max-episodes") f.maxEpisodes = args.integer();
    else if (a == "--seed") f.seed = static_cast<uint64_t>(args.integer());
    else if (a == "--lr") f.lr = args.real();
    else if (a == "--gamma") f.gamma = args.real();
    else if (a == "--log-interval") f.logInterval = args.integer();
    else if (a == "--metrics") f.metrics = v;
    else args.unknown();
  }
  if (f.maxEpisodes < 1) usage("--max-episodes must be at least 1");
  if (f.logInterval < 1) usage("--log-interval must be at least 1");
  if (!(f.lr > 0)) usage("--lr must be positive");
  if (!(f.gamma > 0 && f.gamma <= 1)) usage("--gamma must lie in (0, 1]");
  return f;
}

}  // namespace weft::examples::rl
