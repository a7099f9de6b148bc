#include <cmath>
#include <string>

#include "fixtures/optim_fixtures.h"
#include "nn/optim.h"
#include "nn/serialize.h"
#include "weft_test.h"

using namespace weft;
namespace optim = weft::nn::optim;
namespace fx = weft::testing::optim_fixtures;

namespace {

// How the parameters are laid out for a run: contiguous tensors take the
// fused CPU loop, strided views the tensor-op path.
enum class Layout { Contiguous, Strided };

Tensor makeParam(const std::vector<double>& values, const Shape& shape, DType dtype, Layout layout) {
  Tensor t = fromVector(values, shape).to(dtype);
  if (layout == Layout::Contiguous) return t;
  // The same values in a view with non-unit strides: a transposed copy of
  // the transpose (2-D) or every other element of a wider buffer (1-D).
  if (shape.size() == 2) return t.t().contiguous().t();
  Tensor wide = zeros({shape[0], 2}, {.dtype = dtype});
  Tensor v = wide.select(1, 0);
  v.copy_(t);
  return v;
}

std::vector<Tensor> gradsAt(const fx::Case& c, int step, DType dtype) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < fx::kShapes.size(); ++i) {
    if (c.skipStep == step && c.skipParam == static_cast<int>(i)) {
      grads.emplace_back();
    } else {
      grads.push_back(fromVector(fx::kGrads[step][i], fx::kShapes[i]).to(dtype));
    }
  }
  return grads;
}

void checkTrajectory(const fx::Case& c, DType dtype, Layout layout) {
  bool f64 = dtype == DType::Float64;
  const auto& expected = f64 ? c.expected64 : c.expected32;
  double rtol = f64 ? 1e-10 : 2e-5, atol = f64 ? 1e-12 : 2e-6;
  std::vector<Tensor> params;
  for (size_t i = 0; i < fx::kShapes.size(); ++i) {
    params.push_back(makeParam(fx::kInitialParams[i], fx::kShapes[i], dtype, layout));
  }
  std::vector<optim::ParamState> state(params.size());
  for (int k = 0; k < fx::kSteps; ++k) {
    optim::step(c.options, params, gradsAt(c, k, dtype), state);
    for (size_t i = 0; i < params.size(); ++i) {
      INFO(c.name << " " << dtypeName(dtype) << (layout == Layout::Strided ? " strided" : " contiguous")
                  << " step " << k << " param " << i);
      weft::testing::expectClose(params[i].to(DType::Float64), fromVector(expected[k][i], fx::kShapes[i]), rtol,
                                 atol);
    }
  }
}

}  // namespace

TEST_CASE("every optimizer follows PyTorch's trajectory in float64 and float32 (fused CPU loop)") {
  for (const auto& c : fx::kCases) {
    checkTrajectory(c, DType::Float64, Layout::Contiguous);
    checkTrajectory(c, DType::Float32, Layout::Contiguous);
  }
}

TEST_CASE("every optimizer follows PyTorch's trajectory on strided parameters (tensor-op path)") {
  for (const auto& c : fx::kCases) {
    checkTrajectory(c, DType::Float64, Layout::Strided);
    checkTrajectory(c, DType::Float32, Layout::Strided);
  }
}

TEST_CASE("optimizer state carries torch.optim's names, values and per-parameter step counts") {
  for (const auto& c : fx::kCases) {
    INFO(c.name);
    std::vector<Tensor> params;
    for (size_t i = 0; i < fx::kShapes.size(); ++i) params.push_back(fromVector(fx::kInitialParams[i], fx::kShapes[i]));
    std::vector<optim::ParamState> state(params.size());
    for (int k = 0; k < fx::kSteps; ++k) optim::step(c.options, params, gradsAt(c, k, DType::Float64), state);
    for (const auto& [param, steps] : c.finalSteps) CHECK(state[param].step == steps);
    for (size_t i = 0; i < params.size(); ++i) {
      int64_t expectSteps = fx::kSteps - (c.skipParam == static_cast<int>(i) ? 1 : 0);
      CHECK(state[i].step == expectSteps);
      size_t expectBuffers = 0;
      for (const auto& b : c.finalState) expectBuffers += b.param == static_cast<int>(i);
      CHECK(state[i].buffers.size() == expectBuffers);
    }
    for (const auto& b : c.finalState) {
      INFO(b.name << " of parameter " << b.param);
      REQUIRE(state[b.param].has(b.name));
      weft::testing::expectClose(state[b.param].at(b.name), fromVector(b.values, fx::kShapes[b.param]), 1e-10, 1e-12);
    }
    CHECK(optim::stateBufferNames(c.options).size() ==
          [&] {
            size_t n = 0;
            for (const auto& b : c.finalState) n += b.param == 0;
            return n;
          }());
  }
}

TEST_CASE("an Optimizer object steps from .grad and matches the functional trajectory") {
  for (const auto& c : fx::kCases) {
    INFO(c.name);
    std::vector<Tensor> params;
    for (size_t i = 0; i < fx::kShapes.size(); ++i) {
      params.push_back(fromVector(fx::kInitialParams[i], fx::kShapes[i]).to(DType::Float32).requiresGrad_());
    }
    optim::Optimizer opt(params, c.options);
    for (int k = 0; k < fx::kSteps; ++k) {
      std::vector<Tensor> grads = gradsAt(c, k, DType::Float32);
      for (size_t i = 0; i < params.size(); ++i) params[i].setGrad(grads[i]);
      opt.step();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      CHECK(params[i].requiresGrad());
      CHECK(params[i].isLeaf());
      weft::testing::expectClose(params[i].to(DType::Float64), fromVector(c.expected32.back()[i], fx::kShapes[i]),
                                 2e-5, 2e-6);
    }
  }
}

TEST_CASE("an optimizer update keeps parameter handles and bumps their version") {
  Tensor p = fromVector<float>({1, 2, 3}).requiresGrad_();
  Tensor alias = p;
  uint64_t v0 = p.version();
  optim::SGD opt({p}, {.lr = 0.5});
  mul(p, p).sum().backward();
  opt.step();
  CHECK(alias.toVector<float>() == std::vector<float>{0, 0, 0});
  CHECK(p.version() > v0);
}

TEST_CASE("invalid hyper-parameters are rejected with the optimizer's name") {
  Tensor p = zeros({2}).requiresGrad_();
  CHECK_THROWS_WITH_AS(optim::SGD({p}, {}), doctest::Contains("SGD: the learning rate is required"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(optim::SGD({p}, {.lr = -0.1}), doctest::Contains("SGD: invalid learning rate -0.1"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(optim::SGD({p}, {.lr = 0.1, .momentum = -1}), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(optim::SGD({p}, {.lr = 0.1, .nesterov = true}), doctest::Contains("nesterov"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(optim::SGD({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                  InvalidArgumentError);
  CHECK_THROWS_WITH_AS(optim::Adam({p}, {.betas = {1.0, 0.999}}), doctest::Contains("Adam: invalid beta1 1"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(optim::AdamW({p}, {.betas = {0.9, -0.1}}), doctest::Contains("AdamW: invalid beta2"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(optim::Adam({p}, {.eps = -1e-8}), InvalidArgumentError);
  CHECK_THROWS_AS(optim::Adam({p}, {.weightDecay = -1}), InvalidArgumentError);
  CHECK_THROWS_AS(optim::Adagrad({p}, {.lrDecay = -1}), InvalidArgumentError);
  CHECK_THROWS_AS(optim::Adagrad({p}, {.initialAccumulatorValue = -1}), InvalidArgumentError);
  CHECK_THROWS_AS(optim::RMSprop({p}, {.alpha = -0.5}), InvalidArgumentError);
  CHECK_THROWS_AS(optim::RMSprop({p}, {.momentum = -0.5}), InvalidArgumentError);
  optim::Adam adam({p});
  CHECK_THROWS_AS(adam.setLr(-1), InvalidArgumentError);
  adam.setLr(0.5);
  CHECK(adam.lr() == 0.5);
  CHECK_THROWS_AS(adam.setOptions(optim::SGDOptions{.lr = 0.1}), InvalidArgumentError);
}

TEST_CASE("bad parameter lists and mismatched gradients are clear errors") {
  Tensor p = zeros({2, 3}).requiresGrad_();
  CHECK_THROWS_WITH_AS(optim::Adam(std::vector<Tensor>{}), doctest::Contains("empty parameter list"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(optim::Adam({p, p}), doctest::Contains("same tensor"), InvalidArgumentError);
  CHECK_THROWS_AS(optim::Adam({zeros({2}, {.dtype = DType::Int64})}), InvalidArgumentError);
  std::vector<optim::ParamState> state(1);
  CHECK_THROWS_WITH_AS(optim::adam({p}, {zeros({3, 2})}, state, {}),
                       doctest::Contains("Adam: gradient 0 (shape [3, 2]"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(optim::adam({p}, {zeros({2, 3}, {.dtype = DType::Float64})}, state, {}),
                       doctest::Contains("does not match its parameter"), InvalidArgumentError);
  CHECK(state[0].step == 0);
  std::vector<optim::ParamState> none;
  CHECK_THROWS_WITH_AS(optim::adam({p}, {zeros({2, 3})}, none, {}), doctest::Contains("1 parameters but 1 gradients and 0 states"),
                       InvalidArgumentError);
}

TEST_CASE("a parameter without a gradient is skipped and its state untouched") {
  Tensor a = ones({2}), b = ones({2});
  std::vector<optim::ParamState> state(2);
  optim::adam({a, b}, {full({2}, 0.5), Tensor()}, state, {.lr = 0.1});
  CHECK(state[0].step == 1);
  CHECK(state[1].step == 0);
  CHECK(state[1].buffers.empty());
  CHECK(b.toVector<float>() == std::vector<float>{1, 1});
  CHECK(a.toVector<float>()[0] < 1.0f);
}

TEST_CASE("a buffer missing after updates is an error, not a silent restart") {
  Tensor p = ones({3});
  std::vector<optim::ParamState> state(1);
  optim::adam({p}, {ones({3})}, state, {});
  CHECK_THROWS_WITH_AS(optim::adam({p}, {ones({3})}, state, {.amsgrad = true}),
                       doctest::Contains("has step 1 but no 'max_exp_avg_sq' buffer"), InvalidArgumentError);
  state[0].buffers["exp_avg"] = zeros({4});
  CHECK_THROWS_WITH_AS(optim::adam({p}, {ones({3})}, state, {}), doctest::Contains("'exp_avg' buffer of parameter 0"),
                       InvalidArgumentError);
}

TEST_CASE("an optimizer's state dict survives a file round trip and resumes identically") {
  auto makeParams = [] {
    Generator g(5);
    return std::vector<Tensor>{randn({3, 4}, {}, &g).requiresGrad_(), randn({4}, {}, &g).requiresGrad_()};
  };
  auto feed = [](std::vector<Tensor>& ps, int k) {
    Generator g(100 + k);
    for (auto& p : ps) p.setGrad(randn(p.shape(), {}, &g));
  };
  optim::RMSpropOptions o{.lr = 0.01, .momentum = 0.9, .centered = true};
  std::vector<Tensor> pa = makeParams(), pb = makeParams();
  optim::RMSprop a(pa, o), b(pb, o);
  for (int k = 0; k < 3; ++k) {
    feed(pa, k);
    a.step();
    feed(pb, k);
    b.step();
  }
  std::string path = "optim_state_roundtrip.weft";
  nn::saveStateDict(a.stateDict(), path);
  nn::StateDict sd = nn::loadStateDictFile(path);
  std::remove(path.c_str());
  CHECK(sd.count("state.0.step"));
  CHECK(sd.count("state.1.square_avg"));
  CHECK(sd.count("state.1.momentum_buffer"));
  CHECK(sd.count("state.0.grad_avg"));

  // A fresh optimizer over b's parameters continues exactly like a.
  optim::RMSprop resumed(pb, o);
  resumed.loadStateDict(sd);
  CHECK(resumed.state()[1].step == 3);
  for (int k = 3; k < 6; ++k) {
    feed(pa, k);
    a.step();
    feed(pb, k);
    resumed.step();
  }
  for (size_t i = 0; i < pa.size(); ++i) CHECK(pa[i].toVector<float>() == pb[i].toVector<float>());
}

TEST_CASE("loading optimizer state checks indices, names, shapes and completeness") {
  Tensor p = zeros({2, 2}).requiresGrad_();
  optim::Adam opt({p});
  CHECK_THROWS_WITH_AS(opt.loadStateDict({{"state.1.step", scalarTensor(1, DType::Int64)}}),
                       doctest::Contains("refers to parameter 1 but the optimizer has 1"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(opt.loadStateDict({{"bogus", zeros({1})}}), doctest::Contains("malformed key 'bogus'"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(opt.loadStateDict({{"state.x.step", zeros({1})}}), doctest::Contains("malformed key"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(
      opt.loadStateDict({{"state.0.step", scalarTensor(1, DType::Int64)}, {"state.0.sum", zeros({2, 2})}}),
      doctest::Contains("unexpected state buffer 'state.0.sum'"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(opt.loadStateDict({{"state.0.step", scalarTensor(1, DType::Int64)},
                                          {"state.0.exp_avg", zeros({2, 2})},
                                          {"state.0.exp_avg_sq", zeros({4})}}),
                       doctest::Contains("has shape [4] but parameter 0 has shape [2, 2]"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(opt.loadStateDict({{"state.0.step", scalarTensor(2, DType::Int64)},
                                          {"state.0.exp_avg", zeros({2, 2})}}),
                       doctest::Contains("has step 2 but no 'state.0.exp_avg_sq'"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(opt.loadStateDict({{"state.0.step", scalarTensor(-1, DType::Int64)}}),
                       doctest::Contains("not a valid step count"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(opt.loadStateDict({{"state.0.exp_avg", zeros({2, 2})}}), doctest::Contains("no 'state.0.step'"),
                       InvalidArgumentError);
  // Nothing was changed by the failed loads.
  CHECK(opt.state()[0].step == 0);
  CHECK(opt.state()[0].buffers.empty());
}

TEST_CASE("zeroGrad zeroes gradients in place or drops them") {
  Tensor p = ones({3}).requiresGrad_();
  optim::SGD opt({p}, {.lr = 0.1});
  mul(p, p).sum().backward();
  Tensor g = p.grad();
  opt.zeroGrad();
  CHECK(p.grad().sameAs(g));
  CHECK(g.toVector<float>() == std::vector<float>{0, 0, 0});
  opt.zeroGrad(true);
  CHECK_FALSE(p.grad().defined());
}

TEST_CASE("the step with explicit gradients leaves .grad alone") {
  Tensor p = ones({2}).requiresGrad_();
  optim::SGD opt({p}, {.lr = 1.0, .momentum = 0.5});
  opt.step({full({2}, 0.25)});
  CHECK_FALSE(p.grad().defined());
  CHECK(p.toVector<float>() == std::vector<float>{0.75f, 0.75f});
  opt.step({full({2}, 0.25)});
  // buf = 0.5·0.25 + 0.25 = 0.375
  CHECK(p.toVector<float>() == std::vector<float>{0.375f, 0.375f});
}

TEST_CASE("a gradient that is the parameter itself is handled (no fused loop over overlapping memory)") {
  Tensor p = fromVector<float>({1, 2, 4});
  std::vector<optim::ParamState> state(1);
  optim::sgd({p}, {p}, state, {.lr = 0.25});
  CHECK(p.toVector<float>() == std::vector<float>{0.75f, 1.5f, 3});
  Tensor q = fromVector<double>({1, -2});
  std::vector<optim::ParamState> st2(1);
  optim::adam({q}, {q}, st2, {.lr = 0.1});
  // First Adam step moves each element by lr·sign(g) (up to eps).
  weft::testing::expectClose(q, fromVector<double>({0.9, -1.9}), 1e-6, 1e-7);
}
