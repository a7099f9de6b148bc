#include "kernels/cpu/lstm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace weft::kernels::cpu {
namespace {

// ---- the cell, row by row ------------------------------------------------------------
// Row layout: gates [i | f | g | o] (H each), c, cNew, hNew, gradients [H].

// Forward of `rows` rows: activations into gates (kept for backward), c' and h'.
template <class T>
void cellForwardRowsLibm(int64_t rows, int64_t H, T* gates, const T* c, T* cNew, T* hNew) {
  auto sigmoid = [](T x) { return T(1) / (T(1) + std::exp(-x)); };
  for (int64_t r = 0; r < rows; ++r) {
    T* gi = gates + r * 4 * H;
    T *gf = gi + H, *gg = gf + H, *go = gg + H;
    for (int64_t j = 0; j < H; ++j) {
      gi[j] = sigmoid(gi[j]);
      gf[j] = sigmoid(gf[j]);
      gg[j] = std::tanh(gg[j]);
      go[j] = sigmoid(go[j]);
      const T cv = gf[j] * c[r * H + j] + gi[j] * gg[j];
      cNew[r * H + j] = cv;
      hNew[r * H + j] = go[j] * std::tanh(cv);
    }
  }
}

// Backward of `rows` rows: from the activations, c, c' and the gradients of h'
// and c', the gradients of the pre-activations and of c.
template <class T>
void cellBackwardRowsLibm(int64_t rows, int64_t H, const T* gates, const T* c, const T* cNew, const T* gradH,
                          const T* gradC, T* gradGates, T* gradCPrev) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* a = gates + r * 4 * H;
    T* d = gradGates + r * 4 * H;
    for (int64_t j = 0; j < H; ++j) {
      const int64_t k = r * H + j;
      const T i = a[j], f = a[H + j], g = a[2 * H + j], o = a[3 * H + j];
      const T tc = std::tanh(cNew[k]);
      const T gh = gradH[k];
      // d/dc' collects the direct gradient and the path through h' = o * tanh(c').
      const T dc = gradC[k] + gh * o * (T(1) - tc * tc);
      d[j] = dc * g * i * (T(1) - i);
      d[H + j] = dc * c[k] * f * (T(1) - f);
      d[2 * H + j] = dc * i * (T(1) - g * g);
      d[3 * H + j] = gh * tc * o * (T(1) - o);
      gradCPrev[k] = dc * f;
    }
  }
}

// The same two in float32, vectorised over the hidden units (vecmath's
// sigmoid and tanh), instantiated for each instruction set below.
template <class V>
WEFT_VEC_INLINE void cellForwardRowsVec(int64_t rows, int64_t H, float* gates, const float* c, float* cNew,
                                        float* hNew) {
  using vecmath::load, vecmath::store;
  for (int64_t r = 0; r < rows; ++r) {
    float* gi = gates + r * 4 * H;
    float *gf = gi + H, *gg = gf + H, *go = gg + H;
    const float* cr = c + r * H;
    float *cn = cNew + r * H, *hn = hNew + r * H;
    vecmath::forEachVector<V>(H, [&](int64_t j, int64_t n) WEFT_VEC_LAMBDA {
      const V i = vecmath::sigmoid(load<V>(gi + j, n)), f = vecmath::sigmoid(load<V>(gf + j, n));
      const V g = vecmath::tanh(load<V>(gg + j, n)), o = vecmath::sigmoid(load<V>(go + j, n));
      store(gi + j, i, n);
      store(gf + j, f, n);
      store(gg + j, g, n);
      store(go + j, o, n);
      const V cv = f * load<V>(cr + j, n) + i * g;
      store(cn + j, cv, n);
      store(hn + j, o * vecmath::tanh(cv), n);
    });
  }
}

template <class V>
WEFT_VEC_INLINE void cellBackwardRowsVec(int64_t rows, int64_t H, const float* gates, const float* c,
                                         const float* cNew, const float* gradH, const float* gradC, float* gradGates,
                                         float* gradCPrev) {
  using vecmath::load, vecmath::store;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = gates + r * 4 * H;
    float* d = gradGates + r * 4 * H;
    const int64_t k = r * H;
    vecmath::forEachVector<V>(H, [&](int64_t j, int64_t n) WEFT_VEC_LAMBDA {
      const V i = load<V>(a + j, n), f = load<V>(a + H + j, n), g = load<V>(a + 2 * H + j, n);
      const V o = load<V>(a + 3 * H + j, n);
      const V tc = vecmath::tanh(load<V>(cNew + k + j, n));
      const V gh = load<V>(gradH + k + j, n);
      const V dc = load<V>(gradC + k + j, n) + gh * o * (1.0f - tc * tc);
      store(d + j, dc * g * i * (1.0f - i), n);
      store(d + H + j, dc * load<V>(c + k + j, n) * f * (1.0f - f), n);
      store(d + 2 * H + j, dc * i * (1.0f - g * g), n);
      store(d + 3 * H + j, gh * tc * o * (1.0f - o), n);
      store(gradCPrev + k + j, dc * f, n);
    });
  }
}

using CellForwardFn = void (*)(int64_t, int64_t, float*, const float*, float*, float*);
using CellBackwardFn = void (*)(int64_t, int64_t, const float*, const float*, const float*, const float*,
                                const float*, float*, float*);

void cellForwardSse2(int64_t rows, int64_t H, float* g, const float* c, float* cn, float* hn) {
  cellForwardRowsVec<vecmath::F4>(rows, H, g, c, cn, hn);
}
__attribute__((target("avx2,fma"))) void cellForwardAvx2(int64_t rows, int64_t H, float* g, const float* c, float* cn,
                                                         float* hn) {
  cellForwardRowsVec<vecmath::F8>(rows, H, g, c, cn, hn);
}
__attribute__((target("avx512f"))) void cellForwardAvx512(int64_t rows, int64_t H, float* g, const float* c,
                                                          float* cn, float* hn) {
  cellForwardRowsVec<vecmath::F16>(rows, H, g, c, cn, hn);
}
void cellBackwardSse2(int64_t rows, int64_t H, const float* g, const float* c, const float* cn, const float* gh,
                      const float* gc, float* dg, float* dc) {
  cellBackwardRowsVec<vecmath::F4>(rows, H, g, c, cn, gh, gc, dg, dc);
}
__attribute__((target("avx2,fma"))) void cellBackwardAvx2(int64_t rows, int64_t H, const float* g, const float* c,
                                                          const float* cn, const float* gh, const float* gc,
                                                          float* dg, float* dc) {
  cellBackwardRowsVec<vecmath::F8>(rows, H, g, c, cn, gh, gc, dg, dc);
}
__attribute__((target("avx512f"))) void cellBackwardAvx512(int64_t rows, int64_t H, const float* g, const float* c,
                                                           const float* cn, const float* gh, const float* gc,
                                                           float* dg, float* dc) {
  cellBackwardRowsVec<vecmath::F16>(rows, H, g, c, cn, gh, gc, dg, dc);
}

// The widest versions this CPU runs, chosen once.
struct CellKernels {
  CellForwardFn forward;
  CellBackwardFn backward;
};
const CellKernels& cellKernels() {
  static const CellKernels k = [] {
    switch (vecmath::bestIsa()) {
      case vecmath::Isa::Avx512: return CellKernels{cellForwardAvx512, cellBackwardAvx512};
      case vecmath::Isa::Avx2: return CellKernels{cellForwardAvx2, cellBackwardAvx2};
      case vecmath::Isa::Sse2: break;
    }
    return CellKernels{cellForwardSse2, cellBackwardSse2};
  }();
  return k;
}

template <class T>
void cellForwardRows(int64_t rows, int64_t H, T* gates, const T* c, T* cNew, T* hNew) {
  if constexpr (std::is_same_v<T, float>) {
    cellKernels().forward(rows, H, gates, c, cNew, hNew);
  } else {
    cellForwardRowsLibm(rows, H, gates, c, cNew, hNew);
  }
}

template <class T>
void cellBackwardRows(int64_t rows, int64_t H, const T* gates, const T* c, const T* cNew, const T* gradH,
                      const T* gradC, T* gradGates, T* gradCPrev) {
  if constexpr (std::is_same_v<T, float>) {
    cellKernels().backward(rows, H, gates, c, cNew, gradH, gradC, gradGates, gradCPrev);
  } else {
    cellBackwardRowsLibm(rows, H, gates, c, cNew, gradH, gradC, gradGates, gradCPrev);
  }
}

// The batch rows of a layer run the recurrence in chunks (parallelForChunks)
// whose number depends only on the batch size (about 16 rows each, at most
// 8), so that results do not depend on the thread count.
int64_t rowChunks(int64_t rows) { return std::clamp<int64_t>(rows / 16, 1, 8); }

}  // namespace

void lstmCellForward(DType type, int64_t n, int64_t hidden, void* gates, const void* c, void* cNew, void* hNew) {
  WEFT_DISPATCH_FLOATING(type, "lstmCell", [&]<class T>() {
    const int64_t H = hidden;
    parallelFor(n, kParallelGrain / (4 * H + 1) + 1, [&](int64_t rb, int64_t re) {
      cellForwardRows(re - rb, H, static_cast<T*>(gates) + rb * 4 * H, static_cast<const T*>(c) + rb * H,
                      static_cast<T*>(cNew) + rb * H, static_cast<T*>(hNew) + rb * H);
    });
  });
}

void lstmCellBackward(DType type, int64_t n, int64_t hidden, const void* gates, const void* c, const void* cNew,
                      const void* gradH, const void* gradC, void* gradGates, void* gradCPrev) {
  WEFT_DISPATCH_FLOATING(type, "lstmCell backward", [&]<class T>() {
    const int64_t H = hidden;
    parallelFor(n, kParallelGrain / (4 * H + 1) + 1, [&](int64_t rb, int64_t re) {
      cellBackwardRows(re - rb, H, static_cast<const T*>(gates) + rb * 4 * H, static_cast<const T*>(c) + rb * H,
                       static_cast<const T*>(cNew) + rb * H, static_cast<const T*>(gradH) + rb * H,
                       static_cast<const T*>(gradC) + rb * H, static_cast<T*>(gradGates) + rb * 4 * H,
                       static_cast<T*>(gradCPrev) + rb * H);
    });
  });
}

void lstmLayerForward(DType type, const LstmLayerGeometry& g, const void* x, const void* h0, const void* c0,
                      const void* wIh, const void* wHh, const void* bias, void* gates, void* hs, void* cs) {
  WEFT_DISPATCH_FLOATING(type, "lstmLayer", [&]<class T>() {
    const int64_t T_ = g.steps, N = g.batch, I = g.input, H = g.hidden, G = 4 * H;
    T* pg = static_cast<T*>(gates);
    T* phs = static_cast<T*>(hs);
    T* pcs = static_cast<T*>(cs);
    // The input projection of every step at once: gates = x · wIh^T + bias.
    double beta = 0.0;
    if (bias) {
      fillRows(type, bias, T_ * N, G, gates, G);
      beta = 1.0;
    }
    gemm(type, {x, false, I}, {wIh, true, I}, T_ * N, G, I, 1.0, beta, gates, G);
    // The recurrence, each chunk of batch rows on its own. Its products read
    // wHh^T stored as such: BLAS handles these small [rows, H] x [H, 4H]
    // products faster untransposed (no packing of B per call).
    std::unique_ptr<T[]> wHhT(new T[static_cast<size_t>(H * G)]);
    const T* pw = static_cast<const T*>(wHh);
    for (int64_t r = 0; r < G; ++r) {
      for (int64_t k = 0; k < H; ++k) wHhT[static_cast<size_t>(k * G + r)] = pw[r * H + k];
    }
    parallelForChunks(N, rowChunks(N), [&](int64_t, int64_t rb, int64_t re, int) {
      const int64_t rows = re - rb;
      for (int64_t s = 0; s < T_; ++s) {
        T* gs = pg + (s * N + rb) * G;
        const T* hPrev = s == 0 ? static_cast<const T*>(h0) + rb * H : phs + ((s - 1) * N + rb) * H;
        const T* cPrev = s == 0 ? static_cast<const T*>(c0) + rb * H : pcs + ((s - 1) * N + rb) * H;
        gemm(type, {hPrev, false, H}, {wHhT.get(), false, G}, rows, G, H, 1.0, 1.0, gs, G);
        cellForwardRows<T>(rows, H, gs, cPrev, pcs + (s * N + rb) * H, phs + (s * N + rb) * H);
      }
    });
  });
}

void lstmLayerBackward(DType type, const LstmLayerGeometry& g, const LstmLayerSaved& saved,
                       const LstmLayerGrads& in, void* gradGates, const LstmLayerGradOut& out) {
  WEFT_DISPATCH_FLOATING(type, "lstmLayer backward", [&]<class T>() {
    const int64_t T_ = g.steps, N = g.batch, I = g.input, H = g.hidden, G = 4 * H;
    const T* pg = static_cast<const T*>(saved.gates);
    const T* phs = static_cast<const T*>(saved.hs);
    const T* pcs = static_cast<const T*>(saved.cs);
    const T* gOut = static_cast<const T*>(in.output);
    const T* ghT = static_cast<const T*>(in.hLast);
    const T* gcT = static_cast<const T*>(in.cLast);
    T* dg = static_cast<T*>(gradGates);
    T* gh0 = static_cast<T*>(out.h0);
    T* gc0 = static_cast<T*>(out.c0);
    // Back through time, each chunk of batch rows on its own: dh and dc are
    // the gradients reaching h_s and c_s from step s + 1 (and from hLast,
    // cLast at the end); they end as the gradients of h0 and c0.
    parallelForChunks(N, rowChunks(N), [&](int64_t, int64_t rb, int64_t re, int) {
      const int64_t rows = re - rb, len = rows * H;
      std::unique_ptr<T[]> buf(new T[static_cast<size_t>(4 * len)]);
      T* dh = buf.get();
      T* dc = dh + len;
      T* dhTotal = dc + len;
      T* dcPrev = dhTotal + len;
      if (ghT) std::memcpy(dh, ghT + rb * H, sizeof(T) * len);
      else std::fill(dh, dh + len, T(0));
      if (gcT) std::memcpy(dc, gcT + rb * H, sizeof(T) * len);
      else std::fill(dc, dc + len, T(0));
      for (int64_t s = T_ - 1; s >= 0; --s) {
        const int64_t off = (s * N + rb) * H;
        if (gOut) {
          for (int64_t k = 0; k < len; ++k) dhTotal[k] = gOut[off + k] + dh[k];
        } else {
          std::memcpy(dhTotal, dh, sizeof(T) * len);
        }
        const T* cPrev = s == 0 ? static_cast<const T*>(saved.c0) + rb * H : pcs + off - N * H;
        T* dgs = dg + (s * N + rb) * G;
        cellBackwardRows<T>(rows, H, pg + (s * N + rb) * G, cPrev, pcs + off, dhTotal, dc, dgs, dcPrev);
        gemm(type, {dgs, false, G}, {saved.wHh, false, H}, rows, H, G, 1.0, 0.0, dh, H);  // dh = dGates_s · wHh
        std::swap(dc, dcPrev);
      }
      std::memcpy(gh0 + rb * H, dh, sizeof(T) * len);
      std::memcpy(gc0 + rb * H, dc, sizeof(T) * len);
    });
    // The weights see every step at once: dx = dGates · wIh, and one product
    // dGates^T · [x | h_{s-1} | 1] gives the wIh, wHh and bias gradients
    // together (a column of ones sums dGates over the steps and rows).
    const int64_t M = T_ * N;
    if (out.x) gemm(type, {dg, false, G}, {saved.wIh, false, I}, M, I, G, 1.0, 0.0, out.x, I);
    const int64_t xCols = out.wIh ? I : 0, hCols = out.wHh ? H : 0, W = xCols + hCols + (out.bias ? 1 : 0);
    if (W == 0) return;
    std::unique_ptr<T[]> inputs(new T[static_cast<size_t>(M * W)]), dW(new T[static_cast<size_t>(G * W)]);
    const T* px = static_cast<const T*>(saved.x);
    const T* ph0 = static_cast<const T*>(saved.h0);
    for (int64_t m = 0; m < M; ++m) {
      T* row = inputs.get() + m * W;
      if (xCols) std::memcpy(row, px + m * I, sizeof(T) * I);
      if (hCols) std::memcpy(row + xCols, m < N ? ph0 + m * H : phs + (m - N) * H, sizeof(T) * H);  // h_{s-1}
      if (out.bias) row[W - 1] = T(1);
    }
    gemm(type, {dg, true, G}, {inputs.get(), false, W}, G, W, M, 1.0, 0.0, dW.get(), W);
    for (int64_t r = 0; r < G; ++r) {
      const T* row = dW.get() + r * W;
      if (xCols) std::memcpy(static_cast<T*>(out.wIh) + r * I, row, sizeof(T) * I);
      if (hCols) std::memcpy(static_cast<T*>(out.wHh) + r * H, row + xCols, sizeof(T) * H);
      if (out.bias) static_cast<T*>(out.bias)[r] = row[W - 1];
    }
  });
}

}  // namespace weft::kernels::cpu
