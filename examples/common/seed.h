// Seeds derived from a run's --seed, for the example programs: one place for the mixing function
// they all use, so that the random streams of a run (a trainer's data, a batch's dropout mask,
// an observer's actions) are independent of one another and the same on every run.
//
//   Generator data(app::splitmix64(seed ^ (rank * app::kGolden)));
//   int64_t dropout = app::nonNegative(app::splitmix64(seed ^ static_cast<uint64_t>(iteration)));
//
// Header-only; it needs nothing of weft.
#pragma once

#include <cstdint>

namespace weft::examples::app {

// 2^64 / the golden ratio: the increment of splitmix64, and a multiplier that spreads small
// stream numbers over the whole word.
inline constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// splitmix64 (Steele, Lea, Flood 2014): one step of the generator from state `x`, a well-mixed
// 64-bit value in which every input bit affects every output bit.
constexpr uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + kGolden;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The seed of random stream `stream` of a run seeded `seed` (its data, its dropout, its samples):
// streams of one run, and the same stream of two runs, are independent.
constexpr uint64_t streamSeed(uint64_t seed, uint64_t stream) { return splitmix64(seed ^ (stream * kGolden)); }

// `x` as a non-negative int64_t (its top 63 bits): for seeds passed where an int64_t is taken.
constexpr int64_t nonNegative(uint64_t x) { return static_cast<int64_t>(x >> 1); }

}  // namespace weft::examples::app
