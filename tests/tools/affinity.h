// The CPUs the calling process may run on (its affinity mask), in increasing
// order: what weftrun --bind-cpus divides among its ranks.
#pragma once

#include <sched.h>

#include <vector>

namespace weft::testing {

inline std::vector<int> thisProcessCpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof mask, &mask) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  }
  return cpus;
}

}  // namespace weft::testing
