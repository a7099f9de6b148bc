// The CUDA comparison harness (in the manner of ggml's test-backend-ops):
// an op runs on CPU inputs and on the same inputs copied to cuda:0, and the
// outputs, then the gradients of every floating input, must agree within a
// tolerance for the dtype. Views taken inside the op (transpose, slice,
// expand) run on both devices, so non-contiguous inputs are covered by
// writing them into `f`.
//
//   compareWithCpu("gelu", {randomTensor({7, 33}, DType::Float32, 1)},
//                  [](const std::vector<Tensor>& x) { return gelu(x[0].t()); });
//
// Failures are reported with CHECK (all of them, not only the first), each
// naming the case, the output or gradient, the largest absolute difference
// and where it is.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tensor/generator.h"
#include "tensor/ops.h"
#include "weft_test.h"

namespace weft::testing {

struct Tolerance {
  double rtol;
  double atol;
};

// Documented tolerances: float64 agrees to rounding; float32 to the
// reassociation of sums (GPU reductions add in another order); the 16-bit
// types to a few units in their last place.
inline Tolerance defaultTolerance(DType t) {
  switch (t) {
    case DType::Float64: return {1e-10, 1e-12};
    case DType::Float32: return {2e-4, 2e-5};
    case DType::BFloat16: return {3e-2, 3e-2};
    case DType::Float16: return {5e-3, 5e-3};
    default: return {0, 0};
  }
}

// Uniform in [-1, 1) of `shape` and `dtype` (integers: [0, 10)), seeded.
inline Tensor randomTensor(Shape shape, DType dtype, uint64_t seed, double low = -1, double high = 1) {
  Generator g(seed);
  if (isIntegral(dtype)) return randint(0, 10, std::move(shape), {.dtype = dtype}, &g);
  if (dtype == DType::Bool) return randint(0, 2, std::move(shape), {.dtype = DType::Int64}, &g).to(DType::Bool);
  Tensor t = uniform(std::move(shape), low, high, {.dtype = isFloating(dtype) && elementSize(dtype) == 8 ? DType::Float64 : DType::Float32}, &g);
  return t.dtype() == dtype ? t : t.to(dtype);
}

// Largest |a - b| over elements (as float64, on the CPU) and its flat index;
// NaN where one side is NaN and the other not.
inline std::pair<double, int64_t> maxAbsDiff(const Tensor& a, const Tensor& b) {
  auto x = a.to(Device::cpu()).to(DType::Float64).contiguous().toVector<double>();
  auto y = b.to(Device::cpu()).to(DType::Float64).contiguous().toVector<double>();
  double worst = 0;
  int64_t at = -1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) && std::isnan(y[i])) continue;
    double d = std::isnan(x[i]) || std::isnan(y[i]) ? INFINITY : std::abs(x[i] - y[i]);
    if (std::isinf(x[i]) && x[i] == y[i]) d = 0;
    if (d > worst || at < 0) {
      worst = d;
      at = static_cast<int64_t>(i);
    }
  }
  return {worst, at};
}

// CHECKs that `actual` (any device) matches `expected` (CPU) elementwise:
// |a - e| <= atol + rtol * |e|, same shape and dtype.
inline void checkMatches(const std::string& what, const Tensor& actual, const Tensor& expected, Tolerance tol) {
  INFO(what);
  CHECK(actual.shape() == expected.shape());
  CHECK(actual.dtype() == expected.dtype());
  if (actual.shape() != expected.shape()) return;
  Tensor a = actual.to(Device::cpu()).to(DType::Float64);
  Tensor e = expected.to(DType::Float64);
  if (isIntegral(expected.dtype()) || expected.dtype() == DType::Bool) tol = {0, 0};
  bool ok = a.numel() == 0 || allclose(a, e, tol.rtol, tol.atol);
  auto [d, at] = maxAbsDiff(a, e);
  INFO("largest |difference| " << d << " at flat index " << at << " (rtol " << tol.rtol << ", atol " << tol.atol << ")");
  CHECK(ok);
}

struct CompareOptions {
  bool backward = true;      // compare input gradients too (floating inputs)
  double rtolScale = 1;      // multiplies the default tolerance
  double atolScale = 1;
};

// Runs f on `inputs` (CPU) and on their copies on cuda:0 and compares the
// outputs, then the gradients of floating inputs through sum(out * w) for a
// fixed random w.
inline void compareWithCpu(const std::string& name, const std::vector<Tensor>& inputs,
                           const std::function<Tensor(const std::vector<Tensor>&)>& f, CompareOptions o = {}) {
  std::vector<Tensor> cpu, gpu;
  for (const Tensor& x : inputs) {
    Tensor c = x.detach().clone();
    Tensor d = x.detach().to(Device::cuda(0));
    if (o.backward && isFloating(x.dtype())) {
      c.requiresGrad_();
      d.requiresGrad_();
    }
    cpu.push_back(c);
    gpu.push_back(d);
  }
  Tensor outCpu = f(cpu);
  Tensor outGpu = f(gpu);
  CHECK_MESSAGE(outGpu.device() == Device::cuda(0), name, ": output not on cuda:0");
  Tolerance tol = defaultTolerance(outCpu.dtype());
  tol.rtol *= o.rtolScale;
  tol.atol *= o.atolScale;
  checkMatches(name + ": output", outGpu, outCpu, tol);
  if (!o.backward || !isFloating(outCpu.dtype()) || !outCpu.requiresGrad()) return;
  Tensor w = randomTensor(outCpu.shape(), outCpu.dtype(), 12345);
  mul(outCpu, w).sum().backward();
  mul(outGpu, w.to(Device::cuda(0))).sum().backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu[i].requiresGrad()) continue;
    const Tensor gc = cpu[i].grad(), gg = gpu[i].grad();
    CHECK_MESSAGE(gc.defined() == gg.defined(), name, ": gradient of input ", i, " defined on one device only");
    if (!gc.defined() || !gg.defined()) continue;
    Tolerance gt = defaultTolerance(gc.dtype());
    gt.rtol *= o.rtolScale;
    gt.atol *= o.atolScale;
    checkMatches(name + ": gradient of input " + std::to_string(i), gg, gc, gt);
  }
}

}  // namespace weft::testing
