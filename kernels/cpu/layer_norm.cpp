#include "kernels/cpu/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/vec_math.h"

namespace weft::kernels::cpu {
namespace {

template <class T>
using Acc = std::conditional_t<std::is_same_v<T, float>, double, T>;

// The vectors one instruction set works on: a register of `Bytes` holds
// kCount float64 sums, and each step reads kCount values of T into it (half
// a register of float32, widened). Accumulators of the register's own width
// stay in registers; wider ones would spill on every step.
template <class T, int Bytes>
struct Lanes {
  typedef double A __attribute__((vector_size(Bytes)));
  static constexpr int64_t kCount = Bytes / 8;
  typedef T Values __attribute__((vector_size(kCount * sizeof(T))));
};

// kCount consecutive values at p, widened to float64.
template <class T, int Bytes>
WEFT_VEC_INLINE typename Lanes<T, Bytes>::A loadWide(const T* p) {
  typename Lanes<T, Bytes>::Values v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return __builtin_convertvector(v, typename Lanes<T, Bytes>::A);
  }
}

template <class T, int Bytes>
WEFT_VEC_INLINE typename Lanes<T, Bytes>::A loadAcc(const Acc<T>* p) {
  typename Lanes<T, Bytes>::A v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T, int Bytes>
WEFT_VEC_INLINE void storeAcc(Acc<T>* p, typename Lanes<T, Bytes>::A v) {
  std::memcpy(p, &v, sizeof v);
}

// The lanes' sum as a tree of halvings: log2(lanes) dependent additions
// rather than one per lane, as the row sums sit on the critical path of a
// short row.
template <class A>
WEFT_VEC_INLINE double laneSum(A v) {
  constexpr int kN = static_cast<int>(sizeof(A) / sizeof(double));
  double a[kN];
  std::memcpy(a, &v, sizeof v);
  for (int width = kN / 2; width >= 1; width /= 2) {
    for (int k = 0; k < width; ++k) a[k] += a[k + width];
  }
  return a[0];
}

// ---- forward -----------------------------------------------------------------

// Rows [rb, re): one pass for the shifted sums, one to write y.
template <class T, int Bytes>
WEFT_VEC_INLINE void forwardRows(const T* x, int64_t rb, int64_t re, int64_t n, const T* w, const T* b, double eps,
                                 T* y, T* mean, T* rstd) {
  using L = Lanes<T, Bytes>;
  using A = typename L::A;
  constexpr int64_t kL = L::kCount;
  for (int64_t r = rb; r < re; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    const Acc<T> shift = xr[0];
    A s0{}, q0{}, s1{}, q1{};
    int64_t j = 0;
    for (; j + 2 * kL <= n; j += 2 * kL) {
      const A d0 = loadWide<T, Bytes>(xr + j) - shift;
      const A d1 = loadWide<T, Bytes>(xr + j + kL) - shift;
      s0 += d0;
      q0 += d0 * d0;
      s1 += d1;
      q1 += d1 * d1;
    }
    for (; j + kL <= n; j += kL) {
      const A d = loadWide<T, Bytes>(xr + j) - shift;
      s0 += d;
      q0 += d * d;
    }
    Acc<T> sum = laneSum(s0 + s1), sq = laneSum(q0 + q1);
    for (; j < n; ++j) {
      const Acc<T> d = Acc<T>(xr[j]) - shift;
      sum += d;
      sq += d * d;
    }
    const Acc<T> dm = sum / static_cast<Acc<T>>(n);
    const Acc<T> mu = shift + dm;
    const Acc<T> var = std::max(sq / static_cast<Acc<T>>(n) - dm * dm, Acc<T>(0));
    const Acc<T> rs = Acc<T>(1) / std::sqrt(var + static_cast<Acc<T>>(eps));
    mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(rs);
    // y = x * rstd - mean * rstd, then the affine map: PyTorch's order.
    const T scale = static_cast<T>(rs), offset = static_cast<T>(-mu * rs);
    if (w && b) {
      for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * scale + offset) * w[i] + b[i];
    } else if (w) {
      for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * scale + offset) * w[i];
    } else if (b) {
      for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * scale + offset) + b[i];
    } else {
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale + offset;
    }
  }
}

// ---- backward ----------------------------------------------------------------

// Rows [rb, re): the first pass sums ĝ and ĝ·x̂ for the row (and adds g·x̂
// and g into the chunk's partial dweight / dbias, when given); the second
// writes dx.
template <class T, int Bytes>
WEFT_VEC_INLINE void backwardRows(const T* g, const T* x, const T* mean, const T* rstd, const T* w, int64_t rb,
                                  int64_t re, int64_t n, T* gx, Acc<T>* pw, Acc<T>* pb) {
  using L = Lanes<T, Bytes>;
  using A = typename L::A;
  constexpr int64_t kL = L::kCount;
  for (int64_t r = rb; r < re; ++r) {
    const T* gr = g + r * n;
    const T* xr = x + r * n;
    const Acc<T> mu = mean[r], rs = rstd[r];
    A sg{}, sgx{};
    int64_t j = 0;
    for (; j + kL <= n; j += kL) {
      const A gv = loadWide<T, Bytes>(gr + j);
      const A xh = (loadWide<T, Bytes>(xr + j) - mu) * rs;
      const A gh = w ? gv * loadWide<T, Bytes>(w + j) : gv;
      sg += gh;
      sgx += gh * xh;
      if (pw) storeAcc<T, Bytes>(pw + j, loadAcc<T, Bytes>(pw + j) + gv * xh);
      if (pb) storeAcc<T, Bytes>(pb + j, loadAcc<T, Bytes>(pb + j) + gv);
    }
    Acc<T> sumG = laneSum(sg), sumGX = laneSum(sgx);
    for (; j < n; ++j) {
      const Acc<T> gv = gr[j];
      const Acc<T> xh = (Acc<T>(xr[j]) - mu) * rs;
      const Acc<T> gh = w ? gv * Acc<T>(w[j]) : gv;
      sumG += gh;
      sumGX += gh * xh;
      if (pw) pw[j] += gv * xh;
      if (pb) pb[j] += gv;
    }
    if (!gx) continue;
    // dx = rstd·ĝ + k1·(x - mean) + k0, with k1 = -rstd²·mean_n(ĝ·x̂) and
    // k0 = -rstd·mean_n(ĝ); (x - mean) rather than PyTorch's k1·x + k0' keeps
    // the digits a large mean would cancel.
    const Acc<T> inv = Acc<T>(1) / static_cast<Acc<T>>(n);
    const T a = static_cast<T>(rs), k1 = static_cast<T>(-rs * rs * sumGX * inv), k0 = static_cast<T>(-rs * sumG * inv);
    const T m = static_cast<T>(mu);
    T* gxr = gx + r * n;
    if (w) {
      for (int64_t i = 0; i < n; ++i) gxr[i] = a * (gr[i] * w[i]) + k1 * (xr[i] - m) + k0;
    } else {
      for (int64_t i = 0; i < n; ++i) gxr[i] = a * gr[i] + k1 * (xr[i] - m) + k0;
    }
  }
}

// ---- per-instruction-set entry points ---------------------------------------------

template <class T>
struct RowKernels {
  void (*forward)(const T*, int64_t, int64_t, int64_t, const T*, const T*, double, T*, T*, T*);
  void (*backward)(const T*, const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, T*, Acc<T>*,
                   Acc<T>*);
};

template <class T>
void forwardSse2(const T* x, int64_t rb, int64_t re, int64_t n, const T* w, const T* b, double eps, T* y, T* mean,
                 T* rstd) {
  forwardRows<T, 16>(x, rb, re, n, w, b, eps, y, mean, rstd);
}
template <class T>
__attribute__((target("avx2,fma"))) void forwardAvx2(const T* x, int64_t rb, int64_t re, int64_t n, const T* w,
                                                     const T* b, double eps, T* y, T* mean, T* rstd) {
  forwardRows<T, 32>(x, rb, re, n, w, b, eps, y, mean, rstd);
}
template <class T>
__attribute__((target("avx512f"))) void forwardAvx512(const T* x, int64_t rb, int64_t re, int64_t n, const T* w,
                                                      const T* b, double eps, T* y, T* mean, T* rstd) {
  forwardRows<T, 64>(x, rb, re, n, w, b, eps, y, mean, rstd);
}

template <class T>
void backwardSse2(const T* g, const T* x, const T* mean, const T* rstd, const T* w, int64_t rb, int64_t re, int64_t n,
                  T* gx, Acc<T>* pw, Acc<T>* pb) {
  backwardRows<T, 16>(g, x, mean, rstd, w, rb, re, n, gx, pw, pb);
}
template <class T>
__attribute__((target("avx2,fma"))) void backwardAvx2(const T* g, const T* x, const T* mean, const T* rstd,
                                                      const T* w, int64_t rb, int64_t re, int64_t n, T* gx,
                                                      Acc<T>* pw, Acc<T>* pb) {
  backwardRows<T, 32>(g, x, mean, rstd, w, rb, re, n, gx, pw, pb);
}
template <class T>
__attribute__((target("avx512f"))) void backwardAvx512(const T* g, const T* x, const T* mean, const T* rstd,
                                                       const T* w, int64_t rb, int64_t re, int64_t n, T* gx,
                                                       Acc<T>* pw, Acc<T>* pb) {
  backwardRows<T, 64>(g, x, mean, rstd, w, rb, re, n, gx, pw, pb);
}

template <class T>
RowKernels<T> rowKernels() {
  switch (vecmath::bestIsa()) {
    case vecmath::Isa::Avx512: return {forwardAvx512<T>, backwardAvx512<T>};
    case vecmath::Isa::Avx2: return {forwardAvx2<T>, backwardAvx2<T>};
    case vecmath::Isa::Sse2: break;
  }
  return {forwardSse2<T>, backwardSse2<T>};
}

template <class T>
const RowKernels<T>& kernelsFor() {
  static const RowKernels<T> k = rowKernels<T>();
  return k;
}

// Row chunks for one call: about kParallelGrain elements each, at most
// kMaxChunks. The count depends on the shape alone, never on the threads, so
// the backward's per-chunk weight sums combine to the same bits whatever
// the thread count.
constexpr int64_t kMaxChunks = 32;
int64_t chunksFor(int64_t rows, int64_t n) {
  return std::clamp<int64_t>(rows * n / kParallelGrain, 1, std::min(rows, kMaxChunks));
}

}  // namespace

void layerNormForward(DType type, const void* x, int64_t rows, int64_t n, const void* weight, const void* bias,
                      double eps, void* y, void* mean, void* rstd) {
  if (rows <= 0 || n <= 0) return;
  WEFT_DISPATCH_FLOATING(type, "layerNorm", [&]<class T>() {
    const auto& k = kernelsFor<T>();
    const T* xp = static_cast<const T*>(x);
    const T* wp = static_cast<const T*>(weight);
    const T* bp = static_cast<const T*>(bias);
    T* yp = static_cast<T*>(y);
    T* mp = static_cast<T*>(mean);
    T* rp = static_cast<T*>(rstd);
    parallelForChunks(rows, chunksFor(rows, n), [&](int64_t, int64_t rb, int64_t re, int) {
      k.forward(xp, rb, re, n, wp, bp, eps, yp, mp, rp);
    });
  });
}

void layerNormBackward(DType type, const void* g, const void* x, const void* mean, const void* rstd,
                       const void* weight, int64_t rows, int64_t n, void* gradX, void* gradWeight, void* gradBias) {
  if (n <= 0) return;
  WEFT_DISPATCH_FLOATING(type, "layerNorm backward", [&]<class T>() {
    const auto& k = kernelsFor<T>();
    const int64_t chunks = rows > 0 ? chunksFor(rows, n) : 0;
    // Per chunk: dweight partials at [c * 2n, c * 2n + n), dbias after them.
    const bool needParams = gradWeight || gradBias;
    std::vector<Acc<T>> partial(needParams ? static_cast<size_t>(chunks * 2 * n) : 0, Acc<T>(0));
    const T* gp = static_cast<const T*>(g);
    const T* xp = static_cast<const T*>(x);
    const T* mp = static_cast<const T*>(mean);
    const T* rp = static_cast<const T*>(rstd);
    const T* wp = static_cast<const T*>(weight);
    T* gxp = static_cast<T*>(gradX);
    parallelForChunks(rows, chunks, [&](int64_t c, int64_t rb, int64_t re, int) {
      Acc<T>* pw = gradWeight ? partial.data() + c * 2 * n : nullptr;
      Acc<T>* pb = gradBias ? partial.data() + c * 2 * n + n : nullptr;
      k.backward(gp, xp, mp, rp, wp, rb, re, n, gxp, pw, pb);
    });
    for (int pick = 0; pick < 2; ++pick) {
      T* out = static_cast<T*>(pick == 0 ? gradWeight : gradBias);
      if (!out) continue;
      for (int64_t i = 0; i < n; ++i) {
        Acc<T> s = 0;
        for (int64_t c = 0; c < chunks; ++c) s += partial[c * 2 * n + pick * n + i];
        out[i] = static_cast<T>(s);
      }
    }
  });
}

}  // namespace weft::kernels::cpu
