// Layout helpers shared by the op implementations in tensor/: a tensor seen
// around one axis, strides after broadcasting (internal; not part of the
// public API).
#pragma once

#include "tensor/tensor.h"

namespace weft::detail {

// A contiguous tensor seen as [outer, size, inner] around dimension `dim`
// (already wrapped); a 0-D tensor is [1, 1, 1].
struct AxisView {
  int64_t outer = 1, size = 1, inner = 1;
};
AxisView axisView(const Shape& shape, int64_t dim);

// t's strides as seen from outShape after broadcasting (0 on stretched dims).
Shape broadcastStrides(const Tensor& t, const Shape& outShape);

}  // namespace weft::detail
