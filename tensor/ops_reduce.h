// Reductions and softmax. `dims` may be negative; an empty dims list reduces
// over every dimension. keepDim keeps reduced dimensions with size 1.
// sum takes every CPU dtype of common/dtype.h: int32, uint8 and bool sum to
// int64 (as in PyTorch; eq(a, b).sum() counts matches); max/min/argmax/argmin
// take them all and keep the dtype; mean and softmax need a floating dtype.
// On a CUDA tensor the same ops run on its device (kernels/cuda/reduce.h,
// scan.h, softmax.h) with the CPU's results: the same dtypes, ties and NaN
// handling; floating sums may differ by the order of their additions.
#pragma once

#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace weft {

Tensor sum(const Tensor& a);
Tensor sum(const Tensor& a, std::vector<int64_t> dims, bool keepDim = false);
Tensor mean(const Tensor& a);
Tensor mean(const Tensor& a, std::vector<int64_t> dims, bool keepDim = false);
// Sums `a` down to `shape` (the reverse of broadcasting `shape` up to a's).
Tensor sumTo(const Tensor& a, const Shape& shape);

// Over all elements; the gradient is shared equally among tied maxima.
Tensor max(const Tensor& a);
Tensor min(const Tensor& a);
// Values and (Int64) indices along dim; the gradient flows to the index.
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepDim = false);
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepDim = false);
Tensor argmax(const Tensor& a, int64_t dim, bool keepDim = false);
Tensor argmin(const Tensor& a, int64_t dim, bool keepDim = false);

Tensor softmax(const Tensor& a, int64_t dim);
Tensor logSoftmax(const Tensor& a, int64_t dim);

// Running sums along dim, as torch.cumsum: out[..., r, ...] = the sum of
// a[..., s, ...] over s <= r. Every dtype but bfloat16/float16: floating
// dtypes keep theirs (float32 accumulates in float64, as PyTorch's CPU
// cumsum); int64, int32, uint8 and bool give int64 (integer sums wrap). A
// dim out of range is an error naming cumsum; a 0-D input takes dim 0 or -1.
// Differentiable for floating a: the gradient is the reversed running sum
// of g.
Tensor cumsum(const Tensor& a, int64_t dim);

}  // namespace weft
