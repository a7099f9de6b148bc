// Elementwise ops and their backward rules (one rule per op, next to it).
#include "tensor/ops_elementwise.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/elementwise.h"
#include "tensor/autograd.h"
#include "tensor/op_utils.h"
#include "tensor/ops_reduce.h"

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
  detail::requireCpu(name, a);
  detail::requireNumeric(name, a);
  Shape shape = broadcastShapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, {.dtype = a.dtype(), .device = a.device()});
  if (out.numel() == 0) return out;
  Shape as = detail::broadcastStrides(a, shape), bs = detail::broadcastStrides(b, shape);
  kernels::cpu::binary(op, a.dtype(), a.rawData(), as, b.rawData(), bs, out.rawData(), shape);
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
  detail::requireCpu(name, a);
  if (needsFloating(op) ? !isFloating(a.dtype()) : a.dtype() == DType::Bool) {
    throwUnsupportedDType(forwardName(op), a.dtype());
  }
  Tensor x = a.contiguous();
  Tensor out = empty(a.shape(), {.dtype = a.dtype(), .device = a.device()});
  kernels::cpu::unary(op, a.dtype(), x.rawData(), out.rawData(), out.numel(), p0, p1);
  return out;
}

// Records the backward of a unary op through kernels::cpu::unaryBackward.
// saveInput/saveOutput say which of x and y the derivative reads.
void recordUnary(UnaryOp op, const char* name, const Tensor& a, const Tensor& out, bool saveInput, bool saveOutput,
                 double p0 = 0, double p1 = 0) {
  if (!anyRequiresGrad({&a})) return;
  SavedTensor x(saveInput ? a : Tensor()), y(saveOutput ? out : Tensor());
  recordOp(name, {a}, {out}, [op, name, x, y, p0, p1](const std::vector<Tensor>& g) {
    Tensor xi = x.unpack(name), yo = y.unpack(name);
    if (xi.defined()) xi = xi.contiguous();
    Tensor go = g[0].contiguous();
    Tensor gx = emptyLike(go);
    kernels::cpu::unaryBackward(op, go.dtype(), xi.defined() ? xi.rawData() : nullptr,
                                yo.defined() ? yo.rawData() : nullptr, go.rawData(), gx.rawData(), go.numel(), p0, p1);
    return std::vector<Tensor>{gx};
  });
}

Tensor unaryOp(UnaryOp op, const char* name, const Tensor& a, bool saveInput, bool saveOutput, double p0 = 0,
               double p1 = 0) {
  Tensor out = unaryForward(op, name, a, p0, p1);
  recordUnary(op, name, a, out, saveInput, saveOutput, p0, p1);
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  Tensor bb = alpha == 1.0 ? b : mul(b, alpha);
  Tensor out = binaryForward(BinaryOp::Add, "add", a, bb);
  if (anyRequiresGrad({&a, &b})) {
    Shape as = a.shape(), bs = b.shape();
    recordOp("AddBackward", {a, bb}, {out}, [as, bs](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{sumTo(g[0], as), sumTo(g[0], bs)};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  Tensor bb = alpha == 1.0 ? b : mul(b, alpha);
  Tensor out = binaryForward(BinaryOp::Sub, "sub", a, bb);
  if (anyRequiresGrad({&a, &b})) {
    Shape as = a.shape(), bs = b.shape();
    recordOp("SubBackward", {a, bb}, {out}, [as, bs](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{sumTo(g[0], as), sumTo(neg(g[0]), bs)};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binaryForward(BinaryOp::Mul, "mul", a, b);
  if (anyRequiresGrad({&a, &b})) {
    SavedTensor sa(b.requiresGrad() ? a : Tensor()), sb(a.requiresGrad() ? b : Tensor());
    Shape as = a.shape(), bs = b.shape();
    recordOp("MulBackward", {a, b}, {out}, [sa, sb, as, bs](const std::vector<Tensor>& g) {
      Tensor va = sa.unpack("MulBackward"), vb = sb.unpack("MulBackward");
      return std::vector<Tensor>{vb.defined() ? sumTo(mul(g[0], vb), as) : Tensor(),
                                 va.defined() ? sumTo(mul(g[0], va), bs) : Tensor()};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binaryForward(BinaryOp::Div, "div", a, b);
  if (anyRequiresGrad({&a, &b})) {
    SavedTensor sa(b.requiresGrad() ? a : Tensor()), sb(b);
    Shape as = a.shape(), bs = b.shape();
    recordOp("DivBackward", {a, b}, {out}, [sa, sb, as, bs](const std::vector<Tensor>& g) {
      Tensor va = sa.unpack("DivBackward"), vb = sb.unpack("DivBackward");
      Tensor ga = sumTo(div(g[0], vb), as);
      Tensor gb = va.defined() ? sumTo(neg(div(mul(g[0], va), mul(vb, vb))), bs) : Tensor();
      return std::vector<Tensor>{ga, gb};
    });
  }
  return out;
}

Tensor add(const Tensor& a, double b) { return unaryOp(UnaryOp::AddScalar, "AddScalarBackward", a, false, false, b); }
Tensor mul(const Tensor& a, double b) { return unaryOp(UnaryOp::MulScalar, "MulScalarBackward", a, false, false, b); }

namespace {

// Gradient routing for maximum/minimum: to the winner, split equally on ties.
Tensor selectMask(const Tensor& winner, const Tensor& loser, DType dt) {
  NoGradGuard ng;
  Tensor w = gt(winner, loser).to(dt);
  Tensor tie = eq(winner, loser).to(dt);
  return add(w, mul(tie, 0.5));
}

Tensor extremum(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  Tensor out = binaryForward(op, name, a, b);
  if (anyRequiresGrad({&a, &b})) {
    SavedTensor sa(a), sb(b);
    Shape as = a.shape(), bs = b.shape();
    bool isMax = op == BinaryOp::Maximum;
    recordOp(name, {a, b}, {out}, [sa, sb, as, bs, isMax, name](const std::vector<Tensor>& g) {
      Tensor va = sa.unpack(name), vb = sb.unpack(name);
      Tensor ma = isMax ? selectMask(va, vb, g[0].dtype()) : selectMask(vb, va, g[0].dtype());
      Tensor ga = mul(g[0], ma);
      Tensor gb = sub(g[0], ga);
      return std::vector<Tensor>{sumTo(ga, as), sumTo(gb, bs)};
    });
  }
  return out;
}

}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::Maximum, "MaximumBackward", a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::Minimum, "MinimumBackward", a, b); }

Tensor neg(const Tensor& a) { return unaryOp(UnaryOp::Neg, "NegBackward", a, false, false); }
Tensor exp(const Tensor& a) { return unaryOp(UnaryOp::Exp, "ExpBackward", a, false, true); }
Tensor log(const Tensor& a) { return unaryOp(UnaryOp::Log, "LogBackward", a, true, false); }
Tensor sqrt(const Tensor& a) { return unaryOp(UnaryOp::Sqrt, "SqrtBackward", a, false, true); }
Tensor abs(const Tensor& a) { return unaryOp(UnaryOp::Abs, "AbsBackward", a, true, false); }
Tensor square(const Tensor& a) { return unaryOp(UnaryOp::Square, "SquareBackward", a, true, false); }
Tensor relu(const Tensor& a) { return unaryOp(UnaryOp::Relu, "ReluBackward", a, true, false); }
Tensor tanh(const Tensor& a) { return unaryOp(UnaryOp::Tanh, "TanhBackward", a, false, true); }
Tensor sigmoid(const Tensor& a) { return unaryOp(UnaryOp::Sigmoid, "SigmoidBackward", a, false, true); }
Tensor gelu(const Tensor& a) { return unaryOp(UnaryOp::Gelu, "GeluBackward", a, true, false); }

Tensor pow(const Tensor& a, double exponent) {
  if (exponent == 2.0) return square(a);
  return unaryOp(UnaryOp::PowScalar, "PowBackward", a, true, false, exponent);
}

Tensor pow(const Tensor& a, const Tensor& e) {
  Tensor out = binaryForward(BinaryOp::Pow, "pow", a, e);
  if (anyRequiresGrad({&a, &e})) {
    SavedTensor sa(a), se(e), so(out);
    Shape as = a.shape(), es = e.shape();
    bool needE = e.requiresGrad();
    recordOp("PowTensorBackward", {a, e}, {out}, [sa, se, so, as, es, needE](const std::vector<Tensor>& g) {
      Tensor va = sa.unpack("PowTensorBackward"), ve = se.unpack("PowTensorBackward");
      Tensor ga = sumTo(mul(g[0], mul(ve, pow(va, sub(ve, onesLike(ve))))), as);
      Tensor ge = needE ? sumTo(mul(g[0], mul(so.unpack("PowTensorBackward"), log(va))), es) : Tensor();
      return std::vector<Tensor>{ga, ge};
    });
  }
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
  return unaryOp(UnaryOp::Clamp, "ClampBackward", a, true, false, min, max);
}

namespace {

Tensor compareOp(kernels::cpu::CompareOp op, const char* name, const Tensor& a, const Tensor& b) {
  detail::checkSameKind(name, a, b);
  detail::requireCpu(name, a);
  Shape shape = broadcastShapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, {.dtype = DType::Bool});
  if (out.numel() == 0) return out;
  kernels::cpu::compare(op, a.dtype(), a.rawData(), detail::broadcastStrides(a, shape), b.rawData(),
                        detail::broadcastStrides(b, shape), out.data<bool>(), shape);
  return out;
}

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compareOp(kernels::cpu::CompareOp::Eq, "eq", a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compareOp(kernels::cpu::CompareOp::Gt, "gt", a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compareOp(kernels::cpu::CompareOp::Lt, "lt", a, b); }

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) return false;
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
  return unaryOp(UnaryOp::MulScalar, "MulScalarBackward",
                 unaryOp(UnaryOp::Reciprocal, "ReciprocalBackward", b, false, true), false, false, a);
}

}  // namespace weft
