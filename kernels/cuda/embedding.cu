// CUDA embedding and embedding-bag kernels (see embedding.h).
#include <vector>

#include "kernels/cuda/embedding.h"
#include "kernels/cuda/index.h"
#include "kernels/cuda/row_loops.cuh"

namespace weft::kernels::cuda {
namespace {

template <class T>
__global__ void lookupKernel(const T* weight, int64_t dim, const int64_t* indices, int64_t n, T* out) {
  for (int64_t r = firstRow(); r < n; r += rowStride()) {
    const T* src = weight + indices[r] * dim;
    T* dst = out + r * dim;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = src[d];
  }
}

template <class T>
__global__ void lookupBackwardKernel(const T* grad, const int64_t* indices, int64_t n, int64_t dim, T* gradWeight) {
  for (int64_t r = firstRow(); r < n; r += rowStride()) {
    const T* src = grad + r * dim;
    T* dst = gradWeight + indices[r] * dim;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) atomicAdd(dst + d, src[d]);
  }
}

// One row of the output per bag; each thread owns columns and walks the bag.
template <class T>
__global__ void bagKernel(const T* weight, int64_t dim, const int64_t* indices, const int64_t* starts, int64_t bags,
                          BagReduce mode, const T* psw, T* out, int64_t* maxIndices) {
  for (int64_t b = firstRow(); b < bags; b += rowStride()) {
    const int64_t begin = starts[b], end = starts[b + 1];
    T* row = out + b * dim;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      if (mode == BagReduce::Max) {
        if (begin == end) {
          row[d] = T(0);
          maxIndices[b * dim + d] = -1;
          continue;
        }
        int64_t best = indices[begin];
        T v = weight[best * dim + d];
        for (int64_t j = begin + 1; j < end; ++j) {
          const int64_t r = indices[j];
          const T s = weight[r * dim + d];
          if (s > v || s != s) {
            v = s;
            best = r;
          }
        }
        row[d] = v;
        maxIndices[b * dim + d] = best;
        continue;
      }
      T acc = 0;
      for (int64_t j = begin; j < end; ++j) {
        const T s = weight[indices[j] * dim + d];
        acc += psw ? psw[j] * s : s;
      }
      if (mode == BagReduce::Mean && end - begin > 1) acc *= T(1) / static_cast<T>(end - begin);
      row[d] = acc;
    }
  }
}

template <class T>
__global__ void bagBackwardKernel(const T* grad, const int64_t* indices, const int64_t* starts, int64_t bags,
                                  BagReduce mode, const T* psw, int64_t dim, T* gradWeight) {
  for (int64_t b = firstRow(); b < bags; b += rowStride()) {
    const int64_t begin = starts[b], end = starts[b + 1];
    const T scale = mode == BagReduce::Mean && end > begin ? T(1) / static_cast<T>(end - begin) : T(1);
    const T* src = grad + b * dim;
    for (int64_t j = begin; j < end; ++j) {
      const T s = psw ? psw[j] : scale;
      T* dst = gradWeight + indices[j] * dim;
      for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) atomicAdd(dst + d, s * src[d]);
    }
  }
}

template <class T>
__global__ void bagMaxBackwardKernel(const T* grad, const int64_t* maxIndices, int64_t bags, int64_t dim,
                                     T* gradWeight) {
  for (int64_t b = firstRow(); b < bags; b += rowStride()) {
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      const int64_t r = maxIndices[b * dim + d];
      if (r >= 0) atomicAdd(gradWeight + r * dim + d, grad[b * dim + d]);
    }
  }
}

// One warp per bag: lanes split each row, then a shuffle reduction.
template <class T>
__global__ void sampleWeightsBackwardKernel(const T* grad, const T* weight, int64_t dim, const int64_t* indices,
                                            const int64_t* starts, int64_t bags, T* out) {
  const int lane = threadIdx.x & 31;
  const int warpsPerBlock = blockDim.x / 32;
  const int64_t warpStride = static_cast<int64_t>(gridDim.x) * warpsPerBlock;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * warpsPerBlock + threadIdx.x / 32; b < bags; b += warpStride) {
    const T* gb = grad + b * dim;
    for (int64_t j = starts[b]; j < starts[b + 1]; ++j) {
      const T* src = weight + indices[j] * dim;
      T acc = 0;
      for (int64_t d = lane; d < dim; d += 32) acc += gb[d] * src[d];
      for (int s = 16; s > 0; s >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, s);
      if (lane == 0) out[j] = acc;
    }
  }
}

}  // namespace

void checkEmbeddingIndices(const char* op, const int64_t* indices, int64_t n, int64_t num) {
  int64_t lo = 0, hi = 0;
  indexRange(indices, n, &lo, &hi);
  if (n <= 0 || (lo >= 0 && hi < num)) return;
  std::vector<int64_t> host(static_cast<size_t>(n));
  copyDeviceToHost(host.data(), indices, static_cast<size_t>(n) * sizeof(int64_t), currentDevice());
  cpu::checkEmbeddingIndices(op, host.data(), n, num);
}

void embeddingForward(DType type, const void* weight, int64_t num, int64_t dim, const int64_t* indices, int64_t n,
                      void* out) {
  if (n <= 0 || dim <= 0) return;
  if (type != DType::Float32 && type != DType::Float64) throwUnsupportedDType("embedding", type);
  // Rows are copied as bytes, 16 at a time where the layout allows.
  const uint64_t es = elementSize(type);
  const size_t unit = copyUnit({dim * es, addressOf(weight), addressOf(out)});
  const int64_t row = dim * es / unit;
  dispatchBySize(unit, "embedding", [&]<class U>() {
    RowLaunch l = rowLaunch(n, row);
    lookupKernel<U><<<l.grid, l.block, 0, stream()>>>(static_cast<const U*>(weight), row, indices, n,
                                                      static_cast<U*>(out));
    checkLaunch("embedding");
  });
}

void embeddingBackward(DType type, const void* grad, const int64_t* indices, int64_t n, int64_t num, int64_t dim,
                       void* gradWeight) {
  if (n <= 0 || dim <= 0) return;
  WEFT_DISPATCH_FLOATING(type, "embedding backward", [&]<class T>() {
    RowLaunch l = rowLaunch(n, dim);
    lookupBackwardKernel<T><<<l.grid, l.block, 0, stream()>>>(static_cast<const T*>(grad), indices, n, dim,
                                                              static_cast<T*>(gradWeight));
    checkLaunch("embedding backward");
  });
}

void embeddingBagForward(DType type, const void* weight, int64_t num, int64_t dim, const int64_t* indices,
                         const int64_t* bagStarts, int64_t bags, BagReduce mode, const void* perSampleWeights,
                         void* out, int64_t* maxIndices) {
  if (bags <= 0 || dim <= 0) return;
  WEFT_DISPATCH_FLOATING(type, "embeddingBag", [&]<class T>() {
    RowLaunch l = rowLaunch(bags, dim);
    bagKernel<T><<<l.grid, l.block, 0, stream()>>>(static_cast<const T*>(weight), dim, indices, bagStarts, bags, mode,
                                                   static_cast<const T*>(perSampleWeights), static_cast<T*>(out),
                                                   maxIndices);
    checkLaunch("embeddingBag");
  });
}

void embeddingBagBackward(DType type, const void* grad, const int64_t* indices, const int64_t* bagStarts,
                          int64_t bags, BagReduce mode, const void* perSampleWeights, const int64_t* maxIndices,
                          int64_t num, int64_t dim, void* gradWeight) {
  if (bags <= 0 || dim <= 0) return;
  WEFT_DISPATCH_FLOATING(type, "embeddingBag backward", [&]<class T>() {
    RowLaunch l = rowLaunch(bags, dim);
    if (mode == BagReduce::Max) {
      bagMaxBackwardKernel<T><<<l.grid, l.block, 0, stream()>>>(static_cast<const T*>(grad), maxIndices, bags, dim,
                                                                static_cast<T*>(gradWeight));
    } else {
      bagBackwardKernel<T><<<l.grid, l.block, 0, stream()>>>(static_cast<const T*>(grad), indices, bagStarts, bags,
                                                             mode, static_cast<const T*>(perSampleWeights), dim,
                                                             static_cast<T*>(gradWeight));
    }
    checkLaunch("embeddingBag backward");
  });
}

void embeddingBagSampleWeightsBackward(DType type, const void* grad, const void* weight, int64_t dim,
                                       const int64_t* indices, const int64_t* bagStarts, int64_t bags,
                                       void* gradSampleWeights) {
  if (bags <= 0) return;
  WEFT_DISPATCH_FLOATING(type, "embeddingBag backward", [&]<class T>() {
    sampleWeightsBackwardKernel<T><<<blocksFor(bags * 32), kThreads, 0, stream()>>>(
        static_cast<const T*>(grad), static_cast<const T*>(weight), dim, indices, bagStarts, bags,
        static_cast<T*>(gradSampleWeights));
    checkLaunch("embeddingBag backward");
  });
}

}  // namespace weft::kernels::cuda
