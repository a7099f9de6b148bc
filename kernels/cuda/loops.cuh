// The generic elementwise loops every pointwise kernel is built from (as
// kernels/cpu/loops.h on the CPU): one template, the operation a functor.
//
//   launchContiguous(n, [=] __device__(int64_t i) { out[i] = a[i] + b[i]; }, "add");
//   StridedOffsets<3> off(shape, {outStrides, aStrides, bStrides});
//   launchStrided(off, [=] __device__(const int64_t* o) { ... }, "add");
#pragma once

#include <span>

#include "kernels/cuda/common.cuh"

namespace weft::kernels::cuda {

constexpr int kMaxDims = 16;

template <class F>
__global__ void contiguousKernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    f(i);
  }
}

// Runs f(i) for i in [0, n) on the current stream; `op` names the launch in errors.
template <class F>
void launchContiguous(int64_t n, F f, const char* op) {
  if (n <= 0) return;
  contiguousKernel<<<blocksFor(n), kThreads, 0, stream()>>>(n, f);
  checkLaunch(op);
}

// Element offsets of N strided operands over one shape: offsets(i, o) writes
// operand k's element offset for linear index i (row-major over `shape`)
// into o[k]. Dimensions of size 1 are dropped and contiguous runs merged, so
// the divisions per element are as few as the layout allows.
template <int N>
struct StridedOffsets {
  int dims = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[N][kMaxDims];

  StridedOffsets(std::span<const int64_t> shape, const std::span<const int64_t> (&operandStrides)[N]) {
    // Collapse from the innermost dimension outwards.
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (shape[d] == 1) continue;
      bool merge = dims > 0;
      for (int k = 0; k < N && merge; ++k) {
        merge = operandStrides[k][d] == strides[k][dims - 1] * sizes[dims - 1];
      }
      if (merge) {
        sizes[dims - 1] *= shape[d];
        continue;
      }
      sizes[dims] = shape[d];
      for (int k = 0; k < N; ++k) strides[k][dims] = operandStrides[k][d];
      ++dims;
    }
  }

  __device__ __forceinline__ void offsets(int64_t i, int64_t* o) const {
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = 0;
    if (dims == 1) {
#pragma unroll
      for (int k = 0; k < N; ++k) o[k] = i * strides[k][0];
      return;
    }
    for (int d = 0; d < dims; ++d) {  // innermost first
      const int64_t q = i / sizes[d];
      const int64_t r = i - q * sizes[d];
#pragma unroll
      for (int k = 0; k < N; ++k) o[k] += r * strides[k][d];
      i = q;
    }
  }
};

template <int N, class F>
__global__ void stridedKernel(int64_t n, StridedOffsets<N> off, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t o[N];
    off.offsets(i, o);
    f(i, o);
  }
}

// Runs f(i, offsets) for every element of the shape `off` was built from
// (n elements); offsets[k] is operand k's element offset.
template <int N, class F>
void launchStrided(int64_t n, const StridedOffsets<N>& off, F f, const char* op) {
  if (n <= 0) return;
  stridedKernel<N><<<blocksFor(n), kThreads, 0, stream()>>>(n, off, f);
  checkLaunch(op);
}

// Row-major strides of a contiguous `shape`, into `out` (kMaxDims at most).
inline void contiguousStridesOf(std::span<const int64_t> shape, int64_t* out) {
  int64_t acc = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    out[d] = acc;
    acc *= shape[d];
  }
}

}  // namespace weft::kernels::cuda
