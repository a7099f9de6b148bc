// gradcheck: compares an op's backward against central finite differences in
// float64.
//
//   CHECK(gradcheck([](const std::vector<Tensor>& in) { return mul(in[0], in[1]); },
//                   {randn({3, 4}, f64), randn({4}, f64)}));
//
// The scalar checked is L = sum(f(inputs) * W) for a fixed random W, so one
// backward gives dL/dx for every input element, and each element is perturbed
// by ±eps to estimate the same derivative numerically. Inputs must be float64;
// they may be non-contiguous views (their gradients are checked by shape).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

#include "tensor/ops.h"

namespace weft::testing {

inline constexpr TensorOptions kF64{.dtype = DType::Float64};

inline bool gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs,
                      double eps = 1e-6, double atol = 1e-5, double rtol = 1e-3) {
  for (auto& in : inputs) {
    if (in.defined() && isFloating(in.dtype())) in = in.detach().requiresGrad_();
  }
  Tensor out = f(inputs);
  Generator g(99);
  Tensor w = randn(out.shape(), kF64, &g);
  auto scalar = [&](const std::vector<Tensor>& xs) {
    NoGradGuard ng;
    return sum(mul(f(xs), w)).item<double>();
  };
  std::vector<Tensor> diffInputs;
  for (const auto& in : inputs) {
    if (in.defined() && in.requiresGrad()) diffInputs.push_back(in);
  }
  std::vector<Tensor> analytic = autograd::grad({sum(mul(out, w))}, diffInputs, {}, false, true);
  bool ok = true;
  size_t k = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requiresGrad()) continue;
    Tensor base = inputs[i].detach();
    Tensor an = analytic[k++];
    std::vector<double> a = an.defined() ? an.toVector<double>() : std::vector<double>(base.numel(), 0.0);
    // Perturb a contiguous copy so that views of shared storage stay intact.
    Tensor flat = base.contiguous().clone();
    std::vector<double> vals = flat.toVector<double>();
    for (int64_t j = 0; j < flat.numel(); ++j) {
      auto eval = [&](double delta) {
        std::vector<double> v = vals;
        v[j] += delta;
        std::vector<Tensor> xs = inputs;
        xs[i] = fromVector(v, base.shape());
        return scalar(xs);
      };
      double num = (eval(eps) - eval(-eps)) / (2 * eps);
      if (std::abs(num - a[j]) > atol + rtol * std::abs(num)) {
        std::ostringstream os;
        os << "gradcheck: input " << i << " element " << j << ": analytic " << a[j] << " numeric " << num;
        MESSAGE(os.str());
        ok = false;
      }
    }
  }
  return ok;
}

}  // namespace weft::testing
