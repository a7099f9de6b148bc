// Shared by the .cu files: the stream to launch on, grid sizing, launch
// checks, the device types of weft's dtypes and type dispatch. Each kernel
// file follows one shape (ggml's ggml-cuda): static __global__ kernels, a
// static launcher taking a cudaStream_t that checks the launch, and one
// public entry point per op (declared in kernels/cuda/<family>.h with the
// signature of kernels/cpu/<family>.h) that validates and dispatches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/dtype.h"
#include "common/error.h"
#include "common/half.h"
#include "kernels/cuda/runtime.h"

namespace weft::kernels::cuda {

// The current stream of the current device: where every kernel launches.
inline cudaStream_t stream() { return static_cast<cudaStream_t>(currentStream(currentDevice())); }

// Checks a CUDA runtime call, naming it and the device on failure.
#define WEFT_CUDA_CHECK(call)                                                     \
  do {                                                                            \
    cudaError_t weft_cuda_err_ = (call);                                          \
    if (weft_cuda_err_ != cudaSuccess)                                            \
      ::weft::kernels::cuda::throwError(weft_cuda_err_, #call, ::weft::kernels::cuda::currentDevice()); \
  } while (0)

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items: enough to fill the device
// (a few waves), never more than the items need.
inline unsigned blocksFor(int64_t n, int threads = kThreads) {
  const int64_t need = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(properties(currentDevice()).multiprocessors) * 32;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(need, cap)));
}

// Device memory from the caching allocator of `device` (default: the
// current one) for the duration of a scope. Freed blocks are reused in
// stream order, so work enqueued on the current stream before the release
// may still use the buffer.
class Scratch {
 public:
  explicit Scratch(size_t bytes, int device = currentDevice())
      : device_(device), p_(bytes > 0 ? allocate(bytes, device) : nullptr) {}
  ~Scratch() {
    if (p_) deallocate(p_, device_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  int device_;
  void* p_;
};

// A device int flag set to 0 on the current stream; read() waits for the
// stream and returns it (the error checks of ops whose CPU twin throws).
class DeviceFlag {
 public:
  DeviceFlag() : buf_(sizeof(int)) {
    WEFT_CUDA_CHECK(cudaMemsetAsync(buf_.get(), 0, sizeof(int), stream()));
  }
  int* get() const { return buf_.as<int>(); }
  int read() const {
    int host = 0;
    WEFT_CUDA_CHECK(cudaMemcpyAsync(&host, buf_.get(), sizeof(int), cudaMemcpyDeviceToHost, stream()));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(stream()));
    return host;
  }

 private:
  Scratch buf_;
};

// ---- element types -------------------------------------------------------------

// The device type of a host element type (weft::BFloat16 -> __nv_bfloat16,
// weft::Float16 -> __half; same layout, bit for bit).
template <class T> struct DeviceTypeOf { using type = T; };
template <> struct DeviceTypeOf<::weft::BFloat16> { using type = __nv_bfloat16; };
template <> struct DeviceTypeOf<::weft::Float16> { using type = __half; };
template <class T> using DeviceT = typename DeviceTypeOf<T>::type;

// Arithmetic type: float for the 16-bit types (as on the CPU), else T.
template <class T> struct AccOf { using type = T; };
template <> struct AccOf<__nv_bfloat16> { using type = float; };
template <> struct AccOf<__half> { using type = float; };
template <class T> using Acc = typename AccOf<T>::type;

template <class T> constexpr bool kIsDeviceHalf = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

template <class T>
__host__ __device__ __forceinline__ Acc<T> toAcc(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return v;
}

template <class T>
__host__ __device__ __forceinline__ T fromAcc(Acc<T> v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return v;
}

// Any element converted to float/double/integers, as kernels/cpu/copy.cpp's
// convertElement: to bool is x != 0; floating to integer truncates,
// saturates and maps NaN to 0; integer to integer wraps; through float32 for
// the 16-bit types.
template <class D, class S>
__device__ __forceinline__ D convertElement(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (kIsDeviceHalf<S>) {
    return convertElement<D>(toAcc(v));
  } else if constexpr (kIsDeviceHalf<D>) {
    if constexpr (std::is_same_v<S, bool>) return fromAcc<D>(v ? 1.0f : 0.0f);
    else return fromAcc<D>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, bool>) {
    return v != S(0);
  } else if constexpr (std::is_integral_v<D> && std::is_floating_point_v<S>) {
    if (v != v) return D(0);
    constexpr S lo = static_cast<S>(std::numeric_limits<D>::lowest());
    constexpr S hiExclusive = static_cast<S>(std::numeric_limits<D>::max() / 2 + 1) * S(2);
    if (v <= lo) return std::numeric_limits<D>::lowest();
    if (v >= hiExclusive) return std::numeric_limits<D>::max();
    return static_cast<D>(v);
  } else {
    return static_cast<D>(v);
  }
}

}  // namespace weft::kernels::cuda

// Type dispatch with the device element types: T is float, double, int64_t,
// int32_t, uint8_t, bool, __nv_bfloat16 or __half as the macro's name says
// (the host macros of common/dtype.h with the 16-bit types swapped). Any
// other dtype throws InvalidArgumentError naming `opname` and the dtype.
#define WEFT_CUDA_HALF_CASES(...)                                                                  \
  case ::weft::DType::BFloat16: (__VA_ARGS__).template operator()<__nv_bfloat16>(); break;         \
  case ::weft::DType::Float16: (__VA_ARGS__).template operator()<__half>(); break;

#define WEFT_CUDA_DISPATCH_FLOATING_AND_HALF(dtype, opname, ...)                 \
  do {                                                                           \
    switch (dtype) {                                                             \
      case ::weft::DType::Float32: (__VA_ARGS__).template operator()<float>(); break;  \
      case ::weft::DType::Float64: (__VA_ARGS__).template operator()<double>(); break; \
      WEFT_CUDA_HALF_CASES(__VA_ARGS__)                                          \
      default: ::weft::throwUnsupportedDType(opname, dtype);                     \
    }                                                                            \
  } while (0)

#define WEFT_CUDA_DISPATCH_NUMERIC_AND_HALF(dtype, opname, ...)                  \
  do {                                                                           \
    switch (dtype) {                                                             \
      WEFT_DISPATCH_NUMERIC_CASES(__VA_ARGS__)                                   \
      WEFT_CUDA_HALF_CASES(__VA_ARGS__)                                          \
      default: ::weft::throwUnsupportedDType(opname, dtype);                     \
    }                                                                            \
  } while (0)

#define WEFT_CUDA_DISPATCH_ALL_AND_HALF(dtype, opname, ...)                      \
  do {                                                                           \
    switch (dtype) {                                                             \
      WEFT_DISPATCH_NUMERIC_CASES(__VA_ARGS__)                                   \
      case ::weft::DType::Bool: (__VA_ARGS__).template operator()<bool>(); break; \
      WEFT_CUDA_HALF_CASES(__VA_ARGS__)                                          \
      default: ::weft::throwUnsupportedDType(opname, dtype);                     \
    }                                                                            \
  } while (0)
