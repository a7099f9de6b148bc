// The pipelined layout of the gpt example (--pp P [--dp D]): one pipeline stage per process of the
// job, run by pipeline::PipelineExecutor over the mesh's pp group, replicas averaged over its dp
// group.
#include "pipeline_layout.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/init.h"
#include "collectives/mesh.h"
#include "common/error.h"
#include "data/text.h"
#include "kernels/cpu/parallel.h"
#include "nn/optim.h"
#include "nn/transformer.h"
#include "pipeline/executor.h"
#include "pipeline/stage.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::examples::gpt {
namespace {

// Every process builds the whole model (initialModel) and trains its stage; before an
// evaluation or a sample the stages' parameters are broadcast from their owners in the replica, so
// that every process holds the trained model and evaluates or samples it alike (the replicas
// hold the same parameters: they take the same averaged steps).
class Pipelined final : public Layout {
 public:
  explicit Pipelined(const Flags& f)
      : world_(collectives::init()),
        model_(initialModel(f, modelConfigFor(f))),
        gradClip_(f.gradClip),
        scheduleName_(f.schedule),
        microbatches_(f.microbatches) {
    WEFT_ENFORCE(world_->size() == f.dp * f.pp, InvalidArgumentError, "gpt: --pp ", f.pp,
                 f.dp > 1 ? " --dp " + std::to_string(f.dp) : std::string(), " needs a job of ", f.dp * f.pp,
                 " processes (weftrun -n ", f.dp * f.pp, "), this one has ", world_->size());
    WEFT_ENFORCE(f.batchSize % f.microbatches == 0, InvalidArgumentError, "gpt: --batch-size ", f.batchSize,
                 " must be divisible by --microbatches ", f.microbatches);
    WEFT_ENFORCE(f.precision == "float32", InvalidArgumentError, "gpt: --precision ", f.precision,
                 " is not supported with --pp");
    mesh_ = std::make_unique<collectives::Mesh>(
        *world_, std::vector<collectives::MeshDim>{{"dp", static_cast<int>(f.dp)}, {"pp", static_cast<int>(f.pp)}});
    pg_ = &mesh_->group("pp");
    const int stages = pg_->size();
    stage_ = pg_->rank();
    const int chunks = f.schedule == "interleaved" ? 2 : 1;
    layers_ = pipeline::gptLayers(model_);
    WEFT_ENFORCE(static_cast<int>(layers_->size()) >= stages * chunks, InvalidArgumentError, "gpt: --pp ", stages,
                 chunks > 1 ? " interleaved needs " : " needs ", stages * chunks, " pieces of ", layers_->size(),
                 " layers (embedding, ", f.layers, " blocks, head)");
    // Model stage c·P + s is stage s's chunk c.
    stages_ = pipeline::splitSequential(*layers_, pipeline::cutsByParameterCount(*layers_, stages * chunks));
    std::vector<std::shared_ptr<nn::Module>> mine;
    for (int c = 0; c < chunks; ++c) mine.push_back(stages_[static_cast<size_t>(c * stages + stage_)]);
    tied_ = pipeline::gptTiedParameters(*model_, stage_, stages);
    pipeline::Schedule schedule = f.schedule == "gpipe" ? pipeline::gpipe(stages, f.microbatches)
                                  : chunks > 1          ? pipeline::interleavedOneFOneB(stages, chunks, f.microbatches)
                                                        : pipeline::oneFOneB(stages, f.microbatches);
    executor_ = std::make_unique<pipeline::PipelineExecutor>(
        *pg_, mine, std::move(schedule),
        [](const Tensor& logits, const Tensor& y) {
          return crossEntropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
        },
        pipeline::ExecutorOptions{.tied = tied_,
                                  .dataParallel = f.dp > 1 ? &mesh_->group("dp") : nullptr,
                                  .checkpoint = f.checkpoint != "none"});
    // This stage's parameters under the model's names, for the weight-decay groups.
    std::vector<std::pair<std::string, Tensor>> named;
    for (auto& [name, p] : model_->namedParameters()) {
      bool ours = false;
      for (const auto& chunk : mine)
        for (const Tensor& q : chunk->parameters()) ours = ours || q.sameAs(p);
      if (ours) named.emplace_back(name, p);
    }
    for (auto& np : named) params_.push_back(np.second);
    opt_ = std::make_unique<nn::optim::AdamW>(nn::optim::decayGroups(
        named, nn::optim::AdamWOptions{.lr = f.lr, .betas = {0.9, 0.95}, .weightDecay = f.weightDecay}));
  }

  std::string describe() const override {
    const int replicas = mesh_->size("dp");
    return (replicas > 1 ? std::to_string(replicas) + " data-parallel replicas of a " : std::string()) +
           "pipeline of " + std::to_string(pg_->size()) + " stages (one per process, " +
           std::to_string(kernels::cpu::numThreads()) + " kernel threads each), " + scheduleName_ + " with " +
           std::to_string(microbatches_) + " micro-batches";
  }

  int64_t numParameters() const override { return model_->numParameters(); }
  int dataRank() const override { return mesh_->coordinate("dp"); }
  int dataWorld() const override { return mesh_->size("dp"); }
  bool reports() const override { return world_->rank() == 0; }

  double step(const Tensor& x, const Tensor& y, double lr) override {
    opt_->setLr(lr);
    opt_->zeroGrad(true);
    Tensor loss = executor_->step(x, y);
    if (gradClip_ > 0) gradNorm_ = clipGlobalNorm();
    opt_->step();
    synced_ = false;
    // The loss lives on the last stage.
    Tensor l = full({1}, loss.defined() ? loss.item<double>() : 0.0);
    pg_->broadcast(l, pg_->size() - 1).wait();
    return l.item<double>();
  }

  double evaluate(const Tensor& x, const Tensor& y) override {
    sync();
    NoGradGuard ng;
    model_->eval();
    double loss = model_->loss(x, y).item<double>();
    model_->train();
    return loss;
  }

  std::string sample(const std::string& prompt, int64_t tokens, double temperature, int64_t topK,
                     Generator& gen) override {
    sync();
    std::vector<int64_t> ids = data::ByteTokenizer::encode(prompt);
    Tensor idx = fromVector(ids, Shape{1, static_cast<int64_t>(ids.size())});
    model_->eval();
    Tensor out = model_->generate(idx, tokens, temperature, topK, &gen);
    model_->train();
    return data::ByteTokenizer::decode(out.toVector<int64_t>());
  }

  // After sync() every process holds the whole trained model.
  nn::StateDict fullStateDict() override {
    sync();
    return model_->stateDict();
  }

 private:
  static nn::GPTConfig modelConfigFor(const Flags& f) {
    nn::GPTConfig c = modelConfig(f);
    c.checkpoint = nn::CheckpointPolicy::none();  // stages are checkpointed whole by the executor
    return c;
  }

  // nn::clipGradNorm_ over the whole model: the squares of every stage's gradients summed over
  // the stages of the replica (the tied wte counted once, on the first stage; the replicas hold
  // the same averaged gradients), then the same scale everywhere. Returns the norm before clipping.
  double clipGlobalNorm() {
    double local = 0;
    const bool lastHoldsTied = stage_ == pg_->size() - 1 && !tied_.empty();
    for (const Tensor& p : params_) {
      if (lastHoldsTied && p.sameAs(tied_[0].parameter)) continue;
      Tensor g = p.grad();
      if (g.defined()) local += sum(square(g)).item<double>();
    }
    Tensor total = full({1}, local, {.dtype = DType::Float64});
    pg_->allReduce(total, collectives::ReduceOp::Sum).wait();
    const double norm = std::sqrt(total.item<double>());
    const double coef = gradClip_ / (norm + 1e-6);
    if (coef >= 1.0) return norm;
    NoGradGuard ng;
    for (const Tensor& p : params_) {
      Tensor g = p.grad();
      if (g.defined()) g.copy_(mul(g, coef));
    }
    return norm;
  }

  // Every model stage's parameters broadcast from the process of the replica that trains them.
  void sync() {
    if (synced_) return;
    for (size_t k = 0; k < stages_.size(); ++k) {
      const int owner = static_cast<int>(k % static_cast<size_t>(pg_->size()));
      for (const Tensor& p : stages_[k]->parameters()) pg_->broadcast(p.detach(), owner).wait();
    }
    synced_ = true;
  }

  std::unique_ptr<collectives::ProcessGroup> world_;
  std::unique_ptr<collectives::Mesh> mesh_;
  collectives::ProcessGroup* pg_ = nullptr;  // this replica's stages
  std::shared_ptr<nn::GPT> model_;
  std::shared_ptr<nn::Sequential> layers_;
  std::vector<std::shared_ptr<nn::Sequential>> stages_;
  std::vector<pipeline::TiedParameter> tied_;
  std::unique_ptr<pipeline::PipelineExecutor> executor_;
  std::unique_ptr<nn::optim::AdamW> opt_;
  std::vector<Tensor> params_;
  double gradClip_;
  std::string scheduleName_;
  int64_t microbatches_;
  int stage_ = 0;
  bool synced_ = true;
};

}  // namespace

std::unique_ptr<Layout> makePipelineLayout(const Flags& flags) { return std::make_unique<Pipelined>(flags); }

}  // namespace weft::examples::gpt
