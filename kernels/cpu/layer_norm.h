// Layer normalisation over the last n elements of each row, forward and
// backward, over contiguous buffers seen as [rows, n].
//
//   // y = layer_norm(x) over rows of 128 with an affine weight and bias:
//   layerNormForward(DType::Float32, x, rows, 128, w, b, 1e-5, y, mean, rstd);
//   layerNormBackward(DType::Float32, g, x, mean, rstd, w, rows, 128, gx, gw, gb);
//
// Numerics follow PyTorch's: the biased variance, rstd = 1 / sqrt(var + eps),
// y = (x - mean) * rstd * weight + bias. The forward reads each row once for
// both moments: sums of x - x[0] and of its square (shifting by the row's first
// element keeps E[d^2] - E[d]^2 from cancelling when the mean is large
// against the spread), accumulated in float64 for float32 data. The backward
// reads each row twice (the row's two sums, then dx), and accumulates
// dweight and dbias per chunk of rows in float64 for float32, combined in
// chunk order; chunks follow from the shape alone, so every result has the
// same bits with one thread or several.
//
// Rows run in parallel (kernels/cpu/parallel.h); the row loops are compiled
// for AVX-512, AVX2 + FMA and SSE2 and chosen by vecmath::bestIsa(). Float32
// and float64 (other dtypes: InvalidArgumentError).
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cpu {

// y [rows, n] from x [rows, n]; weight and bias [n] or null; mean and rstd
// [rows] receive each row's statistics. All buffers contiguous, of `type`;
// n >= 1.
void layerNormForward(DType type, const void* x, int64_t rows, int64_t n, const void* weight, const void* bias,
                      double eps, void* y, void* mean, void* rstd);

// From g, the gradient of y, and what the forward read and kept (x, mean,
// rstd, weight or null): gradX [rows, n], gradWeight [n] and gradBias [n],
// each computed only when non-null (the weight gradients are overwritten,
// not accumulated). With x̂ = (x - mean) * rstd and ĝ = g * weight:
//   gradX = rstd * (ĝ - mean_n(ĝ) - x̂ * mean_n(ĝ * x̂))
//   gradWeight = sum_rows(g * x̂), gradBias = sum_rows(g)
void layerNormBackward(DType type, const void* g, const void* x, const void* mean, const void* rstd,
                       const void* weight, int64_t rows, int64_t n, void* gradX, void* gradWeight, void* gradBias);

}  // namespace weft::kernels::cpu
