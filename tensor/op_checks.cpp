#include "tensor/op_checks.h"
#include "tensor/op_layout.h"

namespace weft::detail {

void checkDefined(const char* op, const Tensor& t, const char* what) {
  WEFT_ENFORCE(t.defined(), InvalidArgumentError, op, ": ", what, " is an undefined tensor");
}

void checkSameKind(const char* op, const Tensor& a, const Tensor& b) {
  checkDefined(op, a, "first operand");
  checkDefined(op, b, "second operand");
  WEFT_ENFORCE(a.dtype() == b.dtype(), InvalidArgumentError, op, ": dtype mismatch: ", dtypeName(a.dtype()),
               " (shape ", a.shape(), ") and ", dtypeName(b.dtype()), " (shape ", b.shape(), ")");
  WEFT_ENFORCE(a.device() == b.device(), InvalidArgumentError, op, ": device mismatch: ", a.device().str(), " and ",
               b.device().str());
}

void requireCpu(const char* op, const Tensor& t) {
  WEFT_ENFORCE(t.device().isCpu(), InvalidArgumentError, op, ": ", t.device().str(),
               " tensors are not supported by this op yet; move the tensor to the CPU");
}

void requireFloating(const char* op, const Tensor& t) {
  WEFT_ENFORCE(isFloating(t.dtype()), InvalidArgumentError, op, ": expected a floating-point tensor, got ",
               dtypeName(t.dtype()));
}

void requireNumeric(const char* op, const Tensor& t) {
  if (!isFloating(t.dtype()) && !isIntegral(t.dtype())) throwUnsupportedDType(op, t.dtype());
}

void requireDType(const char* op, const Tensor& t, DType dt, const char* what) {
  checkDefined(op, t, what);
  WEFT_ENFORCE(t.dtype() == dt, InvalidArgumentError, op, ": ", what, " must be ", dtypeName(dt), ", got ",
               dtypeName(t.dtype()));
}

void requireDim(const char* op, const Tensor& t, int64_t ndim, const char* what) {
  checkDefined(op, t, what);
  WEFT_ENFORCE(t.dim() == ndim, InvalidArgumentError, op, ": ", what, " must be ", ndim, "-D, got shape ", t.shape());
}

}  // namespace weft::detail
