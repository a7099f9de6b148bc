// The GPT of nn/transformer.h with its sequence split over a
// sequence-parallel group (collectives/sequence_parallel.h): every rank holds
// every parameter and 1/P of the tokens; attention is Ulysses, ring or 2-D.
//
//   collectives::Mesh mesh(*world, {{"sp", 4}});
//   collectives::SpGroup sp(mesh.group("sp"));
//   collectives::SequenceParallelGPT model(cfg, {.mode = SpMode::Ring, .ring = &sp,
//                                                .layout = RingLayout::ZigZag});
//   model.loadFrom(wholeGpt);
//   Tensor x = model.shard(idx), y = model.shard(targets);   // this rank's tokens [B, S/P]
//   Tensor loss = model.loss(x, y);                          // the whole batch's mean, on every rank
//   loss.backward();
//   model.allReduceGradients();                              // .grad = the whole model's gradient
//
// Layout. Submodules and parameters carry nn::GPT's names and shapes. Tokens
// are assigned as SpOptions says: Ulysses contiguously over its group; ring
// (and the ring level of 2-D) by the ring layout, each ring position's tokens
// then split contiguously over the Ulysses group (shardSequence2d). The
// position embedding takes each token's position in the whole sequence.
//
// Any sequence length: shard(whole, pad) first pads the end of the sequence
// to paddedLength() with `pad` (token ids: any id; targets: -100, so that the
// padding is not counted). Under the causal mask no real token sees a padded
// one, so loss and gradients are the unpadded sequence's; a padded position
// past blockSize takes the last position's embedding (it reaches nothing).
//
// loss() is the mean cross-entropy over the whole batch's counted tokens (the
// targets not -100), on every rank: the ranks' sums and counts are summed by
// allreduce (forward) whose backward is the identity, so each rank's backward
// gives the gradients of its tokens' share of the loss (the attention's
// collectives carry the other ranks' shares across); allReduceGradients()
// then sums every parameter's gradient over the group (one allreduce per
// parameter). Plain SGD-style training: loss, backward, allReduceGradients,
// step.
//
// Numerics: loss and gradients equal nn::GPT's on the whole sequence up to
// the order of floating additions. Dropout, in every mode, draws the whole
// model's masks when every rank seeds its default generator as the unsplit
// run does and the sequence splits without padding: the embedding and
// residual dropouts draw the whole [B, S, C] mask on every rank and keep
// their tokens' rows (spTokenDropout), the attention takes its part of the
// whole attention's mask (spAttention). A padded sequence draws the masks of
// the padded length, still a valid dropout.
// Activation checkpointing (GPTConfig::checkpoint) cuts the blocks into
// segments as nn::GPT does, each under checkpoint(): backward recomputes a
// segment's forward, its attention's all-to-alls or ring transfers included,
// at the same point of every rank's backward; losses and gradients are those
// of the run without checkpointing.
//
// Errors: nn::GPT's for the config; InvalidArgumentError when the groups do
// not fit the mode (naming what is missing), heads not divisible by the
// Ulysses size, a sequence that does not split into the layout's chunks, and
// from loadFrom a model of another config; the groups' errors from forward and
// backward.
//
// Lifetimes: the SpGroups must outlive the model and the graphs it records.
#pragma once

#include <memory>
#include <vector>

#include "collectives/sequence_parallel.h"
#include "nn/sequential.h"
#include "nn/transformer.h"

namespace weft::collectives {

// x [B, S/P, C], this rank's tokens -> [B, S/P, C]: nn's CausalSelfAttention
// ("c_attn", "c_proj") with its attention over the whole sequence, dropout
// as SequenceParallelGPT says.
class SequenceParallelAttention : public nn::Module {
 public:
  SequenceParallelAttention(const nn::GPTConfig& c, SpOptions o);
  Tensor forward(const Tensor& x) override;

 private:
  int64_t heads_, width_;
  double dropout_;
  SpOptions options_;
  std::shared_ptr<nn::Linear> cAttn_;
  std::shared_ptr<nn::Linear> cProj_;
};

class SequenceParallelBlock : public nn::Module {
 public:
  SequenceParallelBlock(const nn::GPTConfig& c, SpOptions o);
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<nn::LayerNorm> ln1_;
  std::shared_ptr<SequenceParallelAttention> attn_;
  std::shared_ptr<nn::LayerNorm> ln2_;
  std::shared_ptr<nn::MLP> mlp_;
  SpOptions options_;
  double dropout_ = 0.0;
};

class SequenceParallelGPT : public nn::Module {
 public:
  SequenceParallelGPT(nn::GPTConfig c, SpOptions o);

  // The smallest length >= `length` that splits into the layout's chunks.
  int64_t paddedLength(int64_t length) const;
  // This rank's tokens of a whole [B, S] tensor (ids or targets), padded at
  // the end with `pad` to paddedLength(S).
  Tensor shard(const Tensor& whole, int64_t pad = 0) const;
  // The positions in the whole sequence of this rank's tokens, for a whole
  // (padded) sequence of `length` tokens, capped at blockSize - 1.
  std::vector<int64_t> positions(int64_t length) const;
  // idx Int64 [B, S/P], this rank's tokens of a sequence of S <=
  // paddedLength(blockSize) -> logits [B, S/P, vocabSize].
  Tensor forward(const Tensor& idx) override;
  // The whole batch's mean cross-entropy (see above), the same on every rank.
  Tensor loss(const Tensor& idx, const Tensor& targets);
  // Sums every parameter's gradient over the group (blocking).
  void allReduceGradients();
  // Copies every parameter of `full` (same config).
  void loadFrom(const nn::GPT& full);

  const nn::GPTConfig& config() const { return config_; }

 private:
  nn::GPTConfig config_;
  SpOptions options_;
  std::shared_ptr<nn::Embedding> wte_;
  std::shared_ptr<nn::Embedding> wpe_;
  std::shared_ptr<nn::Sequential> h_;
  std::vector<std::shared_ptr<SequenceParallelBlock>> blocks_;
  std::shared_ptr<nn::LayerNorm> lnF_;
};

}  // namespace weft::collectives
