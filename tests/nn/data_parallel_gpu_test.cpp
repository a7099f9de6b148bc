#include <cstdio>
#include <cstdlib>

#include "nn/nn.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::expectClose;

namespace {

// Ends the test case as skipped unless two CUDA devices are present.
void skipWithoutTwoDevices() {
  WEFT_SKIP_WITHOUT_CUDA();
  if (kernels::cudaDeviceCount() < 2) {
    std::printf("SKIP: DataParallel on devices needs 2 CUDA devices, found %d\n", kernels::cudaDeviceCount());
    std::fflush(stdout);
    std::_Exit(77);
  }
}

std::shared_ptr<nn::Module> makeMlp() {
  return nn::makeSequential(
      {std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(8, 3)});
}

}  // namespace

TEST_CASE("DataParallel over two CUDA devices matches the module on the CPU, outputs and gradients") {
  skipWithoutTwoDevices();
  auto net = makeMlp();
  auto ref = makeMlp();
  ref->loadStateDict(net->stateDict());
  net->to(Device::cuda(0));
  nn::DataParallel dp(net, makeMlp, {Device::cuda(0), Device::cuda(1)});
  nn::optim::SGD opt(net->parameters(), {.lr = 0.05, .momentum = 0.9});
  nn::optim::SGD refOpt(ref->parameters(), {.lr = 0.05, .momentum = 0.9});
  Generator gen(11);
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    Tensor x = randn({7, 6}, {}, &gen);  // slices of 4 and 3 rows
    Tensor y = randn({7, 3}, {}, &gen);
    opt.zeroGrad();
    refOpt.zeroGrad();
    Tensor out = dp.forward(x.to(Device::cuda(0)));
    CHECK(out.device() == Device::cuda(0));
    Tensor expected = ref->forward(x);
    expectClose(out.to(Device::cpu()), expected, 1e-4, 1e-5);
    mseLoss(out, y.to(Device::cuda(0))).backward();
    mseLoss(expected, y).backward();
    auto a = net->namedParameters();
    auto e = ref->namedParameters();
    for (size_t i = 0; i < a.size(); ++i) {
      INFO("parameter " << a[i].first);
      CHECK(a[i].second.grad().device() == Device::cuda(0));
      expectClose(a[i].second.grad().to(Device::cpu()), e[i].second.grad(), 1e-4, 1e-5);
    }
    opt.step();
    refOpt.step();
  }
}

TEST_CASE("DataParallel refuses a module that is not on the first device") {
  skipWithoutTwoDevices();
  auto net = makeMlp();
  CHECK_THROWS_AS(nn::DataParallel(net, makeMlp, {Device::cuda(0), Device::cuda(1)}), InvalidArgumentError);
  net->to(Device::cuda(1));
  CHECK_THROWS_AS(nn::DataParallel(net, makeMlp, {Device::cuda(0), Device::cuda(1)}), InvalidArgumentError);
  CHECK_THROWS_AS(nn::DataParallel(net, makeMlp, {Device::cuda(1), Device::cuda(1)}), InvalidArgumentError);
}
