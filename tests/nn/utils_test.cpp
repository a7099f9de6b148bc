#include <cmath>
#include <limits>

#include "nn/nn.h"
#include "weft_test.h"

using namespace weft;

TEST_CASE("clipGradNorm_ scales gradients to the maximum norm and returns the total") {
  Tensor a = zeros({2}).requiresGrad_(), b = zeros({1}).requiresGrad_(), c = zeros({3}).requiresGrad_();
  a.setGrad(fromVector<float>({3, 0}));
  b.setGrad(fromVector<float>({4}));
  double total = nn::clipGradNorm_({a, b, c}, 1.0);
  CHECK(total == doctest::Approx(5.0));
  CHECK(a.grad().toVector<float>()[0] == doctest::Approx(3.0 / (5.0 + 1e-6)));
  CHECK(b.grad().toVector<float>()[0] == doctest::Approx(4.0 / (5.0 + 1e-6)));
  // Already inside the bound: unchanged.
  CHECK(nn::clipGradNorm_({a, b}, 10.0) == doctest::Approx(1.0).epsilon(1e-5));
  CHECK(b.grad().toVector<float>()[0] == doctest::Approx(0.8).epsilon(1e-5));

  b.setGrad(fromVector<float>({-6}));
  CHECK(nn::clipGradNorm_({a, b}, 3.0, std::numeric_limits<double>::infinity()) == doctest::Approx(6.0));
  CHECK(b.grad().toVector<float>()[0] == doctest::Approx(-3.0).epsilon(1e-5));
  a.setGrad(fromVector<float>({1, 1}));
  b.setGrad(fromVector<float>({1}));
  CHECK(nn::clipGradNorm_({a, b}, 100.0, 1.0) == doctest::Approx(3.0));

  b.setGrad(fromVector<float>({std::numeric_limits<float>::infinity()}));
  CHECK_THROWS_WITH_AS(nn::clipGradNorm_({a, b}, 1.0, 2.0, true), doctest::Contains("total norm"),
                       InvalidArgumentError);
  CHECK(a.grad().toVector<float>() == std::vector<float>{1, 1});
}

TEST_CASE("clipGradValue_ clamps every gradient element") {
  Tensor a = zeros({3}).requiresGrad_();
  a.setGrad(fromVector<float>({-5, 0.5f, 2}));
  nn::clipGradValue_({a}, 1.0);
  CHECK(a.grad().toVector<float>() == std::vector<float>{-1, 0.5f, 1});
}

TEST_CASE("parametersToVector and vectorToParameters round-trip a model") {
  auto a = std::make_shared<nn::Linear>(3, 2), b = std::make_shared<nn::Linear>(3, 2);
  Tensor flat = nn::parametersToVector(a->parameters());
  CHECK(flat.shape() == Shape{8});
  nn::vectorToParameters(flat, b->parameters());
  CHECK(b->weight().toVector<float>() == a->weight().toVector<float>());
  CHECK(b->bias().toVector<float>() == a->bias().toVector<float>());
  CHECK(b->weight().requiresGrad());
  CHECK_THROWS_WITH_AS(nn::vectorToParameters(zeros({7}), b->parameters()),
                       doctest::Contains("the vector has 7 elements but the parameters have 8"), InvalidArgumentError);
}
