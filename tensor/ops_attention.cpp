// Scaled dot-product attention and the merge of partial attentions; the
// kernels are in kernels/cpu/attention.cpp and kernels/cuda/attention.cu
// (chosen by the inputs' device), the gradient rules in
// grad_rules/attention.cpp.
#include "tensor/ops_attention.h"

#include <cmath>
#include <mutex>

#include "kernels/cpu/attention.h"
#include "kernels/cuda_call.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/attention.h"
#endif
#include "tensor/autocast.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/op_checks.h"
#include "tensor/op_layout.h"

namespace weft {
namespace {

// A contiguous tensor with the same values and no history: what kernels read.
Tensor packed(const Tensor& t) { return t.detach().contiguous(); }

void checkAttentionArguments(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionOptions& o) {
  detail::checkDefined(op, q, "q");
  detail::checkDefined(op, k, "k");
  detail::checkDefined(op, v, "v");
  detail::requireFloating(op, q);
  detail::checkSameKind(op, q, k);
  detail::checkSameKind(op, q, v);
  WEFT_ENFORCE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, InvalidArgumentError, op,
               ": q, k and v must be 4-D [B, H, S, D], got q of shape ", q.shape(), ", k of shape ", k.shape(),
               ", v of shape ", v.shape());
  WEFT_ENFORCE(q.size(0) == k.size(0) && q.size(1) == k.size(1), InvalidArgumentError, op,
               ": q of shape ", q.shape(), " and k of shape ", k.shape(), " must have the same batch and head counts");
  WEFT_ENFORCE(k.shape() == v.shape(), InvalidArgumentError, op, ": k of shape ", k.shape(), " and v of shape ",
               v.shape(), " must have the same shape");
  WEFT_ENFORCE(q.size(3) == k.size(3), InvalidArgumentError, op, ": q of shape ", q.shape(), " and k of shape ",
               k.shape(), " must have the same head dimension");
  WEFT_ENFORCE(q.size(3) > 0, InvalidArgumentError, op, ": the head dimension must be positive, got q of shape ",
               q.shape());
  WEFT_ENFORCE(o.dropout >= 0.0 && o.dropout <= 1.0, InvalidArgumentError, op,
               ": dropout probability has to be between 0 and 1, got ", o.dropout);
  if (const auto& f = o.dropoutFrame) {
    WEFT_ENFORCE(!q.device().isCuda(), InvalidArgumentError, op, ": a dropout frame is supported on the CPU only");
    WEFT_ENFORCE(f->headOffset >= 0 && o.queryOffset >= 0 && o.keyOffset >= 0 &&
                     f->heads >= f->headOffset + q.size(1) && f->queries >= o.queryOffset + q.size(2) &&
                     f->keys >= o.keyOffset + k.size(2),
                 InvalidArgumentError, op, ": the dropout frame (heads ", f->heads, " from ", f->headOffset,
                 ", queries ", f->queries, " from ", o.queryOffset, ", keys ", f->keys, " from ", o.keyOffset,
                 ") does not hold q of shape ", q.shape(), " and k of shape ", k.shape());
  }
}

uint64_t drawSeed(Generator* gen) {
  if (gen) return gen->nextU64();
  std::lock_guard<std::mutex> lock(defaultGeneratorMutex());
  return defaultGenerator().nextU64();
}

}  // namespace

AttentionOutput scaledDotProductAttentionWithLse(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const AttentionOptions& o) {
  const char* op = "scaledDotProductAttention";
  if (auto d = autocast::detail::lowFor({&q, &k, &v})) {
    return scaledDotProductAttentionWithLse(autocast::detail::cast(q, *d), autocast::detail::cast(k, *d),
                                            autocast::detail::cast(v, *d), o);
  }
  checkAttentionArguments(op, q, k, v, o);
  if (isLowPrecision(q.dtype())) {
    autocast::Scope plain(q.dtype(), false);  // the float32 computation of a 16-bit op: not cast down again
    AttentionOutput r = scaledDotProductAttentionWithLse(q.to(DType::Float32), k.to(DType::Float32),
                                                         v.to(DType::Float32), o);
    return {r.out.to(q.dtype()), r.lse.to(q.dtype())};
  }
  const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), Sk = k.size(2), D = q.size(3);
  kernels::cpu::AttentionGeometry geo{.batchHeads = B * H,
                                      .queries = Sq,
                                      .keys = Sk,
                                      .headDim = D,
                                      .scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(D)),
                                      .causal = o.causal,
                                      .queryOffset = o.queryOffset,
                                      .keyOffset = o.keyOffset,
                                      .dropout = o.dropout,
                                      .seed = o.dropout > 0.0 ? (o.dropoutSeed ? *o.dropoutSeed : drawSeed(o.generator)) : 0,
                                      .heads = H,
                                      .frameHeads = o.dropoutFrame ? o.dropoutFrame->heads : 0,
                                      .frameHeadOffset = o.dropoutFrame ? o.dropoutFrame->headOffset : 0,
                                      .frameQueries = o.dropoutFrame ? o.dropoutFrame->queries : 0,
                                      .frameKeys = o.dropoutFrame ? o.dropoutFrame->keys : 0};
  const TensorOptions like{.dtype = q.dtype(), .device = q.device()};
  if (!q.device().isCuda()) {
    // The CPU kernels read q, k and v where they are (a fused QKV
    // projection's [B, S, H, D] views need no transposing copy), and write
    // out in q's order, so that out.transpose(1, 2) of [B, S, H, D]-ordered
    // heads is contiguous.
    Tensor qc = grad_rules::attentionOperand(q, &geo.qLayout), kc = grad_rules::attentionOperand(k, &geo.kLayout),
           vc = grad_rules::attentionOperand(v, &geo.vLayout);
    AttentionOutput r{grad_rules::attentionResult({B, H, Sq, D}, like, grad_rules::sequenceMajor(q), &geo.outLayout),
                      empty({B, H, Sq}, like)};
    kernels::cpu::attentionForward(q.dtype(), geo, qc.rawData(), kc.rawData(), vc.rawData(), r.out.rawData(),
                                   r.lse.rawData());
    grad_rules::attentionBackward(q, k, v, r.out, r.lse, qc, kc, vc, geo);
    return r;
  }
  Tensor qc = packed(q), kc = packed(k), vc = packed(v);
  AttentionOutput r{empty({B, H, Sq, D}, like), empty({B, H, Sq}, like)};
  {
    WEFT_CUDA_CALL(q.device().index, attentionForward(q.dtype(), geo, qc.rawData(), kc.rawData(), vc.rawData(),
                                                      r.out.rawData(), r.lse.rawData()));
  }
  grad_rules::attentionBackward(q, k, v, r.out, r.lse, qc, kc, vc, geo);
  return r;
}

Tensor scaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  return scaledDotProductAttentionWithLse(q, k, v, o).out;
}

AttentionOutput mergeAttention(const AttentionOutput& a, const AttentionOutput& b) {
  const char* op = "mergeAttention";
  if (auto d = autocast::detail::promotedFor({&a.out, &a.lse, &b.out, &b.lse})) {
    auto c = [&](const Tensor& t) { return autocast::detail::cast(t, *d, true); };
    return mergeAttention({c(a.out), c(a.lse)}, {c(b.out), c(b.lse)});
  }
  detail::checkDefined(op, a.out, "a.out");
  detail::checkDefined(op, a.lse, "a.lse");
  detail::checkDefined(op, b.out, "b.out");
  detail::checkDefined(op, b.lse, "b.lse");
  detail::requireFloating(op, a.out);
  detail::checkSameKind(op, a.out, a.lse);
  detail::checkSameKind(op, a.out, b.out);
  detail::checkSameKind(op, a.out, b.lse);
  WEFT_ENFORCE(a.out.shape() == b.out.shape() && a.lse.shape() == b.lse.shape(), InvalidArgumentError, op,
               ": the two attentions differ in shape: out ", a.out.shape(), " and ", b.out.shape(), ", lse ",
               a.lse.shape(), " and ", b.lse.shape());
  Shape rowsShape = a.out.shape();
  WEFT_ENFORCE(!rowsShape.empty(), InvalidArgumentError, op, ": out must have at least one dimension, got shape ",
               a.out.shape());
  const int64_t D = rowsShape.back();
  rowsShape.pop_back();
  WEFT_ENFORCE(a.lse.shape() == rowsShape, InvalidArgumentError, op, ": lse of shape ", a.lse.shape(),
               " does not fit out of shape ", a.out.shape(), " (expected ", rowsShape, ")");
  if (isLowPrecision(a.out.dtype())) {
    auto up = [](const Tensor& t) { return t.to(DType::Float32); };
    AttentionOutput r = mergeAttention({up(a.out), up(a.lse)}, {up(b.out), up(b.lse)});
    return {r.out.to(a.out.dtype()), r.lse.to(a.out.dtype())};
  }
  Tensor oa = packed(a.out), la = packed(a.lse), ob = packed(b.out), lb = packed(b.lse);
  const TensorOptions like{.dtype = a.out.dtype(), .device = a.out.device()};
  AttentionOutput r{empty(a.out.shape(), like), empty(a.lse.shape(), like)};
  if (a.out.device().isCuda()) {
    WEFT_CUDA_CALL(a.out.device().index, mergeAttentionForward(a.out.dtype(), la.numel(), D, oa.rawData(),
                                                               la.rawData(), ob.rawData(), lb.rawData(),
                                                               r.out.rawData(), r.lse.rawData()));
  } else {
    kernels::cpu::mergeAttentionForward(a.out.dtype(), la.numel(), D, oa.rawData(), la.rawData(), ob.rawData(),
                                        lb.rawData(), r.out.rawData(), r.lse.rawData());
  }
  grad_rules::mergeAttentionBackward({a.out, a.lse, b.out, b.lse}, r.out, r.lse, oa, la, ob, lb);
  return r;
}

}  // namespace weft
