// The gpt example's process-mesh layouts (--dp D, --tp T, --sp S with --sp-mode, under weftrun -n
// D·T·S): the job's processes arranged as a collectives::Mesh of the sizes above 1, in the order
// {dp, sp, tp} (tensor parallelism innermost, on neighbouring ranks; --sp-mode 2d splits sp into
// {ring, ulysses}), and one Layout per kind of model:
//  - data parallel alone (dp_layout.cpp): nn::GPT under DistributedDataParallel with AdamW, or
//    with --zero 1 ZeroRedundancyOptimizer, or with --zero 2 ShardedDataParallel;
//  - tensor parallel (tp_layout.cpp): collectives::TensorParallelGPT over the tp groups, its tokens
//    split over the sp groups when --sp > 1, DistributedDataParallel over the dp groups;
//  - sequence parallel without tp (sp_layout.cpp): collectives::SequenceParallelGPT over the sp
//    groups, DistributedDataParallel over the dp groups.
// Every process builds the one-process model from the run's seed and takes its part of it, so the
// job starts from the one-process run's weights. --batch-size is each data-parallel replica's:
// the dp replicas draw disjoint shares of the job's windows (TextDataset::batch), and D replicas of
// batch B train on the windows one process draws with batch D·B; the processes of a tp or sp group
// share their replica's windows. The loss of a step is the mean over the replicas' batches, the
// gradient norm is clipped over the whole model, and evaluation and sampling run on every process
// alike (the sample from the whole model, gathered). World rank 0 reports.
//
// Errors: InvalidArgumentError when the job's size is not D·T·S (naming both), and the models'
// and groups' errors (collectives/*.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/mesh.h"
#include "collectives/process_group.h"
#include "collectives/sequence_parallel.h"
#include "layout.h"
#include "nn/optim.h"
#include "nn/transformer.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"

namespace weft::examples::gpt {

// The job's process group and its mesh, with the sequence-parallel groups the flags ask for.
struct MeshJob {
  std::unique_ptr<collectives::ProcessGroup> world;
  std::unique_ptr<collectives::Mesh> mesh;
  std::unique_ptr<collectives::SpGroup> ulysses;  // --sp-mode ulysses or 2d
  std::unique_ptr<collectives::SpGroup> ring;     // --sp-mode ring or 2d

  // The group of dimension `name`, or null when the mesh does not have it (size 1).
  collectives::ProcessGroup* group(const std::string& name) const;
  // The sequence-parallel options of the flags' mode (std::nullopt-like: mode unused when sp = 1).
  collectives::SpOptions spOptions() const;
  bool sequenceParallel() const { return ulysses != nullptr || ring != nullptr; }
};

// Joins the job (collectives::init) and builds the mesh; collective over the job.
MeshJob makeMeshJob(const Flags& flags);
// The mean over the dp group of `loss` (itself without one).
double meanOverReplicas(const MeshJob& job, double loss);
// "mesh {dp: 2, tp: 2}, 2 kernel threads per process".
std::string describeMesh(const MeshJob& job);
// `prompt` continued by `model` (a whole nn::GPT) as Layout::sample says.
std::string sampleText(nn::GPT& model, const std::string& prompt, int64_t tokens, double temperature, int64_t topK,
                       Generator& gen);

// What the tensor- and sequence-parallel layouts share around their model (tp_layout.cpp,
// sp_layout.cpp): the job, the whole model's weights loaded into the parallel one, DDP over the dp
// group, AdamW on nanoGPT's decay groups, and a step: the loss on this process's tokens, the
// gradients summed over the sp group, clipped, stepped. A layout says how its model takes its
// tokens, clips and gives back the whole model's state. Model: a parallel GPT with loss,
// allReduceGradients, namedParameters, eval and train.
template <class Model>
class ParallelGptLayout : public Layout {
 public:
  int64_t numParameters() const override { return numParameters_; }
  int dataRank() const override { return job_.mesh->has("dp") ? job_.mesh->coordinate("dp") : 0; }
  int dataWorld() const override { return job_.mesh->has("dp") ? job_.mesh->size("dp") : 1; }
  bool reports() const override { return job_.world->rank() == 0; }

  double step(const Tensor& x, const Tensor& y, double lr) override {
    opt_->setLr(lr);
    opt_->zeroGrad(true);
    const Tensor loss = model_->loss(tokens(x, 0), tokens(y, -100));
    loss.backward();               // averaged over the dp group by DDP
    model_->allReduceGradients();  // summed over the sp group
    if (gradClip_ > 0) gradNorm_ = clip(gradClip_);
    opt_->step();
    return meanOverReplicas(job_, loss.item<double>());
  }

  double evaluate(const Tensor& x, const Tensor& y) override {
    NoGradGuard ng;
    model_->eval();
    const Tensor loss = model_->loss(tokens(x, 0), tokens(y, -100));
    model_->train();
    return loss.item<double>();
  }

  std::string sample(const std::string& prompt, int64_t tokensToAdd, double temperature, int64_t topK,
                     Generator& gen) override {
    nn::GPT whole(config_);
    whole.loadStateDict(wholeState());
    return sampleText(whole, prompt, tokensToAdd, temperature, topK, gen);
  }

  nn::StateDict fullStateDict() override { return wholeState(); }

 protected:
  // The parallel layers initialise from the default generator before they load the whole
  // model's weights: its state is kept here and restored by adopt(), so that dropout draws the
  // one-process run's masks.
  explicit ParallelGptLayout(const Flags& f)
      : job_(makeMeshJob(f)), config_(modelConfig(f)), gradClip_(f.gradClip), dropoutState_(defaultGenerator().state()) {}

  // Takes the freshly built parallel model: loads the one-process run's weights into it, wraps it
  // in DDP over the dp group, builds the optimizer, restores the generator.
  void adopt(std::shared_ptr<Model> model, const Flags& f) {
    model_ = std::move(model);
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
    defaultGenerator().setState(dropoutState_);
  }

  // This process's part of a batch of tokens (targets padded with `pad`).
  virtual Tensor tokens(const Tensor& t, int64_t pad) = 0;
  // Clips the whole model's gradient norm to maxNorm; returns the norm before clipping.
  virtual double clip(double maxNorm) = 0;
  // The whole model's state dict (loadable into an nn::GPT), on every process; collective.
  virtual nn::StateDict wholeState() = 0;

  MeshJob job_;
  nn::GPTConfig config_;
  std::shared_ptr<Model> model_;
  std::unique_ptr<collectives::DistributedDataParallel> ddp_;

 private:
  std::unique_ptr<nn::optim::AdamW> opt_;
  int64_t numParameters_ = 0;
  double gradClip_;
  GeneratorState dropoutState_;
};

std::unique_ptr<Layout> makeDataParallelLayout(const Flags& flags);
std::unique_ptr<Layout> makeTensorParallelLayout(const Flags& flags);
std::unique_ptr<Layout> makeSequenceParallelLayout(const Flags& flags);

// The layout of a mesh the flags ask for (meshLayout(flags)).
std::unique_ptr<Layout> makeMeshLayout(const Flags& flags);

}  // namespace weft::examples::gpt
