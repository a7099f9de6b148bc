// Losses on CUDA against the CPU kernels (tests/cuda_compare.h): nllLoss,
// crossEntropy and mseLoss with every reduction, ignored targets, spatial
// dimensions, 1-D inputs, non-contiguous inputs, forward and backward, and
// the IndexError of an out-of-range target.
#include <cmath>
#include <string>

#include "cuda_compare.h"
#include "tensor/ops.h"
#include "weft_test.h"

using namespace weft;
using namespace weft::testing;

namespace {

const char* reductionName(Reduction r) {
  switch (r) {
    case Reduction::None: return "none";
    case Reduction::Mean: return "mean";
    case Reduction::Sum: return "sum";
  }
  return "?";
}

// Int64 targets in [0, C) of `shape`, every third one (by flat position,
// from `ignoreFrom`) set to ignoreIndex when ignoreFrom >= 0.
Tensor targets(Shape shape, int64_t C, uint64_t seed, int64_t ignoreFrom = -1, int64_t ignoreIndex = -100) {
  Generator g(seed);
  Tensor t = randint(0, C, std::move(shape), {.dtype = DType::Int64}, &g);
  if (ignoreFrom < 0) return t;
  std::vector<int64_t> h = t.toVector<int64_t>();
  for (size_t i = static_cast<size_t>(ignoreFrom); i < h.size(); i += 3) h[i] = ignoreIndex;
  return fromVector(h, t.shape());
}

std::string lossCase(const char* op, const Shape& s, DType dt, Reduction r, const std::string& extra = "") {
  return detail::concat(op, " ", s, " ", dtypeName(dt), " reduction ", reductionName(r), " ", extra);
}

const std::vector<Reduction> kReductions = {Reduction::None, Reduction::Mean, Reduction::Sum};

}  // namespace

TEST_CASE("nllLoss matches the CPU for every reduction, with ignored targets and spatial dims") {
  WEFT_SKIP_WITHOUT_CUDA();
  struct Case {
    Shape input;
    Shape target;
  };
  const std::vector<Case> cases = {{{37, 11}, {37}}, {{5, 7, 3, 4}, {5, 3, 4}}, {{13}, {}}, {{1, 1}, {1}},
                                   {{0, 4}, {0}},    {{64, 3000}, {64}}};
  uint64_t seed = 1;
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
    for (const Case& c : cases) {
      const int64_t C = c.input.size() == 1 ? c.input[0] : c.input[1];
      for (Reduction r : kReductions) {
        for (int64_t ignoreFrom : {int64_t(-1), int64_t(1)}) {
          if (r == Reduction::Mean && c.input[0] == 0) continue;  // NaN on both devices
          Tensor x = randomTensor(c.input, dt, seed++, -3, 3);
          Tensor t = targets(c.target, C, seed++, ignoreFrom);
          const std::string extra = ignoreFrom < 0 ? "" : "with ignored";
          compareWithCpu(lossCase("nllLoss", c.input, dt, r, extra), {x, t}, [&](const std::vector<Tensor>& v) {
            return nllLoss(logSoftmax(v[0], c.input.size() == 1 ? 0 : 1), v[1], r);
          });
          compareWithCpu(lossCase("crossEntropy", c.input, dt, r, extra), {x, t},
                         [&](const std::vector<Tensor>& v) { return crossEntropy(v[0], v[1], r); });
        }
      }
    }
  }
}

TEST_CASE("crossEntropy of non-contiguous logits and a custom ignoreIndex matches the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::Float64, DType::Float32}) {
    Tensor x = randomTensor({9, 40}, dt, 20, -4, 4);
    Tensor t = targets({40}, 9, 21, 0, 3);  // class 3 doubles as the ignored index
    Tensor t8 = targets({40}, 8, 21, 0, 3);
    for (Reduction r : kReductions) {
      compareWithCpu(lossCase("crossEntropy t()", {40, 9}, dt, r), {x, t},
                     [&](const std::vector<Tensor>& v) { return crossEntropy(v[0].t(), v[1], r, 3); });
      compareWithCpu(lossCase("nllLoss narrow", {40, 8}, dt, r), {x, t8}, [&](const std::vector<Tensor>& v) {
        return nllLoss(logSoftmax(v[0].t().narrow(1, 1, 8), 1), v[1], r, 3);
      });
    }
    // Large class count and spatial positions: the block-per-row backward paths.
    Tensor big = randomTensor({3, 5000}, dt, 22, -4, 4);
    compareWithCpu("crossEntropy wide", {big, targets({3}, 5000, 23)},
                   [](const std::vector<Tensor>& v) { return crossEntropy(v[0], v[1]); });
    Tensor spatial = randomTensor({2, 5, 1100}, dt, 24, -4, 4);
    compareWithCpu("crossEntropy spatial wide", {spatial, targets({2, 1100}, 5, 25, 2)},
                   [](const std::vector<Tensor>& v) { return crossEntropy(v[0], v[1], Reduction::Sum); });
  }
}

TEST_CASE("a loss whose targets are all ignored is NaN (mean) or 0 (sum) on the device as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tensor x = randomTensor({4, 6}, DType::Float32, 30);
  Tensor t = full({4}, -100, {.dtype = DType::Int64});
  Tensor d = x.to(Device::cuda(0)), dt = t.to(Device::cuda(0));
  CHECK(std::isnan(crossEntropy(d, dt).to(Device::cpu()).item<float>()));
  CHECK(std::isnan(crossEntropy(x, t).item<float>()));
  CHECK(crossEntropy(d, dt, Reduction::Sum).to(Device::cpu()).item<float>() == 0.0f);
  Tensor p = d.clone().requiresGrad_();
  crossEntropy(p, dt, Reduction::Sum).backward();
  CHECK(sum(abs(p.grad().to(Device::cpu()))).item<float>() == 0.0f);
}

TEST_CASE("an out-of-range target is the CPU's IndexError on the device too") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tensor x = randomTensor({6, 5}, DType::Float32, 40);
  for (int64_t bad : {int64_t(5), int64_t(-1), int64_t(1000)}) {
    std::vector<int64_t> h = {0, 1, 2, bad, 4, bad};
    Tensor t = fromVector(h);
    std::string cpuMessage, gpuMessage;
    try {
      (void)crossEntropy(x, t);
    } catch (const IndexError& e) {
      cpuMessage = e.what();
    }
    try {
      (void)crossEntropy(x.to(Device::cuda(0)), t.to(Device::cuda(0)));
    } catch (const IndexError& e) {
      gpuMessage = e.what();
    }
    CHECK(!cpuMessage.empty());
    CHECK(gpuMessage == cpuMessage);
    CHECK_THROWS_AS((void)nllLoss(x.to(Device::cuda(0)), t.to(Device::cuda(0))), IndexError);
  }
  // Input and target on different devices.
  CHECK_THROWS_AS((void)crossEntropy(x.to(Device::cuda(0)), targets({6}, 5, 41)), InvalidArgumentError);
}

TEST_CASE("mseLoss matches the CPU for every reduction, gradients of both operands") {
  WEFT_SKIP_WITHOUT_CUDA();
  const std::vector<Shape> shapes = {{37, 11}, {1}, {0, 3}, {3, 1 << 18}, {5, 7, 3}};
  uint64_t seed = 50;
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
    for (const Shape& s : shapes) {
      for (Reduction r : kReductions) {
        if (r == Reduction::Mean && s[0] * (s.size() > 1 ? s[1] : 1) == 0) continue;  // NaN on both devices
        compareWithCpu(lossCase("mseLoss", s, dt, r), {randomTensor(s, dt, seed++), randomTensor(s, dt, seed++)},
                       [&](const std::vector<Tensor>& v) { return mseLoss(v[0], v[1], r); });
      }
    }
    compareWithCpu(lossCase("mseLoss t()", {20, 30}, dt, Reduction::Mean),
                   {randomTensor({20, 30}, dt, 60), randomTensor({30, 20}, dt, 61)},
                   [](const std::vector<Tensor>& v) { return mseLoss(v[0].t(), v[1]); });
  }
}
