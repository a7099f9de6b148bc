// Losses declared in tensor/ops_nn.h: nllLoss, crossEntropy, mseLoss; their
// gradient rules are in grad_rules/loss.cpp. crossEntropy is
// nllLoss(logSoftmax(x, 1)) computed as one op: its forward keeps the
// log-probabilities and its backward produces the gradient of the logits in a
// single pass (softmax minus one-hot), so a training step pays for two tensors
// of the logits' size, not four.

#include "kernels/cpu/copy.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda_call.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/loss.h"
#include "kernels/cuda/softmax.h"
#endif
#include "tensor/autocast.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/op_checks.h"
#include "tensor/op_layout.h"
#include "tensor/ops_nn.h"

namespace weft {
namespace {

// Scores seen as contiguous [N, C, D] (class dimension 1, D = product of the
// trailing dims) with an Int64 target [N, D]; lossShape is the shape of an
// unreduced loss (the target's shape).
struct ClassLayout {
  int64_t N = 1, C = 1, D = 1;
  Shape lossShape;
  Tensor target;  // contiguous
};

// Checks input/target shapes, dtypes, devices and every target value (in
// [0, C) or equal to ignoreIndex; IndexError otherwise). On a CUDA device the
// check runs there and reads its answer back (a wait for the stream).
ClassLayout classLayout(const char* op, const Tensor& input, const Tensor& target, int64_t ignoreIndex) {
  detail::checkDefined(op, input, "input");
  detail::requireFloating(op, input);
  detail::requireDType(op, target, DType::Int64, "target");
  WEFT_ENFORCE(target.device() == input.device(), InvalidArgumentError, op, ": input on ", input.device().str(),
               " and target on ", target.device().str(), "; both must be on one device");
  WEFT_ENFORCE(input.dim() >= 1, InvalidArgumentError, op, ": input must have a class dimension, got shape ",
               input.shape());
  ClassLayout l;
  Shape expected = input.shape();
  if (input.dim() == 1) {
    l.C = input.shape()[0];
    expected.clear();
  } else {
    l.N = input.shape()[0];
    l.C = input.shape()[1];
    for (int64_t d = 2; d < input.dim(); ++d) l.D *= input.shape()[d];
    expected.erase(expected.begin() + 1);
  }
  WEFT_ENFORCE(target.shape() == expected, InvalidArgumentError, op, ": target of shape ", target.shape(),
               " does not match input of shape ", input.shape(), " (expected a target of shape ", expected, ")");
  l.lossShape = expected;
  l.target = target.contiguous();
  const int64_t* t = l.target.data<int64_t>();
  auto badTarget = [&](int64_t value, int64_t i) {
    throw IndexError(detail::concat(op, ": target ", value, " at position ", i, " is out of range for ", l.C,
                                    " classes (input shape ", input.shape(), ")"));
  };
  if (input.device().isCuda()) {
    int64_t value = 0, at = -1;
    WEFT_CUDA_CALL(input.device().index, firstInvalidTarget(t, l.target.numel(), l.C, ignoreIndex, &at, &value));
    if (at >= 0) badTarget(value, at);
    return l;
  }
  for (int64_t i = 0, n = l.target.numel(); i < n; ++i) {
    if (t[i] != ignoreIndex && (t[i] < 0 || t[i] >= l.C)) badTarget(t[i], i);
  }
  return l;
}

// A 0-D tensor of dtype dt on `device` holding value.
Tensor scalarOn(DType dt, Device device, double value) {
  Tensor out = empty({}, {.dtype = dt, .device = device});
  if (device.isCuda()) {
    out.fill_(value);
  } else {
    kernels::cpu::fill(dt, out.rawData(), 1, value);
  }
  return out;
}

// The loss tensor for reduction r: the per-element losses (r == None) or a
// 0-D tensor holding their sum or mean. Fills `totals`.
Tensor nllReduce(DType dt, Device device, const void* logProbs, const ClassLayout& l, int64_t ignoreIndex,
                 Reduction r, kernels::cpu::NllTotals& totals) {
  auto forward = [&](void* losses) {
    const int64_t* t = l.target.data<int64_t>();
    if (device.isCuda()) {
      WEFT_CUDA_CALL(device.index, nllLossForward(dt, logProbs, t, l.N, l.C, l.D, ignoreIndex, losses, &totals));
    } else {
      totals = kernels::cpu::nllLossForward(dt, logProbs, t, l.N, l.C, l.D, ignoreIndex, losses);
    }
  };
  if (r == Reduction::None) {
    Tensor out = empty(l.lossShape, {.dtype = dt, .device = device});
    forward(out.numel() > 0 ? out.rawData() : nullptr);
    return out;
  }
  forward(nullptr);
  // Mean over zero non-ignored targets is 0/0 = NaN, as in PyTorch.
  double value = r == Reduction::Sum ? totals.sum : totals.sum / static_cast<double>(totals.count);
  return scalarOn(dt, device, value);
}

}  // namespace

Tensor nllLoss(const Tensor& input, const Tensor& target, Reduction r, int64_t ignoreIndex) {
  if (autocast::detail::float32For({&input})) return nllLoss(input.to(DType::Float32), target, r, ignoreIndex);
  ClassLayout l = classLayout("nllLoss", input, target, ignoreIndex);
  if (isLowPrecision(input.dtype())) return nllLoss(input.to(DType::Float32), target, r, ignoreIndex).to(input.dtype());
  Tensor x = input.contiguous();
  kernels::cpu::NllTotals totals;
  Tensor out =
      nllReduce(input.dtype(), input.device(), x.numel() > 0 ? x.rawData() : nullptr, l, ignoreIndex, r, totals);
  grad_rules::nllLossBackward(input, out, l.target, l.N, l.C, l.D, ignoreIndex, r, totals.count);
  return out;
}

Tensor crossEntropy(const Tensor& logits, const Tensor& target, Reduction r, int64_t ignoreIndex) {
  if (autocast::detail::float32For({&logits})) return crossEntropy(logits.to(DType::Float32), target, r, ignoreIndex);
  ClassLayout l = classLayout("crossEntropy", logits, target, ignoreIndex);
  if (isLowPrecision(logits.dtype())) {
    return crossEntropy(logits.to(DType::Float32), target, r, ignoreIndex).to(logits.dtype());
  }
  Tensor x = logits.contiguous();
  Tensor logProbs = empty(logits.shape(), {.dtype = logits.dtype(), .device = logits.device()});
  kernels::cpu::NllTotals totals;
  if (logProbs.numel() > 0 && logits.device().isCuda()) {
    WEFT_CUDA_CALL(logits.device().index,
                   softmaxForward(logits.dtype(), x.rawData(), l.N, l.C, l.D, true, logProbs.rawData()));
  } else if (logProbs.numel() > 0) {
    kernels::cpu::softmaxForward(logits.dtype(), x.rawData(), l.N, l.C, l.D, true, logProbs.rawData());
  }
  Tensor out = nllReduce(logits.dtype(), logits.device(), logProbs.numel() > 0 ? logProbs.rawData() : nullptr, l,
                         ignoreIndex, r, totals);
  grad_rules::crossEntropyBackward(logits, out, l.target, logProbs, l.N, l.C, l.D, ignoreIndex, r, totals.count);
  return out;
}

Tensor mseLoss(const Tensor& input, const Tensor& target, Reduction r) {
  if (autocast::detail::float32For({&input, &target})) {
    return mseLoss(autocast::detail::cast(input, DType::Float32), autocast::detail::cast(target, DType::Float32), r);
  }
  detail::checkSameKind("mseLoss", input, target);
  detail::requireFloating("mseLoss", input);
  // PyTorch broadcasts here with a warning; a [N, 1] prediction against a [N]
  // target is almost always a bug, so weft asks for equal shapes.
  WEFT_ENFORCE(input.shape() == target.shape(), InvalidArgumentError, "mseLoss: input of shape ", input.shape(),
               " and target of shape ", target.shape(), " differ; reshape one of them explicitly");
  if (isLowPrecision(input.dtype())) return mseLoss(input.to(DType::Float32), target.to(DType::Float32), r).to(input.dtype());
  Tensor x = input.contiguous(), t = target.contiguous();
  int64_t n = x.numel();
  DType dt = input.dtype();
  Tensor out;
  double total = 0;
  auto forward = [&](void* losses) {
    if (n == 0) return;
    if (input.device().isCuda()) {
      WEFT_CUDA_CALL(input.device().index, mseLossForward(dt, x.rawData(), t.rawData(), n, losses, &total));
    } else {
      total = kernels::cpu::mseLossForward(dt, x.rawData(), t.rawData(), n, losses);
    }
  };
  if (r == Reduction::None) {
    out = empty(input.shape(), {.dtype = dt, .device = input.device()});
    forward(out.rawData());
  } else {
    forward(nullptr);
    out = scalarOn(dt, input.device(), r == Reduction::Sum ? total : total / static_cast<double>(n));
  }
  grad_rules::mseLossBackward(input, target, out, x, t, r);
  return out;
}

}  // namespace weft
