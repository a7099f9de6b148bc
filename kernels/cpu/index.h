// Gather/scatter kernels behind cat, stack and indexSelect, over contiguous
// buffers viewed as [outer, size, inner] around the dimension the op works on.
//
//   // cat two contiguous [2, 3] and [2, 5] float tensors along dim 1 into [2, 8]:
//   catForward(DType::Float32, a, 2, 3, out, 8, 0);
//   catForward(DType::Float32, b, 2, 5, out, 8, 3);
//
// Index arguments are validated by the caller (the tensor layer raises the
// IndexError); these kernels assume every index is in range.
#pragma once

#include <cstdint>

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

}  // namespace weft::kernels::cpu
