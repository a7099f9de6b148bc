// The pipelined layout of the gpt example (--pp P [--tp T] [--dp D]): one pipeline stage per process
// of the job, or per tp group with --tp, run by pipeline::PipelineExecutor over the mesh's pp group,
// replicas averaged over its dp group.
#include "pipeline_layout.h"

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/init.h"
#include "collectives/mesh.h"
#include "collectives/sequence_parallel.h"
#include "collectives/tensor_parallel.h"
#include "collectives/tensor_parallel_gpt.h"
#include "common/error.h"
#include "data/text.h"
#include "kernels/cpu/parallel.h"
#include "mesh_layout.h"
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
// hold the same parameters: they take the same averaged steps). With --tp or --sp every process
// holds its tp rank's shards of the whole model (a TensorParallelGPT loaded from the one-process
// model, on a tp group of one process without --tp) and, with --sp, takes its sp rank's tokens;
// it trains the shards of its stage and evaluates with the tp and sp groups of its stage; the
// sample is drawn from the whole model gathered from the tp group.
class Pipelined final : public Layout {
 public:
  explicit Pipelined(const Flags& f)
      : world_(joinJob(f.dp * f.pp * f.tp * f.sp,
                       "--pp " + std::to_string(f.pp) +
                           (f.tp > 1 ? " --tp " + std::to_string(f.tp) : std::string()) +
                           (f.sp > 1 ? " --sp " + std::to_string(f.sp) : std::string()) +
                           (f.dp > 1 ? " --dp " + std::to_string(f.dp) : std::string()))),
        model_(initialModel(f, modelConfigFor(f))),
        gradClip_(f.gradClip),
        scheduleName_(f.schedule),
        microbatches_(f.microbatches) {
    WEFT_ENFORCE(f.batchSize % f.microbatches == 0, InvalidArgumentError, "gpt: --batch-size ", f.batchSize,
                 " must be divisible by --microbatches ", f.microbatches);
    // Tensor parallelism innermost, sequence parallelism outside it: world rank ((d·P + s)·S + q)·T
    // + t is tp rank t of sp rank q of stage s of replica d.
    mesh_ = std::make_unique<collectives::Mesh>(*world_, pipelineMeshDims(f));
    makeSpGroups(f, *mesh_, ulysses_, ring_);
    pg_ = &mesh_->group("pp");
    const int stages = pg_->size();
    stage_ = pg_->rank();
    const int chunks = pipelineChunks(f);
    if (f.tp > 1 || f.sp > 1) {
      TensorParallelStages parallel =
          tensorParallelStages(f, *mesh_, *model_, modelConfigFor(f), ulysses_.get(), ring_.get());
      tp_ = parallel.tp;
      sp_ = parallel.sp;
      tpModel_ = parallel.model;
      layers_ = pipeline::gptLayers(tpModel_);
    } else {
      layers_ = pipeline::gptLayers(model_);
    }
    checkPipelineCut(*layers_, stages, chunks, f);
    // Model stage c·P + s is stage s's chunk c.
    stages_ = pipeline::splitSequential(*layers_, pipeline::cutsByParameterCount(*layers_, stages * chunks));
    std::vector<std::shared_ptr<nn::Module>> mine;
    for (int c = 0; c < chunks; ++c) mine.push_back(stages_[static_cast<size_t>(c * stages + stage_)]);
    tied_ = tpModel_ ? pipeline::gptTiedParameters(*tpModel_, stage_, stages)
                     : pipeline::gptTiedParameters(*model_, stage_, stages);
    executor_ = std::make_unique<pipeline::PipelineExecutor>(
        *pg_, mine, pipelineSchedule(f, stages, chunks), pipelineLoss(tpModel_),
        pipeline::ExecutorOptions{.tied = tied_,
                                  .dataParallel = f.dp > 1 ? &mesh_->group("dp") : nullptr,
                                  .checkpoint = f.checkpoint != "none"});
    // This stage's parameters under the model's names, for the weight-decay groups.
    for (auto& [name, p] : tpModel_ ? tpModel_->namedParameters() : model_->namedParameters()) {
      bool ours = false;
      for (const auto& chunk : mine)
        for (const Tensor& q : chunk->parameters()) ours = ours || q.sameAs(p);
      if (ours) named_.emplace_back(name, p);
    }
    opt_ = std::make_unique<nn::optim::AdamW>(nn::optim::decayGroups(
        named_, nn::optim::AdamWOptions{.lr = f.lr, .betas = {0.9, 0.95}, .weightDecay = f.weightDecay}));
  }

  std::string describe() const override {
    const int replicas = mesh_->size("dp");
    const std::string threads = std::to_string(kernels::cpu::numThreads()) + " kernel threads each";
    std::string stage = "one per process, " + threads;
    if (tpModel_) {
      const int processes = world_->size() / (replicas * pg_->size());
      stage = "each over " + std::to_string(processes) + " processes: " +
              (tp_->size() > 1 ? "TensorParallelGPT layers" : "GPT layers") +
              (sp_ ? " with " + describeSequenceParallel(*sp_) : std::string()) + ", mesh " + mesh_->describe() +
              ", " + threads;
    }
    return (replicas > 1 ? std::to_string(replicas) + " data-parallel replicas of a " : std::string()) +
           "pipeline of " + std::to_string(pg_->size()) + " stages (" + stage + "), " + scheduleName_ + " with " +
           std::to_string(microbatches_) + " micro-batches";
  }

  int64_t numParameters() const override { return model_->numParameters(); }
  int dataRank() const override { return mesh_->coordinate("dp"); }
  int dataWorld() const override { return mesh_->size("dp"); }
  bool reports() const override { return world_->rank() == 0; }

  double step(const Tensor& x, const Tensor& y, double lr) override {
    opt_->setLr(lr);
    opt_->zeroGrad(true);
    // With --sp, this process's tokens; the stage's gradients are their share until summed over the
    // sp group.
    Tensor loss = tpModel_ ? executor_->step(tpModel_->shardTokens(x, 0), tpModel_->shardTokens(y, -100))
                           : executor_->step(x, y);
    if (sp_) {
      for (const auto& [name, p] : named_) {
        if (p.grad().defined()) collectives::spSumInPlace(*sp_, p.grad());
      }
    }
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
    if (tpModel_) {
      tpModel_->eval();
      const double loss = tpModel_->loss(tpModel_->shardTokens(x, 0), tpModel_->shardTokens(y, -100)).item<double>();
      tpModel_->train();
      return loss;
    }
    model_->eval();
    double loss = model_->loss(x, y).item<double>();
    model_->train();
    return loss;
  }

  std::string sample(const std::string& prompt, int64_t tokens, double temperature, int64_t topK,
                     Generator& gen) override {
    sync();
    if (tpModel_) model_->loadStateDict(tpModel_->fullStateDict());
    std::vector<int64_t> ids = data::ByteTokenizer::encode(prompt);
    Tensor idx = fromVector(ids, Shape{1, static_cast<int64_t>(ids.size())});
    model_->eval();
    Tensor out = model_->generate(idx, tokens, temperature, topK, &gen);
    model_->train();
    return data::ByteTokenizer::decode(out.toVector<int64_t>());
  }

  // After sync() every process holds the whole trained model (with --tp or --sp, gathered from
  // its tp group into model_).
  nn::StateDict fullStateDict() override {
    sync();
    if (tpModel_) model_->loadStateDict(tpModel_->fullStateDict());
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
  // the same averaged gradients), then the same scale everywhere. With --tp, the squares of the
  // parameters split over the tp group are summed over it first, and those whole on every tp
  // rank counted once (TensorParallelGPT::clipGradNorm), so every process finds the same norm.
  // Returns the norm before clipping.
  double clipGlobalNorm() {
    double split = 0, whole = 0;
    const bool lastHoldsTied = stage_ == pg_->size() - 1 && !tied_.empty();
    for (const auto& [name, p] : named_) {
      if (lastHoldsTied && p.sameAs(tied_[0].parameter)) continue;
      Tensor g = p.grad();
      if (!g.defined()) continue;
      const double sq = sum(square(g)).item<double>();
      (tpModel_ && tpModel_->isSplit(name) ? split : whole) += sq;
    }
    if (tp_) {
      Tensor s = full({1}, split, {.dtype = DType::Float64});
      tp_->group().allReduce(s, collectives::ReduceOp::Sum).wait();
      split = s.item<double>();
    }
    Tensor total = full({1}, split + whole, {.dtype = DType::Float64});
    pg_->allReduce(total, collectives::ReduceOp::Sum).wait();
    const double norm = std::sqrt(total.item<double>());
    const double coef = gradClip_ / (norm + 1e-6);
    if (coef >= 1.0) return norm;
    NoGradGuard ng;
    for (const auto& [name, p] : named_) {
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
  std::shared_ptr<nn::GPT> model_;  // the whole model; with --tp, where the sample is gathered
  std::unique_ptr<collectives::SpGroup> ulysses_, ring_;      // with --sp, as its mode says
  std::optional<collectives::SpOptions> sp_;                  // with --sp
  std::shared_ptr<collectives::TpGroup> tp_;                  // with --tp or --sp (of one process without --tp)
  std::shared_ptr<collectives::TensorParallelGPT> tpModel_;  // with --tp or --sp: this tp rank's shards
  std::shared_ptr<nn::Sequential> layers_;
  std::vector<std::shared_ptr<nn::Sequential>> stages_;
  std::vector<pipeline::TiedParameter> tied_;
  std::unique_ptr<pipeline::PipelineExecutor> executor_;
  std::unique_ptr<nn::optim::AdamW> opt_;
  std::vector<std::pair<std::string, Tensor>> named_;  // this stage's parameters, the model's names
  double gradClip_;
  std::string scheduleName_;
  int64_t microbatches_;
  int stage_ = 0;
  bool synced_ = true;
};

}  // namespace

std::unique_ptr<Layout> makePipelineLayout(const Flags& flags) { return std::make_unique<Pipelined>(flags); }

std::vector<collectives::MeshDim> pipelineMeshDims(const Flags& f) {
  std::vector<collectives::MeshDim> dims{{"dp", static_cast<int>(f.dp)}, {"pp", static_cast<int>(f.pp)}};
  for (const collectives::MeshDim& d : sequenceParallelDims(f)) dims.push_back(d);
  if (f.tp > 1 || f.sp > 1) dims.push_back({"tp", static_cast<int>(f.tp)});
  return dims;
}

int pipelineChunks(const Flags& f) { return f.schedule == "interleaved" ? 2 : 1; }

TensorParallelStages tensorParallelStages(const Flags& f, collectives::Mesh& mesh, const nn::GPT& whole,
                                          const nn::GPTConfig& config, collectives::SpGroup* ulysses,
                                          collectives::SpGroup* ring) {
  const GeneratorState dropoutState = defaultGenerator().state();
  TensorParallelStages out;
  out.tp = std::make_shared<collectives::TpGroup>(mesh.group("tp"));
  if (f.sp > 1) out.sp = spOptionsOf(ulysses, ring);
  out.model = std::make_shared<collectives::TensorParallelGPT>(out.tp, config, out.sp);
  out.model->loadFrom(whole);
  defaultGenerator().setState(dropoutState);
  return out;
}

void checkPipelineCut(const nn::Sequential& layers, int stages, int chunks, const Flags& f) {
  WEFT_ENFORCE(static_cast<int>(layers.size()) >= stages * chunks, InvalidArgumentError, "gpt: --pp ", stages,
               chunks > 1 ? " interleaved needs " : " needs ", stages * chunks, " pieces of ", layers.size(),
               " layers (embedding, ", f.layers, " blocks, head)");
}

pipeline::Schedule pipelineSchedule(const Flags& f, int stages, int chunks) {
  if (f.schedule == "gpipe") return pipeline::gpipe(stages, f.microbatches);
  return chunks > 1 ? pipeline::interleavedOneFOneB(stages, chunks, f.microbatches)
                    : pipeline::oneFOneB(stages, f.microbatches);
}

pipeline::LossFn pipelineLoss(std::shared_ptr<collectives::TensorParallelGPT> tpModel) {
  if (tpModel) {
    return [model = std::move(tpModel)](const Tensor& logits, const Tensor& y) { return model->lossOfLogits(logits, y); };
  }
  return [](const Tensor& logits, const Tensor& y) {
    return crossEntropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
  };
}

}  // namespace weft::examples::gpt
