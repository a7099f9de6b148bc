#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace weft::kernels::cpu {
namespace {

constexpr int64_t kBq = kAttentionQueryBlock;
constexpr int64_t kBk = kAttentionKeyBlock;

int64_t blocks(int64_t n, int64_t len) { return (n + len - 1) / len; }

// Where the rows of one operand lie: row i of batch-head bh starts at
// at(bh, i) and each row is headDim contiguous elements.
struct Operand {
  int64_t batch, head, row, heads;
  int64_t at(int64_t bh, int64_t i) const {
    return (heads > 0 ? (bh / heads) * batch + (bh % heads) * head : bh * batch) + i * row;
  }
};

Operand operand(const AttentionGeometry& g, const AttentionLayout& l, int64_t rows) {
  if (l.row == 0) return {rows * g.headDim, 0, g.headDim, 0};
  return {l.batch, l.head, l.row, g.heads};
}

// x[c] = exp(x[c] - shift) for c < n.
template <class T>
void expShifted(T* x, int64_t n, T shift) {
  for (int64_t c = 0; c < n; ++c) x[c] -= shift;
  if constexpr (std::is_same_v<T, float>) {
    vecmath::expRow(x, x, n);
  } else {
    for (int64_t c = 0; c < n; ++c) x[c] = std::exp(x[c]);
  }
}

// Which keys each query row of a tile sees, and the dropout of the tile.
struct Tile {
  const AttentionGeometry* g;
  int64_t bh, i0, j0, rows, cols;

  // Keys j0 .. j0 + visible(r) - 1 are visible to query i0 + r.
  int64_t visible(int64_t r) const {
    if (!g->causal) return cols;
    const int64_t last = i0 + r + g->queryOffset - g->keyOffset;  // last visible key, absolute in this call
    return std::clamp<int64_t>(last - j0 + 1, 0, cols);
  }
  // True when every query of the tile sees every key of it.
  bool fullyVisible() const { return !g->causal || visible(0) == cols; }

  // p[r, c] *= the dropout scale of element (i0 + r, j0 + c); ld: p's row length.
  template <class T>
  void applyDropout(T* p, int64_t ld) const {
    if (g->dropout <= 0.0) return;
    const double pr = g->dropout;
    const auto threshold = static_cast<uint64_t>(std::ceil(pr * 0x1.0p53));
    const T keep = pr >= 1.0 ? T(0) : static_cast<T>(1.0 / (1.0 - pr));
    for (int64_t r = 0; r < rows; ++r) {
      const uint64_t base =
          g->frameHeads > 0
              ? static_cast<uint64_t>(
                    (((bh / g->heads) * g->frameHeads + g->frameHeadOffset + bh % g->heads) * g->frameQueries +
                     g->queryOffset + i0 + r) *
                        g->frameKeys +
                    g->keyOffset + j0)
              : static_cast<uint64_t>((bh * g->queries + i0 + r) * g->keys + j0);
      T* row = p + r * ld;
      for (int64_t c = 0; c < cols; ++c) {
        const bool kept = (attentionDropoutBits(g->seed, base + static_cast<uint64_t>(c)) >> 11) >= threshold;
        row[c] *= kept ? keep : T(0);
      }
    }
  }
};

// The first query block that sees key block [j0, ...), and one past the last
// key block query block [i0, i0 + rows) sees.
int64_t firstQueryBlock(const AttentionGeometry& g, int64_t j0) {
  if (!g.causal) return 0;
  const int64_t firstQuery = std::max<int64_t>(0, j0 - (g.queryOffset - g.keyOffset));
  return std::min(firstQuery, g.queries) / kBq;
}
int64_t keyBlockEnd(const AttentionGeometry& g, int64_t i0, int64_t rows) {
  if (!g.causal) return blocks(g.keys, kBk);
  const int64_t keysSeen = std::clamp<int64_t>(i0 + rows + g.queryOffset - g.keyOffset, 0, g.keys);
  return blocks(keysSeen, kBk);
}

template <class T>
void forward(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, T* lse) {
  const int64_t Sq = g.queries, Sk = g.keys, D = g.headDim;
  const Operand oq = operand(g, g.qLayout, Sq), ok = operand(g, g.kLayout, Sk), ov = operand(g, g.vLayout, Sk),
                oo = operand(g, g.outLayout, Sq);
  const int64_t qBlocks = blocks(Sq, kBq), tasks = g.batchHeads * qBlocks;
  const int threads = threadsFor(tasks, numThreads());
  std::vector<std::vector<T>> scratch(threads);
  const DType dt = kDTypeOf<T>;
  parallelRun(tasks, threads, [&](int64_t task, int thread) {
    const int64_t bh = task / qBlocks, i0 = (task % qBlocks) * kBq, rows = std::min(kBq, Sq - i0);
    std::vector<T>& s = scratch[thread];
    s.resize(kBq * kBk);
    double m[kBq], l[kBq];
    std::fill(m, m + rows, -std::numeric_limits<double>::infinity());
    std::fill(l, l + rows, 0.0);
    const T* Q = q + oq.at(bh, i0);
    T* O = out + oo.at(bh, i0);
    for (int64_t r = 0; r < rows; ++r) std::fill(O + r * oo.row, O + r * oo.row + D, T(0));
    const int64_t kEnd = keyBlockEnd(g, i0, rows);
    for (int64_t kb = 0; kb < kEnd; ++kb) {
      const int64_t j0 = kb * kBk, cols = std::min(kBk, Sk - j0);
      const Tile tile{&g, bh, i0, j0, rows, cols};
      const T* K = k + ok.at(bh, j0);
      const T* V = v + ov.at(bh, j0);
      gemm(dt, {Q, false, oq.row}, {K, true, ok.row}, rows, cols, D, g.scale, 0.0, s.data(), cols);
      for (int64_t r = 0; r < rows; ++r) {
        T* row = s.data() + r * cols;
        const int64_t vis = tile.visible(r);
        if (vis == 0) {
          std::fill(row, row + cols, T(0));
          continue;
        }
        T mx = row[0];
        for (int64_t c = 1; c < vis; ++c) mx = std::max(mx, row[c]);
        const double mNew = std::max(m[r], static_cast<double>(mx));
        const T shift = static_cast<T>(mNew);
        expShifted(row, vis, shift);
        std::fill(row + vis, row + cols, T(0));
        double sum = 0;
        for (int64_t c = 0; c < vis; ++c) sum += row[c];
        if (m[r] != mNew) {
          // The running maximum grew: what was accumulated against the old
          // one shrinks by exp(old - new) (0 when nothing was seen yet).
          const double alpha = std::exp(m[r] - mNew);
          l[r] *= alpha;
          T* o = O + r * oo.row;
          for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(o[d] * alpha);
          m[r] = mNew;
        }
        l[r] += sum;
      }
      tile.applyDropout(s.data(), cols);
      gemm(dt, {s.data(), false, cols}, {V, false, ov.row}, rows, D, cols, 1.0, 1.0, O, oo.row);
    }
    for (int64_t r = 0; r < rows; ++r) {
      T* o = O + r * oo.row;
      if (l[r] == 0.0) {
        std::fill(o, o + D, T(0));
        lse[bh * Sq + i0 + r] = -std::numeric_limits<T>::infinity();
        continue;
      }
      const double inv = 1.0 / l[r];
      for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(o[d] * inv);
      lse[bh * Sq + i0 + r] = static_cast<T>(m[r] + std::log(l[r]));
    }
  });
}

// Per-thread tiles of the backward passes.
template <class T>
struct BackwardScratch {
  std::vector<T> p, pd, dp;
  void size() {
    p.resize(kBq * kBk);
    pd.resize(kBq * kBk);
    dp.resize(kBq * kBk);
  }
};

// Fills P = exp(S - lse) (0 where masked or the row sees nothing) into
// sc.p, P ∘ Z into sc.pd when dropout is on, and dS = P ∘ (dP ∘ Z - delta)
// into sc.dp, for one tile. Returns the tile's P ∘ Z (sc.p without dropout).
template <class T>
const T* tileGradient(const AttentionGeometry& g, const Tile& tile, const T* Q, int64_t ldq, const T* K, int64_t ldk,
                      const T* V, int64_t ldv, const T* dO, int64_t lddo, const T* lseRows, const double* deltaRows,
                      BackwardScratch<T>& sc) {
  const DType dt = kDTypeOf<T>;
  const int64_t D = g.headDim, rows = tile.rows, cols = tile.cols;
  T* p = sc.p.data();
  T* dp = sc.dp.data();
  gemm(dt, {Q, false, ldq}, {K, true, ldk}, rows, cols, D, g.scale, 0.0, p, cols);
  for (int64_t r = 0; r < rows; ++r) {
    T* row = p + r * cols;
    const int64_t vis = std::isinf(lseRows[r]) ? 0 : tile.visible(r);
    expShifted(row, vis, lseRows[r]);
    std::fill(row + vis, row + cols, T(0));
  }
  // dP = dO V^T
  gemm(dt, {dO, false, lddo}, {V, true, ldv}, rows, cols, D, 1.0, 0.0, dp, cols);
  const T* pz = p;
  if (g.dropout > 0.0) {
    std::copy(p, p + rows * cols, sc.pd.data());
    tile.applyDropout(sc.pd.data(), cols);
    tile.applyDropout(dp, cols);
    pz = sc.pd.data();
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T delta = static_cast<T>(deltaRows[r]);
    T* d = dp + r * cols;
    const T* pr = p + r * cols;
    for (int64_t c = 0; c < cols; ++c) d[c] = pr[c] * (d[c] - delta);
  }
  return pz;
}

template <class T>
void backward(const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out, const T* lse,
              const T* gradOut, const T* gradLse, T* gradQ, T* gradK, T* gradV) {
  const int64_t Sq = g.queries, Sk = g.keys, D = g.headDim, BH = g.batchHeads;
  const Operand oq = operand(g, g.qLayout, Sq), ok = operand(g, g.kLayout, Sk), ov = operand(g, g.vLayout, Sk),
                oo = operand(g, g.outLayout, Sq), ogo = operand(g, g.gradOutLayout, Sq),
                ogq = operand(g, g.gradQLayout, Sq), ogk = operand(g, g.gradKLayout, Sk),
                ogv = operand(g, g.gradVLayout, Sk);
  const DType dt = kDTypeOf<T>;
  // delta_i = rowsum(dO ∘ O) - dLse_i
  std::vector<double> delta(static_cast<size_t>(BH * Sq));
  parallelFor(BH * Sq, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* go = gradOut + ogo.at(r / Sq, r % Sq);
      const T* o = out + oo.at(r / Sq, r % Sq);
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += static_cast<double>(go[d]) * o[d];
      delta[r] = s - (gradLse ? static_cast<double>(gradLse[r]) : 0.0);
    }
  });
  const int64_t qBlocks = blocks(Sq, kBq), kBlocks = blocks(Sk, kBk);

  // Key block kb of batch-head bh: its dK and dV rows from every query block
  // that sees it; with gradQToo, each tile also adds dQ += scale dS K.
  auto keyBlock = [&](int64_t bh, int64_t kb, BackwardScratch<T>& sc, bool gradQToo) {
    const int64_t j0 = kb * kBk, cols = std::min(kBk, Sk - j0);
    const T* K = k + ok.at(bh, j0);
    const T* V = v + ov.at(bh, j0);
    T* dK = gradK + ogk.at(bh, j0);
    T* dV = gradV + ogv.at(bh, j0);
    for (int64_t c = 0; c < cols; ++c) {
      std::fill(dK + c * ogk.row, dK + c * ogk.row + D, T(0));
      std::fill(dV + c * ogv.row, dV + c * ogv.row + D, T(0));
    }
    for (int64_t qb = firstQueryBlock(g, j0); qb < qBlocks; ++qb) {
      const int64_t i0 = qb * kBq, rows = std::min(kBq, Sq - i0);
      const Tile tile{&g, bh, i0, j0, rows, cols};
      if (g.causal && tile.visible(rows - 1) == 0) continue;
      const T* Q = q + oq.at(bh, i0);
      const T* dO = gradOut + ogo.at(bh, i0);
      const T* pz = tileGradient(g, tile, Q, oq.row, K, ok.row, V, ov.row, dO, ogo.row, lse + bh * Sq + i0,
                                 delta.data() + bh * Sq + i0, sc);
      // dV += (P ∘ Z)^T dO, dK += scale dS^T Q
      gemm(dt, {pz, true, cols}, {dO, false, ogo.row}, cols, D, rows, 1.0, 1.0, dV, ogv.row);
      gemm(dt, {sc.dp.data(), true, cols}, {Q, false, oq.row}, cols, D, rows, g.scale, 1.0, dK, ogk.row);
      if (gradQToo) {
        gemm(dt, {sc.dp.data(), false, cols}, {K, false, ok.row}, rows, D, cols, g.scale, 1.0,
             gradQ + ogq.at(bh, i0), ogq.row);
      }
    }
  };

  if (gradK && gradQ && BH >= 2 * static_cast<int64_t>(numThreads())) {
    // One pass, tasks = batch-heads: a task owns every gradient row of its
    // batch-head, so dQ += scale dS K joins the tile loop of pass 1 and S
    // and dP are computed once. The key blocks are the outer loop, so each
    // dQ row receives its key blocks in the order of pass 2: the same GEMMs
    // in the same order, the same bits.
    const int threads = threadsFor(BH, numThreads());
    std::vector<BackwardScratch<T>> scratch(threads);
    parallelRun(BH, threads, [&](int64_t bh, int thread) {
      BackwardScratch<T>& sc = scratch[thread];
      sc.size();
      for (int64_t i = 0; i < Sq; ++i) std::fill(gradQ + ogq.at(bh, i), gradQ + ogq.at(bh, i) + D, T(0));
      for (int64_t kb = 0; kb < kBlocks; ++kb) keyBlock(bh, kb, sc, true);
    });
    return;
  }

  if (gradK) {
    const int64_t tasks = BH * kBlocks;
    const int threads = threadsFor(tasks, numThreads());
    std::vector<BackwardScratch<T>> scratch(threads);
    parallelRun(tasks, threads, [&](int64_t task, int thread) {
      BackwardScratch<T>& sc = scratch[thread];
      sc.size();
      keyBlock(task / kBlocks, task % kBlocks, sc, false);
    });
  }

  if (gradQ) {
    const int64_t tasks = BH * qBlocks;
    const int threads = threadsFor(tasks, numThreads());
    std::vector<BackwardScratch<T>> scratch(threads);
    parallelRun(tasks, threads, [&](int64_t task, int thread) {
      const int64_t bh = task / qBlocks, i0 = (task % qBlocks) * kBq, rows = std::min(kBq, Sq - i0);
      BackwardScratch<T>& sc = scratch[thread];
      sc.size();
      const T* Q = q + oq.at(bh, i0);
      const T* dO = gradOut + ogo.at(bh, i0);
      T* dQ = gradQ + ogq.at(bh, i0);
      for (int64_t r = 0; r < rows; ++r) std::fill(dQ + r * ogq.row, dQ + r * ogq.row + D, T(0));
      const int64_t kEnd = keyBlockEnd(g, i0, rows);
      for (int64_t kb = 0; kb < kEnd; ++kb) {
        const int64_t j0 = kb * kBk, cols = std::min(kBk, Sk - j0);
        const Tile tile{&g, bh, i0, j0, rows, cols};
        const T* K = k + ok.at(bh, j0);
        const T* V = v + ov.at(bh, j0);
        tileGradient(g, tile, Q, oq.row, K, ok.row, V, ov.row, dO, ogo.row, lse + bh * Sq + i0,
                     delta.data() + bh * Sq + i0, sc);
        // dQ += scale dS K
        gemm(dt, {sc.dp.data(), false, cols}, {K, false, ok.row}, rows, D, cols, g.scale, 1.0, dQ, ogq.row);
      }
    });
  }
}

template <class T>
void mergeForward(int64_t rows, int64_t D, const T* oA, const T* lA, const T* oB, const T* lB, T* out, T* lse) {
  parallelFor(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const double la = lA[r], lb = lB[r], m = std::max(la, lb);
      T* o = out + r * D;
      if (m == -std::numeric_limits<double>::infinity()) {
        std::fill(o, o + D, T(0));
        lse[r] = -std::numeric_limits<T>::infinity();
        continue;
      }
      const double ea = std::exp(la - m), eb = std::exp(lb - m), s = ea + eb;
      const double a = ea / s, w = eb / s;
      for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(a * oA[r * D + d] + w * oB[r * D + d]);
      lse[r] = static_cast<T>(m + std::log(s));
    }
  });
}

template <class T>
void mergeBackward(int64_t rows, int64_t D, const T* oA, const T* lA, const T* oB, const T* lB, const T* out,
                   const T* lse, const T* gOut, const T* gLse, T* gOA, T* gLA, T* gOB, T* gLB) {
  parallelFor(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const bool empty = std::isinf(static_cast<double>(lse[r])) && lse[r] < 0;
      // The weights as the forward computed them (exp(lseX - lse) would
      // round lse's float32 value again).
      double a = 0, w = 0;
      if (!empty) {
        const double la = lA[r], lb = lB[r], m = std::max(la, lb);
        const double ea = std::exp(la - m), eb = std::exp(lb - m), s = ea + eb;
        a = ea / s;
        w = eb / s;
      }
      const T* go = gOut + r * D;
      double dotA = 0, dotB = 0;
      for (int64_t d = 0; d < D; ++d) {
        dotA += static_cast<double>(go[d]) * (static_cast<double>(oA[r * D + d]) - out[r * D + d]);
        dotB += static_cast<double>(go[d]) * (static_cast<double>(oB[r * D + d]) - out[r * D + d]);
      }
      if (gOA) {
        for (int64_t d = 0; d < D; ++d) gOA[r * D + d] = static_cast<T>(a * go[d]);
      }
      if (gOB) {
        for (int64_t d = 0; d < D; ++d) gOB[r * D + d] = static_cast<T>(w * go[d]);
      }
      if (gLA) gLA[r] = static_cast<T>(a == 0 ? 0.0 : a * (gLse[r] + dotA));
      if (gLB) gLB[r] = static_cast<T>(w == 0 ? 0.0 : w * (gLse[r] + dotB));
    }
  });
}

}  // namespace

void attentionForward(DType type, const AttentionGeometry& g, const void* q, const void* k, const void* v, void* out,
                      void* lse) {
  WEFT_DISPATCH_FLOATING(type, "scaledDotProductAttention", [&]<class T>() {
    forward<T>(g, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out),
               static_cast<T*>(lse));
  });
}

void attentionBackward(DType type, const AttentionGeometry& g, const void* q, const void* k, const void* v,
                       const void* out, const void* lse, const void* gradOut, const void* gradLse, void* gradQ,
                       void* gradK, void* gradV) {
  WEFT_DISPATCH_FLOATING(type, "scaledDotProductAttention backward", [&]<class T>() {
    backward<T>(g, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                static_cast<const T*>(out), static_cast<const T*>(lse), static_cast<const T*>(gradOut),
                static_cast<const T*>(gradLse), static_cast<T*>(gradQ), static_cast<T*>(gradK),
                static_cast<T*>(gradV));
  });
}

void mergeAttentionForward(DType type, int64_t rows, int64_t headDim, const void* outA, const void* lseA,
                           const void* outB, const void* lseB, void* out, void* lse) {
  WEFT_DISPATCH_FLOATING(type, "mergeAttention", [&]<class T>() {
    mergeForward<T>(rows, headDim, static_cast<const T*>(outA), static_cast<const T*>(lseA),
                    static_cast<const T*>(outB), static_cast<const T*>(lseB), static_cast<T*>(out),
                    static_cast<T*>(lse));
  });
}

void mergeAttentionBackward(DType type, int64_t rows, int64_t headDim, const void* outA, const void* lseA,
                            const void* outB, const void* lseB, const void* out, const void* lse,
                            const void* gradOut, const void* gradLse, void* gradOutA, void* gradLseA, void* gradOutB,
                            void* gradLseB) {
  WEFT_DISPATCH_FLOATING(type, "mergeAttention backward", [&]<class T>() {
    mergeBackward<T>(rows, headDim, static_cast<const T*>(outA), static_cast<const T*>(lseA),
                     static_cast<const T*>(outB), static_cast<const T*>(lseB), static_cast<const T*>(out),
                     static_cast<const T*>(lse), static_cast<const T*>(gradOut), static_cast<const T*>(gradLse),
                     static_cast<T*>(gradOutA), static_cast<T*>(gradLseA), static_cast<T*>(gradOutB),
                     static_cast<T*>(gradLseB));
  });
}

}  // namespace weft::kernels::cpu
