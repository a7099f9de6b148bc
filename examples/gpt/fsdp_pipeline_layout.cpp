// The gpt example's pipeline of fully sharded stages (--fsdp --dp D --pp P [--tp T] [--sp S],
// weftrun -n D·P·T·S): the mesh of pipeline_layout.h ({dp: D, pp: P}, with --tp or --sp {dp, pp,
// sp, tp}: world rank ((d·P + s)·S + q)·T + t is tp rank t of sp rank q of stage s of replica d),
// each of this process's model stages (two chunks with --schedule interleaved) wrapped in
// FullyShardedDataParallel over the stage's dp group, its TransformerBlocks the units and the rest
// (embeddings; final LayerNorm and tied head) the root unit, run by pipeline::PipelineExecutor over
// the pp group without its own data-parallel averaging. With --tp or --sp (torchtitan's 3-D FSDP ×
// PP × TP) the stages are ranges of collectives::TensorParallelGPT layers over the stage's tp group
// (of one process without --tp), given the sp groups' SpOptions with --sp, as in
// pipeline_layout.h; the units are their ParallelTransformerBlocks, each process shards its tp
// rank's part over dp, takes its sp rank's tokens, and its shards' gradients are summed over the sp
// group after FSDP's reduce-scatter (both sums: the order does not matter); the last stage's loss
// is TensorParallelGPT::lossOfLogits.
//
// Micro-batches. Each micro-batch's backward is one autograd pass, at whose end FSDP
// reduce-scatters the stage's gradients over dp into the shards' gradients, where the M passes
// add up; noSync is not used: it would keep the stage's whole unsharded gradient from the first
// micro-batch's backward to the last, the memory FSDP shards. The cost is M reduce-scatters of
// each unit per step instead of one.
//
// The tied wte (with --tp or --sp, the tp rank's rows of it). The first and the last stage each
// hold it in their root unit, among other parameters (wpe; ln_f), so the two roots' shards hold
// different parts of it: after the step's backward each of the two gathers its root's gradient
// over dp, the two exchange wte's part over pp (the same dp, sp and tp coordinates on both sides)
// and each adds the other's to the elements of its shard.
//
// Clipping: the squares of the shard gradients summed over the whole job (one allreduce over the
// world), as nn::clipGradNorm_ over the one-process model, each element counted once: those of
// parameters split over tp on every tp rank, those of the replicated ones (LayerNorms, wpe, the
// row-parallel biases) on tp rank 0 only, all only at sp coordinate 0 (after the sum the sp group's
// gradients are the same), and the last stage's copy of wte's gradient not at all.
//
// --checkpoint other than none has the executor checkpoint each stage whole, but for the first
// stage's first chunk, which it runs plainly: its input, the token ids, needs no gradient, and the
// executor splits off a first layer to run plainly only from a Sequential, not from the wrapper.
//
// Memory: every process builds the one-process run's whole model (initialModel: the seed's, or
// --load's), then keeps only its stages, sharded (with --tp or --sp, the other stages' parts of its
// TensorParallelGPT, which the embedding and the head run through, are freed). Evaluation runs the
// job's batch through the pipeline of wrappers, without grad, on every replica (the activations
// sent along pp, the loss broadcast from the last stage), so no process holds the whole model while
// training; the sample, after it, is drawn from the whole model, as is --save's file: each stage
// gathered from its dp group (FSDP::fullStateDict to each dp rank in turn) into a plain copy of the
// model (of its tp rank's parts with --tp or --sp), whose stages are then broadcast over pp (and
// with --tp or --sp assembled over tp: TensorParallelGPT::fullStateDict).
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/fsdp.h"
#include "collectives/init.h"
#include "collectives/mesh.h"
#include "collectives/sequence_parallel.h"
#include "collectives/tensor_parallel.h"
#include "collectives/tensor_parallel_gpt.h"
#include "common/error.h"
#include "fsdp_layout.h"
#include "kernels/cpu/parallel.h"
#include "mesh_layout.h"
#include "nn/transformer.h"
#include "pipeline/executor.h"
#include "pipeline_layout.h"
#include "pipeline/stage.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"
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
      : world_(joinJob(f.dp * f.pp * f.tp * f.sp,
                       "gpt: --fsdp --dp " + std::to_string(f.dp) + " --pp " + std::to_string(f.pp) +
                           (f.tp > 1 ? " --tp " + std::to_string(f.tp) : std::string()) +
                           (f.sp > 1 ? " --sp " + std::to_string(f.sp) : std::string()))),
        config_(stageConfig(f)),
        gradClip_(f.gradClip),
        scheduleName_(f.schedule),
        microbatches_(f.microbatches) {
    WEFT_ENFORCE(f.batchSize % f.microbatches == 0, InvalidArgumentError, "gpt: --batch-size ", f.batchSize,
                 " must be divisible by --microbatches ", f.microbatches);
    WEFT_ENFORCE(f.precision == "float32", InvalidArgumentError, "gpt: --precision ", f.precision,
                 " is not supported with --fsdp");
    // As pipeline_layout.h's mesh: world rank ((d·P + s)·S + q)·T + t is tp rank t of sp rank q of
    // stage s of replica d.
    mesh_ = std::make_unique<collectives::Mesh>(*world_, pipelineMeshDims(f));
    makeSpGroups(f, *mesh_, ulysses_, ring_);
    pp_ = &mesh_->group("pp");
    dp_ = &mesh_->group("dp");
    const int stages = pp_->size();
    stage_ = pp_->rank();
    const int chunks = pipelineChunks(f);
    // The whole model, the one-process run's (layout.h); this process keeps its stages.
    std::shared_ptr<nn::GPT> model = initialModel(f, config_);
    numParameters_ = model->numParameters();
    std::shared_ptr<nn::Sequential> layers;
    if (f.tp > 1 || f.sp > 1) {
      TensorParallelStages parallel = tensorParallelStages(f, *mesh_, *model, config_, ulysses_.get(), ring_.get());
      tp_ = parallel.tp;
      sp_ = parallel.sp;
      tpModel_ = parallel.model;
      layers = pipeline::gptLayers(tpModel_);
    } else {
      layers = pipeline::gptLayers(model);
    }
    checkPipelineCut(*layers, stages, chunks, f);
    cuts_ = pipeline::cutsByParameterCount(*layers, stages * chunks);
    const auto modelStages = pipeline::splitSequential(*layers, cuts_);
    // Model stage c·P + s is stage s's chunk c.
    std::vector<std::shared_ptr<nn::Module>> mine;
    for (int c = 0; c < chunks; ++c) {
      const size_t k = static_cast<size_t>(c * stages + stage_);
      collectives::FullyShardedDataParallel::Options o;
      for (size_t i = 0; i < modelStages[k]->size(); ++i) {
        const std::shared_ptr<nn::Module>& layer = modelStages[k]->at(i);
        if (std::dynamic_pointer_cast<nn::TransformerBlock>(layer) ||
            std::dynamic_pointer_cast<collectives::ParallelTransformerBlock>(layer)) {
          o.units.push_back(layer);
        }
      }
      fsdps_.push_back(std::make_unique<collectives::FullyShardedDataParallel>(modelStages[k], *dp_, o));
      ownStages_.push_back(k);
      modules_.push_back(modelStages[k]);
      mine.push_back(std::make_shared<ShardedStage>(*fsdps_.back()));
    }
    if (tpModel_) {
      // The TensorParallelGPT stays (the first and last stages' embedding and head run through it),
      // but the other stages' parts are not this process's to hold: their memory is freed.
      std::vector<Tensor> own;
      for (const auto& w : fsdps_) {
        for (const Tensor& p : w->module()->parameters()) own.push_back(p);
      }
      for (size_t k = 0; k < modelStages.size(); ++k) {
        if (std::find(ownStages_.begin(), ownStages_.end(), k) != ownStages_.end()) continue;
        for (const Tensor& p : modelStages[k]->parameters()) {
          if (std::none_of(own.begin(), own.end(), [&p](const Tensor& q) { return q.sameAs(p); })) {
            p.impl()->storage->release();
          }
        }
      }
    }
    // The tied wte (this tp rank's rows of it with --tp or --sp): in chunk 0 of the first stage and
    // the last chunk of the last.
    const Tensor wte = tpModel_ ? tpModel_->wte()->weight() : model->wte()->weight();
    if (stage_ == 0 || stage_ == stages - 1) {
      tied_ = stage_ == 0 ? fsdps_.front().get() : fsdps_.back().get();
      tiedPeer_ = stage_ == 0 ? stages - 1 : 0;
      tiedPlace_ = flatPlace(*tied_, wte);
      WEFT_CHECK(tiedPlace_.offset >= 0) << "wte is not in stage " << stage_;
      tiedNumel_ = wte.numel();
    }
    countNormElements(wte);
    executor_ = std::make_unique<pipeline::PipelineExecutor>(
        *pp_, mine, pipelineSchedule(f, stages, chunks), pipelineLoss(tpModel_),
        pipeline::ExecutorOptions{.tied = {}, .dataParallel = nullptr, .checkpoint = f.checkpoint != "none"});
    std::vector<collectives::FullyShardedDataParallel*> wrappers;
    for (const auto& w : fsdps_) wrappers.push_back(w.get());
    opt_ = std::make_unique<ShardedAdamW>(wrappers, dp_->rank(), f);
  }

  std::string describe() const override {
    const std::string threads = std::to_string(kernels::cpu::numThreads()) + " kernel threads each";
    std::string stage = "one per process, " + threads;
    if (tpModel_) {
      const int processes = world_->size() / (dp_->size() * pp_->size());
      stage = "each over " + std::to_string(processes) + " processes: " +
              (tp_->size() > 1 ? "TensorParallelGPT layers" : "GPT layers") +
              (sp_ ? " with " + describeSequenceParallel(*sp_) : std::string()) + ", mesh " + mesh_->describe() +
              ", " + threads;
    }
    return "fully sharded data parallel (ZeRO-3) over " + std::to_string(dp_->size()) +
           " replicas of a pipeline of " + std::to_string(pp_->size()) + " stages (" + stage + "), " +
           scheduleName_ + " with " + std::to_string(microbatches_) + " micro-batches";
  }

  int64_t numParameters() const override { return numParameters_; }
  int dataRank() const override { return mesh_->coordinate("dp"); }
  int dataWorld() const override { return mesh_->size("dp"); }
  bool reports() const override { return world_->rank() == 0; }

  double step(const Tensor& x, const Tensor& y, double lr) override {
    opt_->setLr(lr);
    opt_->zeroGrad();
    // With --sp, this process's tokens; the shards' gradients are their share until summed over the
    // sp group (after FSDP's reduce-scatter over dp: both are sums, the order does not matter).
    Tensor loss = tpModel_ ? executor_->step(tpModel_->shardTokens(x, 0), tpModel_->shardTokens(y, -100))
                           : executor_->step(x, y);
    if (sp_) {
      NoGradGuard ng;
      for (const auto& w : fsdps_) {
        for (const Tensor& s : w->parameters()) {
          if (s.grad().defined()) collectives::spSumInPlace(*sp_, s.grad());
        }
      }
    }
    exchangeTied();
    if (gradClip_ > 0) gradNorm_ = clipGlobalNorm();
    opt_->step();
    // The last stage of each replica holds its replica's loss (on every process of its tp and sp
    // groups, counted at their coordinate 0): the job's is their mean.
    Tensor l = full({1}, loss.defined() && firstOfTp_ && firstOfSp_ ? loss.item<double>() : 0.0,
                    {.dtype = DType::Float64});
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
    const Tensor xs = tpModel_ ? tpModel_->shardTokens(x, 0) : x;
    const Tensor ys = tpModel_ ? tpModel_->shardTokens(y, -100) : y;
    Tensor h = xs;
    double loss = 0;
    for (int k = 0; k < pieces; ++k) {
      if (k % stages != stage_) continue;
      const uint32_t tag = kEvalTag + static_cast<uint32_t>(k);
      if (k > 0) {
        h = empty({xs.size(0), xs.size(1), config_.width});
        pp_->irecv(h, (k - 1) % stages, tag).wait();
      }
      h = fsdps_[static_cast<size_t>(k / stages)]->forward(h);
      if (k + 1 < pieces) {
        pp_->isend(h, (k + 1) % stages, tag + 1).wait();
      } else {
        loss = tpModel_ ? tpModel_->lossOfLogits(h, ys).item<double>()
                        : crossEntropy(h.view({-1, config_.vocabSize}), ys.reshape({-1})).item<double>();
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

  // The shard elements this process counts in the gradient norm (see the file's comment): those of
  // the parameters split over tp on every tp rank, those of the replicated ones on tp rank 0, all of
  // them on the first process of each sp group only, and none of the last stage's wte.
  void countNormElements(const Tensor& wte) {
    firstOfTp_ = tp_ == nullptr || tp_->rank() == 0;
    for (const char* d : {"sp", "ring", "ulysses"}) {
      firstOfSp_ = firstOfSp_ && (!mesh_->has(d) || mesh_->coordinate(d) == 0);
    }
    if (!firstOfSp_) return;
    std::vector<Tensor> split;
    if (tpModel_) {
      for (const auto& [name, p] : tpModel_->namedParameters()) {
        if (tpModel_->isSplit(name)) split.push_back(p);
      }
    }
    const bool last = stage_ == pp_->size() - 1;
    for (const auto& w : fsdps_) {
      for (const ShardSlice& s : shardSlices(*w, dp_->rank())) {
        if (last && w.get() == tied_ && s.parameter.sameAs(wte)) continue;  // counted on the first stage
        const bool isSplit =
            std::any_of(split.begin(), split.end(), [&s](const Tensor& p) { return p.sameAs(s.parameter); });
        if (isSplit || firstOfTp_) counted_.push_back({w->parameters()[s.unit], s.shardBegin, s.length});
      }
    }
  }

  // nn::clipGradNorm_ over the whole model (see the file's comment); returns the norm.
  double clipGlobalNorm() {
    NoGradGuard ng;
    double local = 0;
    for (const Elements& e : counted_) {
      const Tensor g = e.shard.grad();
      if (g.defined()) local += sum(square(g.narrow(0, e.begin, e.length).to(DType::Float64))).item<double>();
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
  // plain model (with --tp or --sp a TensorParallelGPT of this tp rank's parts), then every stage
  // broadcast from the process of the replica that trains it, and with --tp or --sp the whole model
  // assembled from the tp group's parts.
  std::shared_ptr<nn::GPT> gatherWhole() {
    Generator g(0);  // the weights are overwritten; the default generator draws dropout
    auto whole = std::make_shared<nn::GPT>(config_, &g);
    std::shared_ptr<collectives::TensorParallelGPT> parts;
    if (tpModel_) {
      const GeneratorState drawn = defaultGenerator().state();
      parts = std::make_shared<collectives::TensorParallelGPT>(tp_, config_);
      defaultGenerator().setState(drawn);
    }
    const auto wholeStages =
        pipeline::splitSequential(*(parts ? pipeline::gptLayers(parts) : pipeline::gptLayers(whole)), cuts_);
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
    if (parts) whole->loadStateDict(parts->fullStateDict());
    return whole;
  }

  // The elements [begin, begin + length) of a shard.
  struct Elements {
    Tensor shard;
    int64_t begin;
    int64_t length;
  };

  std::unique_ptr<collectives::ProcessGroup> world_;
  std::unique_ptr<collectives::Mesh> mesh_;
  collectives::ProcessGroup* pp_ = nullptr;  // this replica's stages
  collectives::ProcessGroup* dp_ = nullptr;  // this stage's replicas
  std::unique_ptr<collectives::SpGroup> ulysses_, ring_;     // with --sp, as its mode says
  std::optional<collectives::SpOptions> sp_;                 // with --sp
  std::shared_ptr<collectives::TpGroup> tp_;                 // with --tp or --sp (of one process without --tp)
  std::shared_ptr<collectives::TensorParallelGPT> tpModel_;  // with --tp or --sp: this tp rank's parts
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
  std::vector<Elements> counted_;  // the shard elements this process counts in the gradient norm
  bool firstOfTp_ = true;          // tp coordinate 0
  bool firstOfSp_ = true;          // sp coordinate 0 (every sp dimension)
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
