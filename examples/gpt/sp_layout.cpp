// The sequence-parallel layout of the gpt example (--sp S without --tp, with --dp: mesh_layout.h):
// a collectives::SequenceParallelGPT on the sp group (every parameter on every process, 1/S of each
// sequence's tokens; attention by --sp-mode: Ulysses, zig-zag ring, or 2-D), its gradients summed
// over the sp group after backward, DistributedDataParallel over the dp group with --dp; AdamW on
// every parameter, the gradient norm clipped as nn::clipGradNorm_ does.
#include <memory>
#include <string>

#include "collectives/ddp.h"
#include "collectives/sequence_parallel_gpt.h"
#include "mesh_layout.h"
#include "nn/optim.h"
#include "nn/utils.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"

namespace weft::examples::gpt {
namespace {

class SequenceParallel final : public Layout {
 public:
  explicit SequenceParallel(const Flags& f) : job_(makeMeshJob(f)), config_(modelConfig(f)), gradClip_(f.gradClip) {
    // The parallel layers initialise from the default generator before they load the whole
    // model's weights: its state is restored, so that dropout draws the one-process run's masks.
    const GeneratorState dropoutState = defaultGenerator().state();
    model_ = std::make_shared<collectives::SequenceParallelGPT>(config_, job_.spOptions());
    {
      std::shared_ptr<nn::GPT> whole = initialModel(f);
      numParameters_ = whole->numParameters();
      model_->loadFrom(*whole);
    }
    if (collectives::ProcessGroup* dp = job_.group("dp")) {
      ddp_ = std::make_unique<collectives::DistributedDataParallel>(model_, *dp);
    }
    opt_ = std::make_unique<nn::optim::AdamW>(nn::optim::decayGroups(
        model_->namedParameters(),
        nn::optim::AdamWOptions{.lr = f.lr, .betas = {0.9, 0.95}, .weightDecay = f.weightDecay}));
    defaultGenerator().setState(dropoutState);
  }

  std::string describe() const override {
    const collectives::SpOptions o = job_.spOptions();
    std::string how = o.mode == collectives::SpMode::Hybrid ? "SequenceParallelGPT, 2-D (Ulysses x zig-zag ring)"
                      : o.mode == collectives::SpMode::Ring ? "SequenceParallelGPT, ring attention (zig-zag)"
                                                            : "SequenceParallelGPT, Ulysses";
    if (ddp_) how += ", DistributedDataParallel";
    return describeMesh(job_) + ", " + how;
  }
  int64_t numParameters() const override { return numParameters_; }
  int dataRank() const override { return job_.mesh->has("dp") ? job_.mesh->coordinate("dp") : 0; }
  int dataWorld() const override { return job_.mesh->has("dp") ? job_.mesh->size("dp") : 1; }
  bool reports() const override { return job_.world->rank() == 0; }

  double step(const Tensor& x, const Tensor& y, double lr) override {
    opt_->setLr(lr);
    opt_->zeroGrad(true);
    Tensor loss = model_->loss(model_->shard(x), model_->shard(y, -100));
    loss.backward();               // averaged over the dp group by DDP
    model_->allReduceGradients();  // summed over the sp group
    if (gradClip_ > 0) nn::clipGradNorm_(model_->parameters(), gradClip_);
    opt_->step();
    return meanOverReplicas(job_, loss.item<double>());
  }

  double evaluate(const Tensor& x, const Tensor& y) override {
    NoGradGuard ng;
    model_->eval();
    double loss = model_->loss(model_->shard(x), model_->shard(y, -100)).item<double>();
    model_->train();
    return loss;
  }

  std::string sample(const std::string& prompt, int64_t tokens, double temperature, int64_t topK,
                     Generator& gen) override {
    nn::GPT whole(config_);
    whole.loadStateDict(model_->stateDict());
    return sampleText(whole, prompt, tokens, temperature, topK, gen);
  }

 private:
  MeshJob job_;
  nn::GPTConfig config_;
  std::shared_ptr<collectives::SequenceParallelGPT> model_;
  std::unique_ptr<collectives::DistributedDataParallel> ddp_;
  std::unique_ptr<nn::optim::AdamW> opt_;
  int64_t numParameters_ = 0;
  double gradClip_;
};

}  // namespace

std::unique_ptr<Layout> makeSequenceParallelLayout(const Flags& flags) {
  return std::make_unique<SequenceParallel>(flags);
}

}  // namespace weft::examples::gpt
