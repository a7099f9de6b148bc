// PyTorch-compatible random permutations: the exact sequence that
// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` returns on
// the CPU in PyTorch 1.13, so that weft processes and PyTorch processes given
// the same seed walk a dataset in the same order.
//
//   weft::data::TorchCpuGenerator g(42);
//   std::vector<int64_t> p = weft::data::torchRandperm(10, g);  // == torch.randperm(10, generator=...)
//   std::vector<int64_t> q = weft::data::torchRandperm(10, 42); // same, fresh generator
//
// This is deliberately NOT weft::Generator (xoshiro256**): it exists only to
// reproduce PyTorch's choices (DistributedSampler uses it). Everything weft
// shuffles for itself uses weft::Generator.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace weft::data {

// PyTorch's CPUGeneratorImpl: a 32-bit Mersenne Twister (MT19937) seeded with
// the low 32 bits of the 64-bit seed (torch's at::mt19937 seeds through
// init_genrand with `seed & 0xffffffff`, exactly like std::mt19937).
// A negative Python seed reaches PyTorch 1.13 as its two's-complement uint64.
// Not thread-safe: one per thread.
class TorchCpuGenerator {
 public:
  explicit TorchCpuGenerator(uint64_t seed = 67280421310721ULL) { manualSeed(seed); }
  void manualSeed(uint64_t seed) { engine_.seed(static_cast<uint32_t>(seed & 0xffffffffULL)); }
  // CPUGeneratorImpl::random(): one 32-bit draw.
  uint32_t random() { return static_cast<uint32_t>(engine_()); }
  // CPUGeneratorImpl::random64(): two draws, the first one the high word.
  uint64_t random64() {
    uint64_t hi = random();
    uint64_t lo = random();
    return (hi << 32) | lo;
  }

 private:
  std::mt19937 engine_;
};

// torch.randperm(n) on the CPU (PyTorch 1.13 randperm_cpu): start from the
// identity, then for i in [0, n-1) swap element i with element
// i + random() % (n - i). Consumes n-1 draws from `gen`. n < 0 is an
// InvalidArgumentError.
std::vector<int64_t> torchRandperm(int64_t n, TorchCpuGenerator& gen);
// The same from a generator freshly seeded with `seed`.
std::vector<int64_t> torchRandperm(int64_t n, uint64_t seed);

}  // namespace weft::data
