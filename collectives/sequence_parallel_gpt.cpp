#include "collectives/sequence_parallel_gpt.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "common/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::collectives {

namespace {

SpOptions checked(SpOptions o, const nn::GPTConfig& c) {
  const bool needsUlysses = o.mode != SpMode::Ring, needsRing = o.mode != SpMode::Ulysses;
  WEFT_ENFORCE(!needsUlysses || o.ulysses, InvalidArgumentError,
               "SequenceParallelGPT: this mode needs SpOptions::ulysses, the Ulysses group");
  WEFT_ENFORCE(!needsRing || o.ring, InvalidArgumentError,
               "SequenceParallelGPT: this mode needs SpOptions::ring, the ring group");
  if (!needsUlysses) o.ulysses = nullptr;
  if (!needsRing) o.ring = nullptr;
  WEFT_ENFORCE(!o.ulysses || c.heads % o.ulysses->size() == 0, InvalidArgumentError, "SequenceParallelGPT: heads (",
               c.heads, ") must be divisible by the Ulysses size ", o.ulysses ? o.ulysses->size() : 1);
  return o;
}

// Sums `t` over the groups of `o` in place (blocking): over the whole grid of
// sequence-parallel ranks.
void sumOverGroups(const SpOptions& o, const Tensor& t) {
  for (SpGroup* g : {o.ulysses, o.ring}) {
    if (g) g->group().allReduce(t, ReduceOp::Sum).wait();
  }
}

// Sum over the groups in forward, identity in backward.
Tensor reduceFromSp(const SpOptions& o, const Tensor& x) {
  Tensor out;
  {
    NoGradGuard noGrad;
    out = x.contiguous().clone();
  }
  sumOverGroups(o, out);
  recordOp("reduceFromSp", {x}, {out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

}  // namespace

// ---- attention and block ------------------------------------------------------------------

SequenceParallelAttention::SequenceParallelAttention(const nn::GPTConfig& c, SpOptions o)
    : Module("SequenceParallelAttention"), heads_(c.heads), width_(c.width), options_(checked(o, c)) {
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
  Tensor y;
  if (options_.mode == SpMode::Ulysses) {
    AttentionOptions a;
    a.causal = true;
    y = ulyssesAttention(*options_.ulysses, q, k, v, a);
  } else {
    RingOptions r;
    r.causal = true;
    r.layout = options_.layout;
    y = options_.mode == SpMode::Ring ? ringAttention(*options_.ring, q, k, v, r)
                                      : hybridAttention(*options_.ulysses, *options_.ring, q, k, v, r);
  }
  return cProj_->forward(y.transpose(1, 2).reshape({b, t, width_}));
}

SequenceParallelBlock::SequenceParallelBlock(const nn::GPTConfig& c, SpOptions o) : Module("SequenceParallelBlock") {
  ln1_ = registerModule("ln_1", std::make_shared<nn::LayerNorm>(Shape{c.width}, 1e-5, true, c.bias));
  attn_ = registerModule("attn", std::make_shared<SequenceParallelAttention>(c, o));
  ln2_ = registerModule("ln_2", std::make_shared<nn::LayerNorm>(Shape{c.width}, 1e-5, true, c.bias));
  mlp_ = registerModule("mlp", std::make_shared<nn::MLP>(c));
}

Tensor SequenceParallelBlock::forward(const Tensor& x) {
  Tensor h = add(x, attn_->forward(ln1_->forward(x)));
  return add(h, mlp_->forward(ln2_->forward(h)));
}

// ---- the model ---------------------------------------------------------------------------

SequenceParallelGPT::SequenceParallelGPT(nn::GPTConfig c, SpOptions o)
    : Module("SequenceParallelGPT"), config_(std::move(c)), options_(checked(o, config_)) {
  WEFT_ENFORCE(config_.dropout == 0.0, InvalidArgumentError,
               "SequenceParallelGPT: dropout is not supported, got ", config_.dropout);
  wte_ = registerModule("wte", std::make_shared<nn::Embedding>(config_.vocabSize, config_.width));
  wpe_ = registerModule("wpe", std::make_shared<nn::Embedding>(config_.blockSize, config_.width));
  h_ = registerModule("h", std::make_shared<nn::Sequential>());
  for (int64_t i = 0; i < config_.layers; ++i) {
    blocks_.push_back(std::make_shared<SequenceParallelBlock>(config_, options_));
    h_->push_back(blocks_.back());
  }
  lnF_ = registerModule("ln_f", std::make_shared<nn::LayerNorm>(Shape{config_.width}, 1e-5, true, config_.bias));
}

int64_t SequenceParallelGPT::paddedLength(int64_t length) const {
  int64_t multiple = options_.ulysses ? options_.ulysses->size() : 1;
  if (options_.ring) multiple *= options_.ring->size() * (options_.layout == RingLayout::ZigZag ? 2 : 1);
  return (length + multiple - 1) / multiple * multiple;
}

Tensor SequenceParallelGPT::shard(const Tensor& whole, int64_t pad) const {
  WEFT_ENFORCE(whole.defined() && whole.dim() == 2, InvalidArgumentError,
               "SequenceParallelGPT::shard: expected a [B, S] tensor, got shape ",
               whole.defined() ? whole.shape() : Shape{});
  const int64_t s = whole.size(1), padded = paddedLength(s);
  Tensor x = whole;
  if (padded != s) x = cat({whole, full({whole.size(0), padded - s}, static_cast<double>(pad), {.dtype = whole.dtype()})}, 1);
  switch (options_.mode) {
    case SpMode::Ulysses: return shardSequence(x, 1, *options_.ulysses, RingLayout::Contiguous);
    case SpMode::Ring: return shardSequence(x, 1, *options_.ring, options_.layout);
    case SpMode::Hybrid: return shardSequence2d(x, 1, *options_.ulysses, *options_.ring, options_.layout);
  }
  return Tensor();
}

std::vector<int64_t> SequenceParallelGPT::positions(int64_t length) const {
  std::vector<int64_t> p = shard(arange(length).view({1, length})).toVector<int64_t>();
  for (int64_t& v : p) v = std::min(v, config_.blockSize - 1);
  return p;
}

Tensor SequenceParallelGPT::forward(const Tensor& idx) {
  WEFT_ENFORCE(idx.defined() && idx.dtype() == DType::Int64 && idx.dim() == 2, InvalidArgumentError,
               "SequenceParallelGPT: idx must be Int64 [B, S/P], got ",
               idx.defined() ? shapeString(idx.shape()) + " " + dtypeName(idx.dtype()) : std::string("undefined"));
  int64_t ranks = 1;
  for (SpGroup* g : {options_.ulysses, options_.ring}) ranks *= g ? g->size() : 1;
  const int64_t length = idx.size(1) * ranks;
  WEFT_ENFORCE(length <= paddedLength(config_.blockSize), InvalidArgumentError,
               "SequenceParallelGPT: the whole sequence has ", length, " tokens, more than blockSize = ",
               config_.blockSize, " padded to ", paddedLength(config_.blockSize));
  Tensor pos = fromVector(positions(length), {idx.size(1)});
  Tensor x = add(wte_->forward(idx), indexSelect(wpe_->weight(), 0, pos));
  for (const auto& blk : blocks_) x = blk->forward(x);
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
  sumOverGroups(options_, count);
  return div(reduceFromSp(options_, sum), count.to(sum.dtype()));
}

void SequenceParallelGPT::allReduceGradients() {
  for (const Tensor& p : parameters()) {
    if (p.grad().defined()) sumOverGroups(options_, p.grad());
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
