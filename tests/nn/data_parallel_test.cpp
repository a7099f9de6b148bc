#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "kernels/cpu/parallel.h"
#include "nn/nn.h"
#include "tensor/autograd.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::expectClose;

namespace {

constexpr TensorOptions kF64{.dtype = DType::Float64};

std::shared_ptr<nn::Module> makeMlp() {
  auto net = nn::makeSequential({std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::ReLU>(),
                                 std::make_shared<nn::Linear>(8, 3)});
  net->to(DType::Float64);
  return net;
}

// The reference: a plain module holding the same values as `net`.
std::shared_ptr<nn::Module> copyOf(const std::shared_ptr<nn::Module>& net,
                                   const std::function<std::shared_ptr<nn::Module>()>& make) {
  auto copy = make();
  nn::StateDict values;
  for (auto& [name, t] : net->stateDict()) values.emplace(name, t.clone());
  copy->loadStateDict(values);
  return copy;
}

void expectSameGradients(const nn::Module& actual, const nn::Module& expected) {
  auto a = actual.namedParameters();
  auto e = expected.namedParameters();
  REQUIRE(a.size() == e.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << a[i].first);
    REQUIRE(a[i].second.grad().defined());
    expectClose(a[i].second.grad(), e[i].second.grad(), 1e-12, 1e-12);
  }
}

// y = x W^T * scale in training, (x - runningMean) W^T * scale in eval, with
// buffers `scale` (read by forward), `runningMean` (an exponential average of
// the batch mean that a training forward updates in place, as a batch norm's
// running statistics) and `calls` (an int64 count of training forwards).
class Scaled : public nn::Module {
 public:
  Scaled() : Module("Scaled") {
    Generator gen(7);
    weight_ = registerParameter("weight", randn({3, 4}, kF64, &gen));
    scale_ = registerBuffer("scale", full({1}, 1.5, kF64));
    runningMean_ = registerBuffer("runningMean", zeros({4}, kF64));
    calls_ = registerBuffer("calls", zeros({1}, {.dtype = DType::Int64}));
  }
  Tensor forward(const Tensor& x) override {
    if (isTraining()) {
      {
        NoGradGuard ng;
        runningMean_.mul_(0.9).add_(x.detach().mean({0}), 0.1);
        calls_.add_(onesLike(calls_));
      }
      return mul(matmul(x, weight_.t()), scale_);
    }
    return mul(matmul(sub(x, runningMean_), weight_.t()), scale_);
  }
  Tensor scale_, runningMean_, calls_;

 private:
  Tensor weight_;
};

// Records the thread of every forward and how many kernel threads a job
// started there would get.
class Probe : public nn::Module {
 public:
  Probe(std::mutex* mu, std::set<std::thread::id>* threads, std::set<int>* kernelThreads)
      : Module("Probe"), mu_(mu), threads_(threads), kernelThreads_(kernelThreads) {
    registerParameter("w", ones({2}, kF64));
  }
  Tensor forward(const Tensor& x) override {
    std::lock_guard<std::mutex> lock(*mu_);
    threads_->insert(std::this_thread::get_id());
    kernelThreads_->insert(kernels::cpu::threadsFor(1000, 1000));
    return mul(x, namedTensor("w"));
  }

 private:
  std::mutex* mu_;
  std::set<std::thread::id>* threads_;
  std::set<int>* kernelThreads_;
};

Tensor sumOfSquares(const Tensor& t) { return mul(t, t).sum(); }

}  // namespace

TEST_CASE("DataParallel with 1, 2 and 3 replicas matches the module on the whole batch, even and uneven") {
  for (int replicas : {1, 2, 3}) {
    for (int64_t batch : {6, 7, 4}) {
      CAPTURE(replicas);
      CAPTURE(batch);
      auto net = makeMlp();
      auto ref = copyOf(net, makeMlp);
      auto dp = std::make_shared<nn::DataParallel>(net, makeMlp, replicas);
      Generator gen(static_cast<uint64_t>(100 * replicas + batch));
      Tensor x = randn({batch, 6}, kF64, &gen);
      Tensor w = randn({batch, 3}, kF64, &gen);
      Tensor xd = x.clone().requiresGrad_();
      Tensor xr = x.clone().requiresGrad_();

      Tensor out = dp->forward(xd);
      Tensor expected = ref->forward(xr);
      expectClose(out, expected, 1e-12, 1e-12);
      mul(out, w).sum().backward();
      mul(expected, w).sum().backward();
      expectSameGradients(*net, *ref);
      expectClose(xd.grad(), xr.grad(), 1e-12, 1e-12);
    }
  }
}

TEST_CASE("replicas take the module's dtype at every forward, whatever the factory built") {
  auto net = makeMlp();  // float64
  auto ref = copyOf(net, makeMlp);
  auto float32Mlp = [] {
    return std::static_pointer_cast<nn::Module>(nn::makeSequential(
        {std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(8, 3)}));
  };
  nn::DataParallel dp(net, float32Mlp, 2);
  Generator gen(12);
  Tensor x = randn({5, 6}, kF64, &gen);
  Tensor out = dp.forward(x);
  CHECK(out.dtype() == DType::Float64);
  expectClose(out, ref->forward(x), 1e-12, 1e-12);
}

TEST_CASE("DataParallel's parameters and state dict are the module's, under 'module.'") {
  auto net = makeMlp();
  nn::DataParallel dp(net, makeMlp, 2);
  REQUIRE(dp.parameters().size() == net->parameters().size());
  for (size_t i = 0; i < net->parameters().size(); ++i) CHECK(dp.parameters()[i].sameAs(net->parameters()[i]));
  CHECK(dp.stateDict().count("module.0.weight") == 1);
  CHECK(dp.replicas() == 2);
}

TEST_CASE("gradients reach the module's parameters through autograd::grad too, and the module's .grad stays") {
  auto net = makeMlp();
  auto ref = copyOf(net, makeMlp);
  nn::DataParallel dp(net, makeMlp, 3);
  Generator gen(3);
  Tensor x = randn({9, 6}, kF64, &gen);
  auto params = net->parameters();
  auto grads = autograd::grad({sumOfSquares(dp.forward(x))}, params);
  sumOfSquares(ref->forward(x)).backward();
  auto refParams = ref->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    expectClose(grads[i], refParams[i].grad(), 1e-12, 1e-12);
    CHECK_FALSE(params[i].grad().defined());
  }
}

TEST_CASE("without grad mode the replicas record nothing") {
  auto net = makeMlp();
  auto ref = copyOf(net, makeMlp);
  nn::DataParallel dp(net, makeMlp, 2);
  Generator gen(4);
  Tensor x = randn({5, 6}, kF64, &gen);
  NoGradGuard ng;
  Tensor out = dp.forward(x);
  CHECK_FALSE(out.requiresGrad());
  expectClose(out, ref->forward(x), 1e-12, 1e-12);
}

TEST_CASE("buffers are copied to every replica, and replica 0's in-place updates are the module's") {
  auto make = [] { return std::static_pointer_cast<nn::Module>(std::make_shared<Scaled>()); };
  auto net = std::make_shared<Scaled>();
  auto ref = std::make_shared<Scaled>();
  nn::DataParallel dp(net, make, 3);
  Generator gen(5);
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    // A buffer changed on the module between forwards reaches every replica.
    const double scale = 1.5 + step;
    net->scale_.fill_(scale);
    ref->scale_.fill_(scale);
    Tensor x = randn({8, 4}, kF64, &gen);  // chunks of 3, 3, 2 rows
    Tensor out = dp.forward(x);
    expectClose(out, mul(matmul(x, net->namedTensor("weight").t()), full({1}, scale, kF64)), 1e-12, 1e-12);
    // torch's rule: the module's running statistics follow replica 0's slice.
    ref->forward(x.narrow(0, 0, 3));
    expectClose(net->runningMean_, ref->runningMean_, 1e-12, 1e-12);
    CHECK(net->calls_.item<int64_t>() == step + 1);
  }
  // Gradients still match the whole-batch module with buffers in play.
  net->zeroGrad(true);
  ref->zeroGrad(true);
  ref->loadStateDict(net->stateDict());
  Tensor x = randn({8, 4}, kF64, &gen);
  sumOfSquares(dp.forward(x)).backward();
  sumOfSquares(ref->forward(x)).backward();
  expectSameGradients(*net, *ref);
}

TEST_CASE("replicas follow the module's training mode") {
  auto make = [] { return std::static_pointer_cast<nn::Module>(std::make_shared<Scaled>()); };
  auto net = std::make_shared<Scaled>();
  nn::DataParallel dp(net, make, 2);
  dp.eval();
  CHECK_FALSE(net->isTraining());
  Generator gen(6);
  Tensor mean = randn({4}, kF64, &gen);
  net->runningMean_.copy_(mean);
  Tensor x = randn({6, 4}, kF64, &gen);
  expectClose(dp.forward(x), mul(matmul(sub(x, mean), net->namedTensor("weight").t()), net->scale_), 1e-12, 1e-12);
  CHECK(net->calls_.item<int64_t>() == 0);
  CHECK(allclose(net->runningMean_, mean));
  dp.train();
  dp.forward(randn({4, 4}, kF64, &gen));
  CHECK(net->calls_.item<int64_t>() == 1);
}

TEST_CASE("optimizer steps through DataParallel equal the single module's, step after step") {
  auto net = makeMlp();
  auto ref = copyOf(net, makeMlp);
  nn::DataParallel dp(net, makeMlp, 3);
  nn::optim::SGD opt(net->parameters(), {.lr = 0.05, .momentum = 0.9});
  nn::optim::SGD refOpt(ref->parameters(), {.lr = 0.05, .momentum = 0.9});
  Generator gen(8);
  for (int step = 0; step < 6; ++step) {
    CAPTURE(step);
    Tensor x = randn({10, 6}, kF64, &gen);
    Tensor y = randn({10, 3}, kF64, &gen);
    opt.zeroGrad();
    refOpt.zeroGrad();
    mseLoss(dp.forward(x), y).backward();
    mseLoss(ref->forward(x), y).backward();
    opt.step();
    refOpt.step();
    auto a = net->parameters();
    auto e = ref->parameters();
    for (size_t i = 0; i < a.size(); ++i) expectClose(a[i], e[i], 1e-11, 1e-12);
  }
}

TEST_CASE("each replica runs on its own thread, its kernels on that thread alone") {
  std::mutex mu;
  std::set<std::thread::id> threads;
  std::set<int> kernelThreads;
  auto make = [&] { return std::static_pointer_cast<nn::Module>(std::make_shared<Probe>(&mu, &threads, &kernelThreads)); };
  nn::DataParallel dp(make(), make, 3);
  const int saved = kernels::cpu::numThreads();
  kernels::cpu::setNumThreads(2);
  dp.forward(ones({3, 2}, kF64));
  CHECK(threads.size() == 3);
  CHECK(threads.count(std::this_thread::get_id()) == 1);
  CHECK(kernelThreads == std::set<int>{1});
  // The limit ends with the forward.
  CHECK(kernels::cpu::threadsFor(1000, 1000) == 2);
  kernels::cpu::setNumThreads(saved);
}

TEST_CASE("a batch smaller than the replicas splits as chunk does, or is refused when below the replica count") {
  auto net = makeMlp();
  auto ref = copyOf(net, makeMlp);
  nn::DataParallel dp(net, makeMlp, 4);
  Generator gen(9);
  // chunk(5 rows, 4) gives 2, 2, 1: three replicas run.
  Tensor x = randn({5, 6}, kF64, &gen);
  expectClose(dp.forward(x), ref->forward(x), 1e-12, 1e-12);
  try {
    dp.forward(randn({3, 6}, kF64, &gen));
    FAIL("expected an InvalidArgumentError");
  } catch (const InvalidArgumentError& e) {
    CHECK(std::string(e.what()).find("3 rows") != std::string::npos);
    CHECK(std::string(e.what()).find("4 replicas") != std::string::npos);
  }
  CHECK_THROWS_AS(dp.forward(full({}, 1.0, kF64)), InvalidArgumentError);
  CHECK_THROWS_AS(dp.forward(Tensor()), InvalidArgumentError);
}

TEST_CASE("bad DataParallel arguments are InvalidArgumentErrors naming the problem") {
  auto net = makeMlp();
  CHECK_THROWS_AS(nn::DataParallel(net, makeMlp, 0), InvalidArgumentError);
  CHECK_THROWS_AS(nn::DataParallel(net, makeMlp, -2), InvalidArgumentError);
  CHECK_THROWS_AS(nn::DataParallel(nullptr, makeMlp, 2), InvalidArgumentError);
  CHECK_THROWS_AS(nn::DataParallel(net, nullptr, 2), InvalidArgumentError);
  CHECK_NOTHROW(nn::DataParallel(net, nullptr, 1));
  CHECK_THROWS_AS(nn::DataParallel(net, [] { return std::shared_ptr<nn::Module>(); }, 2), InvalidArgumentError);
  CHECK_THROWS_AS(nn::DataParallel(net, [&net] { return net; }, 2), InvalidArgumentError);
  auto wider = [] {
    return std::static_pointer_cast<nn::Module>(nn::makeSequential(
        {std::make_shared<nn::Linear>(6, 9), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(9, 3)}));
  };
  try {
    nn::DataParallel dp(net, wider, 2);
    FAIL("expected an InvalidArgumentError");
  } catch (const InvalidArgumentError& e) {
    CHECK(std::string(e.what()).find("'0.weight'") != std::string::npos);
  }
  CHECK_THROWS_AS(nn::DataParallel(net, makeMlp, std::vector<Device>{Device::cpu(), Device::cpu()}),
                  InvalidArgumentError);
  CHECK_THROWS_AS(nn::DataParallel(net, makeMlp, std::vector<Device>{}), InvalidArgumentError);
  CHECK_THROWS_AS(nn::DataParallel(net, makeMlp, std::vector<Device>{Device::cuda(0), Device::cuda(1)}),
                  InvalidArgumentError);
}

TEST_CASE("an error in a replica's forward reaches the caller as its type, after every replica stopped") {
  auto net = makeMlp();
  nn::DataParallel dp(net, makeMlp, 3);
  Generator gen(10);
  CHECK_THROWS_AS(dp.forward(randn({6, 5}, kF64, &gen)), InvalidArgumentError);
  // The wrapper still works afterwards.
  CHECK(dp.forward(randn({6, 6}, kF64, &gen)).shape() == Shape{6, 3});
}
