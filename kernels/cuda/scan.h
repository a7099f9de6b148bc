// Prefix sums on CUDA: the function of kernels/cpu/scan.h, same name,
// signature and result types, over device buffers viewed as [outer, R,
// inner]. Launches on the current stream; no host synchronisation.
//
//   // cumsum over dim 1 of a contiguous float [4, 5, 6] tensor on the device:
//   cumsum(DType::Float32, x, 4, 5, 6, false, DType::Float32, out);
//
// Running sums are float64 for float32 and float64, float32 for
// bfloat16/float16, and wrap-around 64-bit integers for the integer and bool
// inputs (which give Int64), as on the CPU. Along the last axis a warp or a
// block scans each row in chunks (a parallel prefix within the chunk, a
// running carry across chunks), so float sums may differ from the CPU's
// sequential ones by reassociation; along other axes each column is summed
// in order.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cuda {

// out[o, r, i] = sum of in[o, s, i] over s <= r (reverse: over s >= r).
// outType must be the input's dtype for floating inputs, Int64 for integer
// and bool inputs (InvalidArgumentError otherwise). out may not alias in.
void cumsum(DType type, const void* in, int64_t outer, int64_t R, int64_t inner, bool reverse, DType outType,
            void* out);

}  // namespace weft::kernels::cuda
