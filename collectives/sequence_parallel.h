// Sequence parallelism: the tokens of a sequence are split over the ranks of
// a sequence-parallel group, and attention either re-partitions them with
// all-to-all so that each rank attends over the whole sequence for a subset
// of the heads (DeepSpeed-Ulysses: ulyssesAttention), or keeps the queries in
// place and passes key/value blocks around a ring (ringAttention).
//
//   collectives::Mesh mesh(*world, {{"sp", 4}});
//   collectives::SpGroup sp(mesh.group("sp"));
//   // q, k, v [B, H, S/P, D]: this rank's tokens [r·S/P, (r+1)·S/P), every head
//   Tensor y = collectives::ulyssesAttention(sp, q, k, v, {.causal = true});  // [B, H, S/P, D]
//   // ring attention with the zig-zag layout: q, k, v = shardSequence(whole, 2, sp, RingLayout::ZigZag)
//   Tensor z = collectives::ringAttention(sp, q, k, v, {.causal = true, .layout = RingLayout::ZigZag});
//
// Layout. Rank r of a group of P holds tokens [r·S/P, (r+1)·S/P) (contiguous
// blocks). seqToHeads turns [B, H, S/P, D] into [B, H/P, S, D], heads
// [r·H/P, (r+1)·H/P) over the whole sequence, with one allToAll; headsToSeq
// is its inverse. Each is the other's backward.
//
// ulyssesAttention runs scaledDotProductAttention (tensor/ops_attention.h)
// on the re-partitioned q, k, v with the options given (masks and offsets
// refer to positions in the whole sequence, so causal attention is the whole
// sequence's) and returns this rank's tokens of the output: four allToAlls
// in forward (q, k, v, the output) and four in backward. With dropout, each
// rank draws its own masks for its heads unless the options carry a dropout
// frame (spAttention passes one). Output and gradients equal
// attention over the whole sequence, up to the order of floating additions.
//
// ringAttention keeps q in place and runs P steps: at step s it attends to
// the key/value block of rank r − s (its own first) with
// scaledDotProductAttentionWithLse, the positions of both blocks as offsets
// (so causal masking is the whole sequence's, and a pair of chunks wholly in
// the future is skipped), and merges the partial outputs exactly through
// their log-sum-exp (mergeAttention). The next block is already travelling
// (isend to rank r + 1, irecv from rank r − 1) while a step computes. Only q,
// k, v, the output and its log-sum-exp are kept for backward, which passes
// the key/value blocks around the ring again, each followed by the gradients
// of its keys and values accumulated by every rank it visits
// (FlashAttention-2's backward per pair of chunks, against the merged output
// and log-sum-exp), the last rank's sum going to the block's owner; the next
// block and the gradients just summed travel while the next step computes.
// Transfers: forward P − 1 of 2·B·H·(S/P)·D elements; backward P − 1 of
// 2·B·H·(S/P)·D (the blocks) and P of 2·B·H·(S/P)·D (their gradients).
// RingOptions::overlap = false runs the same transfers after each step's
// compute instead. Every rank of the group must backpropagate through its
// output, in the same order relative to its other ring backwards (an output
// that reaches no loss leaves the ring's neighbours waiting until the group's
// timeout). Dropout: RingOptions::dropout.
//
// Ring layouts. Contiguous: rank r holds tokens [r·S/P, (r+1)·S/P) (S
// divisible by P). ZigZag: the sequence in 2·P equal chunks, rank r holding
// chunks r and 2·P − 1 − r, in that order (S divisible by 2·P): with causal
// masking every rank then has the same number of unmasked query/key pairs,
// where the contiguous layout leaves rank 0 idle for most steps.
// shardSequence gives a rank's tokens of a whole tensor for either layout
// (Ulysses uses Contiguous).
//
// 2-D (hybridAttention): Ulysses inside a group × ring across groups. With
// a mesh {ring: R, ulysses: U} (Ulysses innermost, so its all-to-alls stay
// on neighbouring ranks), the ring layout splits the sequence over the ring
// group and each ring position's tokens are split contiguously over its
// Ulysses group (shardSequence2d). seqToHeads over the Ulysses group gives
// each rank its heads/U heads of its ring position's tokens, ringAttention
// over the ring group runs on those, headsToSeq brings the output back: four
// allToAlls of the Ulysses group and the ring's transfers (of 1/U of the
// heads) each way.
//
// Traffic. SpGroup counts the allToAlls and the ring's sends and their
// payload bytes (an allToAll sends (P−1)/P of its payload), forward and
// backward apart.
//
// Errors: InvalidArgumentError when q, k, v are not 4-D of one shape and
// dtype, when P does not divide H (Ulysses) or the sequence does not split
// into the layout's chunks (naming both); the group's errors
// (process_group.h), raised by forward or backward. The attention functions
// do not pad: a sequence whose length the layout does not divide is padded
// before it is split, as spShardTokens (below) does at the end of a model's
// token ids, which causal attention keeps out of every real token's view.
//
// Threads and lifetimes: every rank of the group runs the same forwards and
// backwards in the same order; the allToAlls run on the calling thread and on
// the thread running backward. The SpGroup must outlive the graphs recorded
// through it (their backward uses it).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "collectives/process_group.h"
#include "tensor/ops_attention.h"
#include "tensor/tensor.h"

namespace weft::collectives {

// The sequence-parallel group and its traffic counters.
class SpGroup {
 public:
  explicit SpGroup(ProcessGroup& group) : group_(group) {}
  ProcessGroup& group() const { return group_; }
  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }

  struct Traffic {
    int64_t forwardAllToAlls = 0;
    int64_t forwardBytes = 0;  // payload of the tensors exchanged
    int64_t backwardAllToAlls = 0;
    int64_t backwardBytes = 0;
  };
  Traffic traffic() const;
  void resetTraffic();

  struct Transfers {
    int64_t forwardSends = 0;
    int64_t forwardBytes = 0;
    int64_t backwardSends = 0;
    int64_t backwardBytes = 0;
  };
  Transfers transfers() const;

  // allToAll (blocking), counted as forward or backward traffic.
  void allToAll(const Tensor& output, const Tensor& input, bool backward);
  // isend, counted in transfers().
  Work isend(const Tensor& t, int dst, uint32_t tag, bool backward);

 private:
  ProcessGroup& group_;
  std::atomic<int64_t> forwardAllToAlls_{0};
  std::atomic<int64_t> forwardBytes_{0};
  std::atomic<int64_t> backwardAllToAlls_{0};
  std::atomic<int64_t> backwardBytes_{0};
  std::atomic<int64_t> forwardSends_{0};
  std::atomic<int64_t> forwardSendBytes_{0};
  std::atomic<int64_t> backwardSends_{0};
  std::atomic<int64_t> backwardSendBytes_{0};
};

enum class RingLayout { Contiguous, ZigZag };

// This rank's tokens of `whole` along `dim` under `layout`, a contiguous copy.
Tensor shardSequence(const Tensor& whole, int64_t dim, const SpGroup& sp, RingLayout layout);

struct RingOptions {
  bool causal = false;
  RingLayout layout = RingLayout::Contiguous;
  std::optional<double> scale = std::nullopt;  // default 1/sqrt(headDim)
  // Dropout on the attention probabilities: each rank draws one seed from
  // its default generator and every step (forward and backward) takes its
  // part of the mask of attention over the whole sequence of `heads` heads
  // (0: q's), q's first at `headOffset` (a dropout frame,
  // tensor/ops_attention.h): with the generators seeded alike, the mask of
  // the unsplit attention.
  double dropout = 0.0;
  int64_t heads = 0;
  int64_t headOffset = 0;
  // Whether a step's transfers travel while it computes (above). false:
  // each step's transfers start once its compute is done and are waited for
  // at once, the same bytes in the same order (what the overlap saves is the
  // difference of the two).
  bool overlap = true;
};


// [B, H, S/P, D] (this rank's tokens, every head) -> [B, H/P, S, D] (this
// rank's heads, every token). Differentiable: backward is headsToSeq.
Tensor seqToHeads(SpGroup& sp, const Tensor& x);
// The inverse: [B, H/P, S, D] -> [B, H, S/P, D]. Backward is seqToHeads.
Tensor headsToSeq(SpGroup& sp, const Tensor& x);

// Attention over the whole sequence from each rank's tokens (see above).
Tensor ulyssesAttention(SpGroup& sp, const Tensor& q, const Tensor& k, const Tensor& v,
                        const AttentionOptions& o = {});

// q, k, v [B, H, S/P, D], this rank's tokens under o.layout -> the output for
// those tokens, [B, H, S/P, D] (see above).
Tensor ringAttention(SpGroup& sp, const Tensor& q, const Tensor& k, const Tensor& v, const RingOptions& o = {});

// This rank's tokens of `whole` along `dim` for hybridAttention: its ring
// position's tokens under `layout`, then the Ulysses rank's contiguous part.
Tensor shardSequence2d(const Tensor& whole, int64_t dim, const SpGroup& ulysses, const SpGroup& ring,
                       RingLayout layout);
// q, k, v [B, H, S/(U·R), D] as shardSequence2d gives them -> the output for
// those tokens. Heads must be divisible by U.
Tensor hybridAttention(SpGroup& ulysses, SpGroup& ring, const Tensor& q, const Tensor& k, const Tensor& v,
                       const RingOptions& o = {});

// ---- a model's sequence-parallel layout --------------------------------------------
// Which attention a model uses and over which groups; the helpers below
// place its tokens accordingly (SequenceParallelGPT, and TensorParallelGPT
// with sequence parallelism).
enum class SpMode { Ulysses, Ring, Hybrid };

struct SpOptions {
  SpMode mode = SpMode::Ulysses;
  SpGroup* ulysses = nullptr;  // Ulysses and Hybrid
  SpGroup* ring = nullptr;     // Ring and Hybrid
  RingLayout layout = RingLayout::Contiguous;  // Ring and Hybrid
};

// `o` with the groups its mode does not use cleared; InvalidArgumentError
// (naming `who`) when a group it needs is missing or `heads` is not divisible
// by the Ulysses size.
SpOptions checkedSpOptions(SpOptions o, int64_t heads, const char* who);
// The number of ranks the tokens are split over (the product of the groups').
int64_t spRanks(const SpOptions& o);
// The smallest length >= `length` that splits into o's chunks.
int64_t spPaddedLength(const SpOptions& o, int64_t length);
// This rank's tokens of a whole [B, S] tensor, padded at the end with `pad`
// to spPaddedLength(S).
Tensor spShardTokens(const SpOptions& o, const Tensor& whole, int64_t pad = 0);
// The positions in the whole sequence of this rank's tokens, for a (padded)
// whole sequence of `length` tokens, capped at `cap`.
std::vector<int64_t> spPositions(const SpOptions& o, int64_t length, int64_t cap);
// Causal attention over the whole sequence with o's mode: q, k, v
// [B, H, S/P, D] of this rank's tokens. With `dropout` > 0, every rank draws
// one seed from its default generator and takes its part of the whole
// attention's mask (a dropout frame, tensor/ops_attention.h; the ring's
// RingOptions::dropout): with the generators seeded alike, the mask of
// attention over the whole sequence. q's heads may be
// part of a larger attention (tensor parallelism): `heads` of it (0: q's),
// q's first at `headOffset`.
Tensor spAttention(const SpOptions& o, const Tensor& q, const Tensor& k, const Tensor& v, double dropout = 0.0,
                   int64_t heads = 0, int64_t headOffset = 0);
// Dropout of this rank's tokens x [B, S/P, C] (or [B, S/P]) with the mask
// that dropout() of the whole [B, S, C] draws from the default generator (S =
// S/P · spRanks(o)): every rank draws the whole mask and keeps its tokens'
// rows (spPositions), so that with the generators seeded alike the masks are
// those of the unsplit model. x itself when not training or p = 0.
Tensor spTokenDropout(const SpOptions& o, const Tensor& x, double p, bool training);
// Sums `t` in place over o's groups (blocking): over every rank holding
// tokens of the sequence.
void spSumInPlace(const SpOptions& o, const Tensor& t);
// Sum over o's groups in forward, identity in backward.
Tensor reduceFromSp(const SpOptions& o, const Tensor& x);

}  // namespace weft::collectives
