#include "collectives/tensor_parallel_gpt.h"

#include <cmath>
#include <utility>

#include "collectives/detail/checkpointed_blocks.h"
#include "common/error.h"
#include "tensor/ops.h"
#include "tensor/ops_attention.h"

namespace weft::collectives {

namespace {

void checkSplit(const nn::GPTConfig& c, int t) {
  WEFT_ENFORCE(c.heads > 0 && c.width > 0 && c.width % c.heads == 0, InvalidArgumentError,
               "TensorParallelGPT: heads (", c.heads, ") must be positive and divide width (", c.width, ")");
  WEFT_ENFORCE(c.heads % t == 0, InvalidArgumentError, "TensorParallelGPT: heads (", c.heads,
               ") must be divisible by the tensor-parallel size ", t);
  WEFT_ENFORCE(c.vocabSize > 0, InvalidArgumentError, "TensorParallelGPT: vocabSize must be positive, got ",
               c.vocabSize);
}

}  // namespace

// ---- attention, MLP, block ------------------------------------------------------------

ParallelCausalSelfAttention::ParallelCausalSelfAttention(std::shared_ptr<TpGroup> tp, const nn::GPTConfig& c,
                                                         std::optional<SpOptions> sp)
    : Module("ParallelCausalSelfAttention"), width_(c.width), dropout_(c.dropout) {
  checkSplit(c, tp->size());
  localHeads_ = c.heads / tp->size();
  heads_ = c.heads;
  headOffset_ = tp->rank() * localHeads_;
  if (sp) {
    sp_ = checkedSpOptions(*sp, localHeads_, "ParallelCausalSelfAttention");
  }
  headDim_ = c.width / c.heads;
  cAttn_ = registerModule("c_attn", std::make_shared<ColumnParallelLinear>(tp, c.width, 3 * c.width, c.bias, 3));
  cProj_ = registerModule("c_proj", std::make_shared<RowParallelLinear>(tp, c.width, c.width, c.bias));
}

Tensor ParallelCausalSelfAttention::forward(const Tensor& x) {
  WEFT_ENFORCE(x.defined() && x.dim() == 3 && x.size(2) == width_, InvalidArgumentError,
               "ParallelCausalSelfAttention: expected input [B, T, ", width_, "], got shape ",
               x.defined() ? x.shape() : Shape{});
  const int64_t b = x.size(0), t = x.size(1), local = localHeads_ * headDim_;
  // [B, T, 3·C/T] -> this rank's heads' q, k, v as [B, H/T, T, D].
  std::vector<Tensor> qkv = split(cAttn_->forward(x), local, 2);
  auto heads = [&](const Tensor& part) { return part.view({b, t, localHeads_, headDim_}).transpose(1, 2); };
  AttentionOptions o;
  o.causal = true;
  o.dropout = isTraining() ? dropout_ : 0.0;
  // This rank's heads' part of the whole model's attention dropout mask (the seed drawn alike on
  // every rank of the group).
  o.dropoutFrame = AttentionOptions::DropoutFrame{.heads = heads_, .headOffset = headOffset_, .queries = t, .keys = t};
  Tensor y = sp_ ? spAttention(*sp_, heads(qkv[0]).contiguous(), heads(qkv[1]).contiguous(),
                               heads(qkv[2]).contiguous(), o.dropout, heads_, headOffset_)
                 : scaledDotProductAttention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), o);
  y = y.transpose(1, 2).reshape({b, t, local});
  return tokenDropout(cProj_->forward(y));
}

Tensor ParallelCausalSelfAttention::tokenDropout(const Tensor& x) const {
  return sp_ ? spTokenDropout(*sp_, x, dropout_, isTraining()) : dropout(x, dropout_, isTraining());
}

ParallelMLP::ParallelMLP(std::shared_ptr<TpGroup> tp, const nn::GPTConfig& c, std::optional<SpOptions> sp)
    : Module("ParallelMLP"), dropout_(c.dropout), sp_(std::move(sp)) {
  checkSplit(c, tp->size());
  cFc_ = registerModule("c_fc", std::make_shared<ColumnParallelLinear>(tp, c.width, 4 * c.width, c.bias));
  cProj_ = registerModule("c_proj", std::make_shared<RowParallelLinear>(tp, 4 * c.width, c.width, c.bias));
}

Tensor ParallelMLP::forward(const Tensor& x) {
  Tensor y = cProj_->forward(gelu(cFc_->forward(x)));
  return sp_ ? spTokenDropout(*sp_, y, dropout_, isTraining()) : dropout(y, dropout_, isTraining());
}

ParallelTransformerBlock::ParallelTransformerBlock(std::shared_ptr<TpGroup> tp, const nn::GPTConfig& c,
                                                   std::optional<SpOptions> sp)
    : Module("ParallelTransformerBlock") {
  ln1_ = registerModule("ln_1", std::make_shared<nn::LayerNorm>(Shape{c.width}, 1e-5, true, c.bias));
  attn_ = registerModule("attn", std::make_shared<ParallelCausalSelfAttention>(tp, c, sp));
  ln2_ = registerModule("ln_2", std::make_shared<nn::LayerNorm>(Shape{c.width}, 1e-5, true, c.bias));
  mlp_ = registerModule("mlp", std::make_shared<ParallelMLP>(tp, c, sp));
}

Tensor ParallelTransformerBlock::forward(const Tensor& x) {
  Tensor h = add(x, attn_->forward(ln1_->forward(x)));
  return add(h, mlp_->forward(ln2_->forward(h)));
}

// ---- the model -------------------------------------------------------------------------

TensorParallelGPT::TensorParallelGPT(std::shared_ptr<TpGroup> tp, nn::GPTConfig c, std::optional<SpOptions> sp)
    : Module("TensorParallelGPT"), tp_(std::move(tp)), config_(std::move(c)) {
  // nn::GPT validates the sizes it shares with this model.
  WEFT_ENFORCE(config_.blockSize > 0 && config_.layers > 0, InvalidArgumentError,
               "TensorParallelGPT: blockSize and layers must be positive, got ", config_.blockSize, " and ",
               config_.layers);
  WEFT_ENFORCE(config_.dropout >= 0.0 && config_.dropout < 1.0, InvalidArgumentError,
               "TensorParallelGPT: dropout must lie in [0, 1), got ", config_.dropout);
  checkSplit(config_, tp_->size());
  if (sp) {
    sp_ = checkedSpOptions(*sp, config_.heads / tp_->size(), "TensorParallelGPT");
  }
  wte_ = registerModule("wte", std::make_shared<VocabParallelEmbedding>(tp_, config_.vocabSize, config_.width));
  wpe_ = registerModule("wpe", std::make_shared<nn::Embedding>(config_.blockSize, config_.width));
  h_ = registerModule("h", std::make_shared<nn::Sequential>());
  for (int64_t i = 0; i < config_.layers; ++i) {
    blocks_.push_back(std::make_shared<ParallelTransformerBlock>(tp_, config_, sp_));
    h_->push_back(blocks_.back());
  }
  lnF_ = registerModule("ln_f", std::make_shared<nn::LayerNorm>(Shape{config_.width}, 1e-5, true, config_.bias));
  sharded_["wte"] = wte_.get();
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const std::string at = "h." + std::to_string(i) + ".";
    sharded_[at + "attn.c_attn"] = blocks_[i]->attn()->cAttn().get();
    sharded_[at + "attn.c_proj"] = blocks_[i]->attn()->cProj().get();
    sharded_[at + "mlp.c_fc"] = blocks_[i]->mlp()->cFc().get();
    sharded_[at + "mlp.c_proj"] = blocks_[i]->mlp()->cProj().get();
  }
}

Tensor TensorParallelGPT::embed(const Tensor& idx, bool training) {
  WEFT_ENFORCE(idx.defined() && idx.dtype() == DType::Int64 && idx.dim() == 2, InvalidArgumentError,
               "TensorParallelGPT: idx must be Int64 [B, T], got ",
               idx.defined() ? shapeString(idx.shape()) + " " + dtypeName(idx.dtype()) : std::string("undefined"));
  const int64_t t = idx.size(1);
  Tensor x;
  if (sp_) {
    const int64_t length = t * spRanks(*sp_);
    WEFT_ENFORCE(t >= 1 && length <= spPaddedLength(*sp_, config_.blockSize), InvalidArgumentError,
                 "TensorParallelGPT: the whole sequence has ", length, " tokens, more than blockSize = ",
                 config_.blockSize, " padded to ", spPaddedLength(*sp_, config_.blockSize));
    Tensor pos = fromVector(spPositions(*sp_, length, config_.blockSize - 1), {t});
    x = add(wte_->forward(idx), indexSelect(wpe_->weight(), 0, pos));
  } else {
    WEFT_ENFORCE(t >= 1 && t <= config_.blockSize, InvalidArgumentError,
                 "TensorParallelGPT: idx has sequence length T = ", t, ", which must lie in [1, blockSize = ",
                 config_.blockSize, "]");
    x = add(wte_->forward(idx), wpe_->weight().narrow(0, 0, t));
  }
  return sp_ ? spTokenDropout(*sp_, x, config_.dropout, training) : dropout(x, config_.dropout, training);
}

Tensor TensorParallelGPT::features(const Tensor& idx) {
  return lnF_->forward(detail::runBlocks(blocks_, config_.checkpoint, embed(idx, isTraining())));
}

Tensor TensorParallelGPT::head(const Tensor& x) { return linear(copyToTp(*tp_, lnF_->forward(x)), wte_->weight()); }

Tensor TensorParallelGPT::forward(const Tensor& idx) {
  return linear(copyToTp(*tp_, features(idx)), wte_->weight());
}

Tensor TensorParallelGPT::loss(const Tensor& idx, const Tensor& targets) {
  WEFT_ENFORCE(
      targets.defined() && targets.dtype() == DType::Int64 && idx.defined() && targets.shape() == idx.shape(),
      InvalidArgumentError, "TensorParallelGPT::loss: targets must be Int64 of idx's shape ",
      idx.defined() ? idx.shape() : Shape{}, ", got ",
      targets.defined() ? shapeString(targets.shape()) + " " + dtypeName(targets.dtype()) : std::string("undefined"));
  return lossOfLogits(forward(idx), targets);
}

Tensor TensorParallelGPT::lossOfLogits(const Tensor& logits, const Tensor& targets) {
  WEFT_ENFORCE(logits.defined() && logits.dim() == 3 && logits.size(2) == wte_->weight().size(0) &&
                   targets.defined() && targets.dtype() == DType::Int64 && targets.dim() == 2 &&
                   targets.size(0) == logits.size(0) && targets.size(1) == logits.size(1),
               InvalidArgumentError, "TensorParallelGPT::lossOfLogits: expected logits [B, T, ",
               wte_->weight().size(0), "] and Int64 targets [B, T], got ",
               logits.defined() ? shapeString(logits.shape()) : std::string("undefined"), " and ",
               targets.defined() ? shapeString(targets.shape()) + " " + dtypeName(targets.dtype())
                                 : std::string("undefined"));
  Tensor flat = targets.reshape({-1});
  if (!sp_) {
    return vocabParallelCrossEntropy(*tp_, logits.reshape({-1, logits.size(2)}), flat, wte_->vocabStart(),
                                     Reduction::Mean, config_.vocabSize);
  }
  Tensor sum = vocabParallelCrossEntropy(*tp_, logits.reshape({-1, logits.size(2)}), flat, wte_->vocabStart(),
                                         Reduction::Sum, config_.vocabSize);
  double counted = 0;
  for (int64_t v : flat.toVector<int64_t>()) counted += v == -100 ? 0.0 : 1.0;
  Tensor count = full({}, counted, {.dtype = DType::Float64});
  spSumInPlace(*sp_, count);
  return div(reduceFromSp(*sp_, sum), count.to(sum.dtype()));
}

Tensor TensorParallelGPT::shardTokens(const Tensor& whole, int64_t pad) const {
  return sp_ ? spShardTokens(*sp_, whole, pad) : whole;
}

void TensorParallelGPT::allReduceGradients() {
  if (!sp_) return;
  for (const Tensor& p : parameters()) {
    if (p.grad().defined()) spSumInPlace(*sp_, p.grad());
  }
}

const TpSharded* TensorParallelGPT::shardingOf(const std::string& name, std::string* param) const {
  const auto dot = name.rfind('.');
  const std::string path = dot == std::string::npos ? std::string() : name.substr(0, dot);
  *param = dot == std::string::npos ? name : name.substr(dot + 1);
  auto it = sharded_.find(path);
  return it == sharded_.end() ? nullptr : it->second;
}

Tensor TensorParallelGPT::shard(const std::string& name, const Tensor& full) const {
  std::string param;
  if (const TpSharded* s = shardingOf(name, &param)) return s->shard(param, full);
  for (const auto& [n, p] : namedParameters()) {
    if (n != name) continue;
    WEFT_ENFORCE(full.defined() && full.shape() == p.shape(), InvalidArgumentError, "TensorParallelGPT: parameter '",
                 name, "' is whole on every rank and has shape ", p.shape(), ", got ",
                 full.defined() ? full.shape() : Shape{});
    return full.contiguous().clone();
  }
  throw NotFoundError("TensorParallelGPT: no parameter named '" + name + "'");
}

void TensorParallelGPT::loadFrom(const nn::GPT& full) {
  const nn::GPTConfig& c = full.config();
  WEFT_ENFORCE(c.vocabSize == config_.vocabSize && c.blockSize == config_.blockSize && c.layers == config_.layers &&
                   c.heads == config_.heads && c.width == config_.width && c.bias == config_.bias,
               InvalidArgumentError, "TensorParallelGPT::loadFrom: the model's config (vocabSize ", c.vocabSize,
               ", blockSize ", c.blockSize, ", layers ", c.layers, ", heads ", c.heads, ", width ", c.width,
               ") differs from this one's (vocabSize ", config_.vocabSize, ", blockSize ", config_.blockSize,
               ", layers ", config_.layers, ", heads ", config_.heads, ", width ", config_.width, ")");
  nn::StateDict dict;
  for (const auto& [n, p] : full.namedParameters()) dict[n] = p;
  loadFullStateDict(dict);
}

void TensorParallelGPT::loadFullStateDict(const nn::StateDict& full) {
  NoGradGuard noGrad;
  for (auto& [n, p] : namedParameters()) {
    auto it = full.find(n);
    WEFT_ENFORCE(it != full.end(), NotFoundError, "TensorParallelGPT::loadFullStateDict: no entry '", n, "'");
    p.copy_(shard(n, it->second));
  }
}

nn::StateDict TensorParallelGPT::fullStateDict() {
  NoGradGuard noGrad;
  nn::StateDict dict;
  for (auto& [n, p] : namedParameters()) {
    std::string param;
    const TpSharded* s = shardingOf(n, &param);
    if (!s || !s->split(param)) {
      dict[n] = p.detach().contiguous().clone();
      continue;
    }
    std::vector<Tensor> shards;
    tp_->group().allGather(shards, p.detach().contiguous()).wait();
    dict[n] = s->unshard(param, shards);
  }
  return dict;
}

bool TensorParallelGPT::isSplit(const std::string& name) const {
  std::string param;
  if (const TpSharded* s = shardingOf(name, &param)) return s->split(param);
  for (const auto& [n, p] : namedParameters()) {
    if (n == name) return false;
  }
  throw NotFoundError("TensorParallelGPT: no parameter named '" + name + "'");
}

double TensorParallelGPT::clipGradNorm(double maxNorm) {
  NoGradGuard noGrad;
  double sharded = 0, whole = 0;
  std::vector<Tensor> grads;
  for (auto& [n, p] : namedParameters()) {
    if (!p.grad().defined()) continue;
    std::string param;
    const double sq = sum(square(p.grad().to(DType::Float64))).item<double>();
    const TpSharded* s = shardingOf(n, &param);
    (s && s->split(param) ? sharded : whole) += sq;
    grads.push_back(p.grad());
  }
  Tensor t = full({1}, sharded, {.dtype = DType::Float64});
  tp_->group().allReduce(t, ReduceOp::Sum).wait();
  const double norm = std::sqrt(t.item<double>() + whole);
  const double coef = maxNorm / (norm + 1e-6);
  if (coef < 1.0) {
    for (Tensor& g : grads) g.mul_(coef);
  }
  return norm;
}

}  // namespace weft::collectives
