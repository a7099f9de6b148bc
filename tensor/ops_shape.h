// Joining, splitting and gathering. (Pure views — view, transpose, narrow,
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
// Rows of `a` along dim picked by the Int64 `index` (1-D); out-of-range
// indices are an IndexError naming the index and the size.
Tensor indexSelect(const Tensor& a, int64_t dim, const Tensor& index);

}  // namespace weft
