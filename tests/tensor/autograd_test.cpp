#include "gradcheck.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::gradcheck;
using weft::testing::kF64;

TEST_SUITE_BEGIN("autograd");

TEST_CASE("a leaf's gradient accumulates across two backward passes") {
  Tensor x = fromVector<float>({1, 2, 3}).requiresGrad_();
  mul(x, x).sum().backward();
  mul(x, x).sum().backward();
  CHECK(x.grad().toVector<float>() == std::vector<float>{4, 8, 12});
}

TEST_CASE("backward through a freed graph is a clear error") {
  Tensor x = fromVector<double>({1, 2}).requiresGrad_();
  Tensor y = mul(x, x).sum();
  y.backward();
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("backward through the graph a second time"), StateError);
}

TEST_CASE("retainGraph allows a second backward") {
  Tensor x = fromVector<double>({1, 2}).requiresGrad_();
  Tensor y = mul(x, x).sum();
  y.backward(Tensor(), true);
  y.backward();
  CHECK(x.grad().toVector<double>() == std::vector<double>{4, 8});
}

TEST_CASE("autograd::grad returns gradients without touching .grad") {
  Tensor x = fromVector<double>({1, 2, 3}).requiresGrad_();
  Tensor w = fromVector<double>({4, 5, 6}).requiresGrad_();
  Tensor y = mul(x, w).sum();
  auto g = autograd::grad({y}, {x, w});
  CHECK(g[0].toVector<double>() == std::vector<double>{4, 5, 6});
  CHECK(g[1].toVector<double>() == std::vector<double>{1, 2, 3});
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
}

TEST_CASE("autograd::grad of an unused input is an error unless allowed") {
  Tensor x = fromVector<double>({1}).requiresGrad_();
  Tensor z = fromVector<double>({1}).requiresGrad_();
  Tensor y = mul(x, x).sum();
  CHECK_THROWS_AS(autograd::grad({y}, {z}, {}, true), InvalidArgumentError);
  auto g = autograd::grad({y}, {z}, {}, false, true);
  CHECK_FALSE(g[0].defined());
}

TEST_CASE("no_grad guard stops recording") {
  Tensor x = ones({2}).requiresGrad_();
  Tensor y;
  {
    NoGradGuard ng;
    y = mul(x, x);
  }
  CHECK_FALSE(y.requiresGrad());
  CHECK(y.gradFn() == nullptr);
}

TEST_CASE("a tensor hook can replace the gradient flowing through it") {
  Tensor x = fromVector<double>({1, 2}).requiresGrad_();
  Tensor y = mul(x, 3.0);
  y.registerHook([](const Tensor& g) { return mul(g, 10.0); });
  y.sum().backward();
  CHECK(x.grad().toVector<double>() == std::vector<double>{30, 30});
}

TEST_CASE("a pre-hook on a leaf's accumulator sees each incoming gradient") {
  Tensor x = fromVector<double>({1, 2}).requiresGrad_();
  int calls = 0;
  x.gradAccumulator()->registerPreHook([&](std::vector<Tensor>& g) {
    ++calls;
    CHECK(g[0].toVector<double>() == std::vector<double>{2, 4});
  });
  mul(x, x).sum().backward();
  CHECK(calls == 1);
}

TEST_CASE("a post-hook on a node sees what it produced") {
  Tensor x = fromVector<double>({1, 2}).requiresGrad_();
  Tensor y = mul(x, x);
  std::vector<double> seen;
  y.gradFn()->registerPostHook([&](const std::vector<Tensor>& in, const std::vector<Tensor>&) {
    seen = in[0].toVector<double>();
  });
  y.sum().backward();
  CHECK(seen == std::vector<double>{1, 2});  // d(x*x)/d(first operand) = second operand
}

TEST_CASE("a tensor saved for backward and then modified in place is detected") {
  Tensor x = fromVector<double>({1, 2}).requiresGrad_();
  Tensor w = fromVector<double>({3, 4});
  Tensor y = mul(x, w).sum();
  w.add_(onesLike(w));
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("modified in place"), StateError);
}

TEST_CASE("in-place ops on a tensor that requires grad are refused outside no_grad") {
  Tensor x = ones({2}).requiresGrad_();
  CHECK_THROWS_AS(x.add_(ones({2})), InvalidArgumentError);
  NoGradGuard ng;
  x.add_(ones({2}));
  CHECK(x.toVector<float>() == std::vector<float>{2, 2});
}

TEST_CASE("a diamond graph sums the gradients of both paths") {
  Tensor x = fromVector<double>({2}).requiresGrad_();
  Tensor a = mul(x, 3.0), b = mul(x, x);
  add(a, b).sum().backward();
  CHECK(x.grad().item<double>() == doctest::Approx(3 + 4));
}

TEST_CASE("broadcasting binary ops pass gradcheck") {
  CHECK(gradcheck([](const auto& in) { return add(in[0], in[1]); }, {randn({3, 4}, kF64), randn({4}, kF64)}));
  CHECK(gradcheck([](const auto& in) { return sub(in[0], in[1], 0.5); }, {randn({3, 1}, kF64), randn({1, 4}, kF64)}));
  CHECK(gradcheck([](const auto& in) { return mul(in[0], in[1]); }, {randn({2, 3, 4}, kF64), randn({3, 1}, kF64)}));
  CHECK(gradcheck([](const auto& in) { return div(in[0], in[1]); },
                  {randn({3, 4}, kF64), add(rand({4}, kF64), 0.5)}));
  CHECK(gradcheck([](const auto& in) { return maximum(in[0], in[1]); }, {randn({3, 4}, kF64), randn({3, 4}, kF64)}));
  CHECK(gradcheck([](const auto& in) { return minimum(in[0], in[1]); }, {randn({3, 4}, kF64), randn({4}, kF64)}));
  CHECK(gradcheck([](const auto& in) { return pow(in[0], in[1]); },
                  {add(rand({3}, kF64), 0.5), randn({3}, kF64)}));
}

TEST_CASE("binary ops accept non-contiguous inputs") {
  Tensor a = randn({4, 3}, kF64).t();  // [3, 4], strides (1, 3)
  CHECK_FALSE(a.isContiguous());
  CHECK(gradcheck([](const auto& in) { return mul(in[0], in[1]); }, {a, randn({3, 4}, kF64)}));
}

TEST_CASE("unary ops pass gradcheck") {
  Tensor x = randn({3, 4}, kF64);
  Tensor pos = add(rand({3, 4}, kF64), 0.1);
  CHECK(gradcheck([](const auto& in) { return neg(in[0]); }, {x}));
  CHECK(gradcheck([](const auto& in) { return exp(in[0]); }, {x}));
  CHECK(gradcheck([](const auto& in) { return log(in[0]); }, {pos}));
  CHECK(gradcheck([](const auto& in) { return sqrt(in[0]); }, {pos}));
  CHECK(gradcheck([](const auto& in) { return abs(in[0]); }, {x}));
  CHECK(gradcheck([](const auto& in) { return pow(in[0], 3.0); }, {x}));
  CHECK(gradcheck([](const auto& in) { return pow(in[0], 0.5); }, {pos}));
  CHECK(gradcheck([](const auto& in) { return clamp(in[0], -0.5, 0.5); }, {x}));
  CHECK(gradcheck([](const auto& in) { return relu(in[0]); }, {x}));
  CHECK(gradcheck([](const auto& in) { return tanh(in[0]); }, {x}));
  CHECK(gradcheck([](const auto& in) { return sigmoid(in[0]); }, {x}));
  CHECK(gradcheck([](const auto& in) { return gelu(in[0]); }, {x}));
  CHECK(gradcheck([](const auto& in) { return 2.0 / in[0]; }, {pos}));
}

TEST_CASE("views pass gradcheck") {
  Tensor x = randn({2, 3, 4}, kF64);
  CHECK(gradcheck([](const auto& in) { return in[0].view({6, 4}); }, {x}));
  CHECK(gradcheck([](const auto& in) { return in[0].transpose(0, 2).reshape({-1}); }, {x}));
  CHECK(gradcheck([](const auto& in) { return in[0].permute({2, 0, 1}); }, {x}));
  CHECK(gradcheck([](const auto& in) { return in[0].narrow(1, 1, 2); }, {x}));
  CHECK(gradcheck([](const auto& in) { return in[0].select(2, -1); }, {x}));
  CHECK(gradcheck([](const auto& in) { return in[0].unsqueeze(1).expand({2, 5, 3, 4}); }, {x}));
  CHECK(gradcheck([](const auto& in) { return in[0].flatten(1); }, {x}));
  CHECK(gradcheck([](const auto& in) { return in[0].sum({0, 2}); }, {x}));
  CHECK(gradcheck([](const auto& in) { return in[0].mean({1}, true); }, {x}));
}

TEST_CASE("sum over leading, trailing and middle dims agrees with a manual sum") {
  Tensor x = arange(24, {.dtype = DType::Float64}).view({2, 3, 4});
  CHECK(x.sum({0}).toVector<double>()[0] == 0 + 12);
  CHECK(x.sum({2}).toVector<double>()[1] == 4 + 5 + 6 + 7);
  CHECK(x.sum({1}).toVector<double>()[0] == 0 + 4 + 8);
  CHECK(x.sum().item<double>() == 276);
  CHECK(x.transpose(0, 2).sum({0}).shape() == Shape{3, 2});
}

TEST_CASE("a queued callback runs after the pass and may hand a leaf a replacement gradient") {
  Tensor w = weft::fromVector(std::vector<float>{1.0f, 2.0f}).requiresGrad_();
  Tensor y = (w * w).sum();
  std::vector<std::string> order;
  // As DDP does: intercept the leaf's gradient, then hand over a different value after the pass.
  w.gradAccumulator()->registerPreHook([&](std::vector<Tensor>& grads) {
    order.push_back("hook");
    Tensor g = grads[0];
    grads[0] = Tensor();
    weft::autograd::queueCallback([&, g] {
      order.push_back("callback");
      weft::autograd::accumulateLeafGradient(w, g * 10.0);
    });
  });
  y.backward();
  REQUIRE(order.size() == 2);
  CHECK(order[0] == "hook");
  CHECK(order[1] == "callback");
  CHECK(w.grad().toVector<float>() == std::vector<float>{20.0f, 40.0f});
  CHECK_THROWS_AS(weft::autograd::queueCallback([] {}), weft::StateError);
  CHECK_THROWS_AS(weft::autograd::accumulateLeafGradient(w, w), weft::StateError);
}

TEST_SUITE_END();
