// Copies and fills: the kernels behind contiguous(), clone(), to(dtype), fill_.
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"

namespace weft::kernels::cpu {

// Copies the strided source (element strides, any dtype) into a contiguous
// destination of `dstType`, converting element types as common/dtype.h
// describes.
void copyStridedToContiguous(DType srcType, const void* src, std::span<const int64_t> shape,
                             std::span<const int64_t> srcStrides, DType dstType, void* dst);

// Copies a contiguous source into a strided destination of the same dtype.
void copyContiguousToStrided(DType type, const void* src, std::span<const int64_t> shape,
                             void* dst, std::span<const int64_t> dstStrides);

// Sets n contiguous elements to `value` converted to `type`. A value an
// integer dtype cannot hold (out of range, infinite, NaN) is an
// InvalidArgumentError, as in PyTorch.
void fill(DType type, void* dst, int64_t n, double value);

}  // namespace weft::kernels::cpu
