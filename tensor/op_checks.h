// Argument checks shared by the op implementations in tensor/: each throws a
// typed error naming the op (internal; not part of the public API).
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

}  // namespace weft::detail
