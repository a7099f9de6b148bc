// Gather/scatter kernels behind cat, stack and indexSelect, over contiguous
// buffers viewed as [outer, size, inner] around the dimension the op works on,
// and behind gather and scatterAdd, over strided operands of equal rank.
//
//   // cat two contiguous [2, 3] and [2, 5] float tensors along dim 1 into [2, 8]:
//   catForward(DType::Float32, a, 2, 3, out, 8, 0);
//   catForward(DType::Float32, b, 2, 5, out, 8, 3);
//
// Index arguments are validated by the caller (the tensor layer raises the
// IndexError); these kernels assume every index is in range.
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"

namespace weft::kernels::cpu {

// Copies src, a contiguous [outer, srcRow] buffer, into dst viewed as
// contiguous [outer, dstRow] at columns [offset, offset + srcRow). Any dtype.
void catForward(DType type, const void* src, int64_t outer, int64_t srcRow, void* dst, int64_t dstRow,
                int64_t offset);

// out[o, j, i] = in[o, index[j], i] for in [outer, size, inner] and out
// [outer, n, inner], both contiguous. Any dtype; index[j] in [0, size).
void indexSelectForward(DType type, const void* in, int64_t outer, int64_t size, int64_t inner,
                        const int64_t* index, int64_t n, void* out);

// gradIn [outer, size, inner] (overwritten) = sum over j of g[o, j, i] placed
// at gradIn[o, index[j], i]: repeated indices accumulate. Floating dtypes
// (bfloat16/float16 accumulate in float32).
void indexSelectBackward(DType type, const void* g, int64_t outer, int64_t size, int64_t inner,
                         const int64_t* index, int64_t n, void* gradIn);

// out[p] = in[p with its `dim` coordinate replaced by index[p]] for every
// position p of `shape` (index's shape, also out's). in is read through its
// element strides inStrides (any layout, same rank as shape); index and out
// are contiguous. Any dtype; index[p] in [0, in's size along dim).
void gatherForward(DType type, const void* in, std::span<const int64_t> inStrides, int64_t dim,
                   const int64_t* index, std::span<const int64_t> shape, void* out);

// out[p with its `dim` coordinate replaced by index[p]] += src[p] for every
// position p of `shape` (index's shape). out is written through its element
// strides outStrides and src read through srcStrides (both of shape's rank,
// each at least shape's sizes); index is contiguous. Repeated targets
// accumulate in the order of p along dim, so results do not depend on the
// thread count. Numeric dtypes (bfloat16/float16: each addition in float32,
// rounded to the dtype); index[p] in [0, out's size along dim).
void scatterAddForward(DType type, void* out, std::span<const int64_t> outStrides, int64_t dim,
                       const int64_t* index, std::span<const int64_t> shape, const void* src,
                       std::span<const int64_t> srcStrides);

}  // namespace weft::kernels::cpu
