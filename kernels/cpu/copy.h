// Copies and fills: the kernels behind contiguous(), clone(), to(dtype), fill_;
// and the float32 conversions through which kernels compute on bfloat16 and
// float16 (common/half.h).
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

// n contiguous bfloat16/float16 (`type`) elements to float32 and back, with
// common/half.h's rounding, bit for bit. bfloat16 loops vectorise as they
// are; float16 uses the CPU's F16C instructions where it has them.
void halfToFloat(DType type, const void* src, float* dst, int64_t n);
void floatToHalf(DType type, const float* src, void* dst, int64_t n);
// The same with common/half.h's scalar code only (what a CPU without F16C
// runs), for checking the two agree.
void halfToFloatPortable(DType type, const void* src, float* dst, int64_t n);
void floatToHalfPortable(DType type, const float* src, void* dst, int64_t n);

// Elements per block of the through-float32 loops: a block of each operand
// fits in L1 beside the others.
inline constexpr int64_t kHalfBlock = 1024;

}  // namespace weft::kernels::cpu
