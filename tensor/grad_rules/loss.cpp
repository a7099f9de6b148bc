// Gradient rules of the losses (see grad_rules.h). g is the gradient of the
// loss: one value per element (Reduction::None) or a scalar that reaches
// every element times `scale` (1 for Sum, 1/count for Mean).
#include "kernels/cpu/loss.h"
#include "kernels/cuda_call.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/loss.h"
#endif
#include "tensor/autograd.h"
#include "tensor/grad_rules/grad_rules.h"

namespace weft::grad_rules {
namespace {

using Grads = std::vector<Tensor>;

double reductionScale(Reduction r, int64_t count) {
  return r == Reduction::Mean ? 1.0 / static_cast<double>(count) : 1.0;
}

}  // namespace

// d/d(input[n, target[n]]) = -g (0 for an ignored target), 0 elsewhere
void nllLossBackward(const Tensor& input, const Tensor& out, const Tensor& target, int64_t N, int64_t C, int64_t D,
                     int64_t ignoreIndex, Reduction r, int64_t count) {
  if (!anyRequiresGrad({&input})) return;
  SavedTensor savedTarget(target);
  Shape inShape = input.shape();
  double scale = reductionScale(r, count);
  bool perElement = r == Reduction::None;
  recordOp("NllLossBackward", {input}, {out},
           [savedTarget, inShape, N, C, D, ignoreIndex, scale, perElement](const Grads& g) {
             Tensor t = savedTarget.unpack("NllLossBackward");
             Tensor go = g[0].contiguous();
             Tensor gi = empty(inShape, {.dtype = go.dtype(), .device = go.device()});
             const void* gp = go.numel() > 0 ? go.rawData() : nullptr;
             if (gi.numel() > 0 && gi.device().isCuda()) {
               WEFT_CUDA_CALL(gi.device().index, nllLossBackward(go.dtype(), t.data<int64_t>(), N, C, D, ignoreIndex,
                                                                 gp, perElement, scale, gi.rawData()));
             } else if (gi.numel() > 0) {
               kernels::cpu::nllLossBackward(go.dtype(), t.data<int64_t>(), N, C, D, ignoreIndex, gp, perElement,
                                             scale, gi.rawData());
             }
             return Grads{gi};
           });
}

// d/dlogits = g·(softmax(logits) - onehot(target)) (0 for an ignored target)
void crossEntropyBackward(const Tensor& logits, const Tensor& out, const Tensor& target, const Tensor& logProbs,
                          int64_t N, int64_t C, int64_t D, int64_t ignoreIndex, Reduction r, int64_t count) {
  if (!anyRequiresGrad({&logits})) return;
  SavedTensor savedTarget(target), savedLogProbs(logProbs);
  double scale = reductionScale(r, count);
  bool perElement = r == Reduction::None;
  recordOp("CrossEntropyBackward", {logits}, {out},
           [savedTarget, savedLogProbs, N, C, D, ignoreIndex, scale, perElement](const Grads& g) {
             Tensor t = savedTarget.unpack("CrossEntropyBackward");
             Tensor lp = savedLogProbs.unpack("CrossEntropyBackward");
             Tensor go = g[0].contiguous();
             Tensor gi = emptyLike(lp);
             const void* gp = go.numel() > 0 ? go.rawData() : nullptr;
             if (gi.numel() > 0 && gi.device().isCuda()) {
               WEFT_CUDA_CALL(gi.device().index,
                              crossEntropyBackward(go.dtype(), lp.rawData(), t.data<int64_t>(), N, C, D, ignoreIndex,
                                                   gp, perElement, scale, gi.rawData()));
             } else if (gi.numel() > 0) {
               kernels::cpu::crossEntropyBackward(go.dtype(), lp.rawData(), t.data<int64_t>(), N, C, D, ignoreIndex,
                                                  gp, perElement, scale, gi.rawData());
             }
             return Grads{gi};
           });
}

// d/dinput = 2·g·(input - target), d/dtarget = -d/dinput
void mseLossBackward(const Tensor& input, const Tensor& target, const Tensor& out, const Tensor& x, const Tensor& t,
                     Reduction r) {
  if (!anyRequiresGrad({&input, &target})) return;
  SavedTensor savedInput(x), savedTarget(t);
  bool wantInput = input.requiresGrad(), wantTarget = target.requiresGrad();
  double scale = reductionScale(r, x.numel());
  bool perElement = r == Reduction::None;
  recordOp("MseLossBackward", {input, target}, {out},
           [savedInput, savedTarget, wantInput, wantTarget, scale, perElement](const Grads& g) {
             Tensor xi = savedInput.unpack("MseLossBackward"), ti = savedTarget.unpack("MseLossBackward");
             Tensor go = g[0].contiguous();
             Tensor gx = wantInput ? emptyLike(xi) : Tensor();
             Tensor gt = wantTarget ? emptyLike(ti) : Tensor();
             void* gxp = wantInput ? gx.rawData() : nullptr;
             void* gtp = wantTarget ? gt.rawData() : nullptr;
             if (xi.numel() > 0 && xi.device().isCuda()) {
               WEFT_CUDA_CALL(xi.device().index, mseLossBackward(xi.dtype(), xi.rawData(), ti.rawData(), xi.numel(),
                                                                 go.rawData(), perElement, scale, gxp, gtp));
             } else if (xi.numel() > 0) {
               kernels::cpu::mseLossBackward(xi.dtype(), xi.rawData(), ti.rawData(), xi.numel(), go.rawData(),
                                             perElement, scale, gxp, gtp);
             }
             return Grads{gx, gt};
           });
}

}  // namespace weft::grad_rules
