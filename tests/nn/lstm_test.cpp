#include "fixtures/lstm_fixture.h"
#include "nn/nn.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::expectClose;
namespace fx = weft::testing::lstm_fixture;

namespace {

std::shared_ptr<nn::LSTM> fixtureLstm() {
  auto lstm = std::make_shared<nn::LSTM>(fx::kInput, fx::kHidden, fx::kLayers);
  lstm->to(DType::Float64);
  nn::StateDict sd;
  for (const auto& p : fx::kParams) sd[p.name] = fromVector(p.values, p.shape);
  lstm->loadStateDict(sd);
  return lstm;
}

Tensor tensor(const std::vector<double>& v, Shape s) { return fromVector(v, std::move(s)); }

const Shape kSeqShape{fx::kSteps, fx::kBatch, fx::kInput};
const Shape kOutShape{fx::kSteps, fx::kBatch, fx::kHidden};
const Shape kStateShape{fx::kLayers, fx::kBatch, fx::kHidden};

}  // namespace

TEST_CASE("a 2-layer LSTM matches PyTorch's output, final state and gradients") {
  auto lstm = fixtureLstm();
  Tensor x = tensor(fx::kInputValues, kSeqShape).requiresGrad_();
  Tensor h0 = tensor(fx::kH0, kStateShape).requiresGrad_();
  Tensor c0 = tensor(fx::kC0, kStateShape).requiresGrad_();
  auto [out, state] = lstm->forward(x, {h0, c0});
  expectClose(out, tensor(fx::kOutput, kOutShape), 1e-10, 1e-12);
  expectClose(state.h, tensor(fx::kHn, kStateShape), 1e-10, 1e-12);
  expectClose(state.c, tensor(fx::kCn, kStateShape), 1e-10, 1e-12);

  Tensor loss = add(add(mul(out, tensor(fx::kWOut, kOutShape)).sum(), mul(state.h, tensor(fx::kWH, kStateShape)).sum()),
                    mul(state.c, tensor(fx::kWC, kStateShape)).sum());
  loss.backward();
  expectClose(x.grad(), tensor(fx::kInputGrad, kSeqShape), 1e-9, 1e-11);
  expectClose(h0.grad(), tensor(fx::kH0Grad, kStateShape), 1e-9, 1e-11);
  expectClose(c0.grad(), tensor(fx::kC0Grad, kStateShape), 1e-9, 1e-11);
  for (const auto& p : fx::kParams) {
    INFO(p.name);
    expectClose(lstm->namedTensor(p.name).grad(), tensor(p.grad, p.shape), 1e-9, 1e-11);
  }
}

TEST_CASE("the LSTM's parameters have PyTorch's names, shapes and order") {
  nn::LSTM lstm(nn::LstmOptions{.inputSize = 3, .hiddenSize = 4, .numLayers = 2});
  auto named = lstm.namedParameters();
  REQUIRE(named.size() == fx::kParams.size());
  for (size_t i = 0; i < named.size(); ++i) {
    CHECK(named[i].first == fx::kParams[i].name);
    CHECK(named[i].second.shape() == fx::kParams[i].shape);
  }
  nn::LSTM noBias(nn::LstmOptions{.inputSize = 3, .hiddenSize = 4, .bias = false});
  CHECK(noBias.parameters().size() == 2);
  CHECK_FALSE(noBias.biasIh(0).defined());
  CHECK(lstm.toString() == "LSTM(3, 4, num_layers=2)");
}

TEST_CASE("batchFirst, unbatched input and a missing state agree with the default layout") {
  auto lstm = fixtureLstm();
  Tensor x = tensor(fx::kInputValues, kSeqShape);
  Tensor zerosState = zeros(kStateShape, {.dtype = DType::Float64});
  auto ref = lstm->forward(x, {zerosState, zerosState});
  // No state means zeros.
  auto fromNothing = lstm->forward(x, {});
  expectClose(fromNothing.output, ref.output, 0, 0);
  expectClose(lstm->forward(x), ref.output, 0, 0);

  auto bf = std::make_shared<nn::LSTM>(
      nn::LstmOptions{.inputSize = fx::kInput, .hiddenSize = fx::kHidden, .numLayers = fx::kLayers, .batchFirst = true});
  bf->to(DType::Float64);
  bf->loadStateDict(lstm->stateDict());
  auto outBf = bf->forward(x.transpose(0, 1), {});
  CHECK(outBf.output.shape() == Shape{fx::kBatch, fx::kSteps, fx::kHidden});
  expectClose(outBf.output.transpose(0, 1), ref.output, 1e-12, 1e-14);
  expectClose(outBf.state.h, ref.state.h, 1e-12, 1e-14);

  // Unbatched: the second sequence of the batch on its own.
  Tensor seq = x.select(1, 1);
  auto single = lstm->forward(seq, {});
  CHECK(single.output.shape() == Shape{fx::kSteps, fx::kHidden});
  CHECK(single.state.c.shape() == Shape{fx::kLayers, fx::kHidden});
  expectClose(single.output, ref.output.select(1, 1), 1e-12, 1e-14);
  expectClose(single.state.h, ref.state.h.select(1, 1), 1e-12, 1e-14);
}

TEST_CASE("carrying the state across two calls equals one call over the whole sequence") {
  auto lstm = fixtureLstm();
  Tensor x = tensor(fx::kInputValues, kSeqShape);
  auto whole = lstm->forward(x, {});
  auto first = lstm->forward(x.narrow(0, 0, 2), {});
  auto second = lstm->forward(x.narrow(0, 2, 1), first.state);
  expectClose(second.output.select(0, 0), whole.output.select(0, 2), 1e-12, 1e-14);
  expectClose(second.state.c, whole.state.c, 1e-12, 1e-14);
}

TEST_CASE("dropout between LSTM layers acts in training only, never after the last layer") {
  auto lstm = std::make_shared<nn::LSTM>(
      nn::LstmOptions{.inputSize = 3, .hiddenSize = 8, .numLayers = 2, .dropout = 0.5});
  Tensor x = randn({5, 4, 3});
  lstm->eval();
  Tensor a = lstm->forward(x), b = lstm->forward(x);
  CHECK(a.toVector<float>() == b.toVector<float>());
  lstm->train();
  Generator g(1);
  lstm->setGenerator(&g);
  Tensor c = lstm->forward(x);
  CHECK(c.toVector<float>() != a.toVector<float>());
  // A single layer has no inter-layer dropout.
  auto one = std::make_shared<nn::LSTM>(nn::LstmOptions{.inputSize = 3, .hiddenSize = 8, .dropout = 0.5});
  Tensor d = one->forward(x);
  one->eval();
  CHECK(one->forward(x).toVector<float>() == d.toVector<float>());
}

TEST_CASE("LSTM shape errors name the expected layout") {
  nn::LSTM lstm(3, 4, 2);
  CHECK_THROWS_WITH_AS(lstm.forward(randn({5, 2, 7})), doctest::Contains("expected input [T, N, 3]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(lstm.forward(randn({5, 2, 3}), {zeros({1, 2, 4}), zeros({1, 2, 4})}),
                       doctest::Contains("expected h and c of shape [2, 2, 4]"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(lstm.forward(randn({5, 2, 3}), {zeros({2, 2, 4}), Tensor()}), doctest::Contains("both h and c"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(lstm.forward(randn({0, 2, 3})), InvalidArgumentError);
  CHECK_THROWS_AS(nn::LSTM(nn::LstmOptions{.inputSize = 3, .hiddenSize = 4, .dropout = 2}), InvalidArgumentError);
  CHECK_THROWS_AS(nn::LSTM(0, 4), InvalidArgumentError);
}
