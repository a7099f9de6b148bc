#include "kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

template <class T>
using Acc = std::conditional_t<std::is_same_v<T, float>, double, T>;

// Columns of `inner` are processed in blocks of this many so that the
// per-column maxima and sums of a block live on the stack.
constexpr int64_t kInnerBlock = 128;

template <class T>
void forwardRow(const T* x, T* y, int64_t R, bool log) {
  T m = x[0];
  for (int64_t r = 1; r < R; ++r) m = std::max(m, x[r]);
  // A NaN anywhere makes the sum, hence the whole row, NaN (as in PyTorch);
  // so does a row of -inf or one holding +inf.
  Acc<T> s = 0;
  if (log) {
    for (int64_t r = 0; r < R; ++r) s += std::exp(x[r] - m);
    // (x - max) - log(sum), in that order: folding max into the shift first
    // would round it at the magnitude of x and lose the small differences.
    T logSum = static_cast<T>(std::log(s));
    for (int64_t r = 0; r < R; ++r) y[r] = (x[r] - m) - logSum;
  } else {
    for (int64_t r = 0; r < R; ++r) {
      T e = std::exp(x[r] - m);
      y[r] = e;
      s += e;
    }
    T inv = static_cast<T>(Acc<T>(1) / s);
    for (int64_t r = 0; r < R; ++r) y[r] *= inv;
  }
}

template <class T>
void forwardStrided(const T* x, T* y, int64_t R, int64_t inner, int64_t n, bool log) {
  T m[kInnerBlock];
  Acc<T> s[kInnerBlock];
  for (int64_t i = 0; i < n; ++i) {
    m[i] = x[i];
    s[i] = 0;
  }
  for (int64_t r = 1; r < R; ++r) {
    const T* row = x + r * inner;
    for (int64_t i = 0; i < n; ++i) m[i] = std::max(m[i], row[i]);
  }
  for (int64_t r = 0; r < R; ++r) {
    const T* row = x + r * inner;
    T* out = y + r * inner;
    for (int64_t i = 0; i < n; ++i) {
      T e = std::exp(row[i] - m[i]);
      if (!log) out[i] = e;
      s[i] += e;
    }
  }
  if (log) {
    T logSum[kInnerBlock];
    for (int64_t i = 0; i < n; ++i) logSum[i] = static_cast<T>(std::log(s[i]));
    for (int64_t r = 0; r < R; ++r) {
      const T* row = x + r * inner;
      T* out = y + r * inner;
      for (int64_t i = 0; i < n; ++i) out[i] = (row[i] - m[i]) - logSum[i];
    }
  } else {
    T inv[kInnerBlock];
    for (int64_t i = 0; i < n; ++i) inv[i] = static_cast<T>(Acc<T>(1) / s[i]);
    for (int64_t r = 0; r < R; ++r) {
      T* out = y + r * inner;
      for (int64_t i = 0; i < n; ++i) out[i] *= inv[i];
    }
  }
}

template <class T>
void backwardRow(const T* y, const T* g, T* gx, int64_t R, bool log) {
  Acc<T> s = 0;
  if (log) {
    for (int64_t r = 0; r < R; ++r) s += g[r];
    T st = static_cast<T>(s);
    for (int64_t r = 0; r < R; ++r) gx[r] = g[r] - std::exp(y[r]) * st;
  } else {
    for (int64_t r = 0; r < R; ++r) s += static_cast<Acc<T>>(g[r]) * y[r];
    T st = static_cast<T>(s);
    for (int64_t r = 0; r < R; ++r) gx[r] = y[r] * (g[r] - st);
  }
}

template <class T>
void backwardStrided(const T* y, const T* g, T* gx, int64_t R, int64_t inner, int64_t n, bool log) {
  Acc<T> s[kInnerBlock];
  for (int64_t i = 0; i < n; ++i) s[i] = 0;
  for (int64_t r = 0; r < R; ++r) {
    const T* yr = y + r * inner;
    const T* gr = g + r * inner;
    for (int64_t i = 0; i < n; ++i) s[i] += log ? static_cast<Acc<T>>(gr[i]) : static_cast<Acc<T>>(gr[i]) * yr[i];
  }
  T st[kInnerBlock];
  for (int64_t i = 0; i < n; ++i) st[i] = static_cast<T>(s[i]);
  for (int64_t r = 0; r < R; ++r) {
    const T* yr = y + r * inner;
    const T* gr = g + r * inner;
    T* out = gx + r * inner;
    if (log) {
      for (int64_t i = 0; i < n; ++i) out[i] = gr[i] - std::exp(yr[i]) * st[i];
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = yr[i] * (gr[i] - st[i]);
    }
  }
}

}  // namespace

void softmaxForward(DType type, const void* in, int64_t outer, int64_t R, int64_t inner, bool log, void* out) {
  WEFT_DISPATCH_FLOATING(type, log ? "logSoftmax" : "softmax", [&]<class T>() {
    const T* x = static_cast<const T*>(in);
    T* y = static_cast<T*>(out);
    forEachColumnBlock<kInnerBlock>(outer, R, inner, [&](int64_t o, int64_t ib, int64_t n) {
      int64_t at = o * R * inner + ib;
      if (inner == 1) {
        forwardRow(x + at, y + at, R, log);
      } else {
        forwardStrided(x + at, y + at, R, inner, n, log);
      }
    });
  });
}

void softmaxBackward(DType type, const void* y, const void* g, int64_t outer, int64_t R, int64_t inner, bool log,
                     void* gradIn) {
  WEFT_DISPATCH_FLOATING(type, log ? "logSoftmax backward" : "softmax backward", [&]<class T>() {
    const T* yp = static_cast<const T*>(y);
    const T* gp = static_cast<const T*>(g);
    T* gx = static_cast<T*>(gradIn);
    forEachColumnBlock<kInnerBlock>(outer, R, inner, [&](int64_t o, int64_t ib, int64_t n) {
      int64_t at = o * R * inner + ib;
      if (inner == 1) {
        backwardRow(yp + at, gp + at, gx + at, R, log);
      } else {
        backwardStrided(yp + at, gp + at, gx + at, R, inner, n, log);
      }
    });
  });
}

}  // namespace weft::kernels::cpu
