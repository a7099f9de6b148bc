#include "kernels/cuda/copy.h"

#include <cmath>
#include <limits>

#include "kernels/cuda/loops.cuh"

namespace weft::kernels::cuda {
namespace {

template <class S, class D>
void launchCopy(const S* src, const StridedOffsets<1>& off, D* dst, int64_t n) {
  if (off.dims <= 1) {
    const int64_t st = off.dims == 1 ? off.strides[0][0] : 0;
    if (st == 1) {
      launchContiguous(n, [=] __device__(int64_t i) { dst[i] = convertElement<D>(src[i]); }, "copy");
    } else {
      launchContiguous(n, [=] __device__(int64_t i) { dst[i] = convertElement<D>(src[i * st]); }, "copy");
    }
    return;
  }
  launchStrided<1>(n, off, [=] __device__(int64_t i, const int64_t* o) { dst[i] = convertElement<D>(src[o[0]]); },
                   "copy");
}

template <class W>
void scatterCopy(const W* s, const StridedOffsets<1>& off, W* d, int64_t n) {
  launchStrided<1>(n, off, [=] __device__(int64_t i, const int64_t* o) { d[o[0]] = s[i]; }, "copy");
}

template <class T>
void fillTyped(T* d, int64_t n, T v) {
  launchContiguous(n, [=] __device__(int64_t i) { d[i] = v; }, "fill");
}

int64_t numelOf(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

bool isContiguous(std::span<const int64_t> shape, std::span<const int64_t> strides) {
  int64_t expect = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

}  // namespace

void copyStridedToContiguous(DType srcType, const void* src, std::span<const int64_t> shape,
                             std::span<const int64_t> srcStrides, DType dstType, void* dst) {
  const int64_t n = numelOf(shape);
  if (n == 0) return;
  WEFT_ENFORCE(shape.size() <= static_cast<size_t>(kMaxDims), InvalidArgumentError, "copy: ", shape.size(),
               " dimensions; CUDA kernels take at most ", kMaxDims);
  if (srcType == dstType && isContiguous(shape, srcStrides)) {
    WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * elementSize(srcType), cudaMemcpyDeviceToDevice,
                                    stream()));
    return;
  }
  const std::span<const int64_t> strides[1] = {srcStrides};
  StridedOffsets<1> off(shape, strides);
  WEFT_CUDA_DISPATCH_ALL_AND_HALF(srcType, "copy", [&]<class S>() {
    WEFT_CUDA_DISPATCH_ALL_AND_HALF(dstType, "copy", [&]<class D>() {
      launchCopy(static_cast<const S*>(src), off, static_cast<D*>(dst), n);
    });
  });
}

void copyContiguousToStrided(DType type, const void* src, std::span<const int64_t> shape, void* dst,
                             std::span<const int64_t> dstStrides) {
  const int64_t n = numelOf(shape);
  if (n == 0) return;
  WEFT_ENFORCE(shape.size() <= static_cast<size_t>(kMaxDims), InvalidArgumentError, "copy: ", shape.size(),
               " dimensions; CUDA kernels take at most ", kMaxDims);
  if (isContiguous(shape, dstStrides)) {
    WEFT_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * elementSize(type), cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  const std::span<const int64_t> strides[1] = {dstStrides};
  StridedOffsets<1> off(shape, strides);
  // Elements are moved by their size: one kernel per width.
  switch (elementSize(type)) {
    case 1: scatterCopy(static_cast<const uint8_t*>(src), off, static_cast<uint8_t*>(dst), n); break;
    case 2: scatterCopy(static_cast<const uint16_t*>(src), off, static_cast<uint16_t*>(dst), n); break;
    case 4: scatterCopy(static_cast<const uint32_t*>(src), off, static_cast<uint32_t*>(dst), n); break;
    case 8: scatterCopy(static_cast<const uint64_t*>(src), off, static_cast<uint64_t*>(dst), n); break;
    default: throwUnsupportedDType("copy", type);
  }
}

void fill(DType type, void* dst, int64_t n, double value) {
  if (n <= 0) return;
  WEFT_CUDA_DISPATCH_ALL_AND_HALF(type, "fill", [&]<class T>() {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      WEFT_ENFORCE(std::isfinite(value) &&
                       std::trunc(value) >= static_cast<double>(std::numeric_limits<T>::lowest()) &&
                       std::trunc(value) <= static_cast<double>(std::numeric_limits<T>::max()),
                   InvalidArgumentError, "fill: value ", value, " cannot be converted to ", dtypeName(type),
                   " without overflow");
    }
    if (value == 0.0 && !std::signbit(value)) {
      WEFT_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(n) * sizeof(T), stream()));
      return;
    }
    T v;
    if constexpr (kIsDeviceHalf<T>) {
      v = fromAcc<T>(static_cast<float>(value));
    } else if constexpr (std::is_same_v<T, bool>) {
      v = value != 0;
    } else {
      v = static_cast<T>(value);
    }
    fillTyped(static_cast<T*>(dst), n, v);
  });
}

}  // namespace weft::kernels::cuda
