// Argument checks and layout helpers shared by the op implementations in
// tensor/ (internal; not part of the public API).
#pragma once

#include "tensor/tensor.h"

namespace weft::detail {

// Both defined, same dtype and device; the error names the op and both.
void checkSameKind(const char* op, const Tensor& a, const Tensor& b);
void checkDefined(const char* op, const Tensor& t, const char* what);
void requireCpu(const char* op, const Tensor& t);
void requireFloating(const char* op, const Tensor& t);
// A numeric dtype (not bool): InvalidArgumentError naming op and dtype.
void requireNumeric(const char* op, const Tensor& t);
void requireDType(const char* op, const Tensor& t, DType dt, const char* what);
void requireDim(const char* op, const Tensor& t, int64_t ndim, const char* what);

// A contiguous tensor seen as [outer, size, inner] around dimension `dim`
// (already wrapped); a 0-D tensor is [1, 1, 1].
struct AxisView {
  int64_t outer = 1, size = 1, inner = 1;
};
AxisView axisView(const Shape& shape, int64_t dim);

// t's strides as seen from outShape after broadcasting (0 on stretched dims).
Shape broadcastStrides(const Tensor& t, const Shape& outShape);

}  // namespace weft::detail
