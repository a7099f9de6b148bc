#include "kernels/cuda/softmax.h"

#include <cmath>
#include <cstring>
#include <initializer_list>

#include "kernels/cuda/reduce.cuh"

namespace weft::kernels::cuda {
namespace {

// Float32 sums accumulate in float64, as on the CPU.
template <class T>
using SoftAcc = double;

// The running maximum m of the elements seen and the sum s of exp(x - m)
// over them. An element equal to -inf adds nothing (its exponential is 0
// under any finite maximum); s == 0 marks a state that has seen no other
// element. A NaN element makes s NaN, and NaN stays.
template <class T>
struct OnlineSoftmax {
  struct State {
    T m;
    SoftAcc<T> s;
  };
  static __device__ __forceinline__ State identity() { return {-INFINITY, 0}; }
  static __device__ __forceinline__ State add(State a, T x) {
    if (x > a.m) return {x, a.s * expOf(a.m - x) + 1};
    if (x != -INFINITY) a.s += expOf(x - a.m);
    return a;
  }
  static __device__ __forceinline__ State combine(State a, State b) {
    if (a.s == 0) return b;
    if (b.s == 0) return a;
    const T m = a.m > b.m ? a.m : b.m;
    return {m, a.s * expOf(a.m - m) + b.s * expOf(b.m - m)};
  }
  static __device__ __forceinline__ State shuffleXor(State st, int mask) {
    return {shuffleXorValue(st.m, mask), shuffleXorValue(st.s, mask)};
  }
  // A row whose maximum is infinite (a +inf in it, or nothing but -inf) is
  // NaN throughout, as the CPU's exp(x - max) makes it.
  static __device__ __forceinline__ State finish(State a) {
    if (a.m == INFINITY || a.m == -INFINITY) a.s = NAN;
    return a;
  }
};

template <class T>
__device__ __forceinline__ T softmaxValue(T x, T m, T inv, T logSum, bool log) {
  return log ? (x - m) - logSum : expOf(x - m) * inv;
}

// Rows of a [rows, R] buffer: a group of G threads (a warp, or the whole
// block when G == kThreads) per row.
// With Vec, every row starts 16-byte aligned and R is a multiple of
// kVec<T>: each thread reads and writes kVec<T> elements at a time, and keeps
// one running state per vector lane (independent chains).
template <class T>
constexpr int kVec = 16 / sizeof(T);

template <class T, int G, bool Vec>
__global__ void rowForwardKernel(const T* in, int64_t rows, int64_t R, bool log, T* out) {
  using Op = OnlineSoftmax<T>;
  using S = typename Op::State;
  constexpr int kGroups = kThreads / G;
  constexpr int V = kVec<T>;
  __shared__ S scratch[32];
  const int group = threadIdx.x / G, lane = threadIdx.x % G;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroups + group; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kGroups) {
    const T* x = in + row * R;
    T* y = out + row * R;
    S st = Op::identity();
    if constexpr (Vec) {
      S part[V];
#pragma unroll
      for (int k = 0; k < V; ++k) part[k] = Op::identity();
      for (int64_t q = lane; q < R / V; q += G) {
        const uint4 raw = reinterpret_cast<const uint4*>(x)[q];
        T v[V];
        memcpy(v, &raw, sizeof(raw));
#pragma unroll
        for (int k = 0; k < V; ++k) part[k] = Op::add(part[k], v[k]);
      }
#pragma unroll
      for (int k = 0; k < V; ++k) st = Op::combine(st, part[k]);
    } else {
      for (int64_t r = lane; r < R; r += G) st = Op::add(st, x[r]);
    }
    if constexpr (G == 32) {
      st = warpReduce<Op>(st);
    } else {
      st = blockReduce<Op>(st, scratch);
    }
    st = Op::finish(st);
    const T inv = static_cast<T>(SoftAcc<T>(1) / st.s);
    const T logSum = static_cast<T>(::log(st.s));
    if constexpr (Vec) {
      for (int64_t q = lane; q < R / V; q += G) {
        const uint4 raw = reinterpret_cast<const uint4*>(x)[q];
        T v[V];
        memcpy(v, &raw, sizeof(raw));
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = softmaxValue(v[k], st.m, inv, logSum, log);
        uint4 res;
        memcpy(&res, v, sizeof(res));
        reinterpret_cast<uint4*>(y)[q] = res;
      }
    } else {
      for (int64_t r = lane; r < R; r += G) y[r] = softmaxValue(x[r], st.m, inv, logSum, log);
    }
  }
}

// Columns (inner > 1): one thread per (o, i).
template <class T>
__global__ void colForwardKernel(const T* in, int64_t outer, int64_t R, int64_t inner, bool log, T* out) {
  using Op = OnlineSoftmax<T>;
  const int64_t n = outer * inner;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = j / inner, i = j - o * inner;
    const T* x = in + o * R * inner + i;
    T* y = out + o * R * inner + i;
    auto st = Op::identity();
    for (int64_t r = 0; r < R; ++r) st = Op::add(st, x[r * inner]);
    st = Op::finish(st);
    const T inv = static_cast<T>(SoftAcc<T>(1) / st.s);
    const T logSum = static_cast<T>(::log(st.s));
    for (int64_t r = 0; r < R; ++r) y[r * inner] = softmaxValue(x[r * inner], st.m, inv, logSum, log);
  }
}

template <class T>
__device__ __forceinline__ SoftAcc<T> backwardTerm(T y, T g, bool log) {
  return log ? static_cast<SoftAcc<T>>(g) : static_cast<SoftAcc<T>>(g) * y;
}

template <class T>
__device__ __forceinline__ T backwardValue(T y, T g, T st, bool log) {
  return log ? g - expOf(y) * st : y * (g - st);
}

template <class T, int G, bool Vec>
__global__ void rowBackwardKernel(const T* y, const T* g, int64_t rows, int64_t R, bool log, T* gx) {
  using Op = SumOp<SoftAcc<T>>;
  constexpr int kGroups = kThreads / G;
  constexpr int V = kVec<T>;
  __shared__ SoftAcc<T> scratch[32];
  const int group = threadIdx.x / G, lane = threadIdx.x % G;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroups + group; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kGroups) {
    const int64_t base = row * R;
    SoftAcc<T> s = 0;
    if constexpr (Vec) {
      SoftAcc<T> part[V] = {};
      for (int64_t q = lane; q < R / V; q += G) {
        const uint4 yr = reinterpret_cast<const uint4*>(y + base)[q];
        const uint4 gr = reinterpret_cast<const uint4*>(g + base)[q];
        T yv[V], gv[V];
        memcpy(yv, &yr, sizeof(yr));
        memcpy(gv, &gr, sizeof(gr));
#pragma unroll
        for (int k = 0; k < V; ++k) part[k] += backwardTerm(yv[k], gv[k], log);
      }
#pragma unroll
      for (int k = 0; k < V; ++k) s += part[k];
    } else {
      for (int64_t r = lane; r < R; r += G) s += backwardTerm(y[base + r], g[base + r], log);
    }
    // The reduction is a barrier for the group: every read of g below comes
    // after it, so gx may alias g.
    if constexpr (G == 32) {
      s = warpReduce<Op>(s);
    } else {
      s = blockReduce<Op>(s, scratch);
    }
    const T st = static_cast<T>(s);
    if constexpr (Vec) {
      for (int64_t q = lane; q < R / V; q += G) {
        const uint4 yr = reinterpret_cast<const uint4*>(y + base)[q];
        const uint4 gr = reinterpret_cast<const uint4*>(g + base)[q];
        T yv[V], gv[V];
        memcpy(yv, &yr, sizeof(yr));
        memcpy(gv, &gr, sizeof(gr));
#pragma unroll
        for (int k = 0; k < V; ++k) yv[k] = backwardValue(yv[k], gv[k], st, log);
        uint4 res;
        memcpy(&res, yv, sizeof(res));
        reinterpret_cast<uint4*>(gx + base)[q] = res;
      }
    } else {
      for (int64_t r = lane; r < R; r += G) gx[base + r] = backwardValue(y[base + r], g[base + r], st, log);
    }
  }
}

// Whether every row of a [rows, R] buffer starts 16-byte aligned with R a
// multiple of the vector width, for each of the pointers.
template <class T>
bool rowsVectorizable(int64_t R, std::initializer_list<const void*> ptrs) {
  if (R % kVec<T> != 0) return false;
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

template <class T>
__global__ void colBackwardKernel(const T* y, const T* g, int64_t outer, int64_t R, int64_t inner, bool log, T* gx) {
  const int64_t n = outer * inner;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = j / inner, i = j - o * inner;
    const int64_t base = o * R * inner + i;
    SoftAcc<T> s = 0;
    for (int64_t r = 0; r < R; ++r) s += backwardTerm(y[base + r * inner], g[base + r * inner], log);
    const T st = static_cast<T>(s);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t at = base + r * inner;
      gx[at] = backwardValue(y[at], g[at], st, log);
    }
  }
}

// Rows up to this long take one warp each, longer ones a block.
constexpr int64_t kWarpRowMax = 1024;

// Grid for `rows` rows handled by groups of G threads.
unsigned rowGrid(int64_t rows, int groupThreads) {
  const int64_t perBlock = kThreads / groupThreads;
  const int64_t cap = static_cast<int64_t>(properties(currentDevice()).multiprocessors) * 32;
  return static_cast<unsigned>(std::min((rows + perBlock - 1) / perBlock, cap));
}

}  // namespace

void softmaxForward(DType type, const void* in, int64_t outer, int64_t R, int64_t inner, bool log, void* out) {
  const char* op = log ? "logSoftmax" : "softmax";
  WEFT_ENFORCE(outer >= 0 && inner >= 0 && R >= 1, InvalidArgumentError, op, ": cannot take a softmax over ", R,
               " elements");
  WEFT_DISPATCH_FLOATING(type, op, [&]<class T>() {
    if (outer == 0 || inner == 0) return;
    const T* x = static_cast<const T*>(in);
    T* y = static_cast<T*>(out);
    const bool vec = rowsVectorizable<T>(R, {x, y});
    if (inner == 1 && R <= kWarpRowMax && vec) {
      rowForwardKernel<T, 32, true><<<rowGrid(outer, 32), kThreads, 0, stream()>>>(x, outer, R, log, y);
    } else if (inner == 1 && R <= kWarpRowMax) {
      rowForwardKernel<T, 32, false><<<rowGrid(outer, 32), kThreads, 0, stream()>>>(x, outer, R, log, y);
    } else if (inner == 1 && vec) {
      rowForwardKernel<T, kThreads, true><<<rowGrid(outer, kThreads), kThreads, 0, stream()>>>(x, outer, R, log, y);
    } else if (inner == 1) {
      rowForwardKernel<T, kThreads, false><<<rowGrid(outer, kThreads), kThreads, 0, stream()>>>(x, outer, R, log, y);
    } else {
      colForwardKernel<T><<<blocksFor(outer * inner), kThreads, 0, stream()>>>(x, outer, R, inner, log, y);
    }
    checkLaunch(op);
  });
}

void softmaxBackward(DType type, const void* y, const void* g, int64_t outer, int64_t R, int64_t inner, bool log,
                     void* gradIn) {
  const char* op = log ? "logSoftmax backward" : "softmax backward";
  WEFT_ENFORCE(outer >= 0 && inner >= 0 && R >= 0, InvalidArgumentError, op, ": negative size");
  WEFT_DISPATCH_FLOATING(type, op, [&]<class T>() {
    if (outer == 0 || inner == 0 || R == 0) return;
    const T* yp = static_cast<const T*>(y);
    const T* gp = static_cast<const T*>(g);
    T* gx = static_cast<T*>(gradIn);
    const bool vec = rowsVectorizable<T>(R, {yp, gp, gx});
    const unsigned warpGrid = rowGrid(outer, 32), blockGrid = rowGrid(outer, kThreads);
    if (inner == 1 && R <= kWarpRowMax && vec) {
      rowBackwardKernel<T, 32, true><<<warpGrid, kThreads, 0, stream()>>>(yp, gp, outer, R, log, gx);
    } else if (inner == 1 && R <= kWarpRowMax) {
      rowBackwardKernel<T, 32, false><<<warpGrid, kThreads, 0, stream()>>>(yp, gp, outer, R, log, gx);
    } else if (inner == 1 && vec) {
      rowBackwardKernel<T, kThreads, true><<<blockGrid, kThreads, 0, stream()>>>(yp, gp, outer, R, log, gx);
    } else if (inner == 1) {
      rowBackwardKernel<T, kThreads, false><<<blockGrid, kThreads, 0, stream()>>>(yp, gp, outer, R, log, gx);
    } else {
      colBackwardKernel<T><<<blocksFor(outer * inner), kThreads, 0, stream()>>>(yp, gp, outer, R, inner, log, gx);
    }
    checkLaunch(op);
  });
}

}  // namespace weft::kernels::cuda
