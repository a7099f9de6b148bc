// Reduction kernels over contiguous buffers viewed as 2-D or 3-D: the tensor
// layer makes its operand contiguous (or permutes reduced dimensions to one
// side) first, then names the axis to reduce by the sizes around it.
//
//   // max over dim 1 of a contiguous [4, 5, 6] tensor:
//   extremumForward(DType::Float32, x, 4, 5, 6, true, values, indices);  // [4, 6] each
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cpu {

// out[k] = sum_r in[k*R + r]  (reduce the trailing axis of [K, R]).
// Float32 sums accumulate in float64, bfloat16/float16 sums in float32
// (rounded to the dtype once at the end).
void sumRows(DType type, const void* in, int64_t K, int64_t R, void* out);
// out[k] = sum_r in[r*K + k]  (reduce the leading axis of [R, K]).
// Accumulates in the element type, rows in order (float32 in float32: the
// column-parallel adds vectorise), bfloat16/float16 in float32. The CUDA
// sumCols accumulates float32 in float64, so the two differ by float32's
// rounding over R terms.
void sumCols(DType type, const void* in, int64_t R, int64_t K, void* out);

// The largest (isMax) or smallest element along the middle axis of a
// contiguous [outer, R, inner] buffer, R >= 1. Writes values[o*inner + i]
// (when values is not null, same dtype as in) and its position r along the
// axis to indices[o*inner + i] (when not null). Ties pick the first position;
// a NaN beats every number (the result is NaN, as in PyTorch).
void extremumForward(DType type, const void* in, int64_t outer, int64_t R, int64_t inner, bool isMax, void* values,
                     int64_t* indices);
// Gradient of extremumForward's values: gradIn (contiguous [outer, R, inner],
// overwritten) is zero except gradIn[o, indices[o*inner + i], i] = g[o*inner + i].
// Every index must lie in [0, R).
void extremumBackward(DType type, const void* g, const int64_t* indices, int64_t outer, int64_t R, int64_t inner,
                      void* gradIn);

}  // namespace weft::kernels::cpu
