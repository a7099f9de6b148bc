// Gradient rules of scaled dot-product attention and of the merge of partial
// attentions (see grad_rules.h). g = {d out, d lse}; the engine hands zeros
// for lse when only out was used.
#include "kernels/cpu/attention.h"
#include "kernels/cuda_call.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/attention.h"
#endif
#include "tensor/autograd.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/ops.h"

namespace weft::grad_rules {

using Grads = std::vector<Tensor>;

Tensor attentionOperand(const Tensor& t, kernels::cpu::AttentionLayout* layout) {
  if (t.stride(3) == 1 || t.size(3) == 1) {
    *layout = {t.stride(0), t.stride(1), t.stride(2)};
    return t.detach();
  }
  *layout = {};
  return t.detach().contiguous();
}

bool sequenceMajor(const Tensor& t) { return t.size(1) > 1 && t.size(2) > 1 && t.stride(1) < t.stride(2); }

Tensor attentionResult(const Shape& shape, const TensorOptions& like, bool seqMajor,
                       kernels::cpu::AttentionLayout* layout) {
  if (!seqMajor) {
    *layout = {};
    return empty(shape, like);
  }
  const int64_t H = shape[1], S = shape[2], D = shape[3];
  *layout = {S * H * D, D, H * D};
  return empty({shape[0], S, H, D}, like).transpose(1, 2);
}

// FlashAttention-2's backward (kernels/cpu/attention.h): the tiles of the
// scores and probabilities are recomputed from q, k, v, out and lse, and the
// dropout mask from the geometry's seed
void attentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                       const Tensor& qc, const Tensor& kc, const Tensor& vc,
                       const kernels::cpu::AttentionGeometry& geo) {
  if (!anyRequiresGrad({&q, &k, &v})) return;
  const bool needQ = q.requiresGrad(), needKV = k.requiresGrad() || v.requiresGrad();
  const bool needK = k.requiresGrad(), needV = v.requiresGrad();
  // out and lse are this node's own outputs: an in-place write to either is
  // caught by the saved version.
  SavedTensor sq(qc), sk(kc), sv(vc), so(out), sl(lse);
  const Shape qShape = q.shape(), kShape = k.shape();
  const bool qSeq = sequenceMajor(q), kSeq = sequenceMajor(k), vSeq = sequenceMajor(v);
  const DType dt = q.dtype();
  const Device dev = q.device();
  recordOp("ScaledDotProductAttentionBackward", {q, k, v}, {out, lse},
           [sq, sk, sv, so, sl, geo, needQ, needKV, needK, needV, qShape, kShape, qSeq, kSeq, vSeq, dt,
            dev](const Grads& g) {
             const char* name = "ScaledDotProductAttentionBackward";
             Tensor qs = sq.unpack(name), ks = sk.unpack(name), vs = sv.unpack(name);
             Tensor os = so.unpack(name), ls = sl.unpack(name);
             Tensor gLse = g[1].contiguous();
             Grads grads(3);
             const TensorOptions like{.dtype = dt, .device = dev};
             auto raw = [](const Tensor& t) -> void* { return t.defined() ? t.rawData() : nullptr; };
             if (dev.isCuda()) {
               Tensor gOut = g[0].contiguous();
               if (needQ) grads[0] = empty(qShape, like);
               Tensor gk = needKV ? empty(kShape, like) : Tensor();
               Tensor gv = needKV ? empty(kShape, like) : Tensor();
               WEFT_CUDA_CALL(dev.index, attentionBackward(dt, geo, qs.rawData(), ks.rawData(), vs.rawData(),
                                                           os.rawData(), ls.rawData(), gOut.rawData(), gLse.rawData(),
                                                           raw(grads[0]), raw(gk), raw(gv)));
               if (needK) grads[1] = gk;
               if (needV) grads[2] = gv;
               return grads;
             }
             // The gradients come out in their inputs' orders, so that the
             // transposes and views of the heads pass them on without copies.
             kernels::cpu::AttentionGeometry bg = geo;
             Tensor gOut = attentionOperand(g[0], &bg.gradOutLayout);
             if (needQ) grads[0] = attentionResult(qShape, like, qSeq, &bg.gradQLayout);
             Tensor gk = needKV ? attentionResult(kShape, like, kSeq, &bg.gradKLayout) : Tensor();
             Tensor gv = needKV ? attentionResult(kShape, like, vSeq, &bg.gradVLayout) : Tensor();
             kernels::cpu::attentionBackward(dt, bg, qs.rawData(), ks.rawData(), vs.rawData(), os.rawData(),
                                             ls.rawData(), gOut.rawData(), gLse.rawData(), raw(grads[0]), raw(gk),
                                             raw(gv));
             if (needK) grads[1] = gk;
             if (needV) grads[2] = gv;
             return grads;
           });
}

// out = a outA + b outB with a = exp(lseA - lse), b = exp(lseB - lse):
// d/doutA = a g_out, d/dlseA = a (g_lse + g_out · (outA - out)), and
// likewise for B
void mergeAttentionBackward(const std::vector<Tensor>& inputs, const Tensor& out, const Tensor& lse,
                            const Tensor& oa, const Tensor& la, const Tensor& ob, const Tensor& lb) {
  if (!anyRequiresGrad(inputs)) return;
  std::vector<bool> need(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) need[i] = inputs[i].requiresGrad();
  SavedTensor soa(oa), sla(la), sob(ob), slb(lb), so(out), sl(lse);
  const Shape outShape = out.shape(), lseShape = lse.shape();
  const DType dt = out.dtype();
  const Device dev = out.device();
  recordOp("MergeAttentionBackward", inputs, {out, lse},
           [need, soa, sla, sob, slb, so, sl, outShape, lseShape, dt, dev](const Grads& g) {
             const char* name = "MergeAttentionBackward";
             Tensor oas = soa.unpack(name), las = sla.unpack(name), obs = sob.unpack(name), lbs = slb.unpack(name);
             Tensor os = so.unpack(name), ls = sl.unpack(name);
             Tensor gOut = g[0].contiguous(), gLse = g[1].contiguous();
             Grads grads(4);
             for (size_t i = 0; i < 4; ++i) {
               if (need[i]) grads[i] = empty(i % 2 == 0 ? outShape : lseShape, {.dtype = dt, .device = dev});
             }
             auto raw = [](const Tensor& t) -> void* { return t.defined() ? t.rawData() : nullptr; };
             if (dev.isCuda()) {
               WEFT_CUDA_CALL(dev.index, mergeAttentionBackward(dt, ls.numel(), outShape.back(), oas.rawData(),
                                                                las.rawData(), obs.rawData(), lbs.rawData(),
                                                                os.rawData(), ls.rawData(), gOut.rawData(),
                                                                gLse.rawData(), raw(grads[0]), raw(grads[1]),
                                                                raw(grads[2]), raw(grads[3])));
             } else {
               kernels::cpu::mergeAttentionBackward(dt, ls.numel(), outShape.back(), oas.rawData(), las.rawData(),
                                                    obs.rawData(), lbs.rawData(), os.rawData(), ls.rawData(),
                                                    gOut.rawData(), gLse.rawData(), raw(grads[0]), raw(grads[1]),
                                                    raw(grads[2]), raw(grads[3]));
             }
             return grads;
           });
}

}  // namespace weft::grad_rules
