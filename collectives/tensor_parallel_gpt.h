// The GPT of nn/transformer.h split over a tensor-parallel group
// (collectives/tensor_parallel.h): each block holds 1/T of its matrices, and
// the vocabulary (token embedding, tied head, loss) is split too.
//
//   collectives::Mesh mesh(*world, {{"tp", 4}});
//   auto tp = std::make_shared<collectives::TpGroup>(mesh.group("tp"));
//   collectives::TensorParallelGPT model(tp, cfg);
//   model.loadFrom(fullGpt);                      // this rank's shards of an nn::GPT's weights
//   Tensor loss = model.loss(x, y);               // the same on every rank
//   loss.backward();                              // p.grad(): the shard of the whole model's gradient
//
// Layout. Submodules and parameters carry nn::GPT's names ("wte.weight",
// "h.k.attn.c_attn.weight", ...), holding:
//  - wte: VocabParallelEmbedding, rows [r·L, (r+1)·L) with L = ⌈V/T⌉ (a
//    vocabulary T does not divide is padded with zero rows to T·L); the LM
//    head is tied to it, so each rank computes its vocabulary slice of the
//    logits, and the loss masks the padding columns;
//  - h.k.attn: ParallelCausalSelfAttention: heads/T heads per rank; c_attn
//    column-parallel over the fused q, k, v (this rank's heads' rows of each),
//    c_proj row-parallel;
//  - h.k.mlp: ParallelMLP: c_fc column-parallel, c_proj row-parallel;
//  - wpe, ln_1, ln_2, ln_f and the biases of the row-parallel layers whole on
//    every rank.
// shard(name, full) maps a parameter (or gradient) of the whole nn::GPT to
// this rank's part; loadFrom copies every part.
//
// Communication (T ranks, activations [B, S, C] of E bytes each): per block
// in forward exactly two allreduces of B·S·C elements (after attention's
// c_proj and the MLP's c_proj), in backward two more (the gradients entering
// c_attn and c_fc); outside the blocks, the embedding's allreduce of B·S·C
// in forward, the head's of B·S·C in backward, and the loss's three of B·S
// elements in forward. TpGroup::traffic() counts them.
//
// Sequence parallelism (tp × sp): given SpOptions, every rank holds the
// tokens spShardTokens gives it (the same on every rank of its tp group) and
// each tp rank's heads/T heads attend over the whole sequence through
// spAttention (Ulysses needs heads/T divisible by its size); the MLP, the
// embeddings and the vocabulary-parallel loss work on the rank's tokens, the
// loss is the whole batch's mean, and allReduceGradients() sums the
// gradients over the sequence-parallel groups after backward. Mesh order
// puts tp innermost: {{"sp", P}, {"tp", T}}.
//
// Numerics: forward and gradients equal nn::GPT's loaded with the same
// weights up to the order of floating additions, with dropout too when every
// rank of the group seeds its default generator as the whole model's run
// does: the replicated dropouts (embeddings, residual branches) draw the
// whole model's masks from it, and each rank's attention draws the same seed
// and takes its heads' part of the whole model's attention mask (a dropout
// frame, tensor/ops_attention.h). With sequence parallelism too, for a
// sequence the groups divide: the replicated dropouts keep their tokens'
// rows of the whole mask (spTokenDropout), the attention its heads' and
// tokens' part (spAttention).
// Activation checkpointing (GPTConfig::checkpoint) cuts the blocks into
// segments as nn::GPT does, each under checkpoint(): only a segment's input
// is kept, and backward recomputes it, its forward allreduces included (so
// TpGroup::traffic() counts them again, as forward traffic), with the
// generator states restored: losses and gradients are those of the run
// without checkpointing.
//
// Errors: those of nn::GPT's config and inputs; InvalidArgumentError when T
// does not divide heads (naming both), when loadFrom's model has
// another config, and for a shard() of an unknown name (NotFoundError) or a
// tensor of another shape; the group's errors from forward and backward.
#pragma once

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/sequence_parallel.h"
#include "collectives/tensor_parallel.h"
#include "nn/sequential.h"
#include "nn/transformer.h"

namespace weft::collectives {

// x [B, S, C] replicated -> [B, S, C] replicated; heads/T heads on this rank.
// With `sp`, x holds this rank's tokens and the heads/T heads attend over the
// whole sequence through spAttention.
class ParallelCausalSelfAttention : public nn::Module {
 public:
  ParallelCausalSelfAttention(std::shared_ptr<TpGroup> tp, const nn::GPTConfig& c,
                              std::optional<SpOptions> sp = std::nullopt);
  Tensor forward(const Tensor& x) override;
  const std::shared_ptr<ColumnParallelLinear>& cAttn() const { return cAttn_; }
  const std::shared_ptr<RowParallelLinear>& cProj() const { return cProj_; }

 private:
  // The residual dropout: the whole model's mask, of this rank's tokens with sp.
  Tensor tokenDropout(const Tensor& x) const;
  int64_t localHeads_, heads_ = 0, headOffset_ = 0, width_, headDim_;
  double dropout_;
  std::optional<SpOptions> sp_;
  std::shared_ptr<ColumnParallelLinear> cAttn_;
  std::shared_ptr<RowParallelLinear> cProj_;
};

// x [*, C] -> [*, C]: c_fc column-parallel to 4·C/T features, GELU, c_proj
// row-parallel back, dropout.
class ParallelMLP : public nn::Module {
 public:
  // With `sp`, x holds this rank's tokens (the dropout mask is theirs of the whole model's).
  ParallelMLP(std::shared_ptr<TpGroup> tp, const nn::GPTConfig& c, std::optional<SpOptions> sp = std::nullopt);
  Tensor forward(const Tensor& x) override;
  const std::shared_ptr<ColumnParallelLinear>& cFc() const { return cFc_; }
  const std::shared_ptr<RowParallelLinear>& cProj() const { return cProj_; }

 private:
  double dropout_;
  std::optional<SpOptions> sp_;
  std::shared_ptr<ColumnParallelLinear> cFc_;
  std::shared_ptr<RowParallelLinear> cProj_;
};

class ParallelTransformerBlock : public nn::Module {
 public:
  ParallelTransformerBlock(std::shared_ptr<TpGroup> tp, const nn::GPTConfig& c,
                           std::optional<SpOptions> sp = std::nullopt);
  Tensor forward(const Tensor& x) override;
  const std::shared_ptr<ParallelCausalSelfAttention>& attn() const { return attn_; }
  const std::shared_ptr<ParallelMLP>& mlp() const { return mlp_; }

 private:
  std::shared_ptr<nn::LayerNorm> ln1_;
  std::shared_ptr<ParallelCausalSelfAttention> attn_;
  std::shared_ptr<nn::LayerNorm> ln2_;
  std::shared_ptr<ParallelMLP> mlp_;
};

class TensorParallelGPT : public nn::Module {
 public:
  // Parameters initialised as the parallel layers do; loadFrom for GPT-2's.
  // With `sp` (tp × sp), the tokens are split over the sequence-parallel
  // groups as well (see "Sequence parallelism" above).
  TensorParallelGPT(std::shared_ptr<TpGroup> tp, nn::GPTConfig c, std::optional<SpOptions> sp = std::nullopt);

  // idx Int64 [B, S] (the same on every rank of the tp group; with sp, this
  // rank's tokens) -> this rank's vocabulary slice of the logits [B, S, L],
  // columns [wte.vocabStart(), + L) of the padded vocabulary; the padding
  // columns (from wte.localVocab() on) are 0, not logits of any token.
  Tensor forward(const Tensor& idx) override;
  // The final LayerNorm's output [B, S, C], replicated over the tp group.
  Tensor features(const Tensor& idx);
  // nn::GPT::loss's value, through vocabParallelCrossEntropy (with sp: the
  // whole batch's mean over every rank's tokens).
  Tensor loss(const Tensor& idx, const Tensor& targets);
  // The pieces of forward and loss, for a model cut into pipeline stages
  // (pipeline/stage.h): forward(idx) = head(blocks(embed(idx))), loss(idx, y)
  // = lossOfLogits(forward(idx), y).
  //  - embed: the token embedding (vocabulary-parallel) plus the position
  //    embedding (with sp, of this rank's tokens' positions), then dropout
  //    when `training`: idx as forward's -> [B, S, C] replicated;
  //  - head: ln_f, then the head tied to wte: [B, S, C] replicated -> this
  //    rank's vocabulary slice of the logits [B, S, L];
  //  - lossOfLogits: head's logits and targets [B, S] (with sp, this rank's
  //    tokens, -100 ignored) -> loss's value; InvalidArgumentError for other
  //    shapes. Collective over the tp group (and the sp groups).
  Tensor embed(const Tensor& idx, bool training);
  Tensor head(const Tensor& x);
  Tensor lossOfLogits(const Tensor& logits, const Tensor& targets);
  // This rank's tokens of a whole [B, S] tensor: the tensor itself without
  // sp, spShardTokens with it (padded with `pad`).
  Tensor shardTokens(const Tensor& whole, int64_t pad = 0) const;
  // With sp: sums every gradient over the sequence-parallel groups (each
  // rank's backward gives its tokens' share); nothing without.
  void allReduceGradients();

  // This rank's part of parameter `name` of the whole model (see Layout).
  Tensor shard(const std::string& name, const Tensor& full) const;
  // Copies this rank's part of every parameter of `full`, whose config must
  // equal this model's (vocabSize, blockSize, layers, heads, width, bias).
  void loadFrom(const nn::GPT& full);
  // The same from a whole nn::GPT's state dict (a checkpoint): every one of
  // this model's names must be there with its whole shape (NotFoundError,
  // InvalidArgumentError).
  void loadFullStateDict(const nn::StateDict& full);
  // The whole model's state dict, nn::GPT's names and shapes, assembled from
  // every rank's shards: collective over the tp group (one allGather per
  // sharded parameter), the same on every rank. Saved with nn::saveStateDict,
  // it loads into an nn::GPT, or into a TensorParallelGPT of any T.
  nn::StateDict fullStateDict();
  // torch.nn.utils.clip_grad_norm_ (2-norm) over the whole model: the norm of
  // every gradient of the unsplit model (sharded parameters' squares summed
  // over the group, replicated ones counted once), every gradient scaled by
  // min(1, maxNorm / (norm + 1e-6)). Collective over the tp group (one
  // allreduce); returns the norm, the same on every rank.
  double clipGradNorm(double maxNorm);
  // Whether parameter `name` is split over the group (each rank holds a part
  // of it, as the norm of clipGradNorm counts it) rather than whole on every
  // rank; NotFoundError for an unknown name.
  bool isSplit(const std::string& name) const;

  const nn::GPTConfig& config() const { return config_; }
  const std::shared_ptr<TpGroup>& tp() const { return tp_; }
  const std::shared_ptr<VocabParallelEmbedding>& wte() const { return wte_; }
  const std::shared_ptr<nn::Embedding>& wpe() const { return wpe_; }
  const std::shared_ptr<nn::LayerNorm>& lnF() const { return lnF_; }
  const std::vector<std::shared_ptr<ParallelTransformerBlock>>& blocks() const { return blocks_; }

 private:
  std::shared_ptr<TpGroup> tp_;
  nn::GPTConfig config_;
  std::optional<SpOptions> sp_;
  std::shared_ptr<VocabParallelEmbedding> wte_;
  std::shared_ptr<nn::Embedding> wpe_;
  std::shared_ptr<nn::Sequential> h_;
  std::vector<std::shared_ptr<ParallelTransformerBlock>> blocks_;
  std::shared_ptr<nn::LayerNorm> lnF_;
  // The layer that shards parameter `name` (null: a replicated module's);
  // *param gets the name within that layer. A row-parallel bias has one but
  // is whole (TpSharded::split).
  const TpSharded* shardingOf(const std::string& name, std::string* param) const;

  std::map<std::string, const TpSharded*> sharded_;  // module path -> its sharding
};

}  // namespace weft::collectives
