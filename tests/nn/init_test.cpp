#include <cmath>

#include "nn/nn.h"
#include "weft_test.h"

using namespace weft;
namespace init = weft::nn::init;

namespace {

struct Stats {
  double min, max, mean, var;
};

Stats stats(const Tensor& t) {
  std::vector<double> v = t.toVector<double>();
  Stats s{v[0], v[0], 0, 0};
  for (double x : v) {
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
    s.mean += x;
  }
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.var += (x - s.mean) * (x - s.mean);
  s.var /= static_cast<double>(v.size() - 1);
  return s;
}

// Checks that t looks like U(-bound, bound): inside the bounds, reaching close
// to both, with the uniform's mean 0 and variance bound²/3 (tolerances of
// several standard errors for n samples).
void checkUniform(const Tensor& t, double bound) {
  Stats s = stats(t);
  double n = static_cast<double>(t.numel());
  INFO("bound " << bound << " min " << s.min << " max " << s.max << " mean " << s.mean << " var " << s.var);
  CHECK(s.min >= -bound);
  CHECK(s.max <= bound);
  CHECK(s.min < -bound * (1 - 20 / n));
  CHECK(s.max > bound * (1 - 20 / n));
  double var = bound * bound / 3;
  CHECK(std::abs(s.mean) < 5 * std::sqrt(var / n));
  CHECK(std::abs(s.var - var) < 6 * var * std::sqrt(0.8 / n));
}

void checkNormal(const Tensor& t, double mean, double std) {
  Stats s = stats(t);
  double n = static_cast<double>(t.numel());
  INFO("mean " << s.mean << " var " << s.var);
  CHECK(std::abs(s.mean - mean) < 5 * std / std::sqrt(n));
  CHECK(std::abs(s.var - std * std) < 6 * std * std * std::sqrt(2.0 / n));
}

}  // namespace

TEST_CASE("Linear's default init is U(±1/sqrt(in)) for weight and bias") {
  nn::Linear fc(400, 300);
  checkUniform(fc.weight(), 1.0 / std::sqrt(400.0));
  checkUniform(fc.bias(), 1.0 / std::sqrt(400.0));
  CHECK(fc.weight().shape() == Shape{300, 400});
}

TEST_CASE("Conv2d's default init is U(±1/sqrt(in·kh·kw)) for weight and bias") {
  nn::Conv2d conv(32, 64, 3);
  double bound = 1.0 / std::sqrt(32.0 * 9.0);
  checkUniform(conv.weight(), bound);
  nn::Conv2d wide(1000, 2000, 1);
  checkUniform(wide.bias(), 1.0 / std::sqrt(1000.0));
}

TEST_CASE("LSTM's default init is U(±1/sqrt(hidden)) for every parameter") {
  nn::LSTM lstm(30, 100, 2);
  for (auto& [name, p] : lstm.namedParameters()) {
    INFO(name);
    if (p.numel() >= 10000) {
      checkUniform(p, 0.1);
    } else {
      Stats s = stats(p);
      CHECK(s.min >= -0.1);
      CHECK(s.max <= 0.1);
    }
  }
}

TEST_CASE("Embedding and EmbeddingBag weights are N(0, 1)") {
  nn::Embedding emb(1000, 64);
  checkNormal(emb.weight(), 0.0, 1.0);
  nn::EmbeddingBag bag(500, 100);
  checkNormal(bag.weight(), 0.0, 1.0);
}

TEST_CASE("init functions match torch.nn.init's bounds and gains") {
  CHECK(init::calculateGain(init::Nonlinearity::Relu) == doctest::Approx(std::sqrt(2.0)));
  CHECK(init::calculateGain(init::Nonlinearity::Tanh) == doctest::Approx(5.0 / 3.0));
  CHECK(init::calculateGain(init::Nonlinearity::LeakyRelu) == doctest::Approx(std::sqrt(2.0 / (1 + 0.0001))));
  CHECK(init::calculateGain(init::Nonlinearity::LeakyRelu, std::sqrt(5.0)) == doctest::Approx(std::sqrt(1.0 / 3)));
  CHECK(init::calculateGain(init::Nonlinearity::Sigmoid) == 1.0);
  CHECK(init::calculateFanInAndFanOut(empty({64, 32, 3, 3})) == std::pair<int64_t, int64_t>{288, 576});

  Tensor w = empty({200, 300}, {.dtype = DType::Float64});
  init::xavierUniform_(w, 2.0);
  checkUniform(w, 2.0 * std::sqrt(6.0 / 500.0));
  init::kaimingUniform_(w, 0.0, init::FanMode::FanOut, init::Nonlinearity::Relu);
  checkUniform(w, std::sqrt(2.0) * std::sqrt(3.0 / 200.0));
  init::kaimingNormal_(w, 0.0, init::FanMode::FanIn, init::Nonlinearity::Relu);
  checkNormal(w, 0.0, std::sqrt(2.0 / 300.0));
  init::xavierNormal_(w);
  checkNormal(w, 0.0, std::sqrt(2.0 / 500.0));
  init::normal_(w, 3.0, 0.5);
  checkNormal(w, 3.0, 0.5);
  init::uniform_(w, 1.0, 2.0);
  Stats s = stats(w);
  CHECK(s.min >= 1.0);
  CHECK(s.max <= 2.0);
  init::constant_(w, 0.25);
  CHECK(stats(w).min == 0.25);
  CHECK(stats(w).max == 0.25);
  init::zeros_(w);
  CHECK(stats(w).max == 0.0);
  init::ones_(w);
  CHECK(stats(w).min == 1.0);
}

TEST_CASE("init works on parameters that require grad and writes in place") {
  Tensor p = zeros({10, 10}).requiresGrad_();
  Tensor alias = p;
  init::uniform_(p, -1, 1);
  CHECK(stats(alias).max > 0);
  CHECK(p.isLeaf());
  CHECK(p.gradFn() == nullptr);
  Tensor strided = zeros({4, 6}).t();
  init::ones_(strided);
  CHECK(stats(strided).min == 1.0);
}

TEST_CASE("init with an explicit generator is reproducible") {
  Generator g1(42), g2(42);
  nn::Linear a(8, 8), b(8, 8);
  a.resetParameters(&g1);
  b.resetParameters(&g2);
  CHECK(a.weight().toVector<float>() == b.weight().toVector<float>());
  CHECK(a.bias().toVector<float>() == b.bias().toVector<float>());
}

TEST_CASE("init rejects what it cannot fill") {
  CHECK_THROWS_AS(init::uniform_(zeros({2}, {.dtype = DType::Int64})), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(init::kaimingUniform_(zeros({5})), doctest::Contains("at least 2 dimensions"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(init::xavierUniform_(zeros({5})), InvalidArgumentError);
  CHECK_THROWS_AS(init::uniform_(zeros({2}), 1.0, 0.0), InvalidArgumentError);
  CHECK_THROWS_AS(init::normal_(zeros({2}), 0.0, -1.0), InvalidArgumentError);
  CHECK_THROWS_AS(init::uniform_(Tensor()), InvalidArgumentError);
}
