// The tensor-parallel layout of the gpt example (--tp T, with --dp and --sp: mesh_layout.h): a
// collectives::TensorParallelGPT on the tp group (each process 1/T of every block's matrices and of
// the vocabulary), its tokens split over the sp group with --sp, DistributedDataParallel over the
// dp group with --dp; AdamW on this process's parts, the gradient norm clipped over the whole
// model (TensorParallelGPT::clipGradNorm). Evaluation runs the parallel model; the sample is drawn
// from the whole model gathered on every process (TensorParallelGPT::fullStateDict).
#include <memory>
#include <optional>
#include <string>

#include "collectives/tensor_parallel.h"
#include "collectives/tensor_parallel_gpt.h"
#include "mesh_layout.h"

namespace weft::examples::gpt {
namespace {

class TensorParallel final : public ParallelGptLayout<collectives::TensorParallelGPT> {
 public:
  explicit TensorParallel(const Flags& f)
      : ParallelGptLayout(f), tp_(std::make_shared<collectives::TpGroup>(*job_.group("tp"))) {
    std::optional<collectives::SpOptions> sp;
    if (job_.sequenceParallel()) sp = job_.spOptions();
    adopt(std::make_shared<collectives::TensorParallelGPT>(tp_, config_, sp), f);
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

 private:
  Tensor tokens(const Tensor& t, int64_t pad) override { return model_->shardTokens(t, pad); }
  double clip(double maxNorm) override { return model_->clipGradNorm(maxNorm); }
  nn::StateDict wholeState() override { return model_->fullStateDict(); }

  std::shared_ptr<collectives::TpGroup> tp_;
};

}  // namespace

std::unique_ptr<Layout> makeTensorParallelLayout(const Flags& flags) {
  return std::make_unique<TensorParallel>(flags);
}

}  // namespace weft::examples::gpt
