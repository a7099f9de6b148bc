// Reduction kernels on CUDA: the functions of kernels/cpu/reduce.h, same
// names, signatures and results, over device buffers (contiguous, viewed as
// [K, R], [R, K] or [outer, R, inner] as there). Every launch goes on the
// current stream; nothing synchronises with the host.
//
//   // the bias gradient of a [rows, cols] matrix, column-parallel:
//   sumCols(DType::Float32, gradOut, rows, cols, gradBias);
//
// Sums accumulate in float64 for float32 and float64 (as on the CPU), in
// float32 for bfloat16/float16, and in the element type for the integers
// (two's complement wrap, as on the CPU). Reductions are tree-shaped, so a
// floating sum can differ from the CPU's sequential one by reassociation.
// Extrema follow the CPU exactly: ties pick the first position, the first NaN
// wins over every number. Unsupported dtypes throw InvalidArgumentError
// naming the op; a launch failure is a DeviceError.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cuda {

// out[k] = sum_r in[k*R + r]  (reduce the trailing axis of [K, R]).
void sumRows(DType type, const void* in, int64_t K, int64_t R, void* out);
// out[k] = sum_r in[r*K + k]  (reduce the leading axis of [R, K]).
void sumCols(DType type, const void* in, int64_t R, int64_t K, void* out);

// The largest (isMax) or smallest element along the middle axis of a
// contiguous [outer, R, inner] buffer, R >= 1; values (when not null) and
// the Int64 position along the axis (indices, when not null) are written at
// o*inner + i.
void extremumForward(DType type, const void* in, int64_t outer, int64_t R, int64_t inner, bool isMax, void* values,
                     int64_t* indices);
// gradIn (contiguous [outer, R, inner], overwritten) is zero except
// gradIn[o, indices[o*inner + i], i] = g[o*inner + i]. Every index must lie
// in [0, R) (the forward's output).
void extremumBackward(DType type, const void* g, const int64_t* indices, int64_t outer, int64_t R, int64_t inner,
                      void* gradIn);

}  // namespace weft::kernels::cuda
