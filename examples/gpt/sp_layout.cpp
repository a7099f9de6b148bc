// The sequence-parallel layout of the gpt example (--sp S without --tp, with --dp: mesh_layout.h):
// a collectives::SequenceParallelGPT on the sp group (every parameter on every process, 1/S of each
// sequence's tokens; attention by --sp-mode: Ulysses, zig-zag ring, or 2-D), its gradients summed
// over the sp group after backward, DistributedDataParallel over the dp group with --dp; AdamW on
// every parameter, the gradient norm clipped as nn::clipGradNorm_ does.
#include <memory>
#include <string>

#include "collectives/sequence_parallel_gpt.h"
#include "mesh_layout.h"
#include "nn/utils.h"

namespace weft::examples::gpt {
namespace {

class SequenceParallel final : public ParallelGptLayout<collectives::SequenceParallelGPT> {
 public:
  explicit SequenceParallel(const Flags& f) : ParallelGptLayout(f) {
    adopt(std::make_shared<collectives::SequenceParallelGPT>(config_, job_.spOptions()), f);
  }

  std::string describe() const override {
    const collectives::SpOptions o = job_.spOptions();
    std::string how = o.mode == collectives::SpMode::Hybrid ? "SequenceParallelGPT, 2-D (Ulysses x zig-zag ring)"
                      : o.mode == collectives::SpMode::Ring ? "SequenceParallelGPT, ring attention (zig-zag)"
                                                            : "SequenceParallelGPT, Ulysses";
    if (ddp_) how += ", DistributedDataParallel";
    return describeMesh(job_) + ", " + how;
  }

 private:
  Tensor tokens(const Tensor& t, int64_t pad) override { return model_->shard(t, pad); }
  double clip(double maxNorm) override { return nn::clipGradNorm_(model_->parameters(), maxNorm); }
  nn::StateDict wholeState() override { return model_->stateDict(); }
};

}  // namespace

std::unique_ptr<Layout> makeSequenceParallelLayout(const Flags& flags) {
  return std::make_unique<SequenceParallel>(flags);
}

}  // namespace weft::examples::gpt
