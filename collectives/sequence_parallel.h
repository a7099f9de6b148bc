// Sequence parallelism, DeepSpeed-Ulysses style: the tokens of a sequence
// are split over the ranks of a sequence-parallel group, and attention
// re-partitions them with all-to-all so that each rank attends over the
// whole sequence for a subset of the heads.
//
//   collectives::Mesh mesh(*world, {{"sp", 4}});
//   collectives::SpGroup sp(mesh.group("sp"));
//   // q, k, v [B, H, S/P, D]: this rank's tokens [r·S/P, (r+1)·S/P), every head
//   Tensor y = collectives::ulyssesAttention(sp, q, k, v, {.causal = true});  // [B, H, S/P, D]
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
// rank draws its own masks for its heads. Output and gradients equal
// attention over the whole sequence, up to the order of floating additions.
//
// Traffic. SpGroup counts the allToAlls and their payload bytes (each rank
// sends (P−1)/P of it), forward and backward apart.
//
// Errors: InvalidArgumentError when q, k, v are not 4-D of one shape and
// dtype, when P does not divide H (naming both); the group's errors
// (process_group.h), raised by forward or backward. Sequences whose length is
// not a multiple of P must be padded by the caller (with the padded keys
// masked out); nothing here pads.
//
// Threads and lifetimes: every rank of the group runs the same forwards and
// backwards in the same order; the allToAlls run on the calling thread and on
// the thread running backward. The SpGroup must outlive the graphs recorded
// through it (their backward uses it).
#pragma once

#include <atomic>
#include <cstdint>

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

  // allToAll (blocking), counted as forward or backward traffic.
  void allToAll(const Tensor& output, const Tensor& input, bool backward);

 private:
  ProcessGroup& group_;
  std::atomic<int64_t> forwardAllToAlls_{0};
  std::atomic<int64_t> forwardBytes_{0};
  std::atomic<int64_t> backwardAllToAlls_{0};
  std::atomic<int64_t> backwardBytes_{0};
};

// [B, H, S/P, D] (this rank's tokens, every head) -> [B, H/P, S, D] (this
// rank's heads, every token). Differentiable: backward is headsToSeq.
Tensor seqToHeads(SpGroup& sp, const Tensor& x);
// The inverse: [B, H/P, S, D] -> [B, H, S/P, D]. Backward is seqToHeads.
Tensor headsToSeq(SpGroup& sp, const Tensor& x);

// Attention over the whole sequence from each rank's tokens (see above).
Tensor ulyssesAttention(SpGroup& sp, const Tensor& q, const Tensor& k, const Tensor& v,
                        const AttentionOptions& o = {});

}  // namespace weft::collectives
