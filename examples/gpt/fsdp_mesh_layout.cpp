// The gpt example's FSDP over the dp dimension of a mesh with tensor or sequence parallelism
// (--fsdp --dp D with --tp T and/or --sp S, weftrun -n D·S·T; torchtitan's 2-D FSDP × TP, and
// FSDP × sp): the mesh of mesh_layout.h, and on it
//  - with --tp, a collectives::TensorParallelGPT on the tp group (1/T of every block's matrices
//    and of the vocabulary per process; its tokens split over the sp group with --sp), or
//  - with --sp alone, a collectives::SequenceParallelGPT on the sp group (every parameter, 1/S of
//    each sequence's tokens),
// wrapped in FullyShardedDataParallel over the dp group: each block a unit, the rest (wte or this
// rank's rows of it, wpe, ln_f) the root unit, so each process keeps 1/D of what its tp rank
// holds. Every process of a dp group draws its own share of the job's windows (--batch-size is a
// replica's); the processes of a tp or sp group share them. With --sp each process's backward
// gives its tokens' share of the gradients: the shards' gradients are summed over the sp group
// after FSDP's reduce-scatter (both are sums, so the order does not matter), as
// allReduceGradients does for the unwrapped models.
//
// Clipping: the gradient norm of the one-process model, from the squares of the shard gradients
// summed over the whole job (one allreduce over the world), each element counted once: those of
// parameters split over tp (their shape differs from the whole model's) on every tp rank, those
// of the replicated ones (LayerNorms, wpe, the row-parallel biases, whose gradients are the same
// on every tp rank) on tp rank 0 only, and only on the first process of each sp group (after the
// sum the sp group's gradients are the same). Evaluation runs the wrapped model; the sample is
// drawn from the whole model, as is --save's file, gathered over dp (FSDP::fullStateDict to each
// dp rank in turn) and, with tp, over tp (TensorParallelGPT::fullStateDict). The initial weights
// are initialModel's (layout.h: the seed's, or --load's).
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/fsdp.h"
#include "collectives/sequence_parallel.h"
#include "collectives/sequence_parallel_gpt.h"
#include "collectives/tensor_parallel.h"
#include "collectives/tensor_parallel_gpt.h"
#include "common/error.h"
#include "fsdp_layout.h"
#include "mesh_layout.h"
#include "nn/transformer.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace weft::examples::gpt {
namespace {

class FullyShardedMesh final : public Layout {
 public:
  explicit FullyShardedMesh(const Flags& f) : job_(makeMeshJob(f)), config_(modelConfig(f)), gradClip_(f.gradClip) {
    WEFT_ENFORCE(f.precision == "float32", InvalidArgumentError, "gpt: --precision ", f.precision,
                 " is not supported with --fsdp");
    collectives::ProcessGroup* dp = job_.group("dp");
    WEFT_ENFORCE(dp != nullptr, InvalidArgumentError,
                 "gpt: --fsdp with --tp or --sp shards over --dp, which must be above 1");
    // The parallel layers draw their initial values from the default generator, which then draws
    // dropout: its state is restored once they hold the one-process model's weights.
    const GeneratorState dropoutState = defaultGenerator().state();
    collectives::FullyShardedDataParallel::Options o;
    std::shared_ptr<nn::GPT> whole = initialModel(f);
    numParameters_ = whole->numParameters();
    std::map<std::string, Shape> wholeShapes;
    for (const auto& [name, p] : whole->namedParameters()) wholeShapes.emplace(name, p.shape());
    if (collectives::ProcessGroup* tp = job_.group("tp")) {
      tp_ = std::make_shared<collectives::TpGroup>(*tp);
      std::optional<collectives::SpOptions> sp;
      if (job_.sequenceParallel()) sp = job_.spOptions();
      tpModel_ = std::make_shared<collectives::TensorParallelGPT>(tp_, config_, sp);
      tpModel_->loadFrom(*whole);
      for (const auto& b : tpModel_->blocks()) o.units.push_back(b);
      model_ = tpModel_;
    } else {
      spModel_ = std::make_shared<collectives::SequenceParallelGPT>(config_, job_.spOptions());
      spModel_->loadFrom(*whole);
      for (const auto& [name, m] : spModel_->namedModules()) {
        if (std::dynamic_pointer_cast<collectives::SequenceParallelBlock>(m)) o.units.push_back(m);
      }
      model_ = spModel_;
    }
    whole.reset();
    defaultGenerator().setState(dropoutState);
    fsdp_ = std::make_unique<collectives::FullyShardedDataParallel>(model_, *dp, o);
    opt_ = std::make_unique<ShardedAdamW>(std::vector<collectives::FullyShardedDataParallel*>{fsdp_.get()},
                                          dp->rank(), f);
    // Which shard elements this process counts in the norm, and whether each is split over tp.
    firstOfSp_ = true;
    for (const char* d : {"sp", "ring", "ulysses"}) {
      firstOfSp_ = firstOfSp_ && (!job_.mesh->has(d) || job_.mesh->coordinate(d) == 0);
    }
    for (const ShardSlice& s : shardSlices(*fsdp_, dp->rank())) {
      auto it = wholeShapes.find(s.name);
      WEFT_CHECK(it != wholeShapes.end()) << s.name;
      (it->second != s.parameter.shape() ? split_ : replicated_)
          .push_back({fsdp_->parameters()[s.unit], s.shardBegin, s.length});
    }
  }

  std::string describe() const override {
    std::string how = tpModel_ ? "TensorParallelGPT" : "SequenceParallelGPT";
    if (job_.sequenceParallel()) {
      const collectives::SpOptions o = job_.spOptions();
      how += o.mode == collectives::SpMode::Hybrid ? " with 2-D sequence parallelism (Ulysses x zig-zag ring)"
             : o.mode == collectives::SpMode::Ring ? " with ring attention (zig-zag)"
                                                   : " with Ulysses sequence parallelism";
    }
    return describeMesh(job_) + ", FullyShardedDataParallel (ZeRO-3) over dp around " + how;
  }

  int64_t numParameters() const override { return numParameters_; }
  int dataRank() const override { return job_.mesh->coordinate("dp"); }
  int dataWorld() const override { return job_.mesh->size("dp"); }
  bool reports() const override { return job_.world->rank() == 0; }

  double step(const Tensor& x, const Tensor& y, double lr) override {
    opt_->setLr(lr);
    opt_->zeroGrad();
    const Tensor loss = lossOf(x, y);
    loss.backward();  // the shards' gradients averaged over the dp group
    if (job_.sequenceParallel()) {
      NoGradGuard ng;
      const collectives::SpOptions sp = job_.spOptions();
      for (const Tensor& s : fsdp_->parameters()) {
        if (s.grad().defined()) collectives::spSumInPlace(sp, s.grad());
      }
    }
    if (gradClip_ > 0) gradNorm_ = clipGlobalNorm();
    opt_->step();
    return meanOverReplicas(job_, loss.item<double>());
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
    const nn::StateDict state = wholeState();
    const GeneratorState drawn = defaultGenerator().state();
    nn::GPT whole(config_);
    defaultGenerator().setState(drawn);
    whole.loadStateDict(state);
    return sampleText(whole, prompt, tokens, temperature, topK, gen);
  }

  nn::StateDict fullStateDict() override { return wholeState(); }

 private:
  // The whole model's state dict, nn::GPT's names, on every process: gathered over dp
  // (FSDP::fullStateDict to each dp rank in turn), then with tp over tp. Collective over the job.
  nn::StateDict wholeState() {
    collectives::ProcessGroup& dp = *job_.group("dp");
    nn::StateDict mine;
    for (int r = 0; r < dp.size(); ++r) {
      nn::StateDict d = fsdp_->fullStateDict(r);
      if (r == dp.rank()) mine = std::move(d);
    }
    if (!tpModel_) return mine;
    // A plain tensor-parallel model to assemble the whole one in (its initial draws from a
    // generator state that is put back).
    const GeneratorState drawn = defaultGenerator().state();
    collectives::TensorParallelGPT parts(tp_, config_);
    defaultGenerator().setState(drawn);
    parts.loadStateDict(mine);
    return parts.fullStateDict();
  }

  // The elements [begin, begin + length) of a shard.
  struct Elements {
    Tensor shard;
    int64_t begin;
    int64_t length;
  };

  // The models' loss() through the wrapper: the mean cross-entropy of the replica's batch, with sp
  // over every process's tokens (the targets padded with -100 where the sequence is).
  Tensor lossOf(const Tensor& x, const Tensor& y) {
    const Tensor idx = tpModel_ ? tpModel_->shardTokens(x, 0) : spModel_->shard(x, 0);
    const Tensor targets = (tpModel_ ? tpModel_->shardTokens(y, -100) : spModel_->shard(y, -100)).reshape({-1});
    const Tensor out = fsdp_->forward(idx);
    const Tensor logits = out.view({-1, out.size(2)});
    auto crossEntropyOf = [&](Reduction r) {
      return tpModel_ ? collectives::vocabParallelCrossEntropy(*tp_, logits, targets, tpModel_->wte()->vocabStart(),
                                                               r, config_.vocabSize)
                      : crossEntropy(logits, targets, r);
    };
    if (!job_.sequenceParallel()) return crossEntropyOf(Reduction::Mean);
    const collectives::SpOptions sp = job_.spOptions();
    const Tensor sum = crossEntropyOf(Reduction::Sum);
    double counted = 0;
    for (int64_t t : targets.toVector<int64_t>()) counted += t == -100 ? 0.0 : 1.0;
    Tensor count = full({}, counted, {.dtype = DType::Float64});
    collectives::spSumInPlace(sp, count);
    return div(collectives::reduceFromSp(sp, sum), count.to(sum.dtype()));
  }

  // nn::clipGradNorm_ over the whole model (see the file's comment); returns the norm.
  double clipGlobalNorm() {
    NoGradGuard ng;
    auto squares = [](const std::vector<Elements>& parts) {
      double s = 0;
      for (const Elements& e : parts) {
        const Tensor g = e.shard.grad();
        if (g.defined()) s += sum(square(g.narrow(0, e.begin, e.length).to(DType::Float64))).item<double>();
      }
      return s;
    };
    const bool firstOfTp = tp_ == nullptr || tp_->rank() == 0;
    const double local = firstOfSp_ ? squares(split_) + (firstOfTp ? squares(replicated_) : 0.0) : 0.0;
    Tensor total = full({1}, local, {.dtype = DType::Float64});
    job_.world->allReduce(total, collectives::ReduceOp::Sum).wait();
    const double norm = std::sqrt(total.item<double>());
    const double coef = gradClip_ / (norm + 1e-6);
    if (coef >= 1.0) return norm;
    for (const Tensor& s : fsdp_->parameters()) {
      if (s.grad().defined()) s.grad().mul_(coef);
    }
    return norm;
  }

  MeshJob job_;
  nn::GPTConfig config_;
  std::shared_ptr<collectives::TpGroup> tp_;                      // with --tp
  std::shared_ptr<collectives::TensorParallelGPT> tpModel_;       // with --tp
  std::shared_ptr<collectives::SequenceParallelGPT> spModel_;     // with --sp alone
  std::shared_ptr<nn::Module> model_;                             // the one of the two
  std::unique_ptr<collectives::FullyShardedDataParallel> fsdp_;
  std::unique_ptr<ShardedAdamW> opt_;
  std::vector<Elements> split_;       // this process's shard elements of parameters split over tp
  std::vector<Elements> replicated_;  // of parameters every tp rank holds whole
  bool firstOfSp_ = true;             // the process at sp coordinate 0 (every sp dimension)
  int64_t numParameters_ = 0;
  double gradClip_;
};

}  // namespace

std::unique_ptr<Layout> makeFsdpMeshLayout(const Flags& flags) { return std::make_unique<FullyShardedMesh>(flags); }

}  // namespace weft::examples::gpt
