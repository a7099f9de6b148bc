// Joining, splitting, gathering and scattering. (Pure views — view, transpose, narrow,
// select, expand, ... — are Tensor methods, see tensor/tensor.h.)
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace weft {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Pieces of `splitSize` along dim (the last may be smaller); views.
std::vector<Tensor> split(const Tensor& a, int64_t splitSize, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim = 0);
// Rows of `a` along dim picked by the Int64 `index` (1-D, on a's device);
// out-of-range indices are an IndexError naming the index and the size.
Tensor indexSelect(const Tensor& a, int64_t dim, const Tensor& index);

// As torch.gather: out has index's shape and out[p] = x[p with its dim
// coordinate replaced by index[p]]. index is Int64 with x's number of
// dimensions and index.size(d) <= x.size(d) for every d != dim. Any dtype;
// differentiable in x (the gradient scatter-adds g back, so an element
// gathered twice receives both).
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// As torch.scatter_add: a copy of x with src[p] added at x[p with its dim
// coordinate replaced by index[p]] for every position p of index (repeated
// targets accumulate, in order along dim). index is Int64; x, index and src
// have one number of dimensions, index.size(d) <= src.size(d) for every d
// and index.size(d) <= x.size(d) for d != dim; src has x's dtype. Numeric
// dtypes; differentiable in x (gradient g) and src (gradient g gathered at
// index; zero for src elements outside index's extent).
Tensor scatterAdd(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);

// Errors (gather, scatterAdd): InvalidArgumentError naming the op and the
// shapes or dtypes for mismatched ranks, sizes, dtypes or devices; IndexError
// naming the index, its position, the dim and its size for an index outside
// [0, size) (negative indices included). On a CUDA device the index check
// reads back the smallest and largest index, and all of them only to name
// the first one out of range.

}  // namespace weft
