// Context, message and pass ids of distributed autograd, internal to dist_autograd/ (not part of
// the public API). An id holds the rank of the worker that made it above kRankShift and that
// worker's counter below, so that ids made on different workers never collide.
#pragma once

#include <cstdint>
#include <string>

namespace weft::dist_autograd {

inline constexpr int kRankShift = 48;
inline constexpr uint64_t kCounterMask = (uint64_t{1} << kRankShift) - 1;

// The rank that created a context (or message, or pass) id.
inline int creatorOf(int64_t id) { return static_cast<int>(static_cast<uint64_t>(id) >> kRankShift); }

// "rank:counter", as errors and node names show an id.
inline std::string idString(int64_t id) {
  auto u = static_cast<uint64_t>(id);
  return std::to_string(u >> kRankShift) + ":" + std::to_string(u & kCounterMask);
}

}  // namespace weft::dist_autograd
