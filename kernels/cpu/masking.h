// Selection kernels behind where, maskedFill, triu and tril: each output
// element is one of its inputs' elements or zero, so they move elements of
// any dtype by their size and never look at the values.
//
//   // out = cond ? a : b over [2, 3] with a broadcast along dim 0:
//   where(DType::Float32, cond, {3, 1}, a, {0, 1}, b, {3, 1}, out, {2, 3});
//   // keep the upper triangle of each of 4 contiguous [5, 5] matrices:
//   triangle(DType::Float64, x, 4, 5, 5, 0, true, out);
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"

namespace weft::kernels::cpu {

// out (contiguous, `shape`) = cond ? a : b elementwise. The strides are in
// elements, already broadcast to `shape` (0 on broadcast dimensions), as
// binary()'s (kernels/cpu/elementwise.h). a, b and out share `type`.
void where(DType type, const bool* cond, std::span<const int64_t> condStrides, const void* a,
           std::span<const int64_t> aStrides, const void* b, std::span<const int64_t> bStrides, void* out,
           std::span<const int64_t> shape);

// For `batch` contiguous [R, C] matrices: out[i, j] = in[i, j] where j - i >=
// diagonal (upper) or j - i <= diagonal (lower), else zero. out may be in.
void triangle(DType type, const void* in, int64_t batch, int64_t R, int64_t C, int64_t diagonal, bool upper,
              void* out);

}  // namespace weft::kernels::cpu
