#include "tensor/op_layout.h"

namespace weft::detail {

AxisView axisView(const Shape& shape, int64_t dim) {
  AxisView v;
  if (shape.empty()) return v;
  for (int64_t d = 0; d < dim; ++d) v.outer *= shape[d];
  v.size = shape[dim];
  for (size_t d = dim + 1; d < shape.size(); ++d) v.inner *= shape[d];
  return v;
}

Shape broadcastStrides(const Tensor& t, const Shape& outShape) {
  int64_t m = static_cast<int64_t>(outShape.size()), n = t.dim();
  Shape st(m, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t o = m - n + i;
    st[o] = t.shape()[i] == 1 && outShape[o] != 1 ? 0 : t.strides()[i];
  }
  return st;
}

}  // namespace weft::detail
