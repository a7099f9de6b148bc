#include "collectives/sequence_parallel.h"

#include <vector>

#include "common/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::collectives {

SpGroup::Traffic SpGroup::traffic() const {
  Traffic t;
  t.forwardAllToAlls = forwardAllToAlls_.load();
  t.forwardBytes = forwardBytes_.load();
  t.backwardAllToAlls = backwardAllToAlls_.load();
  t.backwardBytes = backwardBytes_.load();
  return t;
}

void SpGroup::resetTraffic() {
  forwardAllToAlls_ = 0;
  forwardBytes_ = 0;
  backwardAllToAlls_ = 0;
  backwardBytes_ = 0;
}

void SpGroup::allToAll(const Tensor& output, const Tensor& input, bool backward) {
  (backward ? backwardAllToAlls_ : forwardAllToAlls_) += 1;
  (backward ? backwardBytes_ : forwardBytes_) += static_cast<int64_t>(input.nbytes());
  group_.allToAll(output, input).wait();
}

namespace {

void check4d(const char* op, const Tensor& x) {
  WEFT_ENFORCE(x.defined() && x.dim() == 4, InvalidArgumentError, op, ": expected a [B, H, S, D] tensor, got shape ",
               x.defined() ? x.shape() : Shape{});
}

// The data movement of seqToHeads, without recording.
Tensor seqToHeadsData(SpGroup& sp, const Tensor& x, bool backward) {
  const int64_t p = sp.size(), b = x.size(0), h = x.size(1), s = x.size(2), d = x.size(3);
  WEFT_ENFORCE(h % p == 0, InvalidArgumentError, "seqToHeads: the heads (", h,
               ") must be divisible by the sequence-parallel size ", p);
  // Chunk i (heads [i·H/P, (i+1)·H/P)) goes to rank i.
  Tensor in = x.reshape({b, p, h / p, s, d}).permute({1, 0, 2, 3, 4}).contiguous();
  Tensor out = emptyLike(in);
  sp.allToAll(out, in, backward);
  // Chunk j holds rank j's tokens: [P, B, H/P, S/P, D] -> [B, H/P, S, D].
  return out.permute({1, 2, 0, 3, 4}).reshape({b, h / p, p * s, d});
}

Tensor headsToSeqData(SpGroup& sp, const Tensor& x, bool backward) {
  const int64_t p = sp.size(), b = x.size(0), hl = x.size(1), s = x.size(2), d = x.size(3);
  WEFT_ENFORCE(s % p == 0, InvalidArgumentError, "headsToSeq: the sequence length (", s,
               ") must be divisible by the sequence-parallel size ", p);
  // Chunk i (tokens [i·S/P, (i+1)·S/P)) goes to rank i.
  Tensor in = x.reshape({b, hl, p, s / p, d}).permute({2, 0, 1, 3, 4}).contiguous();
  Tensor out = emptyLike(in);
  sp.allToAll(out, in, backward);
  // Chunk j holds rank j's heads: [P, B, H/P, S/P, D] -> [B, H, S/P, D].
  return out.permute({1, 0, 2, 3, 4}).reshape({b, p * hl, s / p, d});
}

}  // namespace

Tensor seqToHeads(SpGroup& sp, const Tensor& x) {
  check4d("seqToHeads", x);
  Tensor out;
  {
    NoGradGuard noGrad;
    out = seqToHeadsData(sp, x.detach(), /*backward=*/false);
  }
  recordOp("seqToHeads", {x}, {out}, [&sp](const std::vector<Tensor>& g) {
    NoGradGuard noGrad;
    return std::vector<Tensor>{headsToSeqData(sp, g[0], /*backward=*/true)};
  });
  return out;
}

Tensor headsToSeq(SpGroup& sp, const Tensor& x) {
  check4d("headsToSeq", x);
  Tensor out;
  {
    NoGradGuard noGrad;
    out = headsToSeqData(sp, x.detach(), /*backward=*/false);
  }
  recordOp("headsToSeq", {x}, {out}, [&sp](const std::vector<Tensor>& g) {
    NoGradGuard noGrad;
    return std::vector<Tensor>{seqToHeadsData(sp, g[0], /*backward=*/true)};
  });
  return out;
}

Tensor ulyssesAttention(SpGroup& sp, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  check4d("ulyssesAttention", q);
  WEFT_ENFORCE(k.defined() && v.defined() && k.shape() == q.shape() && v.shape() == q.shape() &&
                   k.dtype() == q.dtype() && v.dtype() == q.dtype(),
               InvalidArgumentError, "ulyssesAttention: q, k and v must share one shape and dtype, got ", q.shape(),
               ", ", k.defined() ? k.shape() : Shape{}, " and ", v.defined() ? v.shape() : Shape{});
  Tensor y = scaledDotProductAttention(seqToHeads(sp, q), seqToHeads(sp, k), seqToHeads(sp, v), o);
  return headsToSeq(sp, y);
}

}  // namespace weft::collectives
