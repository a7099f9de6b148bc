// Gradient rules of the reductions and softmax (see grad_rules.h). g is the
// gradient of the output.
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/scan.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda_call.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/scan.h"
#include "kernels/cuda/softmax.h"
#endif
#include "tensor/autograd.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/ops_elementwise.h"
#include "tensor/ops_reduce.h"

namespace weft::grad_rules {

using Grads = std::vector<Tensor>;

// sum(a, dims): d/da = g broadcast back over the reduced dims
void sumBackward(const Tensor& a, const Tensor& out, const std::vector<int64_t>& dims) {
  if (!anyRequiresGrad({&a})) return;
  Shape inShape = a.shape(), kept = a.shape();
  for (int64_t d : dims) kept[d] = 1;
  recordOp("SumBackward", {a}, {out}, [inShape, kept](const Grads& g) {
    return Grads{g[0].reshape(kept).expand(inShape).contiguous()};
  });
}

// max(a) / min(a): d/da = g shared equally by every element equal to the result
void extremumAllBackward(bool isMax, const Tensor& a, const Tensor& out) {
  if (!anyRequiresGrad({&a})) return;
  const char* name = isMax ? "MaxBackward" : "MinBackward";
  SavedTensor input(a), result(out);
  recordOp(name, {a}, {out}, [input, result, name](const Grads& g) {
    Tensor xi = input.unpack(name), yo = result.unpack(name);
    Tensor mask = eq(xi, yo).to(xi.dtype());
    return Grads{mul(mask, div(g[0], sum(mask)))};
  });
}

// max(a, dim) / min(a, dim): d/da = g at the forward's index along dim, 0 elsewhere
void extremumAlongBackward(bool isMax, const Tensor& a, const Tensor& values, const Tensor& indices,
                           detail::AxisView v) {
  if (!anyRequiresGrad({&a})) return;
  const char* name = isMax ? "MaxDimBackward" : "MinDimBackward";
  SavedTensor where(indices);
  Shape inShape = a.shape();
  recordOp(name, {a}, {values}, [where, inShape, v, name](const Grads& g) {
    Tensor idx = where.unpack(name);
    Tensor go = g[0].contiguous();
    Tensor gi = empty(inShape, {.dtype = go.dtype(), .device = go.device()});
    if (gi.numel() > 0 && go.device().isCuda()) {
      WEFT_CUDA_CALL(go.device().index, extremumBackward(go.dtype(), go.rawData(), idx.data<int64_t>(), v.outer,
                                                         v.size, v.inner, gi.rawData()));
    } else if (gi.numel() > 0) {
      kernels::cpu::extremumBackward(go.dtype(), go.rawData(), idx.data<int64_t>(), v.outer, v.size, v.inner,
                                     gi.rawData());
    }
    return Grads{gi};
  });
}

// softmax:    d/da = y·(g - sum(g·y))   (sums along dim)
// logSoftmax: d/da = g - exp(y)·sum(g)
void softmaxBackward(bool log, const Tensor& a, const Tensor& out, detail::AxisView v) {
  if (!anyRequiresGrad({&a})) return;
  const char* name = log ? "LogSoftmaxBackward" : "SoftmaxBackward";
  SavedTensor result(out);
  recordOp(name, {a}, {out}, [result, v, log, name](const Grads& g) {
    Tensor y = result.unpack(name);
    Tensor go = g[0].contiguous();
    Tensor gi = emptyLike(y);
    if (gi.numel() > 0 && y.device().isCuda()) {
      WEFT_CUDA_CALL(y.device().index, softmaxBackward(y.dtype(), y.rawData(), go.rawData(), v.outer, v.size,
                                                       v.inner, log, gi.rawData()));
    } else if (gi.numel() > 0) {
      kernels::cpu::softmaxBackward(y.dtype(), y.rawData(), go.rawData(), v.outer, v.size, v.inner, log, gi.rawData());
    }
    return Grads{gi};
  });
}

// cumsum(a, dim): d/da[r] = the sum of g[s] over s >= r along dim
void cumsumBackward(const Tensor& a, const Tensor& out, detail::AxisView v) {
  if (!anyRequiresGrad({&a})) return;
  recordOp("CumsumBackward", {a}, {out}, [v](const Grads& g) {
    Tensor go = g[0].contiguous();
    Tensor gi = empty(go.shape(), {.dtype = go.dtype(), .device = go.device()});
    if (gi.numel() > 0 && go.device().isCuda()) {
      WEFT_CUDA_CALL(go.device().index,
                     cumsum(go.dtype(), go.rawData(), v.outer, v.size, v.inner, true, go.dtype(), gi.rawData()));
    } else if (gi.numel() > 0) {
      kernels::cpu::cumsum(go.dtype(), go.rawData(), v.outer, v.size, v.inner, true, go.dtype(), gi.rawData());
    }
    return Grads{gi};
  });
}

}  // namespace weft::grad_rules
