// The data-parallel layout of the gpt example (--dp D, mesh_layout.h): the whole model on every
// process, DistributedDataParallel averaging the gradients over the job, and AdamW stepping every
// parameter on every process; with --zero 1 ZeroRedundancyOptimizer (each process keeps and steps
// the optimizer state of its shard of the parameters, then broadcasts them), with --zero 2
// ShardedDataParallel (the gradients reduce-scattered too: each process keeps its slices only).
#include <memory>
#include <string>

#include "collectives/ddp.h"
#include "collectives/sharded_ddp.h"
#include "collectives/zero.h"
#include "mesh_layout.h"
#include "nn/optim.h"
#include "nn/utils.h"
#include "tensor/autograd.h"

namespace weft::examples::gpt {
namespace {

class DataParallel final : public Layout {
 public:
  explicit DataParallel(const Flags& f)
      : job_(makeMeshJob(f)), model_(initialModel(f)), gradClip_(f.gradClip), zero_(f.zero) {
    collectives::ProcessGroup& dp = *job_.group("dp");
    auto groups = nn::optim::decayGroups(
        model_->namedParameters(),
        nn::optim::AdamWOptions{.lr = f.lr, .betas = {0.9, 0.95}, .weightDecay = f.weightDecay});
    if (zero_ == 2) {
      sharded_ = std::make_unique<collectives::ShardedDataParallel>(model_, std::move(groups), dp);
      return;
    }
    ddp_ = std::make_unique<collectives::DistributedDataParallel>(model_, dp);
    if (zero_ == 1) {
      zeroOpt_ = std::make_unique<collectives::ZeroRedundancyOptimizer>(std::move(groups), dp);
    } else {
      opt_ = std::make_unique<nn::optim::AdamW>(std::move(groups));
    }
  }

  std::string describe() const override {
    const char* how = zero_ == 2   ? "ShardedDataParallel (ZeRO-2)"
                      : zero_ == 1 ? "DistributedDataParallel, ZeroRedundancyOptimizer (ZeRO-1)"
                                   : "DistributedDataParallel";
    return describeMesh(job_) + ", " + how;
  }
  int64_t numParameters() const override { return model_->numParameters(); }
  int dataRank() const override { return job_.mesh->coordinate("dp"); }
  int dataWorld() const override { return job_.mesh->size("dp"); }
  bool reports() const override { return job_.world->rank() == 0; }

  double step(const Tensor& x, const Tensor& y, double lr) override {
    if (sharded_) {
      sharded_->setLr(lr);
      sharded_->zeroGrad(true);
    } else if (zeroOpt_) {
      zeroOpt_->setLr(lr);
      zeroOpt_->zeroGrad(true);
    } else {
      opt_->setLr(lr);
      opt_->zeroGrad(true);
    }
    Tensor loss = model_->loss(x, y);
    loss.backward();  // the gradients averaged over the replicas (or their slices, ZeRO-2)
    if (sharded_) {
      if (gradClip_ > 0) gradNorm_ = sharded_->clipGradNorm_(gradClip_);
      sharded_->step();
    } else {
      if (gradClip_ > 0) gradNorm_ = nn::clipGradNorm_(model_->parameters(), gradClip_);
      if (zeroOpt_) zeroOpt_->step();
      else opt_->step();
    }
    return meanOverReplicas(job_, loss.item<double>());
  }

  double evaluate(const Tensor& x, const Tensor& y) override {
    NoGradGuard ng;
    model_->eval();
    double loss = model_->loss(x, y).item<double>();
    model_->train();
    return loss;
  }

  std::string sample(const std::string& prompt, int64_t tokens, double temperature, int64_t topK,
                     Generator& gen) override {
    return sampleText(*model_, prompt, tokens, temperature, topK, gen);
  }

  // Every process holds the whole model: the replicas take the same averaged steps, and ZeRO
  // broadcasts each shard's parameters after its step.
  nn::StateDict fullStateDict() override { return model_->stateDict(); }

 private:
  MeshJob job_;
  std::shared_ptr<nn::GPT> model_;
  std::unique_ptr<collectives::DistributedDataParallel> ddp_;
  std::unique_ptr<collectives::ShardedDataParallel> sharded_;
  std::unique_ptr<collectives::ZeroRedundancyOptimizer> zeroOpt_;
  std::unique_ptr<nn::optim::AdamW> opt_;
  double gradClip_;
  int64_t zero_;
};

}  // namespace

std::unique_ptr<Layout> makeDataParallelLayout(const Flags& flags) { return std::make_unique<DataParallel>(flags); }

}  // namespace weft::examples::gpt
