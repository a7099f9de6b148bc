// The tensor-parallel layout of the gpt example (--tp T, with --dp and --sp: mesh_layout.h): a
// collectives::TensorParallelGPT on the tp group (each process 1/T of every block's matrices and of
// the vocabulary), its tokens split over the sp group with --sp, DistributedDataParallel over the
// dp group with --dp; AdamW on this process's parts, the gradient norm clipped over the whole
// model (TensorParallelGPT::clipGradNorm). Evaluation runs the parallel model; the sample is drawn
// from the whole model gathered on every process (TensorParallelGPT::fullStateDict).
#include <memory>
#include <optional>
#include <string>

#include "collectives/ddp.h"
#include "collectives/tensor_parallel.h"
#include "collectives/tensor_parallel_gpt.h"
#include "mesh_layout.h"
#include "nn/optim.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"

namespace weft::examples::gpt {
namespace {

class TensorParallel final : public Layout {
 public:
  explicit TensorParallel(const Flags& f) : job_(makeMeshJob(f)), config_(modelConfig(f)), gradClip_(f.gradClip) {
    // The parallel layers initialise from the default generator before they load the whole
    // model's weights: its state is restored, so that dropout draws the one-process run's masks.
    const GeneratorState dropoutState = defaultGenerator().state();
    tp_ = std::make_shared<collectives::TpGroup>(*job_.group("tp"));
    std::optional<collectives::SpOptions> sp;
    if (job_.sequenceParallel()) sp = job_.spOptions();
    model_ = std::make_shared<collectives::TensorParallelGPT>(tp_, config_, sp);
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
    std::string how = "TensorParallelGPT";
    if (job_.sequenceParallel()) {
      const collectives::SpOptions o = job_.spOptions();
      how += o.mode == collectives::SpMode::Hybrid ? " with 2-D sequence parallelism (Ulysses x zig-zag ring)"
             : o.mode == collectives::SpMode::Ring ? " with ring attention (zig-zag)"
                                                   : " with Ulysses sequence parallelism";
    }
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
    Tensor loss = model_->loss(model_->shardTokens(x), model_->shardTokens(y, -100));
    loss.backward();               // averaged over the dp group by DDP
    model_->allReduceGradients();  // summed over the sp group
    if (gradClip_ > 0) model_->clipGradNorm(gradClip_);
    opt_->step();
    return meanOverReplicas(job_, loss.item<double>());
  }

  double evaluate(const Tensor& x, const Tensor& y) override {
    NoGradGuard ng;
    model_->eval();
    double loss = model_->loss(model_->shardTokens(x), model_->shardTokens(y, -100)).item<double>();
    model_->train();
    return loss;
  }

  std::string sample(const std::string& prompt, int64_t tokens, double temperature, int64_t topK,
                     Generator& gen) override {
    nn::GPT whole(config_);
    whole.loadStateDict(model_->fullStateDict());
    return sampleText(whole, prompt, tokens, temperature, topK, gen);
  }

 private:
  MeshJob job_;
  nn::GPTConfig config_;
  std::shared_ptr<collectives::TpGroup> tp_;
  std::shared_ptr<collectives::TensorParallelGPT> model_;
  std::unique_ptr<collectives::DistributedDataParallel> ddp_;
  std::unique_ptr<nn::optim::AdamW> opt_;
  int64_t numParameters_ = 0;
  double gradClip_;
};

}  // namespace

std::unique_ptr<Layout> makeTensorParallelLayout(const Flags& flags) {
  return std::make_unique<TensorParallel>(flags);
}

}  // namespace weft::examples::gpt
