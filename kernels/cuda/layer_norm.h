// CUDA versions of kernels/cpu/layer_norm.h: layer normalisation over the
// last n elements of each row of a contiguous device buffer [rows, n],
// forward and backward, with the CPU's signatures and numerics (biased
// variance, rstd = 1 / sqrt(var + eps), y = (x - mean) * rstd * weight + bias).
//
//   kernels::cuda::layerNormForward(DType::Float32, x, rows, 768, w, b, 1e-5, y, mean, rstd);
//   kernels::cuda::layerNormBackward(DType::Float32, g, x, mean, rstd, w, rows, 768, gx, gw, gb);
//
// The forward reads a row once for both moments, as the CPU does: sums of
// x - x[0] and of its square, in float64 (shifting by the row's first
// element keeps E[d^2] - E[d]^2 from cancelling when the mean is large
// against the spread), then once more for y. The backward runs one block per
// row for dx (its two row sums in float32 for float32, float64 for float64)
// and a column-blocked pass over chunks of rows for dweight and dbias, whose
// per-chunk partials are then summed in chunk order (deterministic). Sums
// run in another order than the CPU's: results agree to rounding. Float32
// and float64 (other dtypes: InvalidArgumentError).
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cuda {

void layerNormForward(DType type, const void* x, int64_t rows, int64_t n, const void* weight, const void* bias,
                      double eps, void* y, void* mean, void* rstd);

void layerNormBackward(DType type, const void* g, const void* x, const void* mean, const void* rstd,
                       const void* weight, int64_t rows, int64_t n, void* gradX, void* gradWeight, void* gradBias);

}  // namespace weft::kernels::cuda
