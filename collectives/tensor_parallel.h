// Megatron-style tensor parallelism: layers whose weight matrices are split
// across the ranks of a tensor-parallel group, and the conjugate autograd
// functions that join them. The GPT built from them is in
// collectives/tensor_parallel_gpt.h.
//
//   collectives::Mesh mesh(*world, {{"dp", 2}, {"tp", 2}});
//   auto tp = std::make_shared<collectives::TpGroup>(mesh.group("tp"));
//   collectives::ColumnParallelLinear fc(tp, 64, 256);     // holds 256/T output features
//   collectives::RowParallelLinear proj(tp, 256, 64);      // holds 256/T input features
//   Tensor y = proj.forward(gelu(fc.forward(x)));          // x and y replicated: one allreduce
//   fc.loadFull(full.weight(), full.bias());               // this rank's shard of a whole layer
//
// The conjugate functions (Megatron's f and g):
//   copyToTp(x)      forward: identity (x is the same on every rank);
//                    backward: allreduce (sum) of the gradient over the group.
//   reduceFromTp(x)  forward: allreduce (sum) of the ranks' partial x;
//                    backward: identity.
// ColumnParallelLinear starts with copyToTp and splits the output features;
// RowParallelLinear splits the input features and ends with reduceFromTp, so
// a column-parallel layer followed by a row-parallel one costs one allreduce
// of the output in forward and one of the input's gradient in backward.
//
// Sharding. Rank r of a group of T holds, of a layer with `out` output
// features split in `parts` equal parts (3 for a fused q, k, v projection,
// 1 otherwise), the r-th 1/T slice of every part, the slices concatenated in
// part order; of a row-parallel layer, columns [r·in/T, (r+1)·in/T) of the
// weight and the whole bias (added once, after the allreduce); of a
// vocabulary-parallel embedding, rows [r·L, (r+1)·L) with L = ⌈V/T⌉, the
// vocabulary padded to T·L rows (see VocabParallelEmbedding). shard() maps a
// whole layer's tensor (a parameter or its gradient) to this rank's part, so
// a split model can be loaded from, and compared with, an unsplit one.
// The linear layers' sizes must divide evenly (InvalidArgumentError naming
// the size and T).
//
// Gradients. With every rank running the same forward on the same (replicated)
// input, each rank's gradients of its shards equal the corresponding slices
// of the unsplit model's, and replicated parameters (biases of row-parallel
// layers, LayerNorms, position embeddings) get the whole model's gradient on
// every rank; nothing needs a further reduction over the tp group.
//
// Traffic. TpGroup counts what the functions above and
// vocabParallelCrossEntropy start: allreduces and the bytes of the tensors
// reduced (payload: a ring allreduce sends 2·(T−1)/T of it per rank), forward
// and backward apart.
//
// Errors: InvalidArgumentError for a linear layer's size T does not divide, a shape or dtype
// the layer cannot take (naming both), and a shard() of a tensor whose shape is
// not the whole layer's; IndexError for a target id outside the vocabulary;
// the group's errors (process_group.h) from the allreduces, raised by forward
// or backward.
//
// Threads and lifetimes: as nn/module.h; the allreduces run on the calling
// thread (forward) and on the thread running backward, and every rank of the
// group must run the same forwards and backwards in the same order. The
// layers share their TpGroup; a TpGroup passed to the functions by reference
// must outlive the graphs recorded through it, and its ProcessGroup the
// TpGroup.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/process_group.h"
#include "nn/module.h"
#include "tensor/ops_nn.h"
#include "tensor/tensor.h"

namespace weft::collectives {

// The tensor-parallel group the layers share, and its traffic counters.
class TpGroup {
 public:
  explicit TpGroup(ProcessGroup& group) : group_(group) {}
  ProcessGroup& group() const { return group_; }
  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }

  struct Traffic {
    int64_t forwardAllReduces = 0;
    int64_t forwardBytes = 0;  // payload of the tensors reduced
    int64_t backwardAllReduces = 0;
    int64_t backwardBytes = 0;
  };
  Traffic traffic() const;
  void resetTraffic();

  // Reduces `t` in place over the group (blocking) and counts it as forward or
  // backward traffic.
  void allReduce(const Tensor& t, ReduceOp op, bool backward);

 private:
  ProcessGroup& group_;
  std::atomic<int64_t> forwardAllReduces_{0};
  std::atomic<int64_t> forwardBytes_{0};
  std::atomic<int64_t> backwardAllReduces_{0};
  std::atomic<int64_t> backwardBytes_{0};
};

// Identity forward, allreduce of the gradient backward.
Tensor copyToTp(TpGroup& tp, const Tensor& x);
// Allreduce forward, identity backward.
Tensor reduceFromTp(TpGroup& tp, const Tensor& x);

// A module whose parameters are shards of a whole layer's.
class TpSharded {
 public:
  virtual ~TpSharded() = default;
  // This rank's part of `full`, the whole layer's tensor for parameter
  // `param` ("weight", "bias"); a contiguous copy.
  virtual Tensor shard(const std::string& param, const Tensor& full) const = 0;
  // The whole layer's tensor for `param` from every rank's shard (shards[i]:
  // rank i's), the inverse of shard().
  virtual Tensor unshard(const std::string& param, const std::vector<Tensor>& shards) const = 0;
  // Whether `param` is split across the ranks (false: whole on every rank).
  virtual bool split(const std::string& param) const { return true; }
};

// y = x·Wᵀ + b with W's output features split (see "Sharding"): x [*, in]
// replicated -> [*, out/T], this rank's features. "weight" [out/T, in],
// "bias" [out/T], initialised as nn::Linear's shard would be (uniform in
// ±1/sqrt(in)).
class ColumnParallelLinear : public nn::Module, public TpSharded {
 public:
  ColumnParallelLinear(std::shared_ptr<TpGroup> tp, int64_t in, int64_t out, bool bias = true, int64_t parts = 1);
  Tensor forward(const Tensor& x) override;
  Tensor shard(const std::string& param, const Tensor& full) const override;
  Tensor unshard(const std::string& param, const std::vector<Tensor>& shards) const override;
  // Copies this rank's shard of a whole layer's weight [out, in] and bias [out].
  void loadFull(const Tensor& weight, const Tensor& bias = Tensor());
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  std::shared_ptr<TpGroup> tp_;
  int64_t in_, out_, parts_;
  Tensor weight_, bias_;
};

// y = x·Wᵀ + b with W's input features split: x [*, in/T], this rank's
// features -> [*, out] replicated (the partial products summed over the
// group). "weight" [out, in/T], "bias" [out] whole.
class RowParallelLinear : public nn::Module, public TpSharded {
 public:
  RowParallelLinear(std::shared_ptr<TpGroup> tp, int64_t in, int64_t out, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor shard(const std::string& param, const Tensor& full) const override;
  Tensor unshard(const std::string& param, const std::vector<Tensor>& shards) const override;
  bool split(const std::string& param) const override { return param != "bias"; }
  void loadFull(const Tensor& weight, const Tensor& bias = Tensor());
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  std::shared_ptr<TpGroup> tp_;
  int64_t in_, out_;
  Tensor weight_, bias_;
};

// An embedding table whose rows (the vocabulary) are split: "weight"
// [L, dim] with L = ⌈V/T⌉, rows [vocabStart(), vocabStart() + L) of the whole
// table padded with zero rows to T·L (paddedVocabSize()): when T does not
// divide V, the last ranks hold padding rows past V (localVocab() real rows,
// possibly none), which no id looks up and which, as a tied LM head, give
// logits columns that vocabParallelCrossEntropy masks. Initialised N(0, 1) as
// nn::Embedding, the padding rows zero. shard() pads the whole [V, dim]
// table, unshard() drops the padding. forward(ids) looks up the ids this rank
// holds, zeros for the others, and sums over the group (one allreduce of
// [*ids, dim]).
class VocabParallelEmbedding : public nn::Module, public TpSharded {
 public:
  VocabParallelEmbedding(std::shared_ptr<TpGroup> tp, int64_t vocab, int64_t dim);
  // Int64 ids in [0, vocab) of any shape -> [*ids, dim]; IndexError for an id
  // outside the vocabulary.
  Tensor forward(const Tensor& ids) override;
  Tensor shard(const std::string& param, const Tensor& full) const override;
  Tensor unshard(const std::string& param, const std::vector<Tensor>& shards) const override;
  void loadFull(const Tensor& weight);
  const Tensor& weight() const { return weight_; }
  int64_t vocabStart() const { return start_; }
  int64_t vocabSize() const { return vocab_; }
  // T·⌈V/T⌉: the rows of every rank's weight together.
  int64_t paddedVocabSize() const { return weight_.size(0) * tp_->size(); }
  // The rows of this rank's weight that are vocabulary (the rest padding).
  int64_t localVocab() const { return real_; }

 private:
  std::shared_ptr<TpGroup> tp_;
  int64_t vocab_, dim_, start_, real_ = 0;
  Tensor weight_;
};

// Mean cross-entropy of logits split over the vocabulary: `logits` [N, L]
// holds this rank's columns [vocabStart, vocabStart + L) of the whole [N, T·L]
// (L = ⌈V/T⌉ for a vocabulary of `vocabSize` V; the default -1 means T·L),
// the columns at V and past it padding, masked out (as if their logits were
// -inf: they add nothing and get zero gradient); `targets` Int64 [N], the
// same on every rank, in [0, V) or -100
// (ignored, as nn's crossEntropy; NaN when every row is ignored). Equals
// crossEntropy of the gathered logits without gathering them: three
// allreduces of N elements (the row maxima, the sums of exponentials, the
// target logits). Differentiable in logits; every rank returns the same loss.
// Reduction::Sum gives the sum over the counted rows instead of the mean.
// InvalidArgumentError when ⌈V/T⌉ is not L.
Tensor vocabParallelCrossEntropy(TpGroup& tp, const Tensor& logits, const Tensor& targets, int64_t vocabStart,
                                 Reduction reduction = Reduction::Mean, int64_t vocabSize = -1);

}  // namespace weft::collectives
