#include "kernels/cpu/embedding.h"

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

// Calls fn(rowBegin, rowEnd) over [0, num), one range per thread when the
// scatter touches enough elements to pay for threads. Each thread scans every
// index and keeps the rows inside its own range, so no two threads write the
// same row.
template <class F>
void overRowRanges(int64_t num, int64_t work, F&& fn) {
  if (work < kParallelGrain) {
    fn(int64_t{0}, num);
  } else {
    parallelFor(num, 1, fn);
  }
}

int64_t rowGrain(int64_t dim) { return kParallelGrain / (dim > 0 ? dim : 1) + 1; }

}  // namespace

void checkEmbeddingIndices(const char* op, const int64_t* indices, int64_t n, int64_t num) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = indices[i];
    WEFT_ENFORCE(v >= 0 && v < num, IndexError, op, ": index ", v, " (at position ", i,
                 ") is out of range for a table of ", num, " rows");
  }
}

void embeddingForward(DType type, const void* weight, int64_t num, int64_t dim, const int64_t* indices, int64_t n,
                      void* out) {
  WEFT_DISPATCH_FLOATING(type, "embedding", [&]<class T>() {
    const T* w = static_cast<const T*>(weight);
    T* o = static_cast<T*>(out);
    parallelFor(n, rowGrain(dim), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) std::memcpy(o + i * dim, w + indices[i] * dim, sizeof(T) * dim);
    });
  });
}

void embeddingBackward(DType type, const void* grad, const int64_t* indices, int64_t n, int64_t num, int64_t dim,
                       void* gradWeight) {
  WEFT_DISPATCH_FLOATING(type, "embedding backward", [&]<class T>() {
    const T* g = static_cast<const T*>(grad);
    T* gw = static_cast<T*>(gradWeight);
    overRowRanges(num, n * dim, [&](int64_t rb, int64_t re) {
      for (int64_t i = 0; i < n; ++i) {
        int64_t r = indices[i];
        if (r < rb || r >= re) continue;
        T* dst = gw + r * dim;
        const T* src = g + i * dim;
        for (int64_t d = 0; d < dim; ++d) dst[d] += src[d];
      }
    });
  });
}

void embeddingBagForward(DType type, const void* weight, int64_t num, int64_t dim, const int64_t* indices,
                         const int64_t* bagStarts, int64_t bags, BagReduce mode, const void* perSampleWeights,
                         void* out, int64_t* maxIndices) {
  WEFT_DISPATCH_FLOATING(type, "embeddingBag", [&]<class T>() {
    const T* w = static_cast<const T*>(weight);
    const T* psw = static_cast<const T*>(perSampleWeights);
    T* o = static_cast<T*>(out);
    int64_t avgBag = bags > 0 ? bagStarts[bags] / bags + 1 : 1;
    parallelFor(bags, rowGrain(dim * avgBag), [&](int64_t bb, int64_t be) {
      for (int64_t b = bb; b < be; ++b) {
        T* row = o + b * dim;
        int64_t begin = bagStarts[b], end = bagStarts[b + 1];
        if (mode == BagReduce::Max) {
          int64_t* mi = maxIndices + b * dim;
          if (begin == end) {
            std::memset(row, 0, sizeof(T) * dim);
            for (int64_t d = 0; d < dim; ++d) mi[d] = -1;
            continue;
          }
          const T* first = w + indices[begin] * dim;
          for (int64_t d = 0; d < dim; ++d) {
            row[d] = first[d];
            mi[d] = indices[begin];
          }
          for (int64_t j = begin + 1; j < end; ++j) {
            const T* src = w + indices[j] * dim;
            for (int64_t d = 0; d < dim; ++d) {
              if (src[d] > row[d] || std::isnan(src[d])) {
                row[d] = src[d];
                mi[d] = indices[j];
              }
            }
          }
          continue;
        }
        std::memset(row, 0, sizeof(T) * dim);
        for (int64_t j = begin; j < end; ++j) {
          const T* src = w + indices[j] * dim;
          if (psw) {
            T s = psw[j];
            for (int64_t d = 0; d < dim; ++d) row[d] += s * src[d];
          } else {
            for (int64_t d = 0; d < dim; ++d) row[d] += src[d];
          }
        }
        if (mode == BagReduce::Mean && end - begin > 1) {
          T inv = T(1) / static_cast<T>(end - begin);
          for (int64_t d = 0; d < dim; ++d) row[d] *= inv;
        }
      }
    });
  });
}

void embeddingBagBackward(DType type, const void* grad, const int64_t* indices, const int64_t* bagStarts,
                          int64_t bags, BagReduce mode, const void* perSampleWeights, const int64_t* maxIndices,
                          int64_t num, int64_t dim, void* gradWeight) {
  WEFT_DISPATCH_FLOATING(type, "embeddingBag backward", [&]<class T>() {
    const T* g = static_cast<const T*>(grad);
    const T* psw = static_cast<const T*>(perSampleWeights);
    T* gw = static_cast<T*>(gradWeight);
    if (mode == BagReduce::Max) {
      overRowRanges(num, bags * dim, [&](int64_t rb, int64_t re) {
        for (int64_t i = 0; i < bags * dim; ++i) {
          int64_t r = maxIndices[i];
          if (r >= rb && r < re) gw[r * dim + i % dim] += g[i];
        }
      });
      return;
    }
    overRowRanges(num, bagStarts[bags] * dim, [&](int64_t rb, int64_t re) {
      for (int64_t b = 0; b < bags; ++b) {
        int64_t begin = bagStarts[b], end = bagStarts[b + 1];
        T scale = mode == BagReduce::Mean && end > begin ? T(1) / static_cast<T>(end - begin) : T(1);
        const T* src = g + b * dim;
        for (int64_t j = begin; j < end; ++j) {
          int64_t r = indices[j];
          if (r < rb || r >= re) continue;
          T s = psw ? psw[j] : scale;
          T* dst = gw + r * dim;
          for (int64_t d = 0; d < dim; ++d) dst[d] += s * src[d];
        }
      }
    });
  });
}

void embeddingBagSampleWeightsBackward(DType type, const void* grad, const void* weight, int64_t dim,
                                       const int64_t* indices, const int64_t* bagStarts, int64_t bags,
                                       void* gradSampleWeights) {
  WEFT_DISPATCH_FLOATING(type, "embeddingBag backward", [&]<class T>() {
    const T* g = static_cast<const T*>(grad);
    const T* w = static_cast<const T*>(weight);
    T* out = static_cast<T*>(gradSampleWeights);
    int64_t avgBag = bags > 0 ? bagStarts[bags] / bags + 1 : 1;
    parallelFor(bags, rowGrain(dim * avgBag), [&](int64_t bb, int64_t be) {
      for (int64_t b = bb; b < be; ++b) {
        const T* gb = g + b * dim;
        for (int64_t j = bagStarts[b]; j < bagStarts[b + 1]; ++j) {
          const T* src = w + indices[j] * dim;
          T acc = 0;
          for (int64_t d = 0; d < dim; ++d) acc += gb[d] * src[d];
          out[j] = acc;
        }
      }
    });
  });
}

}  // namespace weft::kernels::cpu
