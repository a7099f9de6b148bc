#include "layout.h"
#include "fsdp_layout.h"
#include "mesh_layout.h"
#include "pipeline_layout.h"

#include <memory>
#include <string>
#include <utility>

#include "data/text.h"
#include "examples/common/seed.h"
#include "kernels/cpu/parallel.h"
#include "nn/nn.h"
#include "nn/optim.h"
#include "nn/serialize.h"
#include "nn/transformer.h"
#include "nn/utils.h"
#include "tensor/autocast.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::examples::gpt {
namespace {

// The stream of the run's seed that draws the initial weights (seed.h).
constexpr uint64_t kInitStream = 1;

// The whole model and its optimizer in this process.
class SingleProcess final : public Layout {
 public:
  explicit SingleProcess(const Flags& f)
      : model_(initialModel(f)),
        opt_(nn::optim::decayGroups(model_->namedParameters(),
                                    nn::optim::AdamWOptions{.lr = f.lr, .betas = {0.9, 0.95}, .weightDecay = f.weightDecay})),
        gradClip_(f.gradClip),
        bf16_(f.precision == "bf16"),
        device_(Device::parse(f.device)) {
    // The same initial weights on every device: drawn on the CPU, then moved (the
    // optimizer's parameters are the same tensors, moved in place).
    model_->to(device_);
  }

  std::string describe() const override {
    const std::string where = device_.isCuda() ? "one process on " + device_.str() + ", "
                                               : "one process, " + std::to_string(kernels::cpu::numThreads()) +
                                                     " kernel threads, ";
    return where + (bf16_ ? "bfloat16 products (autocast), float32 weights" : "float32");
  }

  int64_t numParameters() const override { return model_->numParameters(); }

  double step(const Tensor& x, const Tensor& y, double lr) override {
    opt_.setLr(lr);
    opt_.zeroGrad(true);
    Tensor loss = forwardLoss(x.to(device_), y.to(device_));
    loss.backward();
    if (gradClip_ > 0) gradNorm_ = nn::clipGradNorm_(model_->parameters(), gradClip_);
    opt_.step();
    return loss.item<double>();
  }

  double evaluate(const Tensor& x, const Tensor& y) override {
    NoGradGuard ng;
    model_->eval();
    double loss = forwardLoss(x.to(device_), y.to(device_)).item<double>();
    model_->train();
    return loss;
  }

  std::string sample(const std::string& prompt, int64_t tokens, double temperature, int64_t topK,
                     Generator& gen) override {
    std::vector<int64_t> ids = data::ByteTokenizer::encode(prompt);
    Tensor idx = fromVector(ids, Shape{1, static_cast<int64_t>(ids.size())}).to(device_);
    model_->eval();
    Tensor out = model_->generate(idx, tokens, temperature, topK, &gen);
    model_->train();
    return data::ByteTokenizer::decode(out.toVector<int64_t>());
  }

  nn::StateDict fullStateDict() override { return model_->stateDict(); }

 private:
  // The loss; with bf16, under an autocast scope (backward runs outside it, in the dtypes
  // forward saw).
  Tensor forwardLoss(const Tensor& x, const Tensor& y) {
    autocast::Scope amp(DType::BFloat16, bf16_);
    return model_->loss(x, y);
  }

  std::shared_ptr<nn::GPT> model_;
  nn::optim::AdamW opt_;
  double gradClip_;
  bool bf16_;
  Device device_;
};

}  // namespace

std::shared_ptr<nn::GPT> initialModel(const Flags& flags, const nn::GPTConfig& config) {
  Generator init(app::streamSeed(flags.seed, kInitStream));
  auto model = std::make_shared<nn::GPT>(config, &init);
  if (!flags.load.empty()) model->loadStateDict(nn::loadStateDictFile(flags.load));
  return model;
}

std::unique_ptr<Layout> makeLayout(const Flags& flags) {
  if (flags.fsdp) return makeFsdpLayout(flags);
  if (flags.pp > 1) return makePipelineLayout(flags);
  if (meshLayout(flags)) return makeMeshLayout(flags);
  return std::make_unique<SingleProcess>(flags);
}

}  // namespace weft::examples::gpt
