#include "tools/weftrun/cpu_binding.h"

#include <sched.h>

#include <cerrno>
#include <string>

#include "tools/weftrun/options.h"

namespace weft::weftrun {

std::vector<std::vector<int>> cpuShares(int ranks) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (::sched_getaffinity(0, sizeof mask, &mask) != 0) {
    throw UsageError("weftrun: --bind-cpus: cannot read weftrun's CPU affinity (errno " + std::to_string(errno) + ")");
  }
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  }
  const int count = static_cast<int>(cpus.size());
  if (ranks < 1 || count < ranks) {
    throw UsageError("weftrun: --bind-cpus: " + std::to_string(ranks) + " processes but weftrun may run on only " +
                     std::to_string(count) + " CPUs; each process needs one of its own (leave --bind-cpus out to " +
                     "let them share)");
  }
  std::vector<std::vector<int>> shares(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const int begin = r * count / ranks, end = (r + 1) * count / ranks;
    shares[static_cast<size_t>(r)].assign(cpus.begin() + begin, cpus.begin() + end);
  }
  return shares;
}

int bindToCpus(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return ::sched_setaffinity(0, sizeof set, &set) == 0 ? 0 : errno;
}

}  // namespace weft::weftrun
