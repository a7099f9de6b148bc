// Copies, casts and fills on a CUDA device: kernels/cpu/copy.h's functions
// with the same signatures and semantics (element conversions as
// common/dtype.h describes), for device pointers, enqueued on the current
// stream of the current device.
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"

namespace weft::kernels::cuda {

void copyStridedToContiguous(DType srcType, const void* src, std::span<const int64_t> shape,
                             std::span<const int64_t> srcStrides, DType dstType, void* dst);
void copyContiguousToStrided(DType type, const void* src, std::span<const int64_t> shape, void* dst,
                             std::span<const int64_t> dstStrides);
void fill(DType type, void* dst, int64_t n, double value);

}  // namespace weft::kernels::cuda
