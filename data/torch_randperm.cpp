#include "data/torch_randperm.h"

#include <numeric>
#include <utility>

#include "common/error.h"

namespace weft::data {

std::vector<int64_t> torchRandperm(int64_t n, TorchCpuGenerator& gen) {
  WEFT_ENFORCE(n >= 0, InvalidArgumentError, "torchRandperm: n must be non-negative, got ", n);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  // The draw is a uint32 reduced modulo (n - i) in 64-bit arithmetic, as in
  // PyTorch; this (slightly biased) choice is what must be reproduced.
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t z = static_cast<int64_t>(gen.random()) % (n - i);
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(z + i)]);
  }
  return perm;
}

std::vector<int64_t> torchRandperm(int64_t n, uint64_t seed) {
  TorchCpuGenerator gen(seed);
  return torchRandperm(n, gen);
}

}  // namespace weft::data
