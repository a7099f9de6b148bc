// Reduction kernels over contiguous buffers viewed as 2-D: the tensor layer
// permutes reduced dimensions to one side first.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cpu {

// out[k] = sum_r in[k*R + r]  (reduce the trailing axis of [K, R]).
// Float32 sums accumulate in float64.
void sumRows(DType type, const void* in, int64_t K, int64_t R, void* out);
// out[k] = sum_r in[r*K + k]  (reduce the leading axis of [R, K]).
void sumCols(DType type, const void* in, int64_t R, int64_t K, void* out);

}  // namespace weft::kernels::cpu
