#include "kernels/cpu/index.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

std::vector<int64_t> contiguousStrides(std::span<const int64_t> shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t step = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = step;
    step *= shape[d];
  }
  return strides;
}

// `v` with dimension `dim` moved to the end.
std::vector<int64_t> dimLast(std::span<const int64_t> v, int64_t dim) {
  std::vector<int64_t> out(v.begin(), v.end());
  std::rotate(out.begin() + dim, out.begin() + dim + 1, out.end());
  return out;
}

// x + y, wrapping in signed integer types instead of overflowing.
template <class T>
T addWrapping(T x, T y) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));
  } else {
    return static_cast<T>(x + y);
  }
}

template <class F>
void byElementSize(DType type, const char* op, F&& fn) {
  switch (elementSize(type)) {
    case 1: fn.template operator()<uint8_t>(); break;
    case 2: fn.template operator()<uint16_t>(); break;
    case 4: fn.template operator()<uint32_t>(); break;
    case 8: fn.template operator()<uint64_t>(); break;
    default: throwUnsupportedDType(op, type);
  }
}

}  // namespace

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

void gatherForward(DType type, const void* in, std::span<const int64_t> inStrides, int64_t dim,
                   const int64_t* index, std::span<const int64_t> shape, void* out) {
  // in's stride along dim is applied to the index, not to the position.
  std::vector<int64_t> inPos(inStrides.begin(), inStrides.end());
  const int64_t dimStride = inPos[dim];
  inPos[dim] = 0;
  const std::vector<int64_t> packed = contiguousStrides(shape);
  byElementSize(type, "gather", [&]<class U>() {
    const U* ip = static_cast<const U*>(in);
    U* op = static_cast<U*>(out);
    const std::span<const int64_t> strides[2] = {inPos, packed};
    forEachRow<2>(shape, strides, [&](const int64_t* off, int64_t n, const int64_t* inner) {
      const U* x = ip + off[0];
      const int64_t* ix = index + off[1];
      U* o = op + off[1];
      for (int64_t i = 0; i < n; ++i) o[i] = x[i * inner[0] + ix[i] * dimStride];
    });
  });
}

void scatterAddForward(DType type, void* out, std::span<const int64_t> outStrides, int64_t dim,
                       const int64_t* index, std::span<const int64_t> shape, const void* src,
                       std::span<const int64_t> srcStrides) {
  // Rows run along dim, so that the elements one row adds into share every
  // other coordinate: different rows never write the same element, and the
  // rows can run in parallel while each adds in order.
  std::vector<int64_t> outPos(outStrides.begin(), outStrides.end());
  const int64_t dimStride = outPos[dim];
  outPos[dim] = 0;
  const std::vector<int64_t> rowShape = dimLast(shape, dim), outRows = dimLast(outPos, dim),
                             indexRows = dimLast(contiguousStrides(shape), dim), srcRows = dimLast(srcStrides, dim);
  WEFT_DISPATCH_NUMERIC_AND_HALF(type, "scatterAdd", [&]<class T>() {
    T* op = static_cast<T*>(out);
    const T* sp = static_cast<const T*>(src);
    const std::span<const int64_t> strides[3] = {outRows, indexRows, srcRows};
    forEachRow<3>(rowShape, strides, [&](const int64_t* off, int64_t n, const int64_t* inner) {
      T* o = op + off[0];
      const int64_t* ix = index + off[1];
      const T* s = sp + off[2];
      for (int64_t i = 0; i < n; ++i) {
        T& target = o[ix[i * inner[1]] * dimStride];
        target = addWrapping(target, s[i * inner[2]]);
      }
    });
  });
}

}  // namespace weft::kernels::cpu
