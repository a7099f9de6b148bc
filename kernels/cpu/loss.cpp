#include "kernels/cpu/loss.h"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

template <class T>
using Acc = std::conditional_t<std::is_same_v<T, float>, double, T>;

}  // namespace

NllTotals nllLossForward(DType type, const void* input, const int64_t* target, int64_t N, int64_t C, int64_t D,
                         int64_t ignoreIndex, void* losses) {
  NllTotals totals;
  WEFT_DISPATCH_FLOATING(type, "nllLoss", [&]<class T>() {
    const T* in = static_cast<const T*>(input);
    T* out = static_cast<T*>(losses);
    // One gather per target: memory bound and small next to the op that
    // produced the log-probabilities, so a serial loop.
    double sum = 0;
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t* tn = target + n * D;
      const T* xn = in + n * C * D;
      for (int64_t d = 0; d < D; ++d) {
        int64_t t = tn[d];
        T loss = 0;
        if (t != ignoreIndex) {
          loss = -xn[t * D + d];
          sum += static_cast<double>(loss);
          ++count;
        }
        if (out) out[n * D + d] = loss;
      }
    }
    totals.sum = sum;
    totals.count = count;
  });
  return totals;
}

void nllLossBackward(DType type, const int64_t* target, int64_t N, int64_t C, int64_t D, int64_t ignoreIndex,
                     const void* gradOut, bool perElement, double scale, void* gradInput) {
  WEFT_DISPATCH_FLOATING(type, "nllLoss backward", [&]<class T>() {
    const T* g = static_cast<const T*>(gradOut);
    T* gi = static_cast<T*>(gradInput);
    std::memset(static_cast<void*>(gi), 0, sizeof(T) * static_cast<size_t>(N * C * D));
    T common = perElement ? T(0) : static_cast<T>(-scale * static_cast<double>(g[0]));
    for (int64_t n = 0; n < N; ++n) {
      const int64_t* tn = target + n * D;
      T* gn = gi + n * C * D;
      for (int64_t d = 0; d < D; ++d) {
        int64_t t = tn[d];
        if (t == ignoreIndex) continue;
        gn[t * D + d] = perElement ? static_cast<T>(-scale * static_cast<double>(g[n * D + d])) : common;
      }
    }
  });
}

void crossEntropyBackward(DType type, const void* logProbs, const int64_t* target, int64_t N, int64_t C, int64_t D,
                          int64_t ignoreIndex, const void* gradOut, bool perElement, double scale, void* gradInput) {
  WEFT_DISPATCH_FLOATING(type, "crossEntropy backward", [&]<class T>() {
    const T* lp = static_cast<const T*>(logProbs);
    const T* g = static_cast<const T*>(gradOut);
    T* gi = static_cast<T*>(gradInput);
    T common = perElement ? T(0) : static_cast<T>(scale * static_cast<double>(g[0]));
    auto weight = [&](int64_t n, int64_t d) -> T {
      if (target[n * D + d] == ignoreIndex) return T(0);
      return perElement ? static_cast<T>(scale * static_cast<double>(g[n * D + d])) : common;
    };
    parallelFor(N, kParallelGrain / (C * D > 0 ? C * D : 1) + 1, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        const T* lpn = lp + n * C * D;
        T* gn = gi + n * C * D;
        const int64_t* tn = target + n * D;
        if (D == 1) {
          T w = weight(n, 0);
          for (int64_t c = 0; c < C; ++c) gn[c] = w * std::exp(lpn[c]);
          if (tn[0] != ignoreIndex) gn[tn[0]] -= w;
          continue;
        }
        for (int64_t c = 0; c < C; ++c) {
          for (int64_t d = 0; d < D; ++d) gn[c * D + d] = weight(n, d) * std::exp(lpn[c * D + d]);
        }
        for (int64_t d = 0; d < D; ++d) {
          if (tn[d] != ignoreIndex) gn[tn[d] * D + d] -= weight(n, d);
        }
      }
    });
  });
}

double mseLossForward(DType type, const void* input, const void* target, int64_t n, void* losses) {
  double total = 0;
  WEFT_DISPATCH_FLOATING(type, "mseLoss", [&]<class T>() {
    const T* x = static_cast<const T*>(input);
    const T* t = static_cast<const T*>(target);
    T* out = static_cast<T*>(losses);
    if (out) {
      parallelFor(n, kParallelGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          T diff = x[i] - t[i];
          out[i] = diff * diff;
        }
      });
      return;
    }
    // Per-chunk partial sums, combined in chunk order.
    const int64_t chunks = parallelChunkCount(n, kParallelGrain);
    std::vector<Acc<T>> partial(static_cast<size_t>(chunks), Acc<T>(0));
    parallelForChunks(n, chunks, [&](int64_t c, int64_t b, int64_t e, int) {
      Acc<T> s = 0;
      for (int64_t i = b; i < e; ++i) {
        Acc<T> diff = static_cast<Acc<T>>(x[i]) - t[i];
        s += diff * diff;
      }
      partial[static_cast<size_t>(c)] = s;
    });
    for (auto v : partial) total += static_cast<double>(v);
  });
  return total;
}

void mseLossBackward(DType type, const void* input, const void* target, int64_t n, const void* gradOut,
                     bool perElement, double scale, void* gradInput, void* gradTarget) {
  WEFT_DISPATCH_FLOATING(type, "mseLoss backward", [&]<class T>() {
    const T* x = static_cast<const T*>(input);
    const T* t = static_cast<const T*>(target);
    const T* g = static_cast<const T*>(gradOut);
    T* gx = static_cast<T*>(gradInput);
    T* gt = static_cast<T*>(gradTarget);
    T twice = static_cast<T>(2 * scale);
    T common = perElement ? T(0) : twice * g[0];
    parallelFor(n, kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        T v = (perElement ? twice * g[i] : common) * (x[i] - t[i]);
        if (gx) gx[i] = v;
        if (gt) gt[i] = -v;
      }
    });
  });
}

}  // namespace weft::kernels::cpu
