// Philox-4x32-10 fills (see random.h).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/random.h"

namespace weft::kernels::cuda {
namespace {

struct Words {
  uint32_t w[4];
};

// Philox-4x32-10 of counter (c0 c1 c2 c3) under key (k0 k1).
__device__ __forceinline__ Words philox(uint64_t counter, uint64_t seed) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(kM0, c0), lo0 = kM0 * c0;
    const uint32_t hi1 = __umulhi(kM1, c2), lo1 = kM1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return Words{{c0, c1, c2, c3}};
}

__device__ __forceinline__ float uniform24(uint32_t w) { return static_cast<float>(w >> 8) * 0x1.0p-24f; }
__device__ __forceinline__ uint64_t bits64(uint32_t hi, uint32_t lo) {
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
__device__ __forceinline__ double uniform53(uint32_t hi, uint32_t lo) {
  return static_cast<double>(bits64(hi, lo) >> 11) * 0x1.0p-53;
}

// Elements one counter serves: 4 for the 32-bit-or-narrower floating types
// (24-bit uniforms), 2 for float64.
template <class T>
constexpr int kPerCounter = std::is_same_v<T, double> ? 2 : 4;

// The uniforms of counter `c`: k of them, in [0, 1), as Acc<T>.
template <class T>
__device__ __forceinline__ void uniforms(const Words& r, Acc<T>* u) {
  if constexpr (std::is_same_v<T, double>) {
    u[0] = uniform53(r.w[0], r.w[1]);
    u[1] = uniform53(r.w[2], r.w[3]);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) u[k] = uniform24(r.w[k]);
  }
}

// Thread per counter: element i = per * counter + k, counter in [0, ceil(n / per)).
template <class T>
__global__ void uniformKernel(T* out, int64_t n, double low, double high, uint64_t seed, uint64_t offset) {
  using A = Acc<T>;
  constexpr int per = kPerCounter<T>;
  const int64_t counters = (n + per - 1) / per;
  const A lo = static_cast<A>(low), span = static_cast<A>(high - low);
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < counters;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    A u[per];
    uniforms<T>(philox(offset + static_cast<uint64_t>(c), seed), u);
#pragma unroll
    for (int k = 0; k < per; ++k) {
      const int64_t i = c * per + k;
      if (i < n) out[i] = fromAcc<T>(lo + span * u[k]);
    }
  }
}

template <class T>
__global__ void normalKernel(T* out, int64_t n, double mean, double std, uint64_t seed, uint64_t offset) {
  using A = Acc<T>;
  constexpr int per = kPerCounter<T>;
  const int64_t counters = (n + per - 1) / per;
  const A mu = static_cast<A>(mean), sigma = static_cast<A>(std);
  constexpr A kTwoPi = static_cast<A>(6.283185307179586476925286766559);
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < counters;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    A u[per], z[per];
    uniforms<T>(philox(offset + static_cast<uint64_t>(c), seed), u);
#pragma unroll
    for (int k = 0; k < per; k += 2) {
      // 1 - u is in (0, 1]: the logarithm is finite.
      const A r = sqrt(A(-2) * log(A(1) - u[k]));
      const A theta = kTwoPi * u[k + 1];
      z[k] = r * cos(theta);
      z[k + 1] = r * sin(theta);
    }
#pragma unroll
    for (int k = 0; k < per; ++k) {
      const int64_t i = c * per + k;
      if (i < n) out[i] = fromAcc<T>(mu + sigma * z[k]);
    }
  }
}

template <class T>
__global__ void randintKernel(T* out, int64_t n, int64_t low, uint64_t range, uint64_t seed, uint64_t offset) {
  const int64_t counters = (n + 1) / 2;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < counters;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Words r = philox(offset + static_cast<uint64_t>(c), seed);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int64_t i = c * 2 + k;
      if (i >= n) break;
      const uint64_t v = __umul64hi(bits64(r.w[2 * k], r.w[2 * k + 1]), range);
      const int64_t value = static_cast<int64_t>(static_cast<uint64_t>(low) + v);
      if constexpr (kIsDeviceHalf<T>) out[i] = fromAcc<T>(static_cast<float>(value));
      else if constexpr (std::is_same_v<T, bool>) out[i] = value != 0;
      else out[i] = static_cast<T>(value);
    }
  }
}

// Element i is dropped when (bits >> 11) < threshold = ceil(p * 2^53).
template <class T>
__global__ void dropoutKernel(const T* x, int64_t n, uint64_t threshold, T keep, uint64_t seed, uint64_t offset,
                              T* mask, T* out) {
  const int64_t counters = (n + 1) / 2;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < counters;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Words r = philox(offset + static_cast<uint64_t>(c), seed);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int64_t i = c * 2 + k;
      if (i >= n) break;
      const bool kept = (bits64(r.w[2 * k], r.w[2 * k + 1]) >> 11) >= threshold;
      const T m = kept ? keep : fromAcc<T>(Acc<T>(0));
      mask[i] = m;
      out[i] = fromAcc<T>(toAcc(x[i]) * toAcc(m));
    }
  }
}

template <int Per>
unsigned countersBlocks(int64_t n) {
  return blocksFor((n + Per - 1) / Per);
}

}  // namespace

void uniformFill(DType type, void* out, int64_t n, double low, double high, uint64_t seed, uint64_t offset) {
  if (n <= 0) return;
  WEFT_CUDA_DISPATCH_FLOATING_AND_HALF(type, "uniform", [&]<class T>() {
    uniformKernel<T><<<countersBlocks<kPerCounter<T>>(n), kThreads, 0, stream()>>>(static_cast<T*>(out), n, low,
                                                                                   high, seed, offset);
    checkLaunch("uniform");
  });
}

void normalFill(DType type, void* out, int64_t n, double mean, double std, uint64_t seed, uint64_t offset) {
  if (n <= 0) return;
  WEFT_CUDA_DISPATCH_FLOATING_AND_HALF(type, "randn", [&]<class T>() {
    normalKernel<T><<<countersBlocks<kPerCounter<T>>(n), kThreads, 0, stream()>>>(static_cast<T*>(out), n, mean, std,
                                                                                  seed, offset);
    checkLaunch("randn");
  });
}

void randintFill(DType type, void* out, int64_t n, int64_t low, int64_t high, uint64_t seed, uint64_t offset) {
  WEFT_ENFORCE(low < high, InvalidArgumentError, "randint: low ", low, " must be below high ", high);
  if (n <= 0) return;
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  WEFT_CUDA_DISPATCH_ALL_AND_HALF(type, "randint", [&]<class T>() {
    randintKernel<T><<<countersBlocks<2>(n), kThreads, 0, stream()>>>(static_cast<T*>(out), n, low, range, seed,
                                                                      offset);
    checkLaunch("randint");
  });
}

void dropoutForward(DType type, const void* x, int64_t n, double p, uint64_t seed, uint64_t offset, void* mask,
                    void* out) {
  WEFT_ENFORCE(p >= 0.0 && p <= 1.0, InvalidArgumentError, "dropout: probability has to be between 0 and 1, got ", p);
  if (n <= 0) return;
  const double scale = p == 1.0 ? 0.0 : 1.0 / (1.0 - p);
  // k < p * 2^53 for an integer k is k < ceil(p * 2^53); p == 1 drops every k < 2^53.
  const auto threshold = static_cast<uint64_t>(std::ceil(p * 0x1.0p53));
  WEFT_CUDA_DISPATCH_FLOATING_AND_HALF(type, "dropout", [&]<class T>() {
    T keep;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) keep = __float2bfloat16_rn(static_cast<float>(scale));
    else if constexpr (std::is_same_v<T, __half>) keep = __float2half_rn(static_cast<float>(scale));
    else keep = static_cast<T>(scale);
    dropoutKernel<T><<<countersBlocks<2>(n), kThreads, 0, stream()>>>(
        static_cast<const T*>(x), n, threshold, keep, seed, offset, static_cast<T*>(mask), static_cast<T*>(out));
    checkLaunch("dropout");
  });
}

}  // namespace weft::kernels::cuda
