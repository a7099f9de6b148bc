#include "collectives/sequence_parallel_gpt.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "collectives/detail/checkpointed_blocks.h"
#include "common/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::collectives {

// ---- attention and block ------------------------------------------------------------------

SequenceParallelAttention::SequenceParallelAttention(const nn::GPTConfig& c, SpOptions o)
    : Module("SequenceParallelAttention"),
      heads_(c.heads),
      width_(c.width),
      dropout_(c.dropout),
      options_(checkedSpOptions(o, c.heads, "SequenceParallelAttention")) {
  cAttn_ = registerModule("c_attn", std::make_shared<nn::Linear>(c.width, 3 * c.width, c.bias));
  cProj_ = registerModule("c_proj", std::make_shared<nn::Linear>(c.width, c.width, c.bias));
}

Tensor SequenceParallelAttention::forward(const Tensor& x) {
  WEFT_ENFORCE(x.defined() && x.dim() == 3 && x.size(2) == width_, InvalidArgumentError,
               "SequenceParallelAttention: expected input [B, S/P, ", width_, "], got shape ",
               x.defined() ? x.shape() : Shape{});
  const int64_t b = x.size(0), t = x.size(1), d = width_ / heads_;
  std::vector<Tensor> qkv = split(cAttn_->forward(x), width_, 2);
  auto heads = [&](const Tensor& part) { return part.view({b, t, heads_, d}).transpose(1, 2).contiguous(); };
  Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  Tensor y = spAttention(options_, q, k, v, isTraining() ? dropout_ : 0.0);
  return spTokenDropout(options_, cProj_->forward(y.transpose(1, 2).reshape({b, t, width_})), dropout_, isTraining());
}

SequenceParallelBlock::SequenceParallelBlock(const nn::GPTConfig& c, SpOptions o) : Module("SequenceParallelBlock") {
  ln1_ = registerModule("ln_1", std::make_shared<nn::LayerNorm>(Shape{c.width}, 1e-5, true, c.bias));
  attn_ = registerModule("attn", std::make_shared<SequenceParallelAttention>(c, o));
  ln2_ = registerModule("ln_2", std::make_shared<nn::LayerNorm>(Shape{c.width}, 1e-5, true, c.bias));
  // nn's MLP without its dropout, which draws over this rank's tokens only: spTokenDropout instead.
  nn::GPTConfig mlp = c;
  mlp.dropout = 0.0;
  mlp_ = registerModule("mlp", std::make_shared<nn::MLP>(mlp));
  options_ = o;
  dropout_ = c.dropout;
}

Tensor SequenceParallelBlock::forward(const Tensor& x) {
  Tensor h = add(x, attn_->forward(ln1_->forward(x)));
  return add(h, spTokenDropout(options_, mlp_->forward(ln2_->forward(h)), dropout_, isTraining()));
}

// ---- the model ---------------------------------------------------------------------------

SequenceParallelGPT::SequenceParallelGPT(nn::GPTConfig c, SpOptions o)
    : Module("SequenceParallelGPT"), config_(std::move(c)), options_(checkedSpOptions(o, config_.heads, "SequenceParallelGPT")) {
  wte_ = registerModule("wte", std::make_shared<nn::Embedding>(config_.vocabSize, config_.width));
  wpe_ = registerModule("wpe", std::make_shared<nn::Embedding>(config_.blockSize, config_.width));
  h_ = registerModule("h", std::make_shared<nn::Sequential>());
  for (int64_t i = 0; i < config_.layers; ++i) {
    blocks_.push_back(std::make_shared<SequenceParallelBlock>(config_, options_));
    h_->push_back(blocks_.back());
  }
  lnF_ = registerModule("ln_f", std::make_shared<nn::LayerNorm>(Shape{config_.width}, 1e-5, true, config_.bias));
}

int64_t SequenceParallelGPT::paddedLength(int64_t length) const { return spPaddedLength(options_, length); }

Tensor SequenceParallelGPT::shard(const Tensor& whole, int64_t pad) const {
  return spShardTokens(options_, whole, pad);
}

std::vector<int64_t> SequenceParallelGPT::positions(int64_t length) const {
  return spPositions(options_, length, config_.blockSize - 1);
}

Tensor SequenceParallelGPT::forward(const Tensor& idx) {
  WEFT_ENFORCE(idx.defined() && idx.dtype() == DType::Int64 && idx.dim() == 2, InvalidArgumentError,
               "SequenceParallelGPT: idx must be Int64 [B, S/P], got ",
               idx.defined() ? shapeString(idx.shape()) + " " + dtypeName(idx.dtype()) : std::string("undefined"));
  const int64_t length = idx.size(1) * spRanks(options_);
  WEFT_ENFORCE(length <= paddedLength(config_.blockSize), InvalidArgumentError,
               "SequenceParallelGPT: the whole sequence has ", length, " tokens, more than blockSize = ",
               config_.blockSize, " padded to ", paddedLength(config_.blockSize));
  Tensor pos = fromVector(positions(length), {idx.size(1)});
  Tensor x = add(wte_->forward(idx), indexSelect(wpe_->weight(), 0, pos));
  x = spTokenDropout(options_, x, config_.dropout, isTraining());
  x = detail::runBlocks(blocks_, config_.checkpoint, x);
  return linear(lnF_->forward(x), wte_->weight());
}

Tensor SequenceParallelGPT::loss(const Tensor& idx, const Tensor& targets) {
  WEFT_ENFORCE(
      targets.defined() && targets.dtype() == DType::Int64 && idx.defined() && targets.shape() == idx.shape(),
      InvalidArgumentError, "SequenceParallelGPT::loss: targets must be Int64 of idx's shape ",
      idx.defined() ? idx.shape() : Shape{}, ", got ",
      targets.defined() ? shapeString(targets.shape()) + " " + dtypeName(targets.dtype()) : std::string("undefined"));
  Tensor logits = forward(idx);
  Tensor flat = targets.reshape({-1});
  Tensor sum = crossEntropy(logits.view({-1, config_.vocabSize}), flat, Reduction::Sum);
  double counted = 0;
  for (int64_t t : flat.toVector<int64_t>()) counted += t == -100 ? 0.0 : 1.0;
  Tensor count = full({}, counted, {.dtype = DType::Float64});
  spSumInPlace(options_, count);
  return div(reduceFromSp(options_, sum), count.to(sum.dtype()));
}

void SequenceParallelGPT::allReduceGradients() {
  for (const Tensor& p : parameters()) {
    if (p.grad().defined()) spSumInPlace(options_, p.grad());
  }
}

void SequenceParallelGPT::loadFrom(const nn::GPT& full) {
  const nn::GPTConfig& c = full.config();
  WEFT_ENFORCE(c.vocabSize == config_.vocabSize && c.blockSize == config_.blockSize && c.layers == config_.layers &&
                   c.heads == config_.heads && c.width == config_.width && c.bias == config_.bias,
               InvalidArgumentError, "SequenceParallelGPT::loadFrom: the model's config differs from this one's");
  std::map<std::string, Tensor> mine;
  for (auto& [n, p] : namedParameters()) mine[n] = p;
  NoGradGuard noGrad;
  for (const auto& [n, p] : full.namedParameters()) {
    auto it = mine.find(n);
    WEFT_ENFORCE(it != mine.end(), NotFoundError, "SequenceParallelGPT::loadFrom: no parameter named '", n, "'");
    it->second.copy_(p);
  }
}

}  // namespace weft::collectives
