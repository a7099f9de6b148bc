// layerNorm: values and all three gradients against PyTorch 1.13
// (tests/tensor/fixtures/gen_layer_norm_cases.py writes the .inc file),
// finite differences, thread-count independence and the typed errors.
#include <cmath>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "kernels/cpu/parallel.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::gradcheck;
using weft::testing::kF64;

namespace {

struct LayerNormCase {
  const char* name;
  DType dtype;
  Shape xShape, normalizedShape;
  bool weight, bias;
  double offset, eps;
  std::vector<double> y, dx, dweight, dbias;
};

#include "fixtures/layer_norm_cases.inc"

// offset + scale * sin(0.37 * i + phase) in float64, then rounded to dtype: the
// inputs gen_layer_norm_cases.py computes.
Tensor wave(Shape shape, double phase, double scale, double offset, DType dtype) {
  std::vector<double> v(static_cast<size_t>(shapeNumel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = offset + scale * std::sin(0.37 * static_cast<double>(i) + phase);
  return fromVector(v, std::move(shape)).to(dtype);
}

// Every element within rtol of the reference, or within atol where the
// reference is near zero.
void checkValues(const Tensor& got, const std::vector<double>& want, double rtol, double atol) {
  REQUIRE(got.defined());
  std::vector<double> g = got.toVector<double>();
  REQUIRE(g.size() == want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": got " << g[i] << ", PyTorch " << want[i]);
    CHECK(std::abs(g[i] - want[i]) <= atol + rtol * std::abs(want[i]));
  }
}

}  // namespace

TEST_CASE("layerNorm matches PyTorch's values and gradients in float64 and float32") {
  for (const LayerNormCase& c : kLayerNormCases) {
    CAPTURE(std::string(c.name));
    CAPTURE(std::string(dtypeName(c.dtype)));
    const bool f64 = c.dtype == DType::Float64;
    const double rtol = f64 ? 1e-10 : 1e-5, atol = f64 ? 1e-12 : 1e-6;
    Tensor x = wave(c.xShape, 0.1, 1.5, c.offset, c.dtype).requiresGrad_();
    Tensor w = c.weight ? wave(c.normalizedShape, 0.7, 0.8, 1.0, c.dtype).requiresGrad_() : Tensor();
    Tensor b = c.bias ? wave(c.normalizedShape, 1.3, 0.5, 0.0, c.dtype).requiresGrad_() : Tensor();
    Tensor g = wave(c.xShape, 0.4, 1.0, 0.0, c.dtype);
    Tensor y = layerNorm(x, c.normalizedShape, w, b, c.eps);
    CHECK(y.dtype() == c.dtype);
    CHECK(y.shape() == c.xShape);
    checkValues(y, c.y, rtol, atol);
    sum(mul(y, g)).backward();
    checkValues(x.grad(), c.dx, rtol, atol);
    if (c.weight) checkValues(w.grad(), c.dweight, rtol, atol);
    if (c.bias) checkValues(b.grad(), c.dbias, rtol, atol);
  }
}

TEST_CASE("layerNorm passes gradcheck for x, weight and bias, alone and together") {
  Generator gen(5);
  Tensor x = randn({3, 2, 5}, kF64, &gen), w = randn({2, 5}, kF64, &gen), b = randn({2, 5}, kF64, &gen);
  CHECK(gradcheck([](const std::vector<Tensor>& in) { return layerNorm(in[0], {2, 5}, in[1], in[2]); }, {x, w, b}));
  CHECK(gradcheck([](const std::vector<Tensor>& in) { return layerNorm(in[0], {5}); }, {x}));
  CHECK(gradcheck([](const std::vector<Tensor>& in) { return layerNorm(in[0], {5}, in[1], {}, 0.1); },
                  {x, randn({5}, kF64, &gen)}));
  // Only weight and bias need gradients; x (a view, non-contiguous) does not.
  Tensor xt = randn({5, 4}, kF64, &gen).t();
  CHECK(gradcheck(
      [xt](const std::vector<Tensor>& in) { return layerNorm(xt, {5}, in[0], in[1]); },
      {randn({5}, kF64, &gen), randn({5}, kF64, &gen)}));
  // Only the bias: its gradient is g summed over the rows.
  CHECK(gradcheck([xt](const std::vector<Tensor>& in) { return layerNorm(xt, {5}, {}, in[0]); },
                  {randn({5}, kF64, &gen)}));
}

TEST_CASE("layerNorm normalises each row to mean 0 and variance var / (var + eps)") {
  // Rows long enough to take every vector path, and a mean of 1e6 against a
  // spread of 1 (a one-pass E[x^2] - E[x]^2 without the shift would lose it).
  Generator gen(11);
  for (int64_t n : {2, 3, 8, 17, 64, 259}) {
    CAPTURE(n);
    Tensor x = add(randn({6, n}, kF64, &gen), 1e6);
    Tensor y = layerNorm(x, {n}, {}, {}, 0.0);
    std::vector<double> xv = x.toVector<double>(), yv = y.toVector<double>();
    for (int64_t r = 0; r < 6; ++r) {
      double mean = 0, var = 0, ym = 0, yv2 = 0;
      for (int64_t j = 0; j < n; ++j) mean += xv[r * n + j] / static_cast<double>(n);
      for (int64_t j = 0; j < n; ++j) var += (xv[r * n + j] - mean) * (xv[r * n + j] - mean) / static_cast<double>(n);
      for (int64_t j = 0; j < n; ++j) {
        const double want = var == 0 ? 0.0 : (xv[r * n + j] - mean) / std::sqrt(var);
        CHECK(yv[r * n + j] == doctest::Approx(want).epsilon(1e-7));
        ym += yv[r * n + j];
        yv2 += yv[r * n + j] * yv[r * n + j];
      }
      CHECK(std::abs(ym) < 1e-8 * static_cast<double>(n));
      if (n > 1) CHECK(yv2 / static_cast<double>(n) == doctest::Approx(1.0).epsilon(1e-8));
    }
  }
}

TEST_CASE("layerNorm gives the same bits with one thread or several") {
  const int saved = kernels::cpu::numThreads();
  for (DType dt : {DType::Float32, DType::Float64}) {
    auto run = [&](int threads) {
      kernels::cpu::setNumThreads(threads);
      Generator g(3);
      Tensor x = randn({300, 257}, {.dtype = dt}, &g).requiresGrad_();
      Tensor w = randn({257}, {.dtype = dt}, &g).requiresGrad_();
      Tensor b = randn({257}, {.dtype = dt}, &g).requiresGrad_();
      Tensor go = randn({300, 257}, {.dtype = dt}, &g);
      Tensor y = layerNorm(x, {257}, w, b);
      sum(mul(y, go)).backward();
      return std::vector<std::vector<double>>{y.toVector<double>(), x.grad().toVector<double>(),
                                              w.grad().toVector<double>(), b.grad().toVector<double>()};
    };
    CAPTURE(std::string(dtypeName(dt)));
    auto one = run(1), two = run(2), three = run(3);
    kernels::cpu::setNumThreads(saved);
    CHECK(one == two);
    CHECK(one == three);
  }
}

TEST_CASE("layerNorm's weight gradient over many rows matches a float64 reference in float32") {
  // Rows split over several chunks; each chunk's sums are float64.
  Generator gen(8);
  Tensor x = randn({1000, 96}, {}, &gen), go = randn({1000, 96}, {}, &gen);
  Tensor w = ones({96}).requiresGrad_(), b = zeros({96}).requiresGrad_();
  sum(mul(layerNorm(x, {96}, w, b), go)).backward();
  Tensor w64 = ones({96}, kF64).requiresGrad_(), b64 = zeros({96}, kF64).requiresGrad_();
  sum(mul(layerNorm(x.to(DType::Float64), {96}, w64, b64), go.to(DType::Float64))).backward();
  checkValues(w.grad(), w64.grad().toVector<double>(), 1e-5, 1e-5);
  checkValues(b.grad(), b64.grad().toVector<double>(), 1e-6, 1e-6);
}

TEST_CASE("layerNorm of empty inputs gives empty outputs and zero weight gradients") {
  Tensor x = zeros({0, 4}).requiresGrad_();
  Tensor w = ones({4}).requiresGrad_(), b = zeros({4}).requiresGrad_();
  Tensor y = layerNorm(x, {4}, w, b);
  CHECK(y.shape() == Shape{0, 4});
  sum(y).backward();
  CHECK(w.grad().toVector<float>() == std::vector<float>(4, 0.0f));
  CHECK(b.grad().toVector<float>() == std::vector<float>(4, 0.0f));
  CHECK(x.grad().shape() == Shape{0, 4});
}

TEST_CASE("layerNorm names the op, the shapes and the value on bad input") {
  Tensor x = zeros({2, 3, 4});
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string("no InvalidArgumentError");
  };
  CHECK(message([&] { layerNorm(x, {}); }).find("layerNorm: normalizedShape must have at least one dimension") !=
        std::string::npos);
  CHECK(message([&] { layerNorm(x, {3}); })
            .find("layerNorm: input of shape [2, 3, 4] does not end in normalizedShape [3]") != std::string::npos);
  CHECK(message([&] { layerNorm(x, {1, 2, 3, 4}); }).find("does not end in normalizedShape [1, 2, 3, 4]") !=
        std::string::npos);
  CHECK(message([&] { layerNorm(x, {3, 4}, zeros({4})); })
            .find("layerNorm: weight of shape [4] must equal normalizedShape [3, 4]") != std::string::npos);
  CHECK(message([&] { layerNorm(x, {4}, {}, zeros({2})); }).find("layerNorm: bias of shape [2]") != std::string::npos);
  CHECK(message([&] { layerNorm(x, {4}, zeros({4}, kF64)); }).find("layerNorm") != std::string::npos);
  CHECK(message([&] { layerNorm(x, {4}, {}, {}, -1e-5); }).find("layerNorm: eps must be non-negative, got -1e-05") !=
        std::string::npos);
  CHECK(message([&] { layerNorm(x, {4}, {}, {}, std::nan("")); }).find("layerNorm: eps must be non-negative") !=
        std::string::npos);
  CHECK(message([&] { layerNorm(zeros({2, 4}, {.dtype = DType::Int64}), {4}); }).find("layerNorm") !=
        std::string::npos);
}
