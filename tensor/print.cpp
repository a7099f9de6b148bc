// Readable printing in PyTorch's layout:
//   tensor([[ 1.0000, -2.5000],
//           [ 0.0000,  3.0000]], dtype=float64, grad_fn=<MulBackward>)
//   tensor([ True, False])                   (bool, as PyTorch prints it)
//   tensor([1, 2], dtype=int32)
// Tensors over 1000 elements show the first and last 3 entries per dimension.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "tensor/autograd.h"
#include "tensor/tensor.h"

namespace weft {
namespace {

constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  bool boolean = false;
  bool integral = false;
  bool scientific = false;
  int width = 1;

  std::string format(double v) const {
    char buf[64];
    if (boolean) std::snprintf(buf, sizeof buf, "%s", v != 0 ? "True" : "False");
    else if (integral) std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
    else if (std::isnan(v)) std::snprintf(buf, sizeof buf, "nan");
    else if (std::isinf(v)) std::snprintf(buf, sizeof buf, v > 0 ? "inf" : "-inf");
    else if (scientific) std::snprintf(buf, sizeof buf, "%.4e", v);
    else std::snprintf(buf, sizeof buf, "%.4f", v);
    return buf;
  }
};

void printDim(std::ostream& os, const std::vector<double>& v, const Shape& shape, const Shape& strides,
              int64_t dim, int64_t offset, bool summarize, const Formatter& f, int indent) {
  int64_t n = shape[dim];
  os << '[';
  bool last = dim + 1 == static_cast<int64_t>(shape.size());
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
      os << (last ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - kEdgeItems;
    }
    if (last) {
      std::string s = f.format(v[offset + i * strides[dim]]);
      os << std::string(f.width - static_cast<int>(s.size()), ' ') << s;
    } else {
      printDim(os, v, shape, strides, dim + 1, offset + i * strides[dim], summarize, f, indent + 1);
    }
    if (i + 1 < n) os << (last ? ", " : ",\n" + std::string(shape.size() - dim - 1 > 1 ? 1 : 0, '\n') + std::string(indent + 1, ' '));
  }
  os << ']';
}

}  // namespace

std::string Tensor::toString() const {
  std::ostringstream os;
  os << *this;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  std::vector<double> v = t.toVector<double>();
  Formatter f;
  f.boolean = t.dtype() == DType::Bool;
  f.integral = isIntegral(t.dtype());
  double maxAbs = 0, minAbs = INFINITY;
  for (double x : v) {
    if (!std::isfinite(x)) continue;
    maxAbs = std::max(maxAbs, std::abs(x));
    if (x != 0) minAbs = std::min(minAbs, std::abs(x));
  }
  f.scientific = !f.integral && !f.boolean && (maxAbs >= 1e8 || (minAbs < 1e-4 && minAbs != INFINITY));
  for (double x : v) f.width = std::max(f.width, static_cast<int>(f.format(x).size()));
  os << "tensor(";
  if (t.dim() == 0) {
    os << f.format(v.empty() ? 0 : v[0]);
  } else if (t.numel() == 0) {
    os << "[], size=" << shapeString(t.shape());
  } else {
    printDim(os, v, t.shape(), contiguousStrides(t.shape()), 0, 0, t.numel() > kSummarizeAbove, f, 7);
  }
  if (t.dtype() != DType::Float32 && t.dtype() != DType::Int64 && t.dtype() != DType::Bool) {
    os << ", dtype=" << dtypeName(t.dtype());
  }
  if (!t.device().isCpu()) os << ", device='" << t.device().str() << "'";
  if (t.gradFn()) os << ", grad_fn=<" << t.gradFn()->name() << '>';
  else if (t.requiresGrad()) os << ", requires_grad=True";
  return os << ')';
}

}  // namespace weft
