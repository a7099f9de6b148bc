#include "collectives/sequence_parallel.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"
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
  forwardSends_ = 0;
  forwardSendBytes_ = 0;
  backwardSends_ = 0;
  backwardSendBytes_ = 0;
}

SpGroup::Transfers SpGroup::transfers() const {
  Transfers t;
  t.forwardSends = forwardSends_.load();
  t.forwardBytes = forwardSendBytes_.load();
  t.backwardSends = backwardSends_.load();
  t.backwardBytes = backwardSendBytes_.load();
  return t;
}

Work SpGroup::isend(const Tensor& t, int dst, uint32_t tag, bool backward) {
  (backward ? backwardSends_ : forwardSends_) += 1;
  (backward ? backwardSendBytes_ : forwardSendBytes_) += static_cast<int64_t>(t.nbytes());
  return group_.isend(t, dst, tag);
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

// ---- ring attention ------------------------------------------------------------------

namespace {

// Tags of the ring's transfers: key/value blocks travel to rank + 1 in
// forward and in backward, and the gradients accumulated for them follow.
// Transfers with one tag between two ranks match in issue order, which every
// rank keeps alike.
constexpr uint32_t kRingForwardTag = 0x52494e47;
constexpr uint32_t kRingBackwardTag = 0x52494e48;
constexpr uint32_t kRingGradientTag = 0x52494e49;

struct Chunk {
  int64_t position;  // of its first token in the whole sequence
  int64_t local;     // of its first token in the rank's tensor
  int64_t length;
};

std::vector<Chunk> chunksOf(int rank, int size, int64_t localLength, RingLayout layout, const char* op) {
  if (layout == RingLayout::Contiguous) return {{rank * localLength, 0, localLength}};
  WEFT_ENFORCE(localLength % 2 == 0, InvalidArgumentError, op, ": the zig-zag layout needs an even number of tokens",
               " per rank, got ", localLength);
  const int64_t c = localLength / 2;
  return {{rank * c, 0, c}, {(2 * size - 1 - rank) * c, c, c}};
}

// Starts the transfer of `packed` to rank + 1 and of rank - 1's into a new
// tensor; wait() both, then take `received`.
struct Shift {
  Work send;
  Work recv;
  Tensor sent;  // kept alive until the send is waited for
  Tensor received;
};

Shift startShift(SpGroup& sp, const Tensor& packed, uint32_t tag, bool backward, int to, int from) {
  Shift s;
  s.received = emptyLike(packed);
  s.recv = sp.group().irecv(s.received, from, tag);
  s.send = sp.isend(packed, to, tag, backward);
  s.sent = packed;
  return s;
}

}  // namespace

Tensor shardSequence(const Tensor& whole, int64_t dim, const SpGroup& sp, RingLayout layout) {
  WEFT_ENFORCE(whole.defined() && dim >= 0 && dim < whole.dim(), InvalidArgumentError,
               "shardSequence: dim ", dim, " is outside a tensor of shape ", whole.defined() ? whole.shape() : Shape{});
  const int64_t s = whole.size(dim), parts = layout == RingLayout::ZigZag ? 2 * sp.size() : sp.size();
  WEFT_ENFORCE(s % parts == 0, InvalidArgumentError, "shardSequence: the sequence length ", s,
               " must be divisible by ", parts, " (the layout's chunks)");
  std::vector<Tensor> pieces;
  for (const Chunk& c : chunksOf(sp.rank(), sp.size(), s / sp.size(), layout, "shardSequence")) {
    pieces.push_back(whole.narrow(dim, c.position, c.length));
  }
  return cat(pieces, dim).contiguous();
}

namespace {

// What one ring step computes for one pair of chunks: q chunk `query`
// against key chunk `key` of the block held.
struct Pair {
  const Chunk* query;
  const Chunk* key;
};

std::vector<Pair> pairsOf(const std::vector<Chunk>& queries, const std::vector<Chunk>& keys, bool causal) {
  std::vector<Pair> pairs;
  for (const Chunk& key : keys) {
    for (const Chunk& query : queries) {
      // Every key in the future of every query: nothing to compute.
      if (causal && key.position > query.position + query.length - 1) continue;
      pairs.push_back({&query, &key});
    }
  }
  return pairs;
}

}  // namespace

Tensor ringAttention(SpGroup& sp, const Tensor& q, const Tensor& k, const Tensor& v, const RingOptions& o) {
  check4d("ringAttention", q);
  WEFT_ENFORCE(k.defined() && v.defined() && k.shape() == q.shape() && v.shape() == q.shape() &&
                   k.dtype() == q.dtype() && v.dtype() == q.dtype(),
               InvalidArgumentError, "ringAttention: q, k and v must share one shape and dtype, got ", q.shape(),
               ", ", k.defined() ? k.shape() : Shape{}, " and ", v.defined() ? v.shape() : Shape{});
  const int p = sp.size(), r = sp.rank();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  const int64_t b = q.size(0), h = q.size(1), local = q.size(2), d = q.size(3);
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(d));
  const std::vector<Chunk> queries = chunksOf(r, p, local, o.layout, "ringAttention");
  WEFT_ENFORCE(o.dropout >= 0.0 && o.dropout <= 1.0, InvalidArgumentError,
               "ringAttention: dropout probability has to be between 0 and 1, got ", o.dropout);
  // Dropout: one seed for every step, and each pair's part of the whole attention's mask.
  const double drop = o.dropout;
  uint64_t seed = 0;
  if (drop > 0.0) {
    std::lock_guard<std::mutex> lock(defaultGeneratorMutex());
    seed = defaultGenerator().nextU64();
  }
  const AttentionOptions::DropoutFrame frame{
      .heads = o.heads > 0 ? o.heads : h, .headOffset = o.headOffset, .queries = local * p, .keys = local * p};

  // ---- forward: no graph inside; the merged out and lse per query chunk.
  Tensor out, lse;
  {
    NoGradGuard noGrad;
    std::vector<std::optional<AttentionOutput>> acc(queries.size());
    // k and v travel stacked: [2, B, H, S/P, D].
    Tensor kv = stack({k.detach(), v.detach()}, 0).contiguous();
    for (int step = 0; step < p; ++step) {
      const int owner = (r - step + p) % p;
      std::optional<Shift> shift;
      if (o.overlap && step + 1 < p) shift = startShift(sp, kv, kRingForwardTag, /*backward=*/false, next, prev);
      const std::vector<Chunk> keys = chunksOf(owner, p, local, o.layout, "ringAttention");
      for (const Pair& pair : pairsOf(queries, keys, o.causal)) {
        AttentionOptions a;
        a.causal = o.causal;
        a.queryOffset = pair.query->position;
        a.keyOffset = pair.key->position;
        a.scale = scale;
        if (drop > 0.0) {
          a.dropout = drop;
          a.dropoutSeed = seed;
          a.dropoutFrame = frame;
        }
        AttentionOutput part = scaledDotProductAttentionWithLse(
            q.detach().narrow(2, pair.query->local, pair.query->length),
            kv.select(0, 0).narrow(2, pair.key->local, pair.key->length),
            kv.select(0, 1).narrow(2, pair.key->local, pair.key->length), a);
        auto& slot = acc[static_cast<size_t>(pair.query - queries.data())];
        slot = slot ? mergeAttention(*slot, part) : part;
      }
      if (!o.overlap && step + 1 < p) shift = startShift(sp, kv, kRingForwardTag, /*backward=*/false, next, prev);
      if (!shift) break;
      shift->send.wait();
      shift->recv.wait();
      kv = shift->received;
    }
    std::vector<Tensor> outs, lses;
    for (auto& a : acc) {
      WEFT_CHECK(a.has_value()) << "ringAttention: a query chunk saw no key block";
      outs.push_back(a->out);
      lses.push_back(a->lse);
    }
    out = (outs.size() == 1 ? outs[0] : cat(outs, 2)).contiguous();
    lse = (lses.size() == 1 ? lses[0] : cat(lses, 2)).contiguous();
  }

  // ---- backward: the key/value blocks go around again, and behind each the
  // gradient of its k and v accumulated by the ranks it visited: at step s a
  // rank computes its part of the gradient of the block it holds, adds the
  // part accumulated by the ranks before it (sent by rank - 1 at its step
  // s - 1) and sends the sum on to rank + 1, whose step s + 1 holds that block;
  // the last step's sum reaches the block's owner. Overlapped, the next block
  // and the gradient sent travel while the next step computes. Only q, k, v,
  // out and lse are kept.
  Tensor qs = q.detach().contiguous(), ks = k.detach().contiguous(), vs = v.detach().contiguous();
  const RingLayout layout = o.layout;
  const bool causal = o.causal, overlap = o.overlap;
  recordOp("ringAttention", {q, k, v}, {out},
           [&sp, qs, ks, vs, out, lse, queries, layout, causal, overlap, scale, p, r, next, prev, b, h, local, d, drop,
            seed, frame](const std::vector<Tensor>& g) {
             NoGradGuard noGrad;
             const DType dt = qs.dtype();
             Tensor gOut = g[0].contiguous();
             Tensor gq = zeros(qs.shape(), {.dtype = dt});
             Tensor kv = stack({ks, vs}, 0).contiguous();  // the block held: [k, v]
             // The accumulated [dk, dv] in flight to rank + 1, and rank - 1's coming in.
             std::optional<Shift> grads;
             Tensor incoming;  // rank - 1's sum for the block held, once arrived
             auto settle = [&grads]() {
               grads->send.wait();
               grads->recv.wait();
               Tensor t = grads->received;
               grads.reset();
               return t;
             };
             auto chunkOf = [&](const Tensor& t, const Chunk& c) { return t.narrow(2, c.local, c.length).contiguous(); };
             Tensor sum;  // this rank's part of the held block's [dk, dv], then with rank - 1's added
             for (int step = 0; step < p; ++step) {
               const int owner = (r - step + p) % p;
               const std::vector<Chunk> keys = chunksOf(owner, p, local, layout, "ringAttention");
               std::optional<Shift> shift;
               if (overlap && step + 1 < p) shift = startShift(sp, kv, kRingBackwardTag, /*backward=*/true, next, prev);
               Tensor kb = kv.select(0, 0), vb = kv.select(0, 1);
               sum = zeros({2, b, h, local, d}, {.dtype = dt});
               Tensor dkb = sum.select(0, 0), dvb = sum.select(0, 1);
               for (const Pair& pair : pairsOf(queries, keys, causal)) {
                 const Chunk& qc = *pair.query;
                 const Chunk& kc = *pair.key;
                 kernels::cpu::AttentionGeometry geo{.batchHeads = b * h,
                                                     .queries = qc.length,
                                                     .keys = kc.length,
                                                     .headDim = d,
                                                     .scale = scale,
                                                     .causal = causal,
                                                     .queryOffset = qc.position,
                                                     .keyOffset = kc.position,
                                                     .dropout = drop,
                                                     .seed = seed,
                                                     .heads = h,
                                                     .frameHeads = drop > 0.0 ? frame.heads : 0,
                                                     .frameHeadOffset = frame.headOffset,
                                                     .frameQueries = frame.queries,
                                                     .frameKeys = frame.keys};
                 Tensor qPart = chunkOf(qs, qc), oPart = chunkOf(out, qc), gPart = chunkOf(gOut, qc);
                 Tensor lPart = lse.narrow(2, qc.local, qc.length).contiguous();
                 Tensor kPart = chunkOf(kb, kc), vPart = chunkOf(vb, kc);
                 Tensor dq = empty(qPart.shape(), {.dtype = dt});
                 Tensor dk = empty(kPart.shape(), {.dtype = dt}), dv = empty(kPart.shape(), {.dtype = dt});
                 kernels::cpu::attentionBackward(dt, geo, qPart.rawData(), kPart.rawData(), vPart.rawData(),
                                                 oPart.rawData(), lPart.rawData(), gPart.rawData(), nullptr,
                                                 dq.rawData(), dk.rawData(), dv.rawData());
                 gq.narrow(2, qc.local, qc.length).add_(dq);
                 dkb.narrow(2, kc.local, kc.length).add_(dk);
                 dvb.narrow(2, kc.local, kc.length).add_(dv);
               }
               if (p == 1) break;
               if (!overlap && step + 1 < p) shift = startShift(sp, kv, kRingBackwardTag, /*backward=*/true, next, prev);
               if (grads) incoming = settle();
               if (incoming.defined()) sum.add_(incoming);
               incoming = Tensor();
               // Steps 0..P-2 send the sum to the next holder of the block, the
               // last step to its owner (rank + 1); what arrives is the sum for
               // the block of the next step, or after the last this rank's own.
               grads = startShift(sp, sum, kRingGradientTag, /*backward=*/true, next, prev);
               if (!overlap) incoming = settle();
               if (shift) {
                 shift->send.wait();
                 shift->recv.wait();
                 kv = shift->received;
               }
             }
             // This rank's own dk, dv: [2, B, H, S/P, D].
             Tensor own = p == 1 ? sum : (grads ? settle() : incoming);
             return std::vector<Tensor>{gq, own.select(0, 0).contiguous(), own.select(0, 1).contiguous()};
           });
  return out;
}

// ---- 2-D: Ulysses x ring -------------------------------------------------------------

Tensor shardSequence2d(const Tensor& whole, int64_t dim, const SpGroup& ulysses, const SpGroup& ring,
                       RingLayout layout) {
  Tensor position = shardSequence(whole, dim, ring, layout);
  const int64_t s = position.size(dim);
  WEFT_ENFORCE(s % ulysses.size() == 0, InvalidArgumentError, "shardSequence2d: a ring position's ", s,
               " tokens must be divisible by the Ulysses size ", ulysses.size());
  const int64_t part = s / ulysses.size();
  return position.narrow(dim, ulysses.rank() * part, part).contiguous();
}

Tensor hybridAttention(SpGroup& ulysses, SpGroup& ring, const Tensor& q, const Tensor& k, const Tensor& v,
                       const RingOptions& o) {
  check4d("hybridAttention", q);
  WEFT_ENFORCE(k.defined() && v.defined() && k.shape() == q.shape() && v.shape() == q.shape() &&
                   k.dtype() == q.dtype() && v.dtype() == q.dtype(),
               InvalidArgumentError, "hybridAttention: q, k and v must share one shape and dtype, got ", q.shape(),
               ", ", k.defined() ? k.shape() : Shape{}, " and ", v.defined() ? v.shape() : Shape{});
  // The Ulysses rank's heads of the whole attention, for dropout.
  RingOptions ro = o;
  ro.heads = o.heads > 0 ? o.heads : q.size(1);
  ro.headOffset = o.headOffset + ulysses.rank() * (q.size(1) / ulysses.size());
  Tensor y = ringAttention(ring, seqToHeads(ulysses, q), seqToHeads(ulysses, k), seqToHeads(ulysses, v), ro);
  return headsToSeq(ulysses, y);
}

// ---- a model's sequence-parallel layout -------------------------------------------------

SpOptions checkedSpOptions(SpOptions o, int64_t heads, const char* who) {
  const bool needsUlysses = o.mode != SpMode::Ring, needsRing = o.mode != SpMode::Ulysses;
  WEFT_ENFORCE(!needsUlysses || o.ulysses, InvalidArgumentError, who,
               ": this mode needs SpOptions::ulysses, the Ulysses group");
  WEFT_ENFORCE(!needsRing || o.ring, InvalidArgumentError, who, ": this mode needs SpOptions::ring, the ring group");
  if (!needsUlysses) o.ulysses = nullptr;
  if (!needsRing) o.ring = nullptr;
  WEFT_ENFORCE(!o.ulysses || heads % o.ulysses->size() == 0, InvalidArgumentError, who, ": heads (", heads,
               ") must be divisible by the Ulysses size ", o.ulysses ? o.ulysses->size() : 1);
  return o;
}

int64_t spRanks(const SpOptions& o) {
  int64_t n = 1;
  for (SpGroup* g : {o.ulysses, o.ring}) n *= g ? g->size() : 1;
  return n;
}

int64_t spPaddedLength(const SpOptions& o, int64_t length) {
  int64_t multiple = o.ulysses ? o.ulysses->size() : 1;
  if (o.ring) multiple *= o.ring->size() * (o.layout == RingLayout::ZigZag ? 2 : 1);
  return (length + multiple - 1) / multiple * multiple;
}

Tensor spShardTokens(const SpOptions& o, const Tensor& whole, int64_t pad) {
  WEFT_ENFORCE(whole.defined() && whole.dim() == 2, InvalidArgumentError,
               "spShardTokens: expected a [B, S] tensor, got shape ", whole.defined() ? whole.shape() : Shape{});
  const int64_t s = whole.size(1), padded = spPaddedLength(o, s);
  Tensor x = whole;
  if (padded != s) {
    x = cat({whole, full({whole.size(0), padded - s}, static_cast<double>(pad), {.dtype = whole.dtype()})}, 1);
  }
  switch (o.mode) {
    case SpMode::Ulysses: return shardSequence(x, 1, *o.ulysses, RingLayout::Contiguous);
    case SpMode::Ring: return shardSequence(x, 1, *o.ring, o.layout);
    case SpMode::Hybrid: return shardSequence2d(x, 1, *o.ulysses, *o.ring, o.layout);
  }
  return Tensor();
}

std::vector<int64_t> spPositions(const SpOptions& o, int64_t length, int64_t cap) {
  std::vector<int64_t> p = spShardTokens(o, arange(length).view({1, length})).toVector<int64_t>();
  for (int64_t& v : p) v = std::min(v, cap);
  return p;
}

Tensor spAttention(const SpOptions& o, const Tensor& q, const Tensor& k, const Tensor& v, double dropout,
                   int64_t heads, int64_t headOffset) {
  if (o.mode == SpMode::Ulysses) {
    AttentionOptions a;
    a.causal = true;
    if (dropout > 0.0) {
      check4d("spAttention", q);
      const int64_t p = o.ulysses->size(), local = q.size(1), length = q.size(2) * p;
      a.dropout = dropout;
      a.dropoutFrame = AttentionOptions::DropoutFrame{.heads = heads > 0 ? heads : local,
                                                      .headOffset = headOffset + o.ulysses->rank() * (local / p),
                                                      .queries = length,
                                                      .keys = length};
    }
    return ulyssesAttention(*o.ulysses, q, k, v, a);
  }
  RingOptions r;
  r.causal = true;
  r.layout = o.layout;
  r.dropout = dropout;
  r.heads = heads;
  r.headOffset = headOffset;
  return o.mode == SpMode::Ring ? ringAttention(*o.ring, q, k, v, r) : hybridAttention(*o.ulysses, *o.ring, q, k, v, r);
}

Tensor spTokenDropout(const SpOptions& o, const Tensor& x, double p, bool training) {
  if (!training || p == 0.0) return x;
  WEFT_ENFORCE(x.defined() && (x.dim() == 2 || x.dim() == 3), InvalidArgumentError,
               "spTokenDropout: expected this rank's tokens [B, S/P, C] or [B, S/P], got ",
               x.defined() ? x.shape() : Shape{});
  const int64_t length = x.size(1) * spRanks(o);
  Shape whole = x.shape();
  whole[1] = length;
  Tensor mask;
  {
    NoGradGuard noGrad;
    Tensor all = dropout(ones(whole, {.dtype = x.dtype()}), p, true);
    mask = indexSelect(all, 1, fromVector(spPositions(o, length, length - 1), {x.size(1)})).contiguous();
  }
  return mul(x, mask);
}

void spSumInPlace(const SpOptions& o, const Tensor& t) {
  for (SpGroup* g : {o.ulysses, o.ring}) {
    if (g) g->group().allReduce(t, ReduceOp::Sum).wait();
  }
}

Tensor reduceFromSp(const SpOptions& o, const Tensor& x) {
  Tensor out;
  {
    NoGradGuard noGrad;
    out = x.contiguous().clone();
  }
  spSumInPlace(o, out);
  recordOp("reduceFromSp", {x}, {out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

}  // namespace weft::collectives
