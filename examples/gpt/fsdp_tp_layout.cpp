// The gpt example's 2-D layout of FSDP over tensor parallelism (--fsdp --dp D --tp T, weftrun -n
// D·T): the mesh {dp: D, tp: T} of mesh_layout.h, a collectives::TensorParallelGPT on the tp group
// (1/T of every block's matrices and of the vocabulary per process) wrapped in
// FullyShardedDataParallel over the dp group: each ParallelTransformerBlock a unit, the rest (this
// rank's rows of wte, wpe, ln_f) the root unit, so each process keeps 1/D of its tp rank's part.
// Every process of a dp group draws its own share of the job's windows (--batch-size is a
// replica's), the processes of a tp group the same ones.
//
// Clipping: the gradient norm of the one-process model, from the squares of every process's shard
// gradients summed over the whole job (one allreduce over the world): the elements of parameters
// split over tp (their shape differs from the whole model's) count on every tp rank, those of the
// replicated ones (LayerNorms, wpe, the row-parallel biases, whose gradients are the same on every
// tp rank) on tp rank 0 only. Evaluation runs the wrapped model; the sample is drawn from the whole
// model, gathered over dp (FSDP::fullStateDict to each dp rank in turn) and then over tp
// (TensorParallelGPT::fullStateDict).
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/fsdp.h"
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

class FullyShardedTensorParallel final : public Layout {
 public:
  explicit FullyShardedTensorParallel(const Flags& f)
      : job_(makeMeshJob(f)),
        config_(modelConfig(f)),
        tp_(std::make_shared<collectives::TpGroup>(*job_.group("tp"))),
        gradClip_(f.gradClip) {
    WEFT_ENFORCE(f.precision == "float32", InvalidArgumentError, "gpt: --precision ", f.precision,
                 " is not supported with --fsdp");
    collectives::ProcessGroup* dp = job_.group("dp");
    WEFT_ENFORCE(dp != nullptr, InvalidArgumentError, "gpt: --fsdp with --tp shards over --dp, which must be above 1");
    // The parallel layers draw their initial values from the default generator, which then draws
    // dropout: its state is restored once they hold the one-process model's weights.
    const GeneratorState dropoutState = defaultGenerator().state();
    model_ = std::make_shared<collectives::TensorParallelGPT>(tp_, config_);
    {
      std::shared_ptr<nn::GPT> whole = initialModel(f);
      numParameters_ = whole->numParameters();
      for (const auto& [name, p] : whole->namedParameters()) wholeShapes_.emplace(name, p.shape());
      model_->loadFrom(*whole);
    }
    defaultGenerator().setState(dropoutState);
    collectives::FullyShardedDataParallel::Options o;
    for (const auto& b : model_->blocks()) o.units.push_back(b);
    fsdp_ = std::make_unique<collectives::FullyShardedDataParallel>(model_, *dp, o);
    opt_ = std::make_unique<ShardedAdamW>(std::vector<collectives::FullyShardedDataParallel*>{fsdp_.get()},
                                          dp->rank(), f);
    // Which shard elements belong to parameters split over tp.
    for (const ShardSlice& s : shardSlices(*fsdp_, dp->rank())) {
      auto it = wholeShapes_.find(s.name);
      WEFT_CHECK(it != wholeShapes_.end()) << s.name;
      (it->second != s.parameter.shape() ? split_ : replicated_)
          .push_back({fsdp_->parameters()[s.unit], s.shardBegin, s.length});
    }
  }

  std::string describe() const override {
    return describeMesh(job_) + ", FullyShardedDataParallel (ZeRO-3) over dp around TensorParallelGPT";
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
    if (gradClip_ > 0) clipGlobalNorm();
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
    collectives::ProcessGroup& dp = *job_.group("dp");
    nn::StateDict mine;
    for (int r = 0; r < dp.size(); ++r) {
      nn::StateDict d = fsdp_->fullStateDict(r);
      if (r == dp.rank()) mine = std::move(d);
    }
    // A plain tensor-parallel model to assemble the whole one from (its initial draws from a
    // generator state that is put back).
    const GeneratorState state = defaultGenerator().state();
    collectives::TensorParallelGPT parts(tp_, config_);
    defaultGenerator().setState(state);
    parts.loadStateDict(mine);
    nn::GPT whole(config_);
    defaultGenerator().setState(state);
    whole.loadStateDict(parts.fullStateDict());
    return sampleText(whole, prompt, tokens, temperature, topK, gen);
  }

 private:
  // The elements [begin, begin + length) of a shard.
  struct Elements {
    Tensor shard;
    int64_t begin;
    int64_t length;
  };

  Tensor lossOf(const Tensor& x, const Tensor& y) {
    const Tensor logits = fsdp_->forward(x);
    return collectives::vocabParallelCrossEntropy(*tp_, logits.view({-1, logits.size(2)}), y.reshape({-1}),
                                                  model_->wte()->vocabStart(), Reduction::Mean, config_.vocabSize);
  }

  // nn::clipGradNorm_ over the whole model (see the file's comment).
  void clipGlobalNorm() {
    NoGradGuard ng;
    auto squares = [](const std::vector<Elements>& parts) {
      double s = 0;
      for (const Elements& e : parts) {
        const Tensor g = e.shard.grad();
        if (g.defined()) s += sum(square(g.narrow(0, e.begin, e.length).to(DType::Float64))).item<double>();
      }
      return s;
    };
    const double local = squares(split_) + (tp_->rank() == 0 ? squares(replicated_) : 0.0);
    Tensor total = full({1}, local, {.dtype = DType::Float64});
    job_.world->allReduce(total, collectives::ReduceOp::Sum).wait();
    const double norm = std::sqrt(total.item<double>());
    const double coef = gradClip_ / (norm + 1e-6);
    if (coef >= 1.0) return;
    for (const Tensor& s : fsdp_->parameters()) {
      if (s.grad().defined()) s.grad().mul_(coef);
    }
  }

  MeshJob job_;
  nn::GPTConfig config_;
  std::shared_ptr<collectives::TpGroup> tp_;
  std::shared_ptr<collectives::TensorParallelGPT> model_;
  std::unique_ptr<collectives::FullyShardedDataParallel> fsdp_;
  std::unique_ptr<ShardedAdamW> opt_;
  std::map<std::string, Shape> wholeShapes_;  // the one-process model's parameters
  std::vector<Elements> split_;       // this process's shard elements of parameters split over tp
  std::vector<Elements> replicated_;  // of parameters every tp rank holds whole
  int64_t numParameters_ = 0;
  double gradClip_;
};

}  // namespace

std::unique_ptr<Layout> makeFsdpTensorParallelLayout(const Flags& flags) {
  return std::make_unique<FullyShardedTensorParallel>(flags);
}

}  // namespace weft::examples::gpt
