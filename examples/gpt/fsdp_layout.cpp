// The fully sharded layout over the whole job, the choice between the fully sharded layouts, and
// what they share: where parameters lie in the shards, and AdamW over them.
#include "fsdp_layout.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "collectives/fsdp.h"
#include "collectives/init.h"
#include "common/error.h"
#include "data/text.h"
#include "kernels/cpu/parallel.h"
#include "nn/functional.h"
#include "nn/optim.h"
#include "nn/transformer.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::examples::gpt {
namespace {

class FullySharded final : public Layout {
 public:
  explicit FullySharded(const Flags& f)
      : pg_(collectives::init()),
        model_(initialModel(f)),
        fsdp_(model_, *pg_),
        opt_({&fsdp_}, pg_->rank(), f),
        gradClip_(f.gradClip) {
    WEFT_ENFORCE(f.precision == "float32", InvalidArgumentError, "gpt: --precision ", f.precision,
                 " is not supported with --fsdp");
    WEFT_ENFORCE(f.dp == 1 || f.dp == pg_->size(), InvalidArgumentError, "gpt: --fsdp --dp ", f.dp,
                 " needs a job of ", f.dp, " processes (weftrun -n ", f.dp, "), this one has ", pg_->size());
  }

  std::string describe() const override {
    return "fully sharded data parallel (ZeRO-3) over " + std::to_string(pg_->size()) + " processes (" +
           std::to_string(fsdp_.units().size()) + " units, " + std::to_string(kernels::cpu::numThreads()) +
           " kernel threads each), float32";
  }

  int64_t numParameters() const override { return model_->numParameters(); }
  int dataRank() const override { return pg_->rank(); }
  int dataWorld() const override { return pg_->size(); }
  bool reports() const override { return pg_->rank() == 0; }

  double step(const Tensor& x, const Tensor& y, double lr) override {
    opt_.setLr(lr);
    opt_.zeroGrad();
    Tensor loss = lossOf(x, y);
    loss.backward();
    if (gradClip_ > 0) gradNorm_ = fsdp_.clipGradNorm_(gradClip_);
    opt_.step();
    // The job's loss: the mean of the processes' (equal shares of the batch).
    Tensor l = full({1}, loss.item<double>(), {.dtype = DType::Float64});
    pg_->allReduce(l, collectives::ReduceOp::Avg).wait();
    return l.item<double>();
  }

  double evaluate(const Tensor& x, const Tensor& y) override {
    NoGradGuard ng;
    model_->eval();
    const double loss = lossOf(x, y).item<double>();
    model_->train();
    return loss;
  }

  std::string sample(const std::string& prompt, int64_t tokens, double temperature, int64_t topK,
                     Generator& gen) override {
    // The trained model, gathered on each process in turn, in a plain GPT of its own.
    nn::StateDict mine;
    for (int r = 0; r < pg_->size(); ++r) {
      nn::StateDict d = fsdp_.fullStateDict(r);
      if (r == pg_->rank()) mine = std::move(d);
    }
    Generator init(0);
    auto plain = std::make_shared<nn::GPT>(model_->config(), &init);
    plain->loadStateDict(mine);
    plain->eval();
    std::vector<int64_t> ids = data::ByteTokenizer::encode(prompt);
    Tensor idx = fromVector(ids, Shape{1, static_cast<int64_t>(ids.size())});
    Tensor out = plain->generate(idx, tokens, temperature, topK, &gen);
    return data::ByteTokenizer::decode(out.toVector<int64_t>());
  }

  nn::StateDict fullStateDict() override { return fsdp_.fullStateDict(0); }

 private:
  Tensor lossOf(const Tensor& x, const Tensor& y) {
    Tensor logits = fsdp_.forward(x);
    return nn::functional::crossEntropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
  }

  std::unique_ptr<collectives::ProcessGroup> pg_;
  std::shared_ptr<nn::GPT> model_;
  collectives::FullyShardedDataParallel fsdp_;
  ShardedAdamW opt_;
  double gradClip_;
};

}  // namespace

std::unique_ptr<Layout> makeFsdpLayout(const Flags& flags) {
  if (flags.pp > 1) return makeFsdpPipelineLayout(flags);
  if (flags.tp > 1 || flags.sp > 1) return makeFsdpMeshLayout(flags);
  return std::make_unique<FullySharded>(flags);
}

std::vector<ShardSlice> shardSlices(const collectives::FullyShardedDataParallel& fsdp, int rank) {
  const auto named = fsdp.module()->namedParameters();
  std::vector<ShardSlice> out;
  const auto units = fsdp.units();
  for (size_t k = 0; k < units.size(); ++k) {
    const int64_t first = rank * units[k].shardNumel, last = first + units[k].shardNumel;
    int64_t offset = 0;
    for (const std::string& name : units[k].params) {
      auto it = std::find_if(named.begin(), named.end(), [&name](const auto& np) { return np.first == name; });
      WEFT_CHECK(it != named.end()) << name;
      const int64_t n = it->second.numel();
      const int64_t begin = std::max(offset, first), end = std::min(offset + n, last);
      if (begin < end) {
        out.push_back({.unit = k,
                       .name = name,
                       .parameter = it->second,
                       .shardBegin = begin - first,
                       .length = end - begin});
      }
      offset += n;
    }
  }
  return out;
}

FlatPlace flatPlace(const collectives::FullyShardedDataParallel& fsdp, const Tensor& p) {
  const auto named = fsdp.module()->namedParameters();
  const auto units = fsdp.units();
  for (size_t k = 0; k < units.size(); ++k) {
    int64_t offset = 0;
    for (const std::string& name : units[k].params) {
      auto it = std::find_if(named.begin(), named.end(), [&name](const auto& np) { return np.first == name; });
      WEFT_CHECK(it != named.end()) << name;
      if (it->second.sameAs(p)) return {k, offset};
      offset += it->second.numel();
    }
  }
  return {};
}

ShardedAdamW::ShardedAdamW(const std::vector<collectives::FullyShardedDataParallel*>& wrappers, int rank,
                           const Flags& f)
    : lr_(f.lr), weightDecay_(f.weightDecay) {
  std::vector<Tensor> shards;
  for (collectives::FullyShardedDataParallel* w : wrappers) {
    for (const Tensor& s : w->parameters()) shards.push_back(s);
    for (const ShardSlice& s : shardSlices(*w, rank)) {
      if (s.parameter.dim() >= 2) decayed_.push_back({w->parameters()[s.unit], s.shardBegin, s.length});
    }
  }
  opt_ = std::make_unique<nn::optim::AdamW>(
      shards, nn::optim::AdamWOptions{.lr = f.lr, .betas = {0.9, 0.95}, .weightDecay = 0.0});
}

void ShardedAdamW::step() {
  if (weightDecay_ > 0) {
    NoGradGuard ng;
    const double keep = 1.0 - lr_ * weightDecay_;
    for (const Decayed& d : decayed_) d.shard.detach().narrow(0, d.begin, d.length).mul_(keep);
  }
  opt_->step();
}

}  // namespace weft::examples::gpt
