// Prefix sums along one axis of a contiguous buffer viewed as [outer, R,
// inner], forward (cumsum) and reversed (its gradient).
//
//   // cumsum over dim 1 of a contiguous float [4, 5, 6] tensor:
//   cumsum(DType::Float32, x, 4, 5, 6, false, DType::Float32, out);
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cpu {

// out[o, r, i] = sum of in[o, s, i] over s <= r (reverse: over s >= r).
// Floating inputs give their own dtype (float32 sums accumulate in float64,
// as PyTorch's CPU cumsum, bfloat16/float16 sums in float32); integer and bool inputs give int64, wrapping on
// overflow. outType must be that dtype. out may not alias in.
void cumsum(DType type, const void* in, int64_t outer, int64_t R, int64_t inner, bool reverse, DType outType,
            void* out);

}  // namespace weft::kernels::cpu
