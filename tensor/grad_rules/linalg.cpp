// Gradient rules of the matrix products (see grad_rules.h). g is the gradient
// of the output; each gradient is one GEMM, and an operand is kept only for
// the other operand's gradient.
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda_call.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/reduce.h"
#endif
#include "tensor/autograd.h"
#include "tensor/batched_gemm.h"
#include "tensor/grad_rules/grad_rules.h"

namespace weft::grad_rules {

using Grads = std::vector<Tensor>;
using detail::batchedGemm;
using detail::gemmInput;
using kernels::cpu::MatrixOperand;

// out = a·b per batch element: d/da = g·bᵀ, d/db = aᵀ·g (summed over the
// batch dimensions an operand was broadcast along)
void productBackward(const char* name, const Tensor& a, const Tensor& b, const Tensor& out, const Shape& batch) {
  if (!anyRequiresGrad({&a, &b})) return;
  bool needA = a.requiresGrad(), needB = b.requiresGrad();
  SavedTensor sa(needB ? a : Tensor()), sb(needA ? b : Tensor());
  Shape aShape = a.shape(), bShape = b.shape();
  recordOp(name, {a, b}, {out}, [name, needA, needB, sa, sb, aShape, bShape, batch](const Grads& g) {
    Tensor ga, gb;
    if (needA) ga = batchedGemm(g[0], false, sb.unpack(name), true, batch, aShape);
    if (needB) gb = batchedGemm(sa.unpack(name), true, g[0], false, batch, bShape);
    return Grads{ga, gb};
  });
}

// out = x·Wᵀ + bias: d/dx = g·W, d/dW = gᵀ·x, d/dbias = column sums of g
void linearBackward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& xKeep,
                    const Tensor& wKeep, int64_t rows, int64_t in, int64_t outF) {
  if (!anyRequiresGrad({&x, &weight, &bias})) return;
  bool needX = x.requiresGrad(), needW = weight.requiresGrad(), hasBias = bias.defined();
  bool needB = hasBias && bias.requiresGrad();
  SavedTensor sx(needW ? xKeep : Tensor()), sw(needX ? wKeep : Tensor());
  Shape xShape = x.shape(), wShape = weight.shape();
  DType dt = x.dtype();
  std::vector<Tensor> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  recordOp("LinearBackward", inputs, {out},
           [needX, needW, needB, hasBias, sx, sw, xShape, wShape, dt, rows, in, outF](const Grads& g) {
             Tensor g2 = g[0].contiguous();
             const Device dev = g2.device();
             MatrixOperand gm{g2.rawData(), false, outF};
             Grads grads(hasBias ? 3 : 2);
             if (needX) {
               Tensor w = sw.unpack("LinearBackward");
               Tensor gx = empty(xShape, {.dtype = dt, .device = dev});
               detail::gemmOn(dev, dt, gm, gemmInput(w, {}).mat, rows, in, outF, 1.0, 0.0, gx.rawData(), in);
               grads[0] = gx;
             }
             if (needW) {
               detail::GemmInput xs = gemmInput(sx.unpack("LinearBackward"), {});
               Tensor gw = empty(wShape, {.dtype = dt, .device = dev});
               detail::gemmOn(dev, dt, {g2.rawData(), true, outF}, xs.mat, outF, in, rows, 1.0, 0.0, gw.rawData(), in);
               grads[1] = gw;
             }
             if (needB) {
               Tensor gb = empty({outF}, {.dtype = dt, .device = dev});
               if (dev.isCuda()) {
                 WEFT_CUDA_CALL(dev.index, sumCols(dt, g2.rawData(), rows, outF, gb.rawData()));
               } else {
                 kernels::cpu::sumCols(dt, g2.rawData(), rows, outF, gb.rawData());
               }
               grads[2] = gb;
             }
             return grads;
           });
}

}  // namespace weft::grad_rules
