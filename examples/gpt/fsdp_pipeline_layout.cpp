// The gpt example's pipeline of fully sharded stages (--fsdp --dp D --pp P, weftrun -n D·P): the
// mesh {dp: D, pp: P} of pipeline_layout.h (world rank d·P + s is stage s of replica d), each of
// this process's model stages (two chunks with --schedule interleaved) wrapped in
// FullyShardedDataParallel over the stage's dp group, its TransformerBlocks the units and the rest
// (embeddings; final LayerNorm and tied head) the root unit, run by pipeline::PipelineExecutor over
// the pp group without its own data-parallel averaging.
//
// Micro-batches. Each micro-batch's backward is one autograd pass, at whose end FSDP
// reduce-scatters the stage's gradients over dp into the shards' gradients, where the M passes
// add up; noSync is not used: it would keep the stage's whole unsharded gradient from the first
// micro-batch's backward to the last, the memory FSDP shards. The cost is M reduce-scatters of
// each unit per step instead of one.
//
// The tied wte. The first and the last stage each hold wte in their root unit, among other
// parameters (wpe; ln_f), so the two roots' shards hold different parts of it: after the step's
// backward each of the two gathers its root's gradient over dp, the two exchange wte's part over
// pp (the same dp coordinate on both sides) and each adds the other's to the elements of its shard.
//
// Clipping: the squares of every process's shard gradients summed over the whole job (one
// allreduce over the world), the last stage leaving out its copy of wte's gradient, as
// nn::clipGradNorm_ over the one-process model.
//
// --checkpoint other than none has the executor checkpoint each stage whole, but for the first
// stage's first chunk, which it runs plainly: its input, the token ids, needs no gradient, and the
// executor splits off a first layer to run plainly only from a Sequential, not from the wrapper.
//
// Memory: every process builds the one-process run's whole model (initialModel: the seed's, or
// --load's), then keeps only its stages, sharded. Evaluation runs the job's batch through the pipeline of
// wrappers, without grad, on every replica (the activations sent along pp, the loss broadcast from
// the last stage), so no process holds the whole model while training; the sample, after it, is
// drawn from the whole model, as is --save's file: each stage gathered from its dp group
// (FSDP::fullStateDict to each dp rank in turn) into a plain copy of the model, whose stages are
// then broadcast over pp.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/fsdp.h"
#include "collectives/init.h"
#include "collectives/mesh.h"
#include "common/error.h"
#include "fsdp_layout.h"
#include "kernels/cpu/parallel.h"
#include "mesh_layout.h"
#include "nn/transformer.h"
#include "pipeline/executor.h"
#include "pipeline/stage.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::examples::gpt {
namespace {

// The pp group's tags of the tied gradient's exchange and of evaluation's activations (the latter
// plus the model stage that receives), apart from the executor's (pipeline/executor.cpp).
constexpr uint32_t kTiedTag = 0x6F000000u;
constexpr uint32_t kEvalTag = 0x6F000001u;

// A model stage for the executor: its forward is the wrapper's (FSDP::forward runs the stage
// through its hooks). It registers no parameters of its own.
class ShardedStage final : public nn::Module {
 public:
  explicit ShardedStage(collectives::FullyShardedDataParallel& fsdp) : Module("ShardedStage"), fsdp_(fsdp) {}
  Tensor forward(const Tensor& x) override { return fsdp_.forward(x); }

 private:
  collectives::FullyShardedDataParallel& fsdp_;
};

nn::GPTConfig stageConfig(const Flags& f) {
  nn::GPTConfig c = modelConfig(f);
  c.checkpoint = nn::CheckpointPolicy::none();  // stages are checkpointed whole by the executor
  return c;
}

class FullyShardedPipeline final : public Layout {
 public:
  explicit FullyShardedPipeline(const Flags& f)
      : world_(collectives::init()),
        config_(stageConfig(f)),
        gradClip_(f.gradClip),
        scheduleName_(f.schedule),
        microbatches_(f.microbatches) {
    WEFT_ENFORCE(world_->size() == f.dp * f.pp, InvalidArgumentError, "gpt: --fsdp --dp ", f.dp, " --pp ", f.pp,
                 " needs a job of ", f.dp * f.pp, " processes (weftrun -n ", f.dp * f.pp, "), this one has ",
                 world_->size());
    WEFT_ENFORCE(f.batchSize % f.microbatches == 0, InvalidArgumentError, "gpt: --batch-size ", f.batchSize,
                 " must be divisible by --microbatches ", f.microbatches);
    WEFT_ENFORCE(f.precision == "float32", InvalidArgumentError, "gpt: --precision ", f.precision,
                 " is not supported with --fsdp");
    mesh_ = std::make_unique<collectives::Mesh>(
        *world_, std::vector<collectives::MeshDim>{{"dp", static_cast<int>(f.dp)}, {"pp", static_cast<int>(f.pp)}});
    pp_ = &mesh_->group("pp");
    dp_ = &mesh_->group("dp");
    const int stages = pp_->size();
    stage_ = pp_->rank();
    const int chunks = f.schedule == "interleaved" ? 2 : 1;
    // The whole model, the one-process run's (layout.h); this process keeps its stages.
    std::shared_ptr<nn::GPT> model = initialModel(f, config_);
    numParameters_ = model->numParameters();
    auto layers = pipeline::gptLayers(model);
    WEFT_ENFORCE(static_cast<int>(layers->size()) >= stages * chunks, InvalidArgumentError, "gpt: --pp ", stages,
                 chunks > 1 ? " interleaved needs " : " needs ", stages * chunks, " pieces of ", layers->size(),
                 " layers (embedding, ", f.layers, " blocks, head)");
    cuts_ = pipeline::cutsByParameterCount(*layers, stages * chunks);
    const auto modelStages = pipeline::splitSequential(*layers, cuts_);
    // Model stage c·P + s is stage s's chunk c.
    std::vector<std::shared_ptr<nn::Module>> mine;
    for (int c = 0; c < chunks; ++c) {
      const size_t k = static_cast<size_t>(c * stages + stage_);
      collectives::FullyShardedDataParallel::Options o;
      for (size_t i = 0; i < modelStages[k]->size(); ++i) {
        const std::shared_ptr<nn::Module>& layer = modelStages[k]->at(i);
        if (std::dynamic_pointer_cast<nn::TransformerBlock>(layer)) o.units.push_back(layer);
      }
      fsdps_.push_back(std::make_unique<collectives::FullyShardedDataParallel>(modelStages[k], *dp_, o));
      ownStages_.push_back(k);
      modules_.push_back(modelStages[k]);
      mine.push_back(std::make_shared<ShardedStage>(*fsdps_.back()));
    }
    // The tied wte: in chunk 0 of the first stage and the last chunk of the last.
    if (stage_ == 0 || stage_ == stages - 1) {
      tied_ = stage_ == 0 ? fsdps_.front().get() : fsdps_.back().get();
      tiedPeer_ = stage_ == 0 ? stages - 1 : 0;
      tiedPlace_ = flatPlace(*tied_, model->wte()->weight());
      WEFT_CHECK(tiedPlace_.offset >= 0) << "wte is not in stage " << stage_;
      tiedNumel_ = model->wte()->weight().numel();
    }
    pipeline::Schedule schedule = f.schedule == "gpipe" ? pipeline::gpipe(stages, f.microbatches)
                                  : chunks > 1          ? pipeline::interleavedOneFOneB(stages, chunks, f.microbatches)
                                                        : pipeline::oneFOneB(stages, f.microbatches);
    executor_ = std::make_unique<pipeline::PipelineExecutor>(
        *pp_, mine, std::move(schedule),
        [](const Tensor& logits, const Tensor& y) {
          return crossEntropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
        },
        pipeline::ExecutorOptions{.tied = {}, .dataParallel = nullptr, .checkpoint = f.checkpoint != "none"});
    std::vector<collectives::FullyShardedDataParallel*> wrappers;
    for (const auto& w : fsdps_) wrappers.push_back(w.get());
    opt_ = std::make_unique<ShardedAdamW>(wrappers, dp_->rank(), f);
  }

  std::string describe() const override {
    return "fully sharded data parallel (ZeRO-3) over " + std::to_string(dp_->size()) +
           " replicas of a pipeline of " + std::to_string(pp_->size()) + " stages (one per process, " +
           std::to_string(kernels::cpu::numThreads()) + " kernel threads each), " + scheduleName_ + " with " +
           std::to_string(microbatches_) + " micro-batches";
  }

  int64_t numParameters() const override { return numParameters_; }
  int dataRank() const override { return mesh_->coordinate("dp"); }
  int dataWorld() const override { return mesh_->size("dp"); }
  bool reports() const override { return world_->rank() == 0; }

  double step(const Tensor& x, const Tensor& y, double lr) override {
    opt_->setLr(lr);
    opt_->zeroGrad();
    Tensor loss = executor_->step(x, y);
    exchangeTied();
    if (gradClip_ > 0) gradNorm_ = clipGlobalNorm();
    opt_->step();
    // The last stage of each replica holds its replica's loss: the job's is their mean.
    Tensor l = full({1}, loss.defined() ? loss.item<double>() : 0.0, {.dtype = DType::Float64});
    world_->allReduce(l, collectives::ReduceOp::Sum).wait();
    return l.item<double>() / static_cast<double>(dp_->size());
  }

  // The model stages in order, each on the process that trains it, the activations [B, T, C]
  // sent to the next one's.
  double evaluate(const Tensor& x, const Tensor& y) override {
    NoGradGuard ng;
    for (const auto& m : modules_) m->eval();
    const int stages = pp_->size();
    const int pieces = stages * static_cast<int>(fsdps_.size());
    Tensor h = x;
    double loss = 0;
    for (int k = 0; k < pieces; ++k) {
      if (k % stages != stage_) continue;
      const uint32_t tag = kEvalTag + static_cast<uint32_t>(k);
      if (k > 0) {
        h = empty({x.size(0), x.size(1), config_.width});
        pp_->irecv(h, (k - 1) % stages, tag).wait();
      }
      h = fsdps_[static_cast<size_t>(k / stages)]->forward(h);
      if (k + 1 < pieces) {
        pp_->isend(h, (k + 1) % stages, tag + 1).wait();
      } else {
        loss = crossEntropy(h.view({-1, config_.vocabSize}), y.reshape({-1})).item<double>();
      }
    }
    for (const auto& m : modules_) m->train();
    Tensor l = full({1}, loss, {.dtype = DType::Float64});
    pp_->broadcast(l, (pieces - 1) % stages).wait();
    return l.item<double>();
  }

  std::string sample(const std::string& prompt, int64_t tokens, double temperature, int64_t topK,
                     Generator& gen) override {
    return sampleText(*gatherWhole(), prompt, tokens, temperature, topK, gen);
  }

  nn::StateDict fullStateDict() override { return gatherWhole()->stateDict(); }

 private:
  // The tied wte's gradient summed over its two stages, in the elements of each one's shard.
  void exchangeTied() {
    if (tied_ == nullptr) return;
    NoGradGuard ng;
    Tensor shard = tied_->parameters()[tiedPlace_.unit];
    const int64_t chunk = shard.numel();
    if (!shard.grad().defined()) shard.setGrad(zerosLike(shard.detach()));
    Tensor g = shard.grad();
    Tensor flat = empty({chunk * dp_->size()});
    dp_->allGatherInto(flat, g.detach().contiguous()).wait();
    Tensor mine = flat.narrow(0, tiedPlace_.offset, tiedNumel_).contiguous();
    Tensor theirs = emptyLike(mine);
    collectives::Work sent = pp_->isend(mine, tiedPeer_, kTiedTag);
    pp_->irecv(theirs, tiedPeer_, kTiedTag).wait();
    sent.wait();
    Tensor sum = add(mine, theirs);
    const auto [begin, end] = tiedRange();
    const int64_t first = dp_->rank() * chunk;
    if (begin < end) {
      g.narrow(0, begin - first, end - begin).copy_(sum.narrow(0, begin - tiedPlace_.offset, end - begin));
    }
  }

  // The elements of the tied wte in this rank's shard, as positions in its unit's flat storage.
  std::pair<int64_t, int64_t> tiedRange() const {
    const int64_t chunk = tied_->parameters()[tiedPlace_.unit].numel();
    const int64_t first = dp_->rank() * chunk;
    return {std::max(tiedPlace_.offset, first), std::min(tiedPlace_.offset + tiedNumel_, first + chunk)};
  }

  // nn::clipGradNorm_ over the whole model (see the file's comment); returns the norm.
  double clipGlobalNorm() {
    NoGradGuard ng;
    auto squares = [](const Tensor& g) {
      return g.numel() == 0 ? 0.0 : sum(square(g.to(DType::Float64))).item<double>();
    };
    double local = 0;
    for (const auto& w : fsdps_) {
      for (const Tensor& s : w->parameters()) {
        if (!s.grad().defined()) continue;
        const Tensor g = s.grad();
        if (stage_ != pp_->size() - 1 || w.get() != tied_ || !s.sameAs(tied_->parameters()[tiedPlace_.unit])) {
          local += squares(g);
          continue;
        }
        // wte's gradient is counted on the first stage.
        const auto [begin, end] = tiedRange();
        const int64_t first = dp_->rank() * s.numel();
        if (begin >= end) {
          local += squares(g);
          continue;
        }
        local += squares(g.narrow(0, 0, begin - first));
        local += squares(g.narrow(0, end - first, s.numel() - (end - first)));
      }
    }
    Tensor total = full({1}, local, {.dtype = DType::Float64});
    world_->allReduce(total, collectives::ReduceOp::Sum).wait();
    const double norm = std::sqrt(total.item<double>());
    const double coef = gradClip_ / (norm + 1e-6);
    if (coef >= 1.0) return norm;
    for (const auto& w : fsdps_) {
      for (const Tensor& s : w->parameters()) {
        if (s.grad().defined()) s.grad().mul_(coef);
      }
    }
    return norm;
  }

  // The trained model, whole, on every process: each own stage gathered from its dp group into a
  // plain GPT, then every stage broadcast from the process of the replica that trains it.
  std::shared_ptr<nn::GPT> gatherWhole() {
    Generator g(0);  // the weights are overwritten; the default generator draws dropout
    auto whole = std::make_shared<nn::GPT>(config_, &g);
    const auto wholeStages = pipeline::splitSequential(*pipeline::gptLayers(whole), cuts_);
    for (size_t c = 0; c < fsdps_.size(); ++c) {
      nn::StateDict mine;
      for (int r = 0; r < dp_->size(); ++r) {
        nn::StateDict d = fsdps_[c]->fullStateDict(r);
        if (r == dp_->rank()) mine = std::move(d);
      }
      wholeStages[ownStages_[c]]->loadStateDict(mine);
    }
    for (size_t k = 0; k < wholeStages.size(); ++k) {
      const int owner = static_cast<int>(k % static_cast<size_t>(pp_->size()));
      for (const Tensor& p : wholeStages[k]->parameters()) pp_->broadcast(p.detach(), owner).wait();
    }
    return whole;
  }

  std::unique_ptr<collectives::ProcessGroup> world_;
  std::unique_ptr<collectives::Mesh> mesh_;
  collectives::ProcessGroup* pp_ = nullptr;  // this replica's stages
  collectives::ProcessGroup* dp_ = nullptr;  // this stage's replicas
  nn::GPTConfig config_;
  int64_t numParameters_ = 0;
  std::vector<size_t> cuts_;  // of the model's layers into its stages (pipeline::splitSequential)
  std::vector<std::unique_ptr<collectives::FullyShardedDataParallel>> fsdps_;  // per chunk
  std::vector<std::shared_ptr<nn::Sequential>> modules_;                     // the stages they wrap
  std::vector<size_t> ownStages_;                                            // their model stages
  collectives::FullyShardedDataParallel* tied_ = nullptr;  // the wrapper holding wte, on the end stages
  int tiedPeer_ = 0;
  FlatPlace tiedPlace_;
  int64_t tiedNumel_ = 0;
  std::unique_ptr<pipeline::PipelineExecutor> executor_;
  std::unique_ptr<ShardedAdamW> opt_;
  double gradClip_;
  std::string scheduleName_;
  int64_t microbatches_;
  int stage_ = 0;
};

}  // namespace

std::unique_ptr<Layout> makeFsdpPipelineLayout(const Flags& flags) {
  return std::make_unique<FullyShardedPipeline>(flags);
}

}  // namespace weft::examples::gpt
