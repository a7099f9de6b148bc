// Elementwise ops; their gradient rules are in grad_rules/elementwise.cpp.
#include "tensor/ops_elementwise.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/masking.h"
#include "kernels/cuda_call.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/masking.h"
#endif
#include "tensor/autocast.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/op_checks.h"
#include "tensor/op_layout.h"

namespace weft {

using kernels::cpu::BinaryOp;
using kernels::cpu::UnaryOp;

Shape broadcastShapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    WEFT_ENFORCE(x == y || x == 1 || y == 1, InvalidArgumentError, op, ": shapes ", a, " and ", b,
                 " cannot be broadcast together (dimension ", i, ": ", x, " vs ", y, ")");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

namespace {

Tensor binaryForward(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  detail::checkSameKind(name, a, b);
  detail::requireNumeric(name, a);
  Shape shape = broadcastShapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, {.dtype = a.dtype(), .device = a.device()});
  if (out.numel() == 0) return out;
  Shape as = detail::broadcastStrides(a, shape), bs = detail::broadcastStrides(b, shape);
  if (a.device().isCuda()) {
    WEFT_CUDA_CALL(a.device().index, binary(op, a.dtype(), a.rawData(), as, b.rawData(), bs, out.rawData(), shape));
  } else {
    kernels::cpu::binary(op, a.dtype(), a.rawData(), as, b.rawData(), bs, out.rawData(), shape);
  }
  return out;
}

// The user-facing name of a unary op, for dtype errors.
const char* forwardName(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Abs: return "abs";
    case UnaryOp::Sign: return "sign";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Gelu: return "gelu";
    case UnaryOp::PowScalar: return "pow";
    case UnaryOp::Clamp: return "clamp";
    case UnaryOp::AddScalar: return "add";
    case UnaryOp::MulScalar: return "mul";
    case UnaryOp::Square: return "square";
    case UnaryOp::Reciprocal: return "reciprocal";
  }
  return "unary op";
}

// Ops whose results are not integers: floating dtypes only (see common/dtype.h).
bool needsFloating(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp:
    case UnaryOp::Log:
    case UnaryOp::Sqrt:
    case UnaryOp::Tanh:
    case UnaryOp::Sigmoid:
    case UnaryOp::Gelu:
    case UnaryOp::PowScalar:
    case UnaryOp::Reciprocal: return true;
    default: return false;
  }
}

Tensor unaryForward(UnaryOp op, const char* name, const Tensor& a, double p0 = 0, double p1 = 0) {
  detail::checkDefined(name, a, "input");
  if (needsFloating(op) ? !isFloating(a.dtype()) : a.dtype() == DType::Bool) {
    throwUnsupportedDType(forwardName(op), a.dtype());
  }
  Tensor x = a.contiguous();
  Tensor out = empty(a.shape(), {.dtype = a.dtype(), .device = a.device()});
  if (a.device().isCuda()) {
    WEFT_CUDA_CALL(a.device().index, unary(op, a.dtype(), x.rawData(), out.rawData(), out.numel(), p0, p1));
  } else {
    kernels::cpu::unary(op, a.dtype(), x.rawData(), out.rawData(), out.numel(), p0, p1);
  }
  return out;
}

Tensor unaryOp(UnaryOp op, const char* name, const Tensor& a, double p0 = 0, double p1 = 0) {
  Tensor out = unaryForward(op, name, a, p0, p1);
  grad_rules::unaryBackward(op, name, a, out, p0, p1);
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  if (auto d = autocast::detail::promotedFor({&a, &b})) {
    return add(autocast::detail::cast(a, *d, true), autocast::detail::cast(b, *d, true), alpha);
  }
  Tensor bb = alpha == 1.0 ? b : mul(b, alpha);
  Tensor out = binaryForward(BinaryOp::Add, "add", a, bb);
  grad_rules::addBackward(a, bb, out);
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  if (auto d = autocast::detail::promotedFor({&a, &b})) {
    return sub(autocast::detail::cast(a, *d, true), autocast::detail::cast(b, *d, true), alpha);
  }
  Tensor bb = alpha == 1.0 ? b : mul(b, alpha);
  Tensor out = binaryForward(BinaryOp::Sub, "sub", a, bb);
  grad_rules::subBackward(a, bb, out);
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (auto d = autocast::detail::promotedFor({&a, &b})) {
    return mul(autocast::detail::cast(a, *d, true), autocast::detail::cast(b, *d, true));
  }
  Tensor out = binaryForward(BinaryOp::Mul, "mul", a, b);
  grad_rules::mulBackward(a, b, out);
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (auto d = autocast::detail::promotedFor({&a, &b})) {
    return div(autocast::detail::cast(a, *d, true), autocast::detail::cast(b, *d, true));
  }
  Tensor out = binaryForward(BinaryOp::Div, "div", a, b);
  grad_rules::divBackward(a, b, out);
  return out;
}

Tensor add(const Tensor& a, double b) { return unaryOp(UnaryOp::AddScalar, "AddScalarBackward", a, b); }
Tensor mul(const Tensor& a, double b) { return unaryOp(UnaryOp::MulScalar, "MulScalarBackward", a, b); }

Tensor maximum(const Tensor& a, const Tensor& b) {
  if (auto d = autocast::detail::promotedFor({&a, &b})) {
    return maximum(autocast::detail::cast(a, *d, true), autocast::detail::cast(b, *d, true));
  }
  Tensor out = binaryForward(BinaryOp::Maximum, "MaximumBackward", a, b);
  grad_rules::maximumBackward(a, b, out);
  return out;
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  if (auto d = autocast::detail::promotedFor({&a, &b})) {
    return minimum(autocast::detail::cast(a, *d, true), autocast::detail::cast(b, *d, true));
  }
  Tensor out = binaryForward(BinaryOp::Minimum, "MinimumBackward", a, b);
  grad_rules::minimumBackward(a, b, out);
  return out;
}

Tensor neg(const Tensor& a) { return unaryOp(UnaryOp::Neg, "NegBackward", a); }
Tensor exp(const Tensor& a) { return unaryOp(UnaryOp::Exp, "ExpBackward", a); }
Tensor log(const Tensor& a) { return unaryOp(UnaryOp::Log, "LogBackward", a); }
Tensor sqrt(const Tensor& a) { return unaryOp(UnaryOp::Sqrt, "SqrtBackward", a); }
Tensor abs(const Tensor& a) { return unaryOp(UnaryOp::Abs, "AbsBackward", a); }
Tensor square(const Tensor& a) { return unaryOp(UnaryOp::Square, "SquareBackward", a); }
Tensor relu(const Tensor& a) { return unaryOp(UnaryOp::Relu, "ReluBackward", a); }
Tensor tanh(const Tensor& a) { return unaryOp(UnaryOp::Tanh, "TanhBackward", a); }
Tensor sigmoid(const Tensor& a) { return unaryOp(UnaryOp::Sigmoid, "SigmoidBackward", a); }
Tensor gelu(const Tensor& a) { return unaryOp(UnaryOp::Gelu, "GeluBackward", a); }

Tensor pow(const Tensor& a, double exponent) {
  if (exponent == 2.0) return square(a);
  return unaryOp(UnaryOp::PowScalar, "PowBackward", a, exponent);
}

Tensor pow(const Tensor& a, const Tensor& e) {
  if (auto d = autocast::detail::promotedFor({&a, &e})) {
    return pow(autocast::detail::cast(a, *d, true), autocast::detail::cast(e, *d, true));
  }
  Tensor out = binaryForward(BinaryOp::Pow, "pow", a, e);
  grad_rules::powTensorBackward(a, e, out);
  return out;
}

Tensor clamp(const Tensor& a, double min, double max) {
  WEFT_ENFORCE(!(min > max), InvalidArgumentError, "clamp: min ", min, " is greater than max ", max);
  if (a.defined() && isIntegral(a.dtype())) {
    // Infinite or out-of-range bounds do not convert to the integer type: saturate them (int64's
    // largest value rounds up to 2^63 as a double, which int64 cannot hold: stop one double below).
    WEFT_DISPATCH_NUMERIC(a.dtype(), "clamp", [&]<class T>() {
      const double lo = static_cast<double>(std::numeric_limits<T>::lowest());
      const double hi =
          std::is_same_v<T, int64_t> ? 9223372036854774784.0 : static_cast<double>(std::numeric_limits<T>::max());
      min = std::clamp(min, lo, hi);
      max = std::clamp(max, lo, hi);
    });
  }
  return unaryOp(UnaryOp::Clamp, "ClampBackward", a, min, max);
}

namespace {

Tensor compareOp(kernels::cpu::CompareOp op, const char* name, const Tensor& a, const Tensor& b) {
  if (auto d = autocast::detail::promotedFor({&a, &b})) {
    return compareOp(op, name, autocast::detail::cast(a, *d, true), autocast::detail::cast(b, *d, true));
  }
  detail::checkSameKind(name, a, b);
  Shape shape = broadcastShapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, {.dtype = DType::Bool, .device = a.device()});
  if (out.numel() == 0) return out;
  if (a.device().isCuda()) {
    WEFT_CUDA_CALL(a.device().index, compare(op, a.dtype(), a.rawData(), detail::broadcastStrides(a, shape), b.rawData(),
                                             detail::broadcastStrides(b, shape), out.data<bool>(), shape));
  } else {
    kernels::cpu::compare(op, a.dtype(), a.rawData(), detail::broadcastStrides(a, shape), b.rawData(),
                          detail::broadcastStrides(b, shape), out.data<bool>(), shape);
  }
  return out;
}

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compareOp(kernels::cpu::CompareOp::Eq, "eq", a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compareOp(kernels::cpu::CompareOp::Gt, "gt", a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compareOp(kernels::cpu::CompareOp::Lt, "lt", a, b); }

// ---- selection ------------------------------------------------------------------

namespace {

// where's forward; `name` is the node's (where and maskedFill share it).
Tensor selectOp(const char* op, const char* name, const Tensor& cond, const Tensor& a, const Tensor& b) {
  detail::checkDefined(op, cond, "condition");
  detail::requireDType(op, cond, DType::Bool, "condition");
  detail::checkSameKind(op, a, b);
  WEFT_ENFORCE(cond.device() == a.device(), InvalidArgumentError, op, ": device mismatch: condition on ",
               cond.device().str(), ", values on ", a.device().str());
  Shape shape = broadcastShapes(broadcastShapes(cond.shape(), a.shape(), op), b.shape(), op);
  Tensor out = empty(shape, {.dtype = a.dtype(), .device = a.device()});
  if (out.numel() > 0) {
    if (a.device().isCuda()) {
      WEFT_CUDA_CALL(a.device().index, where(a.dtype(), cond.data<bool>(), detail::broadcastStrides(cond, shape),
                                             a.rawData(), detail::broadcastStrides(a, shape), b.rawData(),
                                             detail::broadcastStrides(b, shape), out.rawData(), shape));
    } else {
      kernels::cpu::where(a.dtype(), cond.data<bool>(), detail::broadcastStrides(cond, shape), a.rawData(),
                          detail::broadcastStrides(a, shape), b.rawData(), detail::broadcastStrides(b, shape),
                          out.rawData(), shape);
    }
  }
  grad_rules::whereBackward(name, cond, a, b, out);
  return out;
}

Tensor triangleOp(const char* op, const Tensor& x, int64_t diagonal, bool upper) {
  detail::checkDefined(op, x, "input");
  WEFT_ENFORCE(x.dim() >= 2, InvalidArgumentError, op,
               ": input must have at least 2 dimensions [..., R, C], got shape ", x.shape());
  const int64_t R = x.size(-2), C = x.size(-1);
  Tensor xc = x.contiguous();
  Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  if (out.numel() > 0) {
    if (x.device().isCuda()) {
      WEFT_CUDA_CALL(x.device().index,
                     triangle(x.dtype(), xc.rawData(), x.numel() / (R * C), R, C, diagonal, upper, out.rawData()));
    } else {
      kernels::cpu::triangle(x.dtype(), xc.rawData(), x.numel() / (R * C), R, C, diagonal, upper, out.rawData());
    }
  }
  grad_rules::triangleBackward(upper, diagonal, x, out);
  return out;
}

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (auto d = autocast::detail::promotedFor({&a, &b})) {
    return where(cond, autocast::detail::cast(a, *d, true), autocast::detail::cast(b, *d, true));
  }
  return selectOp("where", "WhereBackward", cond, a, b);
}

Tensor maskedFill(const Tensor& x, const Tensor& mask, double value) {
  const char* op = "maskedFill";
  detail::checkDefined(op, x, "input");
  detail::checkDefined(op, mask, "mask");
  detail::requireDType(op, mask, DType::Bool, "mask");
  WEFT_ENFORCE(broadcastShapes(x.shape(), mask.shape(), op) == x.shape(), InvalidArgumentError, op, ": mask of shape ",
               mask.shape(), " does not broadcast to the input's shape ", x.shape());
  WEFT_ENFORCE(isFloating(x.dtype()) || std::isfinite(value), InvalidArgumentError, op, ": value ", value,
               " cannot be stored in a tensor of dtype ", dtypeName(x.dtype()));
  Tensor fill = full({}, value, {.dtype = x.dtype(), .device = x.device()});
  return selectOp(op, "MaskedFillBackward", mask, fill, x);
}

Tensor triu(const Tensor& x, int64_t diagonal) { return triangleOp("triu", x, diagonal, true); }
Tensor tril(const Tensor& x, int64_t diagonal) { return triangleOp("tril", x, diagonal, false); }

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) return false;
  // Reads both to the host (toVector copies from a device).
  std::vector<double> x = a.toVector<double>(), y = b.toVector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) return false;
    if (std::abs(x[i] - y[i]) > atol + rtol * std::abs(y[i])) return false;
  }
  return true;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return add(a, -b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return mul(a, 1.0 / b); }
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(double a, const Tensor& b) { return add(neg(b), a); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator/(double a, const Tensor& b) {
  return unaryOp(UnaryOp::MulScalar, "MulScalarBackward", unaryOp(UnaryOp::Reciprocal, "ReciprocalBackward", b), a);
}

}  // namespace weft
