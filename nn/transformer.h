// A GPT-2 style decoder-only transformer and its pieces, after nanoGPT:
// LayerNorm, causal self-attention, the MLP, the pre-LN block and the GPT
// language model with its loss and sampler.
//
//   nn::GPTConfig cfg{.vocabSize = 256, .blockSize = 128, .layers = 4, .heads = 4, .width = 128,
//                     .dropout = 0.1, .checkpoint = nn::CheckpointPolicy::sqrtN()};
//   Generator g(42);
//   auto gpt = std::make_shared<nn::GPT>(cfg, &g);     // GPT-2 initialisation drawn from g
//   Tensor loss = gpt->loss(x, y);                     // x, y Int64 [B, T], T <= blockSize
//   loss.backward();
//   gpt->eval();
//   Tensor out = gpt->generate(prompt, 100, 0.8, 40, &g);   // [1, T] -> [1, T + 100]
//
// Names. Parameters carry nanoGPT's state_dict names without its
// "transformer." prefix: "wte.weight" [vocab, width], "wpe.weight"
// [blockSize, width], per block k "h.k.ln_1.{weight,bias}",
// "h.k.attn.c_attn.{weight,bias}" (fused q, k, v: [3·width, width]),
// "h.k.attn.c_proj.*", "h.k.ln_2.*", "h.k.mlp.c_fc.*" ([4·width, width]),
// "h.k.mlp.c_proj.*", then "ln_f.*". The LM head is tied to the token
// embedding (logits = x·wteᵀ): nanoGPT's "lm_head.weight" is "wte.weight"
// and is not a parameter of its own. The pieces are reachable as submodules
// under those names (wte, wpe, h, h.0 ... h.N-1, ln_f), so parallel layouts
// can rebuild or split them.
//
// Numerics. LayerNorm is PyTorch's (biased variance, eps inside the square
// root); attention is scaledDotProductAttention (tensor/ops_attention.h) with
// the causal mask, scale 1/sqrt(width/heads); the MLP's GELU is the exact erf
// form (torch.nn.GELU() and today's nanoGPT; GPT-2's tanh approximation
// differs from it by up to about 5e-4). Dropout, with config.dropout, is
// applied to the embeddings' sum, to the attention probabilities, and to the
// output of each residual branch, in training mode only, drawing from the
// default generator.
//
// Initialisation (GPT-2's): Linear and Embedding weights N(0, 0.02²), the two
// residual output projections (attn.c_proj, mlp.c_proj) N(0, (0.02 /
// sqrt(2·layers))²), biases 0, LayerNorm weights 1 and biases 0, drawn in
// namedParameters() order from the generator given (the default generator
// when null). Constructing a GPT leaves the default generator where it was
// unless it is the one initialising.
//
// Activation checkpointing (GPTConfig::checkpoint): the blocks are cut into
// segments at the blocks where CheckpointPolicy::at() is true, and each
// segment runs under checkpoint() (tensor/checkpoint.h): only its input is
// kept, and backward recomputes its activations with the generator states
// restored, so gradients are bit-identical to a run without checkpointing,
// dropout included. Used only while grad mode is on.
//
// Errors: a config with a non-positive size, heads not dividing width, or
// dropout outside [0, 1) -> InvalidArgumentError naming the field and value;
// token ids that are not Int64 [B, T], T = 0 or T > blockSize ->
// InvalidArgumentError naming the shape or T; a token id outside
// [0, vocabSize) -> IndexError naming the id and its position.
//
// Threading: as nn/module.h; forward, loss and generate change no module
// state (generate runs in the mode the module is in: eval() first to sample
// without dropout).
#pragma once

#include <memory>
#include <vector>

#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/sequential.h"
#include "tensor/generator.h"

namespace weft::nn {

// y = (x - mean) / sqrt(var + eps) · weight + bias over the trailing
// dimensions normalizedShape, as torch.nn.LayerNorm. Parameters "weight"
// (ones) and "bias" (zeros) of normalizedShape when `affine`; `bias` false
// drops the bias alone (nanoGPT's bias=False).
class LayerNorm : public Module {
 public:
  // normalizedShape non-empty with positive sizes, eps > 0
  // (InvalidArgumentError otherwise).
  LayerNorm(Shape normalizedShape, double eps = 1e-5, bool affine = true, bool bias = true);
  // x [*, *normalizedShape] -> same shape; InvalidArgumentError naming both
  // shapes when x's trailing sizes differ.
  Tensor forward(const Tensor& x) override;

  const Shape& normalizedShape() const { return normalizedShape_; }
  double eps() const { return eps_; }
  const Tensor& weight() const { return weight_; }  // undefined without affine
  const Tensor& bias() const { return bias_; }      // undefined without affine or bias

 protected:
  std::string extraRepr() const override;

 private:
  Shape normalizedShape_;
  double eps_;
  Tensor weight_;
  Tensor bias_;
};

// Which blocks start a checkpointed segment (see the header comment). A value
// type; the default is none().
class CheckpointPolicy {
 public:
  CheckpointPolicy() = default;
  // No checkpointing: every activation is kept.
  static CheckpointPolicy none();
  // Every block is its own segment: the least memory held during forward.
  static CheckpointPolicy everyBlock();
  // Segments of k blocks (k >= 1, InvalidArgumentError otherwise).
  static CheckpointPolicy every(int k);
  // Segments of ceil(sqrt(layers)) blocks: about sqrt(layers) segment inputs
  // kept plus one segment's activations during its recomputation.
  static CheckpointPolicy sqrtN();

  // Whether a segment starts at `block` of a model with `layers` blocks.
  bool at(int block, int layers) const;
  bool enabled() const { return kind_ != Kind::None; }
  // The segment length for a model with `layers` blocks (0 for none()).
  int segmentLength(int layers) const;

 private:
  enum class Kind { None, Every, SqrtN };
  CheckpointPolicy(Kind kind, int k) : kind_(kind), k_(k) {}
  Kind kind_ = Kind::None;
  int k_ = 0;
};

struct GPTConfig {
  int64_t vocabSize = 256;
  int64_t blockSize = 128;  // the longest sequence; the position table's size
  int64_t layers = 4;
  int64_t heads = 4;  // must divide width
  int64_t width = 128;
  double dropout = 0.0;  // in [0, 1)
  bool bias = true;      // biases in the Linears and LayerNorms
  CheckpointPolicy checkpoint = CheckpointPolicy::none();
};

// x [B, T, width] -> [B, T, width]: fused q, k, v projection "c_attn", heads
// of width/heads, causal attention with dropout on its probabilities, output
// projection "c_proj", then dropout.
class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const GPTConfig& c);
  // InvalidArgumentError unless x is [B, T, width].
  Tensor forward(const Tensor& x) override;

  const std::shared_ptr<Linear>& cAttn() const { return cAttn_; }
  const std::shared_ptr<Linear>& cProj() const { return cProj_; }

 private:
  int64_t heads_;
  int64_t width_;
  double dropout_;
  std::shared_ptr<Linear> cAttn_;
  std::shared_ptr<Linear> cProj_;
};

// x [*, width] -> [*, width]: "c_fc" to 4·width, exact GELU, "c_proj" back,
// then dropout.
class MLP : public Module {
 public:
  explicit MLP(const GPTConfig& c);
  Tensor forward(const Tensor& x) override;

  const std::shared_ptr<Linear>& cFc() const { return cFc_; }
  const std::shared_ptr<Linear>& cProj() const { return cProj_; }

 private:
  double dropout_;
  std::shared_ptr<Linear> cFc_;
  std::shared_ptr<Linear> cProj_;
};

// Pre-LN residual block: x + attn(ln_1(x)), then + mlp(ln_2(·)).
class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const GPTConfig& c);
  Tensor forward(const Tensor& x) override;

  const std::shared_ptr<LayerNorm>& ln1() const { return ln1_; }
  const std::shared_ptr<CausalSelfAttention>& attn() const { return attn_; }
  const std::shared_ptr<LayerNorm>& ln2() const { return ln2_; }
  const std::shared_ptr<MLP>& mlp() const { return mlp_; }

 private:
  std::shared_ptr<LayerNorm> ln1_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<LayerNorm> ln2_;
  std::shared_ptr<MLP> mlp_;
};

class GPT : public Module {
 public:
  // Validates c (see Errors) and draws GPT-2's initialisation from `init`.
  explicit GPT(GPTConfig c, Generator* init = nullptr);

  // idx Int64 [B, T] -> logits [B, T, vocabSize] in the parameters' dtype.
  Tensor forward(const Tensor& idx) override;
  // The final LayerNorm's output [B, T, width], before the tied head.
  Tensor features(const Tensor& idx);
  // Mean cross-entropy of forward(idx) against `targets` (Int64, idx's shape;
  // entries of -100 are ignored, others must lie in [0, vocabSize)).
  Tensor loss(const Tensor& idx, const Tensor& targets);
  // Appends maxNewTokens tokens to each row of `prompt` (Int64 [B, T],
  // T >= 1) and returns [B, T + maxNewTokens]. Each step feeds the last
  // blockSize tokens, divides the last position's logits by temperature,
  // keeps the topK largest (0: all; ties at the k-th value stay), and samples
  // from their softmax with one gen->nextDouble() per row (the default
  // generator when null). temperature 0 is greedy (the first largest logit;
  // nothing drawn). Runs without grad. InvalidArgumentError for a negative
  // maxNewTokens, temperature or topK.
  Tensor generate(const Tensor& prompt, int64_t maxNewTokens, double temperature = 1.0, int64_t topK = 0,
                  Generator* gen = nullptr);

  const GPTConfig& config() const { return config_; }
  // Every parameter once (the tied head is wte): with V = vocabSize,
  // C = width, V·C + blockSize·C + layers·(12·C² + 13·C) + 2·C with biases,
  // V·C + blockSize·C + layers·(12·C² + 2·C) + C without.
  int64_t numParameters() const;

  const std::shared_ptr<Embedding>& wte() const { return wte_; }
  const std::shared_ptr<Embedding>& wpe() const { return wpe_; }
  const std::vector<std::shared_ptr<TransformerBlock>>& blocks() const { return blocks_; }
  const std::shared_ptr<LayerNorm>& lnF() const { return lnF_; }

 protected:
  std::string extraRepr() const override;

 private:
  void initWeights(Generator* gen);
  void checkTokens(const Tensor& idx, const char* what) const;

  GPTConfig config_;
  std::shared_ptr<Embedding> wte_;
  std::shared_ptr<Embedding> wpe_;
  std::shared_ptr<Sequential> h_;
  std::vector<std::shared_ptr<TransformerBlock>> blocks_;
  std::shared_ptr<LayerNorm> lnF_;
};

}  // namespace weft::nn
