// weftrun --bind-cpus: each local rank gets its own slice of the CPUs weftrun
// may run on, so that ranks sharing a machine never share a core.
//
//   std::vector<std::vector<int>> shares = weft::weftrun::cpuShares(4);  // 4 ranks
//   weft::weftrun::bindToCpus(shares[localRank]);  // in the rank's child, before exec
//
// The CPUs are those of weftrun's affinity mask, in increasing order, cut into
// as many contiguous slices as there are local ranks, as even as the count
// allows (8 CPUs for 3 ranks: 2, 3, 3). Why: two processes that each compute
// on one thread (pipeline stages, say) and whose communication threads wake
// and sleep all the time are otherwise moved between the cores by the
// scheduler, and when both compute threads land on one core each runs only
// half the time; a rank bound to its own cores keeps them, and its
// communication threads run on them while it waits or between its actions.
// A rank's threads, the communication threads included, inherit the binding;
// weftrun sets WEFT_NUM_THREADS to the slice's size unless its own
// environment sets it.
#pragma once

#include <vector>

namespace weft::weftrun {

// The CPU slices of `ranks` local ranks. UsageError naming both counts when
// there are fewer CPUs than ranks.
std::vector<std::vector<int>> cpuShares(int ranks);

// Sets the calling process's affinity to `cpus`. Returns errno on failure, 0
// on success (async-signal-safe: called between fork and exec).
int bindToCpus(const std::vector<int>& cpus);

}  // namespace weft::weftrun
