#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

// float32 sums accumulate in float64, bfloat16/float16 sums in float32.
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, float>, double, std::conditional_t<kIsHalfType<T>, float, T>>;

// True when v should replace the current extremum `best`: strictly larger
// (smaller), or the first NaN. Once best is NaN no number beats it, because
// every comparison with NaN is false.
template <class T, bool IsMax>
inline bool beats(T v, T best) {
  if constexpr (std::is_floating_point_v<T> || kIsHalfType<T>) {
    if (std::isnan(static_cast<float>(v))) return !std::isnan(static_cast<float>(best));
  }
  return IsMax ? v > best : v < best;
}

// Columns of `inner` are processed in blocks of this many, so a block's
// running extrema live on the stack while the R rows stream past.
constexpr int64_t kInnerBlock = 256;

template <class T, bool IsMax>
void extremumTyped(const T* p, int64_t outer, int64_t R, int64_t inner, T* values, int64_t* indices) {
  if (outer * inner == 1 && parallelChunkCount(R, kParallelGrain) > 1) {
    // One long reduction: a partial result per chunk, combined in chunk
    // order, which keeps the first position on ties.
    const int nt = static_cast<int>(parallelChunkCount(R, kParallelGrain));
    std::vector<T> partialValue(nt);
    std::vector<int64_t> partialIndex(nt, -1);
    parallelForChunks(R, nt, [&](int64_t c, int64_t b, int64_t e, int) {
      T bv = p[b];
      int64_t bi = b;
      for (int64_t i = b + 1; i < e; ++i) {
        if (beats<T, IsMax>(p[i], bv)) {
          bv = p[i];
          bi = i;
        }
      }
      partialValue[c] = bv;
      partialIndex[c] = bi;
    });
    T bv{};
    int64_t bi = -1;
    for (int t = 0; t < nt; ++t) {
      if (partialIndex[t] < 0) continue;
      if (bi < 0 || beats<T, IsMax>(partialValue[t], bv)) {
        bv = partialValue[t];
        bi = partialIndex[t];
      }
    }
    if (values) values[0] = bv;
    if (indices) indices[0] = bi;
    return;
  }
  forEachColumnBlock<kInnerBlock>(outer, R, inner, [&](int64_t o, int64_t ib, int64_t n) {
    const T* base = p + o * R * inner + ib;
    int64_t outAt = o * inner + ib;
    if (inner == 1) {
      T bv = base[0];
      int64_t bi = 0;
      for (int64_t r = 1; r < R; ++r) {
        if (beats<T, IsMax>(base[r], bv)) {
          bv = base[r];
          bi = r;
        }
      }
      if (values) values[outAt] = bv;
      if (indices) indices[outAt] = bi;
      return;
    }
    T bv[kInnerBlock];
    int64_t bi[kInnerBlock];
    for (int64_t i = 0; i < n; ++i) {
      bv[i] = base[i];
      bi[i] = 0;
    }
    for (int64_t r = 1; r < R; ++r) {
      const T* row = base + r * inner;
      for (int64_t i = 0; i < n; ++i) {
        if (beats<T, IsMax>(row[i], bv[i])) {
          bv[i] = row[i];
          bi[i] = r;
        }
      }
    }
    if (values) std::copy(bv, bv + n, values + outAt);
    if (indices) std::copy(bi, bi + n, indices + outAt);
  });
}

}  // namespace

void sumRows(DType type, const void* in, int64_t K, int64_t R, void* out) {
  WEFT_DISPATCH_NUMERIC_AND_HALF(type, "sum", [&]<class T>() {
    const T* p = static_cast<const T*>(in);
    T* o = static_cast<T*>(out);
    if (K == 1 && R >= kParallelGrain) {
      // One long row: per-chunk partial sums, combined in chunk order.
      const int64_t chunks = parallelChunkCount(R, kParallelGrain);
      std::vector<Acc<T>> partial(static_cast<size_t>(chunks), Acc<T>(0));
      parallelForChunks(R, chunks, [&](int64_t c, int64_t b, int64_t e, int) {
        Acc<T> s = 0;
        for (int64_t i = b; i < e; ++i) s += p[i];
        partial[static_cast<size_t>(c)] = s;
      });
      Acc<T> s = 0;
      for (auto v : partial) s += v;
      o[0] = static_cast<T>(s);
      return;
    }
    parallelFor(K, kParallelGrain / (R > 0 ? R : 1) + 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        const T* row = p + k * R;
        Acc<T> s = 0;
        for (int64_t r = 0; r < R; ++r) s += row[r];
        o[k] = static_cast<T>(s);
      }
    });
  });
}

void sumCols(DType type, const void* in, int64_t R, int64_t K, void* out) {
  WEFT_DISPATCH_NUMERIC_AND_HALF(type, "sum", [&]<class T>() {
    const T* p = static_cast<const T*>(in);
    T* o = static_cast<T*>(out);
    // Each thread owns a slice of columns and walks all rows over it.
    parallelFor(K, kParallelGrain / (R > 0 ? R : 1) + 1, [&](int64_t b, int64_t e) {
      if constexpr (kIsHalfType<T>) {
        std::vector<float> acc(static_cast<size_t>(e - b), 0.0f);
        for (int64_t r = 0; r < R; ++r) {
          const T* row = p + r * K + b;
          for (int64_t k = 0; k < e - b; ++k) acc[static_cast<size_t>(k)] += static_cast<float>(row[k]);
        }
        for (int64_t k = b; k < e; ++k) o[k] = T(acc[static_cast<size_t>(k - b)]);
      } else {
        for (int64_t k = b; k < e; ++k) o[k] = T(0);
        for (int64_t r = 0; r < R; ++r) {
          const T* row = p + r * K;
          for (int64_t k = b; k < e; ++k) o[k] += row[k];
        }
      }
    });
  });
}

void extremumForward(DType type, const void* in, int64_t outer, int64_t R, int64_t inner, bool isMax, void* values,
                     int64_t* indices) {
  WEFT_DISPATCH_NUMERIC_AND_HALF(type, isMax ? "max" : "min", [&]<class T>() {
    const T* p = static_cast<const T*>(in);
    T* v = static_cast<T*>(values);
    if (isMax) {
      extremumTyped<T, true>(p, outer, R, inner, v, indices);
    } else {
      extremumTyped<T, false>(p, outer, R, inner, v, indices);
    }
  });
}

void extremumBackward(DType type, const void* g, const int64_t* indices, int64_t outer, int64_t R, int64_t inner,
                      void* gradIn) {
  WEFT_DISPATCH_NUMERIC_AND_HALF(type, "max/min backward", [&]<class T>() {
    const T* go = static_cast<const T*>(g);
    T* gi = static_cast<T*>(gradIn);
    parallelFor(outer, kParallelGrain / (R * inner > 0 ? R * inner : 1) + 1, [&](int64_t b, int64_t e) {
      std::memset(static_cast<void*>(gi + b * R * inner), 0, sizeof(T) * static_cast<size_t>((e - b) * R * inner));
      for (int64_t o = b; o < e; ++o) {
        T* slab = gi + o * R * inner;
        const T* grow = go + o * inner;
        const int64_t* irow = indices + o * inner;
        for (int64_t i = 0; i < inner; ++i) slab[irow[i] * inner + i] = grow[i];
      }
    });
  });
}

}  // namespace weft::kernels::cpu
