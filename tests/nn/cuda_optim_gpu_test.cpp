// The optimizers, the loss scaler's unscale and gradient-norm clipping on
// CUDA against the same calls on the CPU: the CPU run is the reference (its
// rules are checked against PyTorch in optim_test.cpp).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda_compare.h"
#include "nn/amp.h"
#include "nn/optim.h"
#include "nn/utils.h"
#include "weft_test.h"

using namespace weft;
namespace optim = weft::nn::optim;
using weft::testing::checkMatches;
using weft::testing::defaultTolerance;
using weft::testing::randomTensor;

namespace {

const Device kGpu = Device::cuda(0);

// Odd sizes, a scalar, an empty tensor and one of several 64 Ki-element
// chunks.
std::vector<Shape> mixedShapes() { return {{7, 13}, {1}, {0, 5}, {33}, {}, {300001}, {3, 1, 17}}; }

std::vector<Tensor> randomParams(const std::vector<Shape>& shapes, DType dtype, uint64_t seed) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < shapes.size(); ++i) out.push_back(randomTensor(shapes[i], dtype, seed + i));
  return out;
}

std::vector<Tensor> onDevice(const std::vector<Tensor>& ts, Device d) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.defined() ? t.to(d) : Tensor());
  return out;
}

// Runs `steps` steps of the optimizer built from `groups` on the CPU and of
// the same optimizer over CUDA copies, with the same random gradients (one
// parameter's gradient left out at step 2), and compares the parameters and
// every state buffer after each step.
void compareSteps(const std::string& name, const std::vector<std::vector<Shape>>& groupShapes,
                  const std::vector<optim::OptimizerOptions>& groupOptions, DType dtype, int steps = 5,
                  double tolScale = 1) {
  INFO(name << " " << dtypeName(dtype));
  std::vector<optim::ParamGroup> cpuGroups, gpuGroups;
  std::vector<Tensor> cpuParams, gpuParams;
  uint64_t seed = 100;
  for (size_t g = 0; g < groupShapes.size(); ++g) {
    std::vector<Tensor> ps = randomParams(groupShapes[g], dtype, seed);
    seed += 1000;
    std::vector<Tensor> ds = onDevice(ps, kGpu);
    cpuGroups.push_back({ps, groupOptions[g]});
    gpuGroups.push_back({ds, groupOptions[g]});
    cpuParams.insert(cpuParams.end(), ps.begin(), ps.end());
    gpuParams.insert(gpuParams.end(), ds.begin(), ds.end());
  }
  optim::Optimizer cpu(cpuGroups);
  optim::Optimizer gpu(gpuGroups);
  weft::testing::Tolerance tol = defaultTolerance(dtype);
  tol.rtol *= tolScale;
  tol.atol *= tolScale;
  for (int k = 0; k < steps; ++k) {
    std::vector<Tensor> grads;
    for (size_t i = 0; i < cpuParams.size(); ++i) {
      const bool skip = k == 2 && i == 1;
      grads.push_back(skip ? Tensor() : randomTensor(cpuParams[i].shape(), dtype, 7000 + 100 * k + i));
    }
    cpu.step(grads);
    gpu.step(onDevice(grads, kGpu));
    for (size_t i = 0; i < cpuParams.size(); ++i) {
      const std::string at = "step " + std::to_string(k) + " param " + std::to_string(i);
      CHECK(gpuParams[i].device() == kGpu);
      checkMatches(at, gpuParams[i], cpuParams[i], tol);
      const optim::ParamState& cs = cpu.state()[i];
      const optim::ParamState& gs = gpu.state()[i];
      CHECK(gs.step == cs.step);
      CHECK(gs.buffers.size() == cs.buffers.size());
      for (const auto& [buffer, value] : cs.buffers) {
        REQUIRE(gs.has(buffer));
        CHECK(gs.at(buffer).device() == kGpu);
        checkMatches(at + " " + buffer, gs.at(buffer), value, tol);
      }
    }
  }
}

std::vector<optim::OptimizerOptions> everyRule() {
  return {
      optim::SGDOptions{.lr = 0.1},
      optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weightDecay = 0.01},
      optim::SGDOptions{.lr = 0.05, .momentum = 0.8, .weightDecay = 0.02, .nesterov = true, .maximize = true},
      optim::AdamOptions{.lr = 0.01},
      optim::AdamOptions{.lr = 0.02, .betas = {0.8, 0.99}, .eps = 1e-6, .weightDecay = 0.1, .amsgrad = true},
      optim::AdamWOptions{.lr = 0.01, .weightDecay = 0.1},
      optim::AdamWOptions{.lr = 0.01, .weightDecay = 0.05, .amsgrad = true, .maximize = true},
      optim::AdagradOptions{.lr = 0.1, .lrDecay = 0.01, .weightDecay = 0.01, .initialAccumulatorValue = 0.1},
      optim::RMSpropOptions{.lr = 0.01},
      optim::RMSpropOptions{.lr = 0.01, .alpha = 0.9, .weightDecay = 0.01, .momentum = 0.9, .centered = true},
      optim::RMSpropOptions{.lr = 0.005, .momentum = 0.5, .maximize = true},
  };
}

std::string describe(const optim::OptimizerOptions& o, size_t k) {
  return std::string(optim::optimizerName(o)) + " #" + std::to_string(k);
}

}  // namespace

TEST_CASE("every optimizer's CUDA step equals the CPU's over 5 steps (float64)") {
  WEFT_SKIP_WITHOUT_CUDA();
  auto rules = everyRule();
  for (size_t k = 0; k < rules.size(); ++k) {
    compareSteps(describe(rules[k], k), {mixedShapes()}, {rules[k]}, DType::Float64);
  }
}

TEST_CASE("every optimizer's CUDA step equals the CPU's over 5 steps (float32)") {
  WEFT_SKIP_WITHOUT_CUDA();
  auto rules = everyRule();
  for (size_t k = 0; k < rules.size(); ++k) {
    compareSteps(describe(rules[k], k), {mixedShapes()}, {rules[k]}, DType::Float32);
  }
}

TEST_CASE("CUDA parameter groups keep their own learning rates") {
  WEFT_SKIP_WITHOUT_CUDA();
  compareSteps("AdamW groups", {{{5, 3}, {11}}, {{4}, {2, 9}}},
               {optim::AdamWOptions{.lr = 0.02, .weightDecay = 0.1}, optim::AdamWOptions{.lr = 0.001, .weightDecay = 0}},
               DType::Float64);
  compareSteps("SGD groups", {{{6, 6}}, {{9}}}, {optim::SGDOptions{.lr = 0.3, .momentum = 0.9},
                                                 optim::SGDOptions{.lr = 0.01, .momentum = 0.5}},
               DType::Float32);
}

TEST_CASE("a CUDA group of many tensors takes several launches") {
  WEFT_SKIP_WITHOUT_CUDA();
  // More tensors than one launch's table holds, of sizes 0 to 70000.
  std::vector<Shape> many;
  for (int i = 0; i < 75; ++i) many.push_back({(i * 937) % 70001});
  compareSteps("Adam many", {many}, {optim::AdamOptions{.lr = 0.01, .amsgrad = true}}, DType::Float64);
  compareSteps("RMSprop many", {many},
               {optim::RMSpropOptions{.lr = 0.01, .momentum = 0.9, .centered = true}}, DType::Float32);
  // More 64 Ki-element chunks than one launch's blocks: the second tensor's
  // chunks continue in a second launch.
  compareSteps("SGD chunks", {{{11000000}, {11000000}, {5}}}, {optim::SGDOptions{.lr = 0.1, .momentum = 0.9}},
               DType::Float32, 2);
}

TEST_CASE("contiguous CUDA parameters at unaligned offsets take the fused scalar loop") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::Float64, DType::Float32}) {
    INFO(dtypeName(dtype));
    // Views one element into their buffers: contiguous, not 16-byte aligned.
    const int64_t n = 70001;
    Tensor cpuBase = randomTensor({n + 1}, dtype, 5);
    Tensor gpuBase = cpuBase.to(kGpu);
    std::vector<Tensor> cpuP = {cpuBase.narrow(0, 1, n)}, gpuP = {gpuBase.narrow(0, 1, n)};
    REQUIRE(gpuP[0].isContiguous());
    std::vector<optim::ParamState> cpuState(1), gpuState(1);
    const optim::AdamOptions o{.lr = 0.01, .weightDecay = 0.01, .amsgrad = true};
    for (int k = 0; k < 3; ++k) {
      Tensor gBase = randomTensor({n + 1}, dtype, 90 + k);
      optim::adam(cpuP, {gBase.narrow(0, 1, n)}, cpuState, o);
      optim::adam(gpuP, {gBase.to(kGpu).narrow(0, 1, n)}, gpuState, o);
      checkMatches("step " + std::to_string(k), gpuP[0], cpuP[0], defaultTolerance(dtype));
      checkMatches("exp_avg_sq", gpuState[0].at("exp_avg_sq"), cpuState[0].at("exp_avg_sq"), defaultTolerance(dtype));
    }
    checkMatches("the element before the view", gpuBase.narrow(0, 0, 1), cpuBase.narrow(0, 0, 1), {0, 0});
  }
}

TEST_CASE("strided and 16-bit CUDA parameters take the tensor-op path and match the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    INFO(dtypeName(dtype));
    Tensor base = randomTensor({6, 10}, dtype, 3);
    Tensor cpuP = base.clone().t();  // non-contiguous views
    Tensor gpuP = base.to(kGpu).t();
    optim::Adam cpu({cpuP}, {.lr = 0.01, .weightDecay = 0.1});
    optim::Adam gpu({gpuP}, {.lr = 0.01, .weightDecay = 0.1});
    for (int k = 0; k < 3; ++k) {
      Tensor g = randomTensor({10, 6}, dtype, 40 + k);
      cpu.step({g});
      gpu.step({g.to(kGpu)});
      checkMatches("step " + std::to_string(k), gpuP, cpuP, defaultTolerance(dtype));
    }
  }
}

TEST_CASE("GradScaler unscales CUDA gradients and finds inf and NaN on the device") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::Float32, DType::Float64, DType::Float16}) {
    INFO(dtypeName(dtype));
    std::vector<Shape> shapes = {{5, 7}, {0}, {200000}, {3}};
    std::vector<Tensor> cpuP = randomParams(shapes, dtype, 11);
    std::vector<Tensor> gpuP = onDevice(cpuP, kGpu);
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor g = randomTensor(shapes[i], dtype, 50 + i, -1000, 1000);
      cpuP[i].setGrad(g);
      gpuP[i].setGrad(g.to(kGpu));
    }
    nn::GradScaler cpuScaler({.initScale = 1024.0});
    nn::GradScaler gpuScaler({.initScale = 1024.0});
    cpuScaler.unscale_(cpuP);
    gpuScaler.unscale_(gpuP);
    for (size_t i = 0; i < shapes.size(); ++i) {
      checkMatches("grad " + std::to_string(i), gpuP[i].grad(), cpuP[i].grad(), {0, 0});
    }
    cpuScaler.update();
    gpuScaler.update();
    CHECK(gpuScaler.getScale() == cpuScaler.getScale());
    CHECK(gpuScaler.growthTracker() == 1);

    // One non-finite element in the middle of the large gradient: the step is
    // skipped, the parameters stay and the scale backs off.
    for (double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
      std::vector<Tensor> params = onDevice(randomParams(shapes, dtype, 21), kGpu);
      std::vector<Tensor> before;
      for (size_t i = 0; i < shapes.size(); ++i) {
        Tensor g = randomTensor(shapes[i], dtype, 60 + i);
        if (i == 2) {
          std::vector<double> v = g.toVector<double>();
          v[123457] = bad;
          g = fromVector(v, shapes[i]).to(dtype);
        }
        params[i].setGrad(g.to(kGpu));
        before.push_back(params[i].to(Device::cpu()));
      }
      optim::SGD opt(params, {.lr = 0.1});
      nn::GradScaler scaler({.initScale = 8.0});
      CHECK_FALSE(scaler.step(opt));
      scaler.update();
      CHECK(scaler.getScale() == 4.0);
      for (size_t i = 0; i < shapes.size(); ++i) checkMatches("kept " + std::to_string(i), params[i], before[i], {0, 0});
    }
  }
}

TEST_CASE("clipGradNorm_ reduces CUDA gradients on the device as the CPU does") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::Float64, DType::Float32}) {
    for (double normType : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
      INFO(dtypeName(dtype) << " norm " << normType);
      std::vector<Shape> shapes = {{9, 4}, {0, 3}, {150000}, {1}};
      std::vector<Tensor> cpuP = randomParams(shapes, dtype, 31);
      std::vector<Tensor> gpuP = onDevice(cpuP, kGpu);
      for (size_t i = 0; i < shapes.size(); ++i) {
        Tensor g = randomTensor(shapes[i], dtype, 80 + i);
        cpuP[i].setGrad(g);
        gpuP[i].setGrad(g.to(kGpu));
      }
      const double cpuTotal = nn::clipGradNorm_(cpuP, 0.5, normType);
      const double gpuTotal = nn::clipGradNorm_(gpuP, 0.5, normType);
      const double rtol = dtype == DType::Float64 ? 1e-10 : 1e-5;
      CHECK(std::abs(gpuTotal - cpuTotal) <= rtol * cpuTotal);
      for (size_t i = 0; i < shapes.size(); ++i) {
        checkMatches("grad " + std::to_string(i), gpuP[i].grad(), cpuP[i].grad(), defaultTolerance(dtype));
      }
    }
  }
}
