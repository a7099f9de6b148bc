#include "kernels/cuda/scan.h"

#include "kernels/cuda/reduce.cuh"

namespace weft::kernels::cuda {
namespace {

// The running sum's type: float64 for float32 and float64, float32 for the
// 16-bit types, uint64 (which wraps like two's complement int64) otherwise.
template <class T> struct RunningOf { using type = uint64_t; };
template <> struct RunningOf<float> { using type = double; };
template <> struct RunningOf<double> { using type = double; };
template <> struct RunningOf<__nv_bfloat16> { using type = float; };
template <> struct RunningOf<__half> { using type = float; };
template <class T> using Running = typename RunningOf<T>::type;

template <class T>
__device__ __forceinline__ Running<T> liftRunning(T v) {
  if constexpr (std::is_integral_v<T>) {
    // Sign-extended: the uint64 sum is the int64 sum modulo 2^64.
    return static_cast<uint64_t>(static_cast<int64_t>(v));
  } else {
    return static_cast<Running<T>>(toAcc(v));
  }
}

template <class S>
__device__ __forceinline__ S shuffleUpValue(S v, int delta) {
  if constexpr (std::is_floating_point_v<S>) {
    return __shfl_up_sync(kFullWarp, v, delta);
  } else {
    return static_cast<S>(__shfl_up_sync(kFullWarp, static_cast<long long>(v), delta));
  }
}

template <class S>
__device__ __forceinline__ S shuffleIndexValue(S v, int lane) {
  if constexpr (std::is_floating_point_v<S>) {
    return __shfl_sync(kFullWarp, v, lane);
  } else {
    return static_cast<S>(__shfl_sync(kFullWarp, static_cast<long long>(v), lane));
  }
}

// Rows of a [rows, R] buffer (inner == 1): a group of G threads (a warp, or
// the whole block when G == kThreads) scans one row in chunks of G
// elements: an inclusive warp scan, the totals of the warps before (G > 32),
// and the carry of the earlier chunks. reverse walks the row from its end.
template <class T, class O, int G>
__global__ void rowScanKernel(const T* in, int64_t rows, int64_t R, bool reverse, O* out) {
  using S = Running<T>;
  constexpr int kGroups = kThreads / G;
  constexpr int kWarps = G / 32;
  __shared__ S warpTotals[kWarps];
  const int group = threadIdx.x / G, lane = threadIdx.x % G;
  const int warp = lane / 32, warpLane = lane % 32;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroups + group; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kGroups) {
    const int64_t base = row * R;
    S carry = S(0);
    for (int64_t c = 0; c < R; c += G) {
      const int64_t p = c + lane;
      const int64_t r = reverse ? R - 1 - p : p;
      S v = p < R ? liftRunning(in[base + r]) : S(0);
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const S u = shuffleUpValue(v, d);
        if (warpLane >= d) v += u;
      }
      S chunkTotal;
      if constexpr (G == 32) {
        chunkTotal = shuffleIndexValue(v, 31);
      } else {
        if (warpLane == 31) warpTotals[warp] = v;
        __syncthreads();
        S before = S(0), total = S(0);
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const S t = warpTotals[w];
          if (w < warp) before += t;
          total += t;
        }
        v += before;
        chunkTotal = total;
        __syncthreads();
      }
      if (p < R) out[base + r] = roundTo<O>(carry + v);
      carry += chunkTotal;
    }
  }
}

// Columns (inner > 1): one thread per (o, i), walking R in order; adjacent
// threads read adjacent elements.
template <class T, class O>
__global__ void colScanKernel(const T* in, int64_t outer, int64_t R, int64_t inner, bool reverse, O* out) {
  using S = Running<T>;
  const int64_t n = outer * inner;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = j / inner, i = j - o * inner;
    const int64_t base = o * R * inner + i;
    S run = S(0);
    for (int64_t k = 0; k < R; ++k) {
      const int64_t at = base + (reverse ? R - 1 - k : k) * inner;
      run += liftRunning(in[at]);
      out[at] = roundTo<O>(run);
    }
  }
}

// Rows up to this long are scanned by one warp each, longer ones by a block.
constexpr int64_t kWarpRowMax = 1024;

template <class T, class O>
void launchScan(const T* in, int64_t outer, int64_t R, int64_t inner, bool reverse, O* out) {
  if (outer == 0 || R == 0 || inner == 0) return;
  const int64_t cap = static_cast<int64_t>(properties(currentDevice()).multiprocessors) * 32;
  if (inner == 1) {
    if (R <= kWarpRowMax) {
      const auto grid = static_cast<unsigned>(std::min((outer + kThreads / 32 - 1) / (kThreads / 32), cap));
      rowScanKernel<T, O, 32><<<grid, kThreads, 0, stream()>>>(in, outer, R, reverse, out);
    } else {
      const auto grid = static_cast<unsigned>(std::min(outer, cap));
      rowScanKernel<T, O, kThreads><<<grid, kThreads, 0, stream()>>>(in, outer, R, reverse, out);
    }
  } else {
    colScanKernel<<<blocksFor(outer * inner), kThreads, 0, stream()>>>(in, outer, R, inner, reverse, out);
  }
  checkLaunch("cumsum");
}

}  // namespace

void cumsum(DType type, const void* in, int64_t outer, int64_t R, int64_t inner, bool reverse, DType outType,
            void* out) {
  WEFT_ENFORCE(outer >= 0 && R >= 0 && inner >= 0, InvalidArgumentError, "cumsum: negative size");
  auto run = [&]<class T>() {
    using O = std::conditional_t<std::is_integral_v<T>, int64_t, T>;
    const DType expected = std::is_integral_v<T> ? DType::Int64 : type;
    WEFT_ENFORCE(outType == expected, InvalidArgumentError, "cumsum of ", dtypeName(type), " gives ",
                 dtypeName(expected), ", not ", dtypeName(outType));
    launchScan(static_cast<const T*>(in), outer, R, inner, reverse, static_cast<O*>(out));
  };
  WEFT_CUDA_DISPATCH_ALL_AND_HALF(type, "cumsum", run);
}

}  // namespace weft::kernels::cuda
