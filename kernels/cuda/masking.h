// Selection kernels on a CUDA device: kernels/cpu/masking.h's where and
// triangle with the same signatures, for device pointers, on the current stream.
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"

namespace weft::kernels::cuda {

void where(DType type, const bool* cond, std::span<const int64_t> condStrides, const void* a,
           std::span<const int64_t> aStrides, const void* b, std::span<const int64_t> bStrides, void* out,
           std::span<const int64_t> shape);
void triangle(DType type, const void* in, int64_t batch, int64_t R, int64_t C, int64_t diagonal, bool upper,
              void* out);

}  // namespace weft::kernels::cuda
