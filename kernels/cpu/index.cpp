#include "kernels/cpu/index.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {

void catForward(DType type, const void* src, int64_t outer, int64_t srcRow, void* dst, int64_t dstRow,
                int64_t offset) {
  size_t es = elementSize(type);
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  size_t rowBytes = static_cast<size_t>(srcRow) * es;
  if (srcRow == dstRow) {
    std::memcpy(d, s, rowBytes * static_cast<size_t>(outer));
    return;
  }
  parallelFor(outer, kParallelGrain / (srcRow > 0 ? srcRow : 1) + 1, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      std::memcpy(d + (o * dstRow + offset) * static_cast<int64_t>(es), s + o * srcRow * static_cast<int64_t>(es),
                  rowBytes);
    }
  });
}

void indexSelectForward(DType type, const void* in, int64_t outer, int64_t size, int64_t inner,
                        const int64_t* index, int64_t n, void* out) {
  size_t es = elementSize(type);
  const char* s = static_cast<const char*>(in);
  char* d = static_cast<char*>(out);
  size_t sliceBytes = static_cast<size_t>(inner) * es;
  int64_t inner64 = inner > 0 ? inner : 1;
  parallelFor(outer * n, kParallelGrain / inner64 + 1, [&](int64_t b, int64_t e) {
    for (int64_t task = b; task < e; ++task) {
      int64_t o = task / n, j = task % n;
      std::memcpy(d + static_cast<int64_t>(sliceBytes) * task,
                  s + static_cast<int64_t>(sliceBytes) * (o * size + index[j]), sliceBytes);
    }
  });
}

void indexSelectBackward(DType type, const void* g, int64_t outer, int64_t size, int64_t inner,
                         const int64_t* index, int64_t n, void* gradIn) {
  if (isLowPrecision(type)) {  // accumulated in float32, rounded once
    std::vector<float> fg(static_cast<size_t>(outer * n * inner)), fi(static_cast<size_t>(outer * size * inner));
    halfToFloat(type, g, fg.data(), static_cast<int64_t>(fg.size()));
    indexSelectBackward(DType::Float32, fg.data(), outer, size, inner, index, n, fi.data());
    floatToHalf(type, fi.data(), gradIn, static_cast<int64_t>(fi.size()));
    return;
  }
  WEFT_DISPATCH_FLOATING(type, "indexSelect backward", [&]<class T>() {
    const T* gp = static_cast<const T*>(g);
    T* gi = static_cast<T*>(gradIn);
    // A task is one outer slab restricted to a block of columns: tasks own
    // disjoint outputs, so repeated indices never race. Columns are split
    // only when there are too few slabs to keep every thread busy.
    int64_t nt = numThreads();
    int64_t colBlock = outer >= nt ? inner : std::max<int64_t>(64, (inner + nt - 1) / nt);
    if (colBlock <= 0) colBlock = 1;
    int64_t blocks = (inner + colBlock - 1) / colBlock;
    int64_t work = std::max(n, size) * std::min(inner, colBlock);
    parallelFor(outer * blocks, kParallelGrain / std::max<int64_t>(work, 1) + 1, [&](int64_t tb, int64_t te) {
      for (int64_t task = tb; task < te; ++task) {
        int64_t o = task / blocks;
        int64_t cb = (task % blocks) * colBlock;
        int64_t len = std::min(inner - cb, colBlock);
        T* slab = gi + o * size * inner + cb;
        const T* gs = gp + o * n * inner + cb;
        for (int64_t r = 0; r < size; ++r) std::fill(slab + r * inner, slab + r * inner + len, T(0));
        for (int64_t j = 0; j < n; ++j) {
          T* dstRow = slab + index[j] * inner;
          const T* srcRow = gs + j * inner;
          for (int64_t i = 0; i < len; ++i) dstRow[i] += srcRow[i];
        }
      }
    });
  });
}

}  // namespace weft::kernels::cpu
