// Reductions and softmax; their gradient rules are in grad_rules/reduce.cpp.
#include "tensor/ops_reduce.h"

#include <algorithm>

#include "kernels/cpu/reduce.h"
#include "kernels/cpu/scan.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda_call.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/scan.h"
#include "kernels/cuda/softmax.h"
#endif
#include "tensor/autocast.h"
#include "tensor/autograd.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/op_checks.h"
#include "tensor/op_layout.h"
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
  Tensor out = empty(outShape, {.dtype = a.dtype(), .device = a.device()});
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
    if (a.device().isCuda()) {
      WEFT_CUDA_CALL(a.device().index, sumCols(a.dtype(), a.rawData(), R, K, out.rawData()));
    } else {
      kernels::cpu::sumCols(a.dtype(), a.rawData(), R, K, out.rawData());
    }
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
  if (a.device().isCuda()) {
    WEFT_CUDA_CALL(a.device().index, sumRows(a.dtype(), x.rawData(), K, R, out.rawData()));
  } else {
    kernels::cpu::sumRows(a.dtype(), x.rawData(), K, R, out.rawData());
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& a, std::vector<int64_t> dims, bool keepDim) {
  if (autocast::detail::float32For({&a})) return sum(a.to(DType::Float32), std::move(dims), keepDim);
  detail::checkDefined("sum", a, "input");
  dims = normalizeDims(a, std::move(dims), "sum");
  if (a.dtype() == DType::Int32 || a.dtype() == DType::UInt8 || a.dtype() == DType::Bool) {
    // Summed in int64, as PyTorch does (a count of mask entries, no uint8 wrap-around).
    return sumForward(a.to(DType::Int64), dims, keepDim);
  }
  Tensor out = sumForward(a, dims, keepDim);
  grad_rules::sumBackward(a, out, dims);
  return out;
}

Tensor sum(const Tensor& a) { return sum(a, {}, false); }

Tensor mean(const Tensor& a, std::vector<int64_t> dims, bool keepDim) {
  if (autocast::detail::float32For({&a})) return mean(a.to(DType::Float32), std::move(dims), keepDim);
  detail::checkDefined("mean", a, "input");
  detail::requireFloating("mean", a);
  if (isLowPrecision(a.dtype())) return mean(a.to(DType::Float32), std::move(dims), keepDim).to(a.dtype());
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

// ---- max / min / argmax / argmin ---------------------------------------------

namespace {

using detail::AxisView;
using detail::axisView;

Shape reducedAlong(const Shape& shape, int64_t dim, bool keepDim) {
  Shape out = shape;
  if (out.empty()) return out;
  if (keepDim) {
    out[dim] = 1;
  } else {
    out.erase(out.begin() + dim);
  }
  return out;
}

// The dtype the extremum kernels read: bool as the uint8 of its 0/1 bytes.
DType kernelType(DType t) { return t == DType::Bool ? DType::UInt8 : t; }

void extremumKernel(const Tensor& x, int64_t outer, int64_t R, int64_t inner, bool isMax, void* values,
                    int64_t* indices) {
  if (x.device().isCuda()) {
    WEFT_CUDA_CALL(x.device().index,
                   extremumForward(kernelType(x.dtype()), x.rawData(), outer, R, inner, isMax, values, indices));
  } else {
    kernels::cpu::extremumForward(kernelType(x.dtype()), x.rawData(), outer, R, inner, isMax, values, indices);
  }
}

Tensor extremumAll(const Tensor& a, bool isMax) {
  const char* op = isMax ? "max" : "min";
  detail::checkDefined(op, a, "input");
  WEFT_ENFORCE(a.numel() > 0, InvalidArgumentError, op, ": cannot reduce an empty tensor of shape ", a.shape(),
               " (there is no identity for ", op, ")");
  Tensor x = a.contiguous();
  Tensor out = empty({}, {.dtype = a.dtype(), .device = a.device()});
  extremumKernel(x, 1, x.numel(), 1, isMax, out.rawData(), nullptr);
  grad_rules::extremumAllBackward(isMax, a, out);
  return out;
}

// Values (when wanted) and Int64 indices of the extremum along dim.
std::pair<Tensor, Tensor> extremumAlong(const Tensor& a, int64_t dim, bool keepDim, bool isMax, bool wantValues,
                                        const char* op) {
  detail::checkDefined(op, a, "input");
  dim = wrapDim(dim, a.dim(), op);
  AxisView v = axisView(a.shape(), dim);
  WEFT_ENFORCE(v.size > 0, InvalidArgumentError, op, ": cannot reduce dimension ", dim, " of size 0 (shape ",
               a.shape(), ")");
  Shape outShape = reducedAlong(a.shape(), dim, keepDim);
  Tensor values = wantValues ? empty(outShape, {.dtype = a.dtype(), .device = a.device()}) : Tensor();
  Tensor indices = empty(outShape, {.dtype = DType::Int64, .device = a.device()});
  if (a.numel() > 0) {
    Tensor x = a.contiguous();
    extremumKernel(x, v.outer, v.size, v.inner, isMax, wantValues ? values.rawData() : nullptr,
                   indices.data<int64_t>());
  }
  if (wantValues) grad_rules::extremumAlongBackward(isMax, a, values, indices, v);
  return {values, indices};
}

}  // namespace

Tensor max(const Tensor& a) { return extremumAll(a, true); }
Tensor min(const Tensor& a) { return extremumAll(a, false); }

std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepDim) {
  return extremumAlong(a, dim, keepDim, true, true, "max");
}

std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepDim) {
  return extremumAlong(a, dim, keepDim, false, true, "min");
}

Tensor argmax(const Tensor& a, int64_t dim, bool keepDim) {
  return extremumAlong(a, dim, keepDim, true, false, "argmax").second;
}

Tensor argmin(const Tensor& a, int64_t dim, bool keepDim) {
  return extremumAlong(a, dim, keepDim, false, false, "argmin").second;
}

// ---- softmax / logSoftmax -----------------------------------------------------

namespace {

Tensor softmaxImpl(const Tensor& a, int64_t dim, bool log) {
  const char* op = log ? "logSoftmax" : "softmax";
  detail::checkDefined(op, a, "input");
  detail::requireFloating(op, a);
  if (isLowPrecision(a.dtype())) return softmaxImpl(a.to(DType::Float32), dim, log).to(a.dtype());
  dim = wrapDim(dim, a.dim(), op);
  AxisView v = axisView(a.shape(), dim);
  Tensor x = a.contiguous();
  Tensor out = empty(a.shape(), {.dtype = a.dtype(), .device = a.device()});
  if (out.numel() > 0) {
    if (a.device().isCuda()) {
      WEFT_CUDA_CALL(a.device().index, softmaxForward(a.dtype(), x.rawData(), v.outer, v.size, v.inner, log,
                                                      out.rawData()));
    } else {
      kernels::cpu::softmaxForward(a.dtype(), x.rawData(), v.outer, v.size, v.inner, log, out.rawData());
    }
  }
  grad_rules::softmaxBackward(log, a, out, v);
  return out;
}

}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) {
  if (autocast::detail::float32For({&a})) return softmaxImpl(a.to(DType::Float32), dim, false);
  return softmaxImpl(a, dim, false);
}
Tensor logSoftmax(const Tensor& a, int64_t dim) {
  if (autocast::detail::float32For({&a})) return softmaxImpl(a.to(DType::Float32), dim, true);
  return softmaxImpl(a, dim, true);
}

Tensor cumsum(const Tensor& a, int64_t dim) {
  detail::checkDefined("cumsum", a, "input");
  dim = wrapDim(dim, std::max<int64_t>(a.dim(), 1), "cumsum");
  const DType outType = isFloating(a.dtype()) ? a.dtype() : DType::Int64;
  if (!isFloating(a.dtype()) && !isIntegral(a.dtype()) && a.dtype() != DType::Bool) {
    throwUnsupportedDType("cumsum", a.dtype());
  }
  AxisView v = axisView(a.shape(), dim);
  Tensor x = a.contiguous();
  Tensor out = empty(a.shape(), {.dtype = outType, .device = a.device()});
  if (out.numel() > 0) {
    if (a.device().isCuda()) {
      WEFT_CUDA_CALL(a.device().index,
                     cumsum(a.dtype(), x.rawData(), v.outer, v.size, v.inner, false, outType, out.rawData()));
    } else {
      kernels::cpu::cumsum(a.dtype(), x.rawData(), v.outer, v.size, v.inner, false, outType, out.rawData());
    }
  }
  grad_rules::cumsumBackward(a, out, v);
  return out;
}

}  // namespace weft
