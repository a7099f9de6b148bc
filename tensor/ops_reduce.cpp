// Reductions and their backward rules.
#include "tensor/ops_reduce.h"

#include <algorithm>

#include "kernels/cpu/reduce.h"
#include "tensor/autograd.h"
#include "tensor/op_utils.h"
#include "tensor/ops_elementwise.h"

namespace weft {
namespace {

// Sorted, de-duplicated, non-negative reduction dims (all dims when empty).
std::vector<int64_t> normalizeDims(const Tensor& a, std::vector<int64_t> dims, const char* op) {
  if (dims.empty()) {
    for (int64_t d = 0; d < a.dim(); ++d) dims.push_back(d);
    return dims;
  }
  for (auto& d : dims) d = wrapDim(d, a.dim(), op);
  std::sort(dims.begin(), dims.end());
  WEFT_ENFORCE(std::adjacent_find(dims.begin(), dims.end()) == dims.end(), InvalidArgumentError, op,
               ": a dimension appears twice in ", dims);
  return dims;
}

Shape reducedShape(const Tensor& a, const std::vector<int64_t>& dims, bool keepDim) {
  Shape out;
  for (int64_t d = 0; d < a.dim(); ++d) {
    bool reduced = std::binary_search(dims.begin(), dims.end(), d);
    if (!reduced) out.push_back(a.shape()[d]);
    else if (keepDim) out.push_back(1);
  }
  return out;
}

// The sum kernel: picks a layout that avoids copying when it can.
Tensor sumForward(const Tensor& a, const std::vector<int64_t>& dims, bool keepDim) {
  Shape outShape = reducedShape(a, dims, keepDim);
  Tensor out = empty(outShape, {.dtype = a.dtype()});
  int64_t R = 1;
  for (int64_t d : dims) R *= a.shape()[d];
  int64_t K = out.numel();
  if (K == 0) return out;
  int64_t nd = a.dim(), nr = static_cast<int64_t>(dims.size());
  bool leading = true, trailing = true;
  for (int64_t i = 0; i < nr; ++i) {
    leading &= dims[i] == i;
    trailing &= dims[i] == nd - nr + i;
  }
  if (a.isContiguous() && leading && nr > 0) {
    kernels::cpu::sumCols(a.dtype(), a.rawData(), R, K, out.rawData());
    return out;
  }
  // Move reduced dims last, then reduce rows.
  Tensor x = a;
  if (!trailing) {
    Shape perm;
    for (int64_t d = 0; d < nd; ++d)
      if (!std::binary_search(dims.begin(), dims.end(), d)) perm.push_back(d);
    perm.insert(perm.end(), dims.begin(), dims.end());
    NoGradGuard ng;
    x = a.permute(perm);
  }
  x = x.contiguous();
  kernels::cpu::sumRows(a.dtype(), x.rawData(), K, R, out.rawData());
  return out;
}

}  // namespace

Tensor sum(const Tensor& a, std::vector<int64_t> dims, bool keepDim) {
  detail::checkDefined("sum", a, "input");
  detail::requireCpu("sum", a);
  dims = normalizeDims(a, std::move(dims), "sum");
  Tensor out = sumForward(a, dims, keepDim);
  if (anyRequiresGrad({&a})) {
    Shape inShape = a.shape(), kept = reducedShape(a, dims, true);
    recordOp("SumBackward", {a}, {out}, [inShape, kept](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].reshape(kept).expand(inShape).contiguous()};
    });
  }
  return out;
}

Tensor sum(const Tensor& a) { return sum(a, {}, false); }

Tensor mean(const Tensor& a, std::vector<int64_t> dims, bool keepDim) {
  detail::checkDefined("mean", a, "input");
  detail::requireFloating("mean", a);
  std::vector<int64_t> nd = normalizeDims(a, dims, "mean");
  int64_t count = 1;
  for (int64_t d : nd) count *= a.shape()[d];
  return mul(sum(a, std::move(dims), keepDim), 1.0 / static_cast<double>(count));
}

Tensor mean(const Tensor& a) { return mean(a, {}, false); }

Tensor sumTo(const Tensor& a, const Shape& shape) {
  if (a.shape() == shape) return a;
  int64_t lead = a.dim() - static_cast<int64_t>(shape.size());
  WEFT_ENFORCE(lead >= 0, InvalidArgumentError, "sumTo: cannot sum shape ", a.shape(), " to ", shape);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else {
      int64_t want = shape[d - lead];
      WEFT_ENFORCE(want == a.shape()[d] || want == 1, InvalidArgumentError, "sumTo: cannot sum shape ", a.shape(),
                   " to ", shape);
      if (want == 1 && a.shape()[d] != 1) dims.push_back(d);
    }
  }
  if (dims.empty()) return a.reshape(shape);
  return sum(a, dims, true).reshape(shape);
}

}  // namespace weft
