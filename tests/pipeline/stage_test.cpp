// Stages (pipeline/stage.h): a Sequential split at cut points chains back to the whole model with
// the same parameters and names; balancedCuts finds the optimum a brute-force search finds; the
// GPT as a Sequential of layers gives GPT::forward's logits and gradients; bad cuts are refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "common/error.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "pipeline/stage.h"
#include "tensor/ops.h"
#include "weft_test.h"

using weft::Generator;
using weft::InvalidArgumentError;
using weft::Tensor;
namespace nn = weft::nn;
namespace pipeline = weft::pipeline;

namespace {

// Linear(4, 8), ReLU, Linear(8, 8), Tanh, Linear(8, 3).
std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  Generator g(seed);
  auto l0 = std::make_shared<nn::Linear>(4, 8);
  auto l2 = std::make_shared<nn::Linear>(8, 8);
  auto l4 = std::make_shared<nn::Linear>(8, 3);
  l0->resetParameters(&g);
  l2->resetParameters(&g);
  l4->resetParameters(&g);
  return nn::makeSequential({l0, std::make_shared<nn::ReLU>(), l2, std::make_shared<nn::Tanh>(), l4});
}

double maxDiff(const Tensor& a, const Tensor& b) { return weft::max(weft::abs(a - b)).item<double>(); }

// The least largest stage cost over every way to cut `costs` into p non-empty contiguous stages.
double bruteForce(const std::vector<double>& costs, int p) {
  const int n = static_cast<int>(costs.size());
  double best = std::numeric_limits<double>::infinity();
  std::function<void(int, int, double)> go = [&](int start, int left, double worst) {
    if (left == 1) {
      double c = 0;
      for (int i = start; i < n; ++i) c += costs[static_cast<size_t>(i)];
      best = std::min(best, std::max(worst, c));
      return;
    }
    double c = 0;
    for (int end = start + 1; end <= n - (left - 1); ++end) {
      c += costs[static_cast<size_t>(end - 1)];
      go(end, left - 1, std::max(worst, c));
    }
  };
  go(0, p, 0.0);
  return best;
}

double largestStage(const std::vector<double>& costs, const std::vector<size_t>& cuts) {
  double worst = 0, c = 0;
  size_t k = 0;
  for (size_t i = 0; i < costs.size(); ++i) {
    if (k < cuts.size() && i == cuts[k]) {
      worst = std::max(worst, c);
      c = 0;
      ++k;
    }
    c += costs[i];
  }
  return std::max(worst, c);
}

}  // namespace

TEST_CASE("a Sequential split at cut points chains back to the whole model, sharing parameters and names") {
  auto net = mlp(3);
  auto stages = pipeline::splitSequential(*net, {2, 4});
  REQUIRE(stages.size() == 3);
  CHECK(stages[0]->size() == 2);
  CHECK(stages[1]->size() == 2);
  CHECK(stages[2]->size() == 1);
  Generator g(9);
  Tensor x = weft::randn({6, 4}, {}, &g);
  Tensor whole = net->forward(x);
  Tensor chained = stages[2]->forward(stages[1]->forward(stages[0]->forward(x)));
  CHECK(maxDiff(whole, chained) == 0.0);
  // Names and tensors as in the whole model.
  auto names = stages[1]->namedParameters();
  REQUIRE(names.size() == 2);
  CHECK(names[0].first == "2.weight");
  CHECK(names[0].second.sameAs(net->namedTensor("2.weight")));
  CHECK(stages[2]->namedParameters()[1].first == "4.bias");
  CHECK(pipeline::splitSequential(*net, {}).size() == 1);
}

TEST_CASE("cut points that leave a stage empty or fall outside the model are refused") {
  auto net = mlp(3);
  for (const std::vector<size_t>& bad :
       {std::vector<size_t>{0}, std::vector<size_t>{2, 2}, std::vector<size_t>{3, 2}, std::vector<size_t>{5}}) {
    CAPTURE(bad.size());
    std::string msg;
    try {
      pipeline::splitSequential(*net, bad);
    } catch (const InvalidArgumentError& e) {
      msg = e.what();
    }
    CHECK(msg.find("cuts must increase strictly within [1, 5) for a Sequential of 5 layers") != std::string::npos);
  }
  CHECK_THROWS_AS(pipeline::splitSequential(nn::Sequential(), {}), InvalidArgumentError);
}

TEST_CASE("balancedCuts finds the least largest stage that a brute-force search finds") {
  Generator g(17);
  for (int n = 1; n <= 9; ++n) {
    for (int p = 1; p <= n; ++p) {
      for (int trial = 0; trial < 4; ++trial) {
        std::vector<double> costs;
        for (int i = 0; i < n; ++i) costs.push_back(std::floor(g.nextDouble() * 100.0));
        auto cuts = pipeline::balancedCuts(costs, p);
        CAPTURE(n);
        CAPTURE(p);
        REQUIRE(cuts.size() == static_cast<size_t>(p - 1));
        for (size_t i = 0; i < cuts.size(); ++i) {
          CHECK(cuts[i] >= 1);
          CHECK(cuts[i] < static_cast<size_t>(n));
          if (i > 0) CHECK(cuts[i] > cuts[i - 1]);
        }
        CHECK(largestStage(costs, cuts) == bruteForce(costs, p));
      }
    }
  }
  CHECK_THROWS_AS(pipeline::balancedCuts({1.0, 2.0}, 3), InvalidArgumentError);
  CHECK_THROWS_AS(pipeline::balancedCuts({1.0, -2.0}, 1), InvalidArgumentError);
  CHECK_THROWS_AS(pipeline::balancedCuts({}, 1), InvalidArgumentError);
}

TEST_CASE("equal parameter counts: the layers' counts and the cuts that balance them") {
  auto net = mlp(3);
  // 4*8+8 = 40, 0, 8*8+8 = 72, 0, 8*3+3 = 27.
  CHECK(pipeline::layerParameterCounts(*net) == std::vector<int64_t>{40, 0, 72, 0, 27});
  auto cuts = pipeline::cutsByParameterCount(*net, 2);
  // Best split: [40, 0] | [72, 0, 27] (99) vs [40, 0, 72] | ... (112): the largest is 99.
  CHECK(cuts == std::vector<size_t>{2});
  auto three = pipeline::cutsByParameterCount(*net, 3);
  REQUIRE(three.size() == 2);
  CHECK(largestStage({40, 0, 72, 0, 27}, three) == 72);
}

TEST_CASE("measured layer times: one per layer, non-negative, gradients left as they were, usable as costs") {
  auto net = mlp(3);
  Generator g(8);
  Tensor x = weft::randn({16, 4}, {}, &g);
  // Layer 0 has a gradient from an earlier backward; the others have none.
  weft::sum(net->at(0)->forward(x)).backward();
  Tensor before = net->namedTensor("0.weight").grad().clone();
  auto times = pipeline::measureLayerTimes(*net, x, 3);
  REQUIRE(times.size() == 5);
  for (double t : times) {
    CHECK(std::isfinite(t));
    CHECK(t >= 0.0);
  }
  CHECK(maxDiff(net->namedTensor("0.weight").grad(), before) == 0.0);
  CHECK_FALSE(net->namedTensor("2.weight").grad().defined());
  auto cuts = pipeline::balancedCuts(times, 3);
  REQUIRE(cuts.size() == 2);
  CHECK(pipeline::splitSequential(*net, cuts).size() == 3);
  CHECK_THROWS_AS(pipeline::measureLayerTimes(*net, x, 0), InvalidArgumentError);
  // A GPT's layers take token ids: the embedding's input needs no gradient.
  nn::GPTConfig cfg{.vocabSize = 11, .blockSize = 4, .layers = 2, .heads = 2, .width = 8};
  Generator init(2);
  auto layers = pipeline::gptLayers(std::make_shared<nn::GPT>(cfg, &init));
  CHECK(pipeline::measureLayerTimes(*layers, weft::zeros({2, 4}, {.dtype = weft::DType::Int64}), 1).size() == 4);
}

TEST_CASE("the GPT as a Sequential of layers gives GPT::forward's logits and gradients") {
  nn::GPTConfig cfg{.vocabSize = 23, .blockSize = 8, .layers = 3, .heads = 2, .width = 16};
  Generator init(5);
  auto gpt = std::make_shared<nn::GPT>(cfg, &init);
  auto layers = pipeline::gptLayers(gpt);
  REQUIRE(layers->size() == 5);
  auto names = layers->namedChildren();
  CHECK(names[0].first == "embed");
  CHECK(names[1].first == "h_0");
  CHECK(names[4].first == "head");
  Generator g(6);
  Tensor idx = weft::randint(0, 23, {2, 7}, {.dtype = weft::DType::Int64}, &g);
  Tensor want = gpt->forward(idx);
  weft::sum(weft::square(want)).backward();
  std::vector<Tensor> wantGrads;
  for (const Tensor& p : gpt->parameters()) wantGrads.push_back(p.grad().clone());
  gpt->zeroGrad();
  Tensor got = layers->forward(idx);
  CHECK(maxDiff(got, want) == 0.0);
  weft::sum(weft::square(got)).backward();
  auto params = gpt->parameters();
  for (size_t i = 0; i < params.size(); ++i) CHECK(maxDiff(params[i].grad(), wantGrads[i]) == 0.0);
  // Each stage of a split holds whole layers; wte is tied between the first and the last stage.
  CHECK(pipeline::gptTiedParameters(*gpt, 0, 1).empty());
  CHECK(pipeline::gptTiedParameters(*gpt, 1, 3).empty());
  auto first = pipeline::gptTiedParameters(*gpt, 0, 3);
  REQUIRE(first.size() == 1);
  CHECK(first[0].parameter.sameAs(gpt->wte()->weight()));
  CHECK(first[0].peerStage == 2);
  CHECK(pipeline::gptTiedParameters(*gpt, 2, 3).at(0).peerStage == 0);
  CHECK_THROWS_AS(layers->forward(weft::zeros({2, 9}, {.dtype = weft::DType::Int64})), InvalidArgumentError);
}
