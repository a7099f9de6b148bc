#include "nn/transformer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <utility>

#include "nn/init.h"
#include "tensor/checkpoint.h"
#include "tensor/ops.h"
#include "tensor/ops_attention.h"

namespace weft::nn {

// ---- LayerNorm ---------------------------------------------------------------

LayerNorm::LayerNorm(Shape normalizedShape, double eps, bool affine, bool bias)
    : Module("LayerNorm"), normalizedShape_(std::move(normalizedShape)), eps_(eps) {
  WEFT_ENFORCE(!normalizedShape_.empty() &&
                   std::all_of(normalizedShape_.begin(), normalizedShape_.end(), [](int64_t s) { return s > 0; }),
               InvalidArgumentError, "LayerNorm: normalizedShape must be non-empty with positive sizes, got ",
               normalizedShape_);
  WEFT_ENFORCE(eps > 0, InvalidArgumentError, "LayerNorm: eps must be positive, got ", eps);
  if (affine) {
    weight_ = registerParameter("weight", ones(normalizedShape_));
    if (bias) bias_ = registerParameter("bias", zeros(normalizedShape_));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  const auto n = static_cast<int64_t>(normalizedShape_.size());
  bool matches = x.defined() && x.dim() >= n;
  for (int64_t i = 0; matches && i < n; ++i) matches = x.size(x.dim() - n + i) == normalizedShape_[i];
  WEFT_ENFORCE(matches, InvalidArgumentError, "LayerNorm(", normalizedShape_, "): expected input [*, ",
               shapeString(normalizedShape_).substr(1), ", got shape ", x.defined() ? x.shape() : Shape{});
  return layerNorm(x, normalizedShape_, weight_, bias_, eps_);
}

std::string LayerNorm::extraRepr() const {
  return detail::concat(normalizedShape_, ", eps=", eps_, ", elementwise_affine=", weight_.defined() ? "true" : "false",
                        weight_.defined() && !bias_.defined() ? ", bias=false" : "");
}

// ---- CheckpointPolicy ----------------------------------------------------------

CheckpointPolicy CheckpointPolicy::none() { return CheckpointPolicy(Kind::None, 0); }
CheckpointPolicy CheckpointPolicy::everyBlock() { return CheckpointPolicy(Kind::Every, 1); }
CheckpointPolicy CheckpointPolicy::sqrtN() { return CheckpointPolicy(Kind::SqrtN, 0); }

CheckpointPolicy CheckpointPolicy::every(int k) {
  WEFT_ENFORCE(k >= 1, InvalidArgumentError, "CheckpointPolicy::every: k must be at least 1, got ", k);
  return CheckpointPolicy(Kind::Every, k);
}

int CheckpointPolicy::segmentLength(int layers) const {
  switch (kind_) {
    case Kind::None: return 0;
    case Kind::Every: return k_;
    case Kind::SqrtN: {
      int s = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(std::max(layers, 1)))));
      while (s * s < layers) ++s;  // guards the rounding of sqrt
      while (s > 1 && (s - 1) * (s - 1) >= layers) --s;
      return s;
    }
  }
  return 0;
}

bool CheckpointPolicy::at(int block, int layers) const {
  if (kind_ == Kind::None || block < 0 || block >= layers) return false;
  return block % segmentLength(layers) == 0;
}

// ---- attention, MLP, block ---------------------------------------------------------

namespace {

void checkConfig(const GPTConfig& c) {
  auto positive = [](const char* field, int64_t v) {
    WEFT_ENFORCE(v > 0, InvalidArgumentError, "GPTConfig: ", field, " must be positive, got ", v);
  };
  positive("vocabSize", c.vocabSize);
  positive("blockSize", c.blockSize);
  positive("layers", c.layers);
  positive("heads", c.heads);
  positive("width", c.width);
  WEFT_ENFORCE(c.width % c.heads == 0, InvalidArgumentError, "GPTConfig: heads (", c.heads, ") must divide width (",
               c.width, ")");
  WEFT_ENFORCE(c.dropout >= 0.0 && c.dropout < 1.0, InvalidArgumentError, "GPTConfig: dropout must lie in [0, 1), got ",
               c.dropout);
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(const GPTConfig& c)
    : Module("CausalSelfAttention"), heads_(c.heads), width_(c.width), dropout_(c.dropout) {
  checkConfig(c);
  cAttn_ = registerModule("c_attn", std::make_shared<Linear>(c.width, 3 * c.width, c.bias));
  cProj_ = registerModule("c_proj", std::make_shared<Linear>(c.width, c.width, c.bias));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  WEFT_ENFORCE(x.defined() && x.dim() == 3 && x.size(2) == width_, InvalidArgumentError,
               "CausalSelfAttention: expected input [B, T, ", width_, "], got shape ",
               x.defined() ? x.shape() : Shape{});
  const int64_t b = x.size(0), t = x.size(1), d = width_ / heads_;
  // [B, T, 3C] -> q, k, v as [B, H, T, D] views of the fused projection.
  std::vector<Tensor> qkv = split(cAttn_->forward(x), width_, 2);
  auto heads = [&](const Tensor& part) { return part.view({b, t, heads_, d}).transpose(1, 2); };
  AttentionOptions o;
  o.causal = true;
  o.dropout = isTraining() ? dropout_ : 0.0;
  Tensor y = scaledDotProductAttention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), o);
  y = y.transpose(1, 2).reshape({b, t, width_});
  return dropout(cProj_->forward(y), dropout_, isTraining());
}

MLP::MLP(const GPTConfig& c) : Module("MLP"), dropout_(c.dropout) {
  checkConfig(c);
  cFc_ = registerModule("c_fc", std::make_shared<Linear>(c.width, 4 * c.width, c.bias));
  cProj_ = registerModule("c_proj", std::make_shared<Linear>(4 * c.width, c.width, c.bias));
}

Tensor MLP::forward(const Tensor& x) {
  return dropout(cProj_->forward(gelu(cFc_->forward(x))), dropout_, isTraining());
}

TransformerBlock::TransformerBlock(const GPTConfig& c) : Module("TransformerBlock") {
  checkConfig(c);
  ln1_ = registerModule("ln_1", std::make_shared<LayerNorm>(Shape{c.width}, 1e-5, true, c.bias));
  attn_ = registerModule("attn", std::make_shared<CausalSelfAttention>(c));
  ln2_ = registerModule("ln_2", std::make_shared<LayerNorm>(Shape{c.width}, 1e-5, true, c.bias));
  mlp_ = registerModule("mlp", std::make_shared<MLP>(c));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  Tensor h = add(x, attn_->forward(ln1_->forward(x)));
  return add(h, mlp_->forward(ln2_->forward(h)));
}

// ---- GPT ---------------------------------------------------------------------------

namespace {

GPTConfig validated(GPTConfig c) {
  checkConfig(c);
  return c;
}

// Restores the default generator's state on destruction: the submodules'
// constructors draw PyTorch's default initialisation from it, which GPT then
// overwrites.
class DefaultGeneratorRestorer {
 public:
  DefaultGeneratorRestorer() : saved_(defaultGeneratorState()) {}
  ~DefaultGeneratorRestorer() { setDefaultGeneratorState(saved_); }
  DefaultGeneratorRestorer(const DefaultGeneratorRestorer&) = delete;
  DefaultGeneratorRestorer& operator=(const DefaultGeneratorRestorer&) = delete;

 private:
  GeneratorState saved_;
};

}  // namespace

GPT::GPT(GPTConfig c, Generator* init) : Module("GPT"), config_(validated(std::move(c))) {
  {
    DefaultGeneratorRestorer restorer;
    wte_ = registerModule("wte", std::make_shared<Embedding>(config_.vocabSize, config_.width));
    wpe_ = registerModule("wpe", std::make_shared<Embedding>(config_.blockSize, config_.width));
    h_ = registerModule("h", std::make_shared<Sequential>());
    for (int64_t i = 0; i < config_.layers; ++i) {
      blocks_.push_back(std::make_shared<TransformerBlock>(config_));
      h_->push_back(blocks_.back());
    }
    lnF_ = registerModule("ln_f", std::make_shared<LayerNorm>(Shape{config_.width}, 1e-5, true, config_.bias));
  }
  initWeights(init);
}

void GPT::initWeights(Generator* gen) {
  const double residualStd = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.layers));
  auto linear = [&](const Linear& l, double std) {
    init::normal_(l.weight(), 0.0, std, gen);
    if (l.bias().defined()) init::zeros_(l.bias());
  };
  auto norm = [](const LayerNorm& n) {
    init::ones_(n.weight());
    if (n.bias().defined()) init::zeros_(n.bias());
  };
  init::normal_(wte_->weight(), 0.0, 0.02, gen);
  init::normal_(wpe_->weight(), 0.0, 0.02, gen);
  for (const auto& blk : blocks_) {
    norm(*blk->ln1());
    linear(*blk->attn()->cAttn(), 0.02);
    linear(*blk->attn()->cProj(), residualStd);
    norm(*blk->ln2());
    linear(*blk->mlp()->cFc(), 0.02);
    linear(*blk->mlp()->cProj(), residualStd);
  }
  norm(*lnF_);
}

void GPT::checkTokens(const Tensor& idx, const char* what) const {
  WEFT_ENFORCE(idx.defined() && idx.dtype() == DType::Int64 && idx.dim() == 2, InvalidArgumentError, "GPT: ", what,
               " must be Int64 [B, T], got ",
               idx.defined() ? shapeString(idx.shape()) + " " + dtypeName(idx.dtype()) : std::string("undefined"));
  const int64_t t = idx.size(1);
  WEFT_ENFORCE(t >= 1 && t <= config_.blockSize, InvalidArgumentError, "GPT: ", what, " has sequence length T = ", t,
               ", which must lie in [1, blockSize = ", config_.blockSize, "]");
  // On a device the embedding's own check reports a bad id (reading the ids
  // here would wait for the device every step).
  if (!idx.device().isCpu()) return;
  const std::vector<int64_t> ids = idx.toVector<int64_t>();
  for (size_t i = 0; i < ids.size(); ++i) {
    WEFT_ENFORCE(ids[i] >= 0 && ids[i] < config_.vocabSize, IndexError, "GPT: ", what, " holds token id ", ids[i],
                 " at [", static_cast<int64_t>(i) / t, ", ", static_cast<int64_t>(i) % t,
                 "], outside the vocabulary [0, ", config_.vocabSize, ")");
  }
}

Tensor GPT::features(const Tensor& idx) {
  checkTokens(idx, "idx");
  const int64_t t = idx.size(1);
  Tensor x = add(wte_->forward(idx), wpe_->weight().narrow(0, 0, t));
  x = dropout(x, config_.dropout, isTraining());
  const int n = static_cast<int>(blocks_.size());
  const bool checkpointing = config_.checkpoint.enabled() && GradMode::enabled();
  for (int b = 0; b < n;) {
    if (!checkpointing) {
      x = (*blocks_[b++])(x);
      continue;
    }
    int e = b + 1;
    while (e < n && !config_.checkpoint.at(e, n)) ++e;
    std::vector<std::shared_ptr<TransformerBlock>> segment(blocks_.begin() + b, blocks_.begin() + e);
    x = checkpoint(
        [segment](const Tensor& in) {
          Tensor y = in;
          for (const auto& blk : segment) y = (*blk)(y);
          return y;
        },
        x);
    b = e;
  }
  return lnF_->forward(x);
}

Tensor GPT::forward(const Tensor& idx) { return linear(features(idx), wte_->weight()); }

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) {
  WEFT_ENFORCE(
      targets.defined() && targets.dtype() == DType::Int64 && idx.defined() && targets.shape() == idx.shape(),
      InvalidArgumentError, "GPT::loss: targets must be Int64 of idx's shape ", idx.defined() ? idx.shape() : Shape{},
      ", got ",
      targets.defined() ? shapeString(targets.shape()) + " " + dtypeName(targets.dtype()) : std::string("undefined"));
  Tensor logits = forward(idx);
  return crossEntropy(logits.view({-1, config_.vocabSize}), targets.reshape({-1}));
}

Tensor GPT::generate(const Tensor& prompt, int64_t maxNewTokens, double temperature, int64_t topK, Generator* gen) {
  WEFT_ENFORCE(maxNewTokens >= 0, InvalidArgumentError, "GPT::generate: maxNewTokens must be >= 0, got ", maxNewTokens);
  WEFT_ENFORCE(temperature >= 0.0 && std::isfinite(temperature), InvalidArgumentError,
               "GPT::generate: temperature must be finite and >= 0, got ", temperature);
  WEFT_ENFORCE(topK >= 0, InvalidArgumentError, "GPT::generate: topK must be >= 0, got ", topK);
  WEFT_ENFORCE(
      prompt.defined() && prompt.dtype() == DType::Int64 && prompt.dim() == 2 && prompt.size(1) >= 1,
      InvalidArgumentError, "GPT::generate: prompt must be Int64 [B, T] with T >= 1, got ",
      prompt.defined() ? shapeString(prompt.shape()) + " " + dtypeName(prompt.dtype()) : std::string("undefined"));
  NoGradGuard noGrad;
  const int64_t rows = prompt.size(0), vocab = config_.vocabSize;
  const int64_t k = topK == 0 ? vocab : std::min(topK, vocab);
  Tensor seq = prompt.contiguous();
  std::vector<double> probs(static_cast<size_t>(vocab));
  std::vector<double> sorted(static_cast<size_t>(vocab));
  std::vector<int64_t> next(static_cast<size_t>(rows));
  for (int64_t step = 0; step < maxNewTokens; ++step) {
    const int64_t t = seq.size(1);
    Tensor context = t <= config_.blockSize ? seq : seq.narrow(1, t - config_.blockSize, config_.blockSize);
    Tensor last = features(context).select(1, context.size(1) - 1);                      // [B, C]
    const std::vector<double> logits = linear(last, wte_->weight()).toVector<double>();  // [B, V]
    for (int64_t r = 0; r < rows; ++r) {
      const double* l = logits.data() + r * vocab;
      if (temperature == 0.0) {
        next[r] = std::max_element(l, l + vocab) - l;
        continue;
      }
      // Top-k: keep the logits >= the k-th largest.
      sorted.assign(l, l + vocab);
      std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<double>());
      const double threshold = sorted[static_cast<size_t>(k - 1)];
      double top = -std::numeric_limits<double>::infinity();
      for (int64_t v = 0; v < vocab; ++v) {
        if (l[v] >= threshold) top = std::max(top, l[v] / temperature);
      }
      double total = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        probs[v] = l[v] >= threshold ? std::exp(l[v] / temperature - top) : 0.0;
        total += probs[v];
      }
      double u;
      if (gen) {
        u = gen->nextDouble();
      } else {
        std::lock_guard<std::mutex> lock(defaultGeneratorMutex());
        u = defaultGenerator().nextDouble();
      }
      // Inverse CDF; the last kept token takes what rounding leaves over.
      const double target = u * total;
      double cumulative = 0;
      int64_t pick = -1;
      for (int64_t v = 0; v < vocab; ++v) {
        if (probs[v] == 0.0) continue;
        pick = v;
        cumulative += probs[v];
        if (target < cumulative) break;
      }
      next[r] = pick;
    }
    seq = cat({seq, fromVector(next, {rows, 1}).to(seq.device())}, 1);
  }
  return seq;
}

int64_t GPT::numParameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

std::string GPT::extraRepr() const {
  return detail::concat("vocab_size=", config_.vocabSize, ", block_size=", config_.blockSize,
                        ", layers=", config_.layers, ", heads=", config_.heads, ", width=", config_.width,
                        ", dropout=", config_.dropout);
}

}  // namespace weft::nn
