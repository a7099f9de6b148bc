// CUDA gather/scatter kernels (see index.h).
#include <vector>

#include "kernels/cuda/index.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/row_loops.cuh"

namespace weft::kernels::cuda {
namespace {

// ---- cat: a [outer, srcRow] block into columns of [outer, dstRow] ----------

template <class U>
__global__ void catKernel(const U* src, int64_t outer, int64_t srcRow, U* dst, int64_t dstRow, int64_t offset) {
  for (int64_t o = firstRow(); o < outer; o += rowStride()) {
    const U* s = src + o * srcRow;
    U* d = dst + o * dstRow + offset;
    for (int64_t c = threadIdx.x; c < srcRow; c += blockDim.x) d[c] = s[c];
  }
}

// ---- indexSelect: rows [o, j] of the output take in's row [o, index[j]] ----

template <class U>
__global__ void indexSelectKernel(const U* in, int64_t outer, int64_t size, int64_t inner, const int64_t* index,
                                  int64_t n, U* out) {
  for (int64_t r = firstRow(); r < outer * n; r += rowStride()) {
    const int64_t o = r / n, j = r - o * n;
    const U* s = in + (o * size + index[j]) * inner;
    U* d = out + r * inner;
    for (int64_t c = threadIdx.x; c < inner; c += blockDim.x) d[c] = s[c];
  }
}

template <class T, class A>
__global__ void indexAddKernel(const T* g, int64_t outer, int64_t size, int64_t inner, const int64_t* index,
                               int64_t n, A* gradIn) {
  for (int64_t r = firstRow(); r < outer * n; r += rowStride()) {
    const int64_t o = r / n, j = r - o * n;
    const T* s = g + r * inner;
    A* d = gradIn + (o * size + index[j]) * inner;
    for (int64_t c = threadIdx.x; c < inner; c += blockDim.x) atomicAdd(d + c, static_cast<A>(toAcc(s[c])));
  }
}

template <class T>
__global__ void floatToTypeKernel(const float* in, int64_t n, T* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = fromAcc<T>(in[i]);
  }
}

// ---- index range --------------------------------------------------------------

__global__ void rangeInitKernel(long long* r) {
  r[0] = INT64_MAX;
  r[1] = INT64_MIN;
}

__global__ void rangeKernel(const int64_t* index, int64_t n, long long* r) {
  long long lo = INT64_MAX, hi = INT64_MIN;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const long long v = index[i];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  for (int s = 16; s > 0; s >>= 1) {
    const long long ol = __shfl_down_sync(0xffffffffu, lo, s), oh = __shfl_down_sync(0xffffffffu, hi, s);
    lo = ol < lo ? ol : lo;
    hi = oh > hi ? oh : hi;
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMin(r, lo);
    atomicMax(r + 1, hi);
  }
}

// Integer additions wrap (as the CPU's addWrapping); the rest add in Acc.
template <class T>
__device__ __forceinline__ T addWrapping(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return fromAcc<T>(toAcc(a) + toAcc(b));
  }
}

// A scatterAdd row runs along dim: its elements share every other
// coordinate, so no two rows write the same element and each adds in order.
template <class T>
void scatterAddRows(T* out, std::span<const int64_t> outStrides, int64_t dim, const int64_t* index,
                    std::span<const int64_t> shape, const T* src, std::span<const int64_t> srcStrides) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> rowShape(shape.begin(), shape.end()), outPos(outStrides.begin(), outStrides.end());
  std::vector<int64_t> indexStrides(rank);
  contiguousStridesOf(shape, indexStrides.data());
  const int64_t len = shape[dim], outDimStride = outStrides[dim], indexDimStride = indexStrides[dim],
                srcDimStride = srcStrides[dim];
  rowShape[dim] = 1;
  outPos[dim] = 0;
  int64_t rows = 1;
  for (int64_t s : rowShape) rows *= s;
  const std::span<const int64_t> strides[3] = {outPos, indexStrides, srcStrides};
  StridedOffsets<3> off(rowShape, strides);
  launchStrided(
      rows, off,
      [=] __device__(int64_t, const int64_t* o) {
        T* dst = out + o[0];
        const int64_t* ix = index + o[1];
        const T* s = src + o[2];
        for (int64_t i = 0; i < len; ++i) {
          T& target = dst[ix[i * indexDimStride] * outDimStride];
          target = addWrapping(target, s[i * srcDimStride]);
        }
      },
      "scatterAdd");
}

template <class U>
void gatherElements(const U* in, int64_t dimStride, const int64_t* index, U* out, int64_t n,
                    const StridedOffsets<2>& off) {
  launchStrided(
      n, off, [=] __device__(int64_t, const int64_t* o) { out[o[1]] = in[o[0] + index[o[1]] * dimStride]; },
      "gather");
}

}  // namespace

void catForward(DType type, const void* src, int64_t outer, int64_t srcRow, void* dst, int64_t dstRow,
                int64_t offset) {
  if (outer <= 0 || srcRow <= 0) return;
  const uint64_t es = elementSize(type);
  const size_t unit = copyUnit({srcRow * es, dstRow * es, offset * es, addressOf(src), addressOf(dst)});
  const int64_t s = srcRow * es / unit, d = dstRow * es / unit, at = offset * es / unit;
  dispatchBySize(unit, "cat", [&]<class U>() {
    RowLaunch l = rowLaunch(outer, s);
    catKernel<U><<<l.grid, l.block, 0, stream()>>>(static_cast<const U*>(src), outer, s, static_cast<U*>(dst), d, at);
    checkLaunch("cat");
  });
}

void indexSelectForward(DType type, const void* in, int64_t outer, int64_t size, int64_t inner,
                        const int64_t* index, int64_t n, void* out) {
  if (outer <= 0 || n <= 0 || inner <= 0) return;
  const uint64_t es = elementSize(type);
  const size_t unit = copyUnit({inner * es, addressOf(in), addressOf(out)});
  const int64_t row = inner * es / unit;
  dispatchBySize(unit, "indexSelect", [&]<class U>() {
    RowLaunch l = rowLaunch(outer * n, row);
    indexSelectKernel<U><<<l.grid, l.block, 0, stream()>>>(static_cast<const U*>(in), outer, size, row, index, n,
                                                           static_cast<U*>(out));
    checkLaunch("indexSelect");
  });
}

void indexSelectBackward(DType type, const void* g, int64_t outer, int64_t size, int64_t inner,
                         const int64_t* index, int64_t n, void* gradIn) {
  const int64_t total = outer * size * inner;
  if (total <= 0) return;
  const int device = currentDevice();
  WEFT_CUDA_DISPATCH_FLOATING_AND_HALF(type, "indexSelect backward", [&]<class T>() {
    using A = Acc<T>;
    // The 16-bit types accumulate in a float32 buffer, rounded once.
    A* acc = kIsDeviceHalf<T> ? static_cast<A*>(allocate(total * sizeof(A), device)) : static_cast<A*>(gradIn);
    WEFT_CUDA_CHECK(cudaMemsetAsync(acc, 0, total * sizeof(A), stream()));
    if (n > 0) {
      RowLaunch l = rowLaunch(outer * n, inner);
      indexAddKernel<T, A><<<l.grid, l.block, 0, stream()>>>(static_cast<const T*>(g), outer, size, inner, index, n,
                                                             acc);
      checkLaunch("indexSelect backward");
    }
    if constexpr (kIsDeviceHalf<T>) {
      floatToTypeKernel<T><<<blocksFor(total), kThreads, 0, stream()>>>(acc, total, static_cast<T*>(gradIn));
      checkLaunch("indexSelect backward");
      deallocate(acc, device);  // reuse is ordered by the stream
    }
  });
}

void gatherForward(DType type, const void* in, std::span<const int64_t> inStrides, int64_t dim,
                   const int64_t* index, std::span<const int64_t> shape, void* out) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (n <= 0) return;
  // in's stride along dim is applied to the index, not to the position.
  std::vector<int64_t> inPos(inStrides.begin(), inStrides.end()), packed(shape.size());
  const int64_t dimStride = inPos[dim];
  inPos[dim] = 0;
  contiguousStridesOf(shape, packed.data());
  const std::span<const int64_t> strides[2] = {inPos, packed};
  StridedOffsets<2> off(shape, strides);
  dispatchBySize(elementSize(type), "gather", [&]<class U>() {
    gatherElements(static_cast<const U*>(in), dimStride, index, static_cast<U*>(out), n, off);
  });
}

void scatterAddForward(DType type, void* out, std::span<const int64_t> outStrides, int64_t dim,
                       const int64_t* index, std::span<const int64_t> shape, const void* src,
                       std::span<const int64_t> srcStrides) {
  for (int64_t s : shape) {
    if (s <= 0) return;
  }
  WEFT_CUDA_DISPATCH_NUMERIC_AND_HALF(type, "scatterAdd", [&]<class T>() {
    scatterAddRows<T>(static_cast<T*>(out), outStrides, dim, index, shape, static_cast<const T*>(src), srcStrides);
  });
}

void indexRange(const int64_t* index, int64_t n, int64_t* lo, int64_t* hi) {
  *lo = INT64_MAX;
  *hi = INT64_MIN;
  if (n <= 0) return;
  const int device = currentDevice();
  auto* r = static_cast<long long*>(allocate(2 * sizeof(long long), device));
  long long host[2];
  try {
    rangeInitKernel<<<1, 1, 0, stream()>>>(r);
    checkLaunch("index range");
    rangeKernel<<<blocksFor(n), kThreads, 0, stream()>>>(index, n, r);
    checkLaunch("index range");
    copyDeviceToHost(host, r, sizeof(host), device);
  } catch (...) {
    deallocate(r, device);
    throw;
  }
  deallocate(r, device);
  *lo = host[0];
  *hi = host[1];
}

}  // namespace weft::kernels::cuda
