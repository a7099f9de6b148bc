// CUDA versions of kernels/cpu/index.h: the gather/scatter kernels behind
// cat, stack, indexSelect, gather and scatterAdd, with the same signatures
// and semantics over device buffers (pointers are device pointers of the
// current device; launches go on its current stream).
//
//   kernels::cuda::indexSelectForward(DType::Float32, in, outer, size, inner, idx, n, out);
//
// Index arguments are validated by the caller, as on the CPU; indexRange
// gives it the smallest and largest index with one read-back of two numbers.
// indexSelectBackward accumulates repeated indices with atomic additions
// (equal to the CPU's sums up to their order); scatterAddForward gives each
// thread one row along dim, so it adds in the CPU's order, without atomics.
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"
#include "kernels/cpu/index.h"

namespace weft::kernels::cuda {

void catForward(DType type, const void* src, int64_t outer, int64_t srcRow, void* dst, int64_t dstRow,
                int64_t offset);

void indexSelectForward(DType type, const void* in, int64_t outer, int64_t size, int64_t inner,
                        const int64_t* index, int64_t n, void* out);

// Floating dtypes; bfloat16/float16 accumulate in a float32 buffer, rounded
// once at the end.
void indexSelectBackward(DType type, const void* g, int64_t outer, int64_t size, int64_t inner,
                         const int64_t* index, int64_t n, void* gradIn);

void gatherForward(DType type, const void* in, std::span<const int64_t> inStrides, int64_t dim,
                   const int64_t* index, std::span<const int64_t> shape, void* out);

// Numeric dtypes and bfloat16/float16 (each addition in float32, rounded).
void scatterAddForward(DType type, void* out, std::span<const int64_t> outStrides, int64_t dim,
                       const int64_t* index, std::span<const int64_t> shape, const void* src,
                       std::span<const int64_t> srcStrides);

// The smallest and largest of index[0..n) (device memory), read back to the
// host (waits for the current stream). n == 0 gives lo = INT64_MAX, hi = INT64_MIN.
void indexRange(const int64_t* index, int64_t n, int64_t* lo, int64_t* hi);

}  // namespace weft::kernels::cuda
