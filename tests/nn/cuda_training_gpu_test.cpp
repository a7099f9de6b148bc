// Whole-model training on CUDA against the same training on the CPU: the
// examples' models (the Fashion-MNIST MLP, the parameter server's CNN, the
// RNN example's LSTM language model, a tiny GPT) each take 3 optimizer steps
// from the same initial weights on the same synthetic batches on both
// devices, in float64 and in float32, and the losses of every step and the
// final weights must agree. Every op family (GEMM, convolution, pooling,
// LSTM, embedding, layer norm, attention, softmax and losses, reductions,
// elementwise) runs forward and backward here, and the optimizers' fused
// CUDA steps and gradient clipping after them.
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda_compare.h"
#include "examples/fashion_mnist_mlp/mlp.h"
#include "nn/nn.h"
#include "nn/transformer.h"
#include "weft_test.h"

using namespace weft;
namespace optim = weft::nn::optim;
using weft::testing::checkMatches;
using weft::testing::randomTensor;
using weft::testing::Tolerance;

namespace {

const Device kGpu = Device::cuda(0);

struct Batch {
  Tensor input;
  Tensor target;
};

struct TrainingCase {
  std::string name;
  // A fresh model with the case's fixed initial weights (float32, CPU).
  std::function<std::shared_ptr<nn::Module>()> makeModel;
  // The batch of step k (CPU; floating inputs in float32).
  std::function<Batch(int k)> batch;
  std::function<Tensor(nn::Module&, const Tensor& input, const Tensor& target)> loss;
  std::function<std::unique_ptr<optim::Optimizer>(nn::Module&)> makeOptimizer;
  double clipNorm = 0;  // clip the gradients' 2-norm to this before each step (0: no clipping)
};

Tensor onto(const Tensor& t, DType dtype, Device d) {
  Tensor x = isFloating(t.dtype()) ? t.to(dtype) : t;
  return x.to(d);
}

// Trains the case's model for 3 steps on the CPU and on cuda:0 in `dtype`
// and compares the losses and the final parameters.
void compareTraining(const TrainingCase& c, DType dtype, Tolerance lossTol, Tolerance weightTol) {
  INFO(c.name << " " << dtypeName(dtype));
  std::shared_ptr<nn::Module> cpuModel = c.makeModel();
  std::shared_ptr<nn::Module> gpuModel = c.makeModel();
  cpuModel->to(dtype);
  gpuModel->to(dtype);
  gpuModel->to(kGpu);
  std::vector<Tensor> cpuParams = cpuModel->parameters(), gpuParams = gpuModel->parameters();
  REQUIRE(cpuParams.size() == gpuParams.size());
  for (size_t i = 0; i < cpuParams.size(); ++i) {
    REQUIRE(gpuParams[i].device() == kGpu);
    checkMatches("initial parameter " + std::to_string(i), gpuParams[i], cpuParams[i], {0, 0});
  }
  std::unique_ptr<optim::Optimizer> cpuOpt = c.makeOptimizer(*cpuModel);
  std::unique_ptr<optim::Optimizer> gpuOpt = c.makeOptimizer(*gpuModel);
  for (int k = 0; k < 3; ++k) {
    Batch b = c.batch(k);
    double losses[2];
    for (int dev = 0; dev < 2; ++dev) {
      nn::Module& model = dev == 0 ? *cpuModel : *gpuModel;
      optim::Optimizer& opt = dev == 0 ? *cpuOpt : *gpuOpt;
      const Device d = dev == 0 ? Device::cpu() : kGpu;
      opt.zeroGrad(true);
      Tensor loss = c.loss(model, onto(b.input, dtype, d), onto(b.target, dtype, d));
      CHECK(loss.device() == d);
      loss.backward();
      if (c.clipNorm > 0) nn::clipGradNorm_(opt.params(), c.clipNorm);
      opt.step();
      losses[dev] = loss.to(Device::cpu()).item<double>();
    }
    INFO("step " << k << ": CPU loss " << losses[0] << ", CUDA loss " << losses[1]);
    CHECK(std::isfinite(losses[0]));
    CHECK(std::abs(losses[1] - losses[0]) <= lossTol.atol + lossTol.rtol * std::abs(losses[0]));
  }
  for (size_t i = 0; i < cpuParams.size(); ++i) {
    checkMatches("parameter " + std::to_string(i) + " after 3 steps", gpuParams[i], cpuParams[i], weightTol);
  }
}

void runBothDTypes(const TrainingCase& c, Tolerance float32Weights = {2e-3, 2e-4}) {
  compareTraining(c, DType::Float64, {1e-10, 1e-12}, {1e-8, 1e-10});
  compareTraining(c, DType::Float32, {1e-4, 1e-5}, float32Weights);
}

// The parameter server's Net (examples/parameter_server/server.h), as a
// module: Conv 1->32 3x3, ReLU, Conv 32->64 3x3, MaxPool 2, Flatten,
// Linear 9216->128, ReLU, Linear 128->10, LogSoftmax; initialised as there
// from Generator(seed). Dropout is left out (eval mode), so that both
// devices compute the same function.
class ParameterServerNet : public nn::Module {
 public:
  explicit ParameterServerNet(uint64_t seed) : Module("Net") {
    conv1_ = registerModule("conv1", std::make_shared<nn::Conv2d>(1, 32, 3));
    conv2_ = registerModule("conv2", std::make_shared<nn::Conv2d>(32, 64, 3));
    fc1_ = registerModule("fc1", std::make_shared<nn::Linear>(9216, 128));
    fc2_ = registerModule("fc2", std::make_shared<nn::Linear>(128, 10));
    Generator gen(seed);
    conv1_->resetParameters(&gen);
    conv2_->resetParameters(&gen);
    fc1_->resetParameters(&gen);
    fc2_->resetParameters(&gen);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = relu(conv1_->forward(x));
    h = maxPool2d(conv2_->forward(h), 2).flatten(1);
    h = relu(fc1_->forward(h));
    return logSoftmax(fc2_->forward(h), 1);
  }

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

// The RNN example's language model (examples/rnn/model.h) in one process:
// embedding [ntoken, ninp], a 2-layer LSTM, a Linear decoder to ntoken
// logits; embedding and decoder weights U(±0.1) as there. No dropout.
class LstmLanguageModel : public nn::Module {
 public:
  static constexpr int64_t kTokens = 40, kInput = 16, kHidden = 24;
  explicit LstmLanguageModel(uint64_t seed) : Module("LstmLanguageModel") {
    embedding_ = registerModule("embedding", std::make_shared<nn::Embedding>(kTokens, kInput));
    lstm_ = registerModule("lstm", std::make_shared<nn::LSTM>(kInput, kHidden, 2));
    decoder_ = registerModule("decoder", std::make_shared<nn::Linear>(kHidden, kTokens));
    Generator gen(seed);
    NoGradGuard ng;
    for (auto& [name, p] : namedParameters()) {
      const double bound = name.rfind("lstm", 0) == 0 ? 1.0 / std::sqrt(static_cast<double>(kHidden)) : 0.1;
      Tensor v = uniform(p.shape(), -bound, bound, {.dtype = p.dtype()}, &gen);
      Tensor dst = p;
      dst.copy_(v);
    }
    Tensor bias = decoder_->bias();
    bias.zero_();
  }
  // tokens Int64 [T, B] -> logits [T * B, ntoken].
  Tensor forward(const Tensor& tokens) override {
    Tensor out = lstm_->forward(embedding_->forward(tokens));
    return decoder_->forward(out.reshape({-1, kHidden}));
  }

 private:
  std::shared_ptr<nn::Embedding> embedding_;
  std::shared_ptr<nn::LSTM> lstm_;
  std::shared_ptr<nn::Linear> decoder_;
};

Tensor tokens(Shape shape, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  return randint(0, vocab, std::move(shape), {.dtype = DType::Int64}, &g);
}

}  // namespace

TEST_CASE("the Fashion-MNIST MLP trains on CUDA as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  namespace mlp = weft::examples::fashion_mnist_mlp;
  TrainingCase c{
      .name = "Fashion-MNIST MLP",
      .makeModel =
          [] {
            manualSeed(7);
            return std::static_pointer_cast<nn::Module>(mlp::makeModel());
          },
      .batch = [](int k) { return Batch{randomTensor({64, 784}, DType::Float32, 10 + k), tokens({64}, 10, 20 + k)}; },
      .loss = [](nn::Module& m, const Tensor& x, const Tensor& y) { return crossEntropy(m.forward(x), y); },
      .makeOptimizer =
          [](nn::Module& m) {
            return std::make_unique<optim::SGD>(
                m.parameters(), optim::SGDOptions{.lr = mlp::kDefaults.lr, .momentum = mlp::kDefaults.momentum});
          },
  };
  runBothDTypes(c);
}

TEST_CASE("the parameter server's CNN trains on CUDA as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  TrainingCase c{
      .name = "parameter-server CNN",
      .makeModel = [] { return std::static_pointer_cast<nn::Module>(std::make_shared<ParameterServerNet>(3)); },
      .batch =
          [](int k) { return Batch{randomTensor({8, 1, 28, 28}, DType::Float32, 30 + k), tokens({8}, 10, 40 + k)}; },
      .loss = [](nn::Module& m, const Tensor& x, const Tensor& y) { return nllLoss(m.forward(x), y); },
      .makeOptimizer =
          [](nn::Module& m) {
            return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.03, .momentum = 0.5});
          },
  };
  runBothDTypes(c);
}

TEST_CASE("the RNN example's LSTM language model trains on CUDA as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  using Lm = LstmLanguageModel;
  TrainingCase c{
      .name = "LSTM language model",
      .makeModel = [] { return std::static_pointer_cast<nn::Module>(std::make_shared<Lm>(5)); },
      .batch = [](int k) { return Batch{tokens({7, 4}, Lm::kTokens, 50 + k), tokens({28}, Lm::kTokens, 60 + k)}; },
      .loss = [](nn::Module& m, const Tensor& x, const Tensor& y) { return crossEntropy(m.forward(x), y); },
      .makeOptimizer =
          [](nn::Module& m) { return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.5}); },
      .clipNorm = 0.25,
  };
  runBothDTypes(c);
}

TEST_CASE("a tiny GPT trains on CUDA as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  const nn::GPTConfig cfg{.vocabSize = 48, .blockSize = 16, .layers = 2, .heads = 2, .width = 32};
  TrainingCase c{
      .name = "GPT",
      .makeModel =
          [cfg] {
            Generator init(11);
            return std::static_pointer_cast<nn::Module>(std::make_shared<nn::GPT>(cfg, &init));
          },
      .batch = [cfg](int k) { return Batch{tokens({3, 16}, cfg.vocabSize, 70 + k), tokens({3, 16}, cfg.vocabSize, 80 + k)}; },
      .loss = [](nn::Module& m, const Tensor& x, const Tensor& y) { return static_cast<nn::GPT&>(m).loss(x, y); },
      .makeOptimizer =
          [](nn::Module& m) {
            return std::make_unique<optim::AdamW>(
                optim::decayGroups(m.namedParameters(), optim::AdamWOptions{.lr = 1e-3, .weightDecay = 0.1}));
          },
      .clipNorm = 1.0,
  };
  // Adam divides by the root of the gradients' second moment, so float32
  // rounding in a gradient near zero moves its weight by up to lr per step.
  runBothDTypes(c, {1e-2, 3e-3});
}
