#include "kernels/cuda/loss.h"

#include <cstring>

#include "kernels/cuda/reduce.cuh"

namespace weft::kernels::cuda {
namespace {

// A float64 sum and a count, reduced together.
struct Totals {
  double sum;
  int64_t count;
};

struct TotalsOp {
  using State = Totals;
  static __device__ __forceinline__ State identity() { return {0.0, 0}; }
  static __device__ __forceinline__ State combine(State a, State b) { return {a.sum + b.sum, a.count + b.count}; }
  static __device__ __forceinline__ State shuffleXor(State s, int m) {
    return {shuffleXorValue(s.sum, m), shuffleXorValue(s.count, m)};
  }
};

// Combines the per-block partial totals (one block) into totals[0].
__global__ void finishTotalsKernel(const Totals* partial, int64_t n, Totals* totals) {
  __shared__ Totals scratch[32];
  Totals t = TotalsOp::identity();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) t = TotalsOp::combine(t, partial[i]);
  t = blockReduce<TotalsOp>(t, scratch);
  if (threadIdx.x == 0) totals[0] = t;
}

// Runs a kernel that leaves one partial Totals per block in `partial` (its
// grid of `blocks` blocks launched by `launch`), then combines them and
// reads the result back.
template <class Launch>
Totals reduceTotals(unsigned blocks, Launch launch, const char* op) {
  Scratch scratch(sizeof(Totals) * (static_cast<size_t>(blocks) + 1));
  Totals* partial = scratch.as<Totals>();
  Totals* total = partial + blocks;
  launch(partial);
  checkLaunch(op);
  finishTotalsKernel<<<1, kThreads, 0, stream()>>>(partial, blocks, total);
  checkLaunch(op);
  Totals host{};
  copyDeviceToHost(&host, total, sizeof(Totals), currentDevice());
  return host;
}

__global__ void firstInvalidTargetKernel(const int64_t* target, int64_t n, int64_t C, int64_t ignoreIndex,
                                         unsigned long long* first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = target[i];
    if (t != ignoreIndex && (t < 0 || t >= C)) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

template <class T>
__global__ void nllForwardKernel(const T* in, const int64_t* target, int64_t N, int64_t C, int64_t D,
                                 int64_t ignoreIndex, T* losses, Totals* partial) {
  __shared__ Totals scratch[32];
  const int64_t n = N * D;
  Totals acc = TotalsOp::identity();
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = target[j];
    T loss = T(0);
    // Targets are validated before; the range test only keeps a bad one from reading out of bounds.
    if (t != ignoreIndex && t >= 0 && t < C) {
      const int64_t row = D == 1 ? j : j / D;
      const int64_t d = j - row * D;
      loss = -in[(row * C + t) * D + d];
      acc.sum += static_cast<double>(loss);
      acc.count += 1;
    }
    if (losses) losses[j] = loss;
  }
  acc = blockReduce<TotalsOp>(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

template <class T>
__global__ void nllBackwardKernel(const int64_t* target, int64_t N, int64_t C, int64_t D, int64_t ignoreIndex,
                                  const T* g, bool perElement, double scale, T* gradInput) {
  const int64_t n = N * D;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = target[j];
    if (t == ignoreIndex || t < 0 || t >= C) continue;
    const int64_t row = D == 1 ? j : j / D;
    const int64_t d = j - row * D;
    gradInput[(row * C + t) * D + d] = static_cast<T>(-scale * static_cast<double>(g[perElement ? j : 0]));
  }
}

// Rows of the gradient: for D == 1 row n holds the C classes of sample n;
// otherwise row n*C + c holds the D positions of class c. A group of G
// threads (a warp, or the block when G == kThreads) writes one row.
template <class T, int G>
__global__ void crossEntropyBackwardKernel(const T* logProbs, const int64_t* target, int64_t N, int64_t C, int64_t D,
                                           int64_t ignoreIndex, const T* g, bool perElement, double scale,
                                           T* gradInput) {
  constexpr int kGroups = kThreads / G;
  const int group = threadIdx.x / G, lane = threadIdx.x % G;
  const int64_t rows = D == 1 ? N : N * C;
  const int64_t cols = D == 1 ? C : D;
  const T common = perElement ? T(0) : static_cast<T>(scale * static_cast<double>(g[0]));
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroups + group; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kGroups) {
    const int64_t n = D == 1 ? row : row / C;
    const int64_t c = D == 1 ? 0 : row - n * C;
    const T* lp = logProbs + row * cols;
    T* gi = gradInput + row * cols;
    for (int64_t k = lane; k < cols; k += G) {
      const int64_t at = D == 1 ? n : n * D + k;  // the target's position
      const int64_t t = target[at];
      const int64_t cls = D == 1 ? k : c;
      T w = T(0);
      if (t != ignoreIndex) w = perElement ? static_cast<T>(scale * static_cast<double>(g[at])) : common;
      T v = w * expOf(lp[k]);
      if (t == cls) v -= w;
      gi[k] = v;
    }
  }
}

// The D == 1 case with every row 16-byte aligned and C a multiple of the
// vector width: the row's weight and target are read once, the row itself
// with 16-byte loads and stores.
template <class T, int G>
__global__ void crossEntropyBackwardVecKernel(const T* logProbs, const int64_t* target, int64_t N, int64_t C,
                                              int64_t ignoreIndex, const T* g, bool perElement, double scale,
                                              T* gradInput) {
  constexpr int kGroups = kThreads / G;
  constexpr int V = 16 / sizeof(T);
  const int group = threadIdx.x / G, lane = threadIdx.x % G;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * kGroups + group; n < N;
       n += static_cast<int64_t>(gridDim.x) * kGroups) {
    const int64_t t = target[n];
    const T w = t == ignoreIndex ? T(0) : static_cast<T>(scale * static_cast<double>(g[perElement ? n : 0]));
    const uint4* lp = reinterpret_cast<const uint4*>(logProbs + n * C);
    uint4* gi = reinterpret_cast<uint4*>(gradInput + n * C);
    for (int64_t q = lane; q < C / V; q += G) {
      uint4 raw = lp[q];
      T v[V];
      memcpy(v, &raw, sizeof(raw));
#pragma unroll
      for (int k = 0; k < V; ++k) {
        T e = w * expOf(v[k]);
        if (t == q * V + k) e -= w;
        v[k] = e;
      }
      memcpy(&raw, v, sizeof(raw));
      gi[q] = raw;
    }
  }
}

template <class T>
__global__ void mseForwardKernel(const T* x, const T* t, int64_t n, T* losses, Totals* partial) {
  __shared__ Totals scratch[32];
  Totals acc = TotalsOp::identity();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (losses) {
      const T diff = x[i] - t[i];
      losses[i] = diff * diff;
    } else {
      const double diff = static_cast<double>(x[i]) - static_cast<double>(t[i]);
      acc.sum += diff * diff;
    }
  }
  if (losses) return;
  acc = blockReduce<TotalsOp>(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

template <class T>
__global__ void mseBackwardKernel(const T* x, const T* t, int64_t n, const T* g, bool perElement, double scale, T* gx,
                                  T* gt) {
  const T twice = static_cast<T>(2 * scale);
  const T common = perElement ? T(0) : twice * g[0];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T v = (perElement ? twice * g[i] : common) * (x[i] - t[i]);
    if (gx) gx[i] = v;
    if (gt) gt[i] = -v;
  }
}

unsigned rowGrid(int64_t rows, int groupThreads) {
  const int64_t perBlock = kThreads / groupThreads;
  const int64_t cap = static_cast<int64_t>(properties(currentDevice()).multiprocessors) * 32;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min((rows + perBlock - 1) / perBlock, cap)));
}

}  // namespace

void firstInvalidTarget(const int64_t* target, int64_t n, int64_t C, int64_t ignoreIndex, int64_t* position,
                        int64_t* value) {
  *position = -1;
  if (n <= 0) return;
  Scratch scratch(sizeof(unsigned long long));
  auto* first = scratch.as<unsigned long long>();
  WEFT_CUDA_CHECK(cudaMemsetAsync(first, 0xff, sizeof(unsigned long long), stream()));
  firstInvalidTargetKernel<<<blocksFor(n), kThreads, 0, stream()>>>(target, n, C, ignoreIndex, first);
  checkLaunch("target check");
  unsigned long long at = 0;
  copyDeviceToHost(&at, first, sizeof(at), currentDevice());
  if (at == ~0ull) return;
  copyDeviceToHost(value, target + at, sizeof(int64_t), currentDevice());
  *position = static_cast<int64_t>(at);
}

NllTotals nllLossForward(DType type, const void* input, const int64_t* target, int64_t N, int64_t C, int64_t D,
                         int64_t ignoreIndex, void* losses) {
  NllTotals totals;
  WEFT_DISPATCH_FLOATING(type, "nllLoss", [&]<class T>() {
    const int64_t n = N * D;
    if (n <= 0) return;
    const unsigned blocks = blocksFor(n);
    Totals t = reduceTotals(
        blocks,
        [&](Totals* partial) {
          nllForwardKernel<T><<<blocks, kThreads, 0, stream()>>>(static_cast<const T*>(input), target, N, C, D,
                                                                 ignoreIndex, static_cast<T*>(losses), partial);
        },
        "nllLoss");
    totals.sum = t.sum;
    totals.count = t.count;
  });
  return totals;
}

void nllLossForward(DType type, const void* input, const int64_t* target, int64_t N, int64_t C, int64_t D,
                    int64_t ignoreIndex, void* losses, NllTotals* totals) {
  *totals = nllLossForward(type, input, target, N, C, D, ignoreIndex, losses);
}

void nllLossBackward(DType type, const int64_t* target, int64_t N, int64_t C, int64_t D, int64_t ignoreIndex,
                     const void* gradOut, bool perElement, double scale, void* gradInput) {
  WEFT_DISPATCH_FLOATING(type, "nllLoss backward", [&]<class T>() {
    const int64_t total = N * C * D;
    if (total <= 0) return;
    WEFT_CUDA_CHECK(cudaMemsetAsync(gradInput, 0, static_cast<size_t>(total) * sizeof(T), stream()));
    const int64_t n = N * D;
    nllBackwardKernel<T><<<blocksFor(n), kThreads, 0, stream()>>>(target, N, C, D, ignoreIndex,
                                                                  static_cast<const T*>(gradOut), perElement, scale,
                                                                  static_cast<T*>(gradInput));
    checkLaunch("nllLoss backward");
  });
}

void crossEntropyBackward(DType type, const void* logProbs, const int64_t* target, int64_t N, int64_t C, int64_t D,
                          int64_t ignoreIndex, const void* gradOut, bool perElement, double scale, void* gradInput) {
  WEFT_DISPATCH_FLOATING(type, "crossEntropy backward", [&]<class T>() {
    if (N * C * D <= 0) return;
    const int64_t rows = D == 1 ? N : N * C;
    const int64_t cols = D == 1 ? C : D;
    const T* lp = static_cast<const T*>(logProbs);
    const T* g = static_cast<const T*>(gradOut);
    T* gi = static_cast<T*>(gradInput);
    constexpr int V = 16 / sizeof(T);
    const bool vec = D == 1 && C % V == 0 && reinterpret_cast<uintptr_t>(lp) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(gi) % 16 == 0;
    if (vec && C <= 1024) {
      crossEntropyBackwardVecKernel<T, 32><<<rowGrid(N, 32), kThreads, 0, stream()>>>(lp, target, N, C, ignoreIndex,
                                                                                      g, perElement, scale, gi);
    } else if (vec) {
      crossEntropyBackwardVecKernel<T, kThreads><<<rowGrid(N, kThreads), kThreads, 0, stream()>>>(
          lp, target, N, C, ignoreIndex, g, perElement, scale, gi);
    } else if (cols <= 1024) {
      crossEntropyBackwardKernel<T, 32><<<rowGrid(rows, 32), kThreads, 0, stream()>>>(lp, target, N, C, D,
                                                                                      ignoreIndex, g, perElement,
                                                                                      scale, gi);
    } else {
      crossEntropyBackwardKernel<T, kThreads><<<rowGrid(rows, kThreads), kThreads, 0, stream()>>>(
          lp, target, N, C, D, ignoreIndex, g, perElement, scale, gi);
    }
    checkLaunch("crossEntropy backward");
  });
}

double mseLossForward(DType type, const void* input, const void* target, int64_t n, void* losses) {
  double total = 0;
  WEFT_DISPATCH_FLOATING(type, "mseLoss", [&]<class T>() {
    if (n <= 0) return;
    const T* x = static_cast<const T*>(input);
    const T* t = static_cast<const T*>(target);
    const unsigned blocks = blocksFor(n);
    if (losses) {
      mseForwardKernel<T><<<blocks, kThreads, 0, stream()>>>(x, t, n, static_cast<T*>(losses), nullptr);
      checkLaunch("mseLoss");
      return;
    }
    total = reduceTotals(
                blocks,
                [&](Totals* partial) { mseForwardKernel<T><<<blocks, kThreads, 0, stream()>>>(x, t, n, nullptr, partial); },
                "mseLoss")
                .sum;
  });
  return total;
}

void mseLossForward(DType type, const void* input, const void* target, int64_t n, void* losses, double* total) {
  *total = mseLossForward(type, input, target, n, losses);
}

void mseLossBackward(DType type, const void* input, const void* target, int64_t n, const void* gradOut,
                     bool perElement, double scale, void* gradInput, void* gradTarget) {
  WEFT_DISPATCH_FLOATING(type, "mseLoss backward", [&]<class T>() {
    if (n <= 0) return;
    mseBackwardKernel<T><<<blocksFor(n), kThreads, 0, stream()>>>(
        static_cast<const T*>(input), static_cast<const T*>(target), n, static_cast<const T*>(gradOut), perElement,
        scale, static_cast<T*>(gradInput), static_cast<T*>(gradTarget));
    checkLaunch("mseLoss backward");
  });
}

}  // namespace weft::kernels::cuda
