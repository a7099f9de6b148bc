#include "fsdp_layout.h"

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
        opt_(fsdp_.parameters(), nn::optim::AdamWOptions{.lr = f.lr, .betas = {0.9, 0.95}, .weightDecay = f.weightDecay}),
        gradClip_(f.gradClip) {
    WEFT_ENFORCE(f.precision == "float32", InvalidArgumentError, "gpt: --precision ", f.precision,
                 " is not supported with --fsdp");
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
    opt_.zeroGrad(true);
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
  nn::optim::AdamW opt_;
  double gradClip_;
};

}  // namespace

std::unique_ptr<Layout> makeFsdpLayout(const Flags& flags) { return std::make_unique<FullySharded>(flags); }

}  // namespace weft::examples::gpt
