// GradScaler (nn/amp.h): skipping overflowed steps without touching parameters
// or optimizer state, backing off and growing the scale as PyTorch's
// GradScaler does, unscaling in place, and its state round trip.
#include <cmath>
#include <limits>
#include <vector>

#include "nn/nn.h"
#include "tensor/ops.h"
#include "weft_test.h"

using namespace weft;

namespace {

// A two-layer float32 model trained under float16 autocast.
struct Tiny {
  Generator gen{7};
  nn::Linear l1{8, 16}, l2{16, 4};
  Tensor x, y;

  Tiny() {
    l1.resetParameters(&gen);
    l2.resetParameters(&gen);
    x = randn({32, 8}, {}, &gen);
    y = randint(0, 4, {32}, {.dtype = DType::Int64}, &gen);
  }
  std::vector<Tensor> params() {
    std::vector<Tensor> p = l1.parameters();
    for (const Tensor& t : l2.parameters()) p.push_back(t);
    return p;
  }
  Tensor loss() {
    autocast::Scope amp(DType::Float16);
    return crossEntropy(l2.forward(relu(l1.forward(x))), y);
  }
};

std::vector<std::vector<float>> values(const std::vector<Tensor>& ts) {
  std::vector<std::vector<float>> out;
  for (const Tensor& t : ts) out.push_back(t.toVector<float>());
  return out;
}

std::vector<std::vector<float>> optimizerState(const nn::optim::Optimizer& opt) {
  std::vector<std::vector<float>> out;
  for (const auto& [key, t] : opt.stateDict()) out.push_back(t.toVector<float>());
  return out;
}

}  // namespace

TEST_CASE("an injected inf gradient skips exactly that step, leaves parameters and state alone and halves the scale") {
  Tiny m;
  std::vector<Tensor> params = m.params();
  nn::optim::Adam opt(params, {.lr = 1e-2});
  nn::GradScaler scaler;
  CHECK(scaler.getScale() == 65536.0);
  const int injectAt = 3;
  int stepsTaken = 0;
  for (int it = 0; it < 6; ++it) {
    CAPTURE(it);
    opt.zeroGrad();
    scaler.scale(m.loss()).backward();
    if (it == injectAt) {
      NoGradGuard ng;
      params[2].grad().select(0, 1).select(0, 5).fill_(INFINITY);  // one element of l2's weight gradient
    }
    auto before = values(params);
    auto stateBefore = optimizerState(opt);
    const double scaleBefore = scaler.getScale();
    bool stepped = scaler.step(opt);
    scaler.update();
    if (it == injectAt) {
      CHECK_FALSE(stepped);
      CHECK(values(params) == before);
      CHECK(optimizerState(opt) == stateBefore);
      CHECK(scaler.getScale() == scaleBefore * 0.5);
      CHECK(scaler.growthTracker() == 0);
    } else {
      CHECK(stepped);
      CHECK(values(params) != before);
      CHECK(scaler.getScale() == scaleBefore);
      ++stepsTaken;
    }
  }
  CHECK(stepsTaken == 5);
  CHECK(opt.state()[0].step == 5);
  CHECK(scaler.getScale() == 32768.0);
}

TEST_CASE("a scale too large for float16 gradients backs off step by step until the gradients fit") {
  // 2^40 times a gradient of order 1e-2 overflows float16 (largest 65504)
  // in the low-precision backward of the products; each overflow halves it.
  Tiny m;
  std::vector<Tensor> params = m.params();
  nn::optim::SGD opt(params, {.lr = 0.1});
  nn::GradScaler scaler({.initScale = std::ldexp(1.0, 40)});
  int skipped = 0, firstStep = -1;
  for (int it = 0; it < 40 && firstStep < 0; ++it) {
    opt.zeroGrad();
    scaler.scale(m.loss()).backward();
    if (scaler.step(opt)) {
      firstStep = it;
    } else {
      ++skipped;
    }
    scaler.update();
  }
  REQUIRE(firstStep > 0);
  CHECK(skipped == firstStep);
  CHECK(scaler.getScale() == std::ldexp(1.0, 40 - skipped));
  // The scale that worked leaves float16 room: the unscaled gradients match a
  // float32 backward of the same autocast loss within float16 precision.
  opt.zeroGrad();
  Tensor loss = m.loss();
  loss.backward();
  std::vector<std::vector<float>> reference = values({params[0].grad(), params[2].grad()});
  opt.zeroGrad();
  scaler.scale(m.loss()).backward();
  scaler.unscale_(opt);
  std::vector<std::vector<float>> unscaled = values({params[0].grad(), params[2].grad()});
  for (size_t t = 0; t < reference.size(); ++t) {
    for (size_t i = 0; i < reference[t].size(); ++i) {
      CHECK(unscaled[t][i] == doctest::Approx(reference[t][i]).epsilon(2e-2).scale(1e-3));
    }
  }
}

TEST_CASE("the scale grows after growthInterval good steps in a row and the count restarts after an overflow") {
  Tensor p = ones({3}).requiresGrad_();
  nn::optim::SGD opt({p}, {.lr = 0.0});
  nn::GradScaler scaler({.initScale = 4.0, .growthFactor = 3.0, .backoffFactor = 0.25, .growthInterval = 3});
  auto iteration = [&](bool overflow) {
    opt.zeroGrad();
    scaler.scale(p.sum()).backward();
    if (overflow) {
      NoGradGuard ng;
      p.grad().select(0, 0).fill_(NAN);
    }
    scaler.step(opt);
    scaler.update();
  };
  iteration(false);
  iteration(false);
  CHECK(scaler.getScale() == 4.0);
  CHECK(scaler.growthTracker() == 2);
  iteration(false);
  CHECK(scaler.getScale() == 12.0);
  CHECK(scaler.growthTracker() == 0);
  iteration(false);
  iteration(false);
  iteration(true);  // NaN counts as an overflow too
  CHECK(scaler.getScale() == 3.0);
  CHECK(scaler.growthTracker() == 0);
  iteration(false);
  iteration(false);
  CHECK(scaler.getScale() == 3.0);
  iteration(false);
  CHECK(scaler.getScale() == 9.0);
}

TEST_CASE("unscale_ divides the gradients in place once, and misuse is a typed error") {
  Tensor p = ones({4}).requiresGrad_();
  Tensor q = ones({2, 2}, {.dtype = DType::BFloat16}).requiresGrad_();
  nn::optim::SGD opt({p}, {.lr = 1.0});
  nn::GradScaler scaler({.initScale = 1024.0});
  CHECK_THROWS_WITH_AS(scaler.update(), doctest::Contains("no gradients were unscaled"), InvalidArgumentError);
  Tensor scaled = scaler.scale((p * fromVector<float>({1, 2, 3, 4})).sum());
  CHECK(scaled.item<float>() == 10240.0f);
  scaled.backward();
  CHECK(p.grad().toVector<float>() == std::vector<float>{1024, 2048, 3072, 4096});
  scaler.unscale_(opt);
  CHECK(p.grad().toVector<float>() == std::vector<float>{1, 2, 3, 4});
  CHECK_THROWS_WITH_AS(scaler.unscale_(opt), doctest::Contains("already unscaled"), InvalidArgumentError);
  CHECK(scaler.step(opt));  // uses the unscaled gradients, not unscaling twice
  CHECK(p.detach().toVector<float>() == std::vector<float>{0, -1, -2, -3});
  CHECK_THROWS_WITH_AS(scaler.step(opt), doctest::Contains("already called"), InvalidArgumentError);
  scaler.update();
  CHECK(scaler.getScale() == 1024.0);
  // A list of bfloat16 parameters: unscaled through float32.
  (q * 3.0).sum().backward();
  q.grad().mul_(1024.0);
  scaler.unscale_(std::vector<Tensor>{q});
  CHECK(q.grad().toVector<float>() == std::vector<float>(4, 3.0f));
  scaler.update();
  CHECK(scaler.growthTracker() == 2);
  // Disabled: a pass-through.
  nn::GradScaler off({.enabled = false});
  Tensor loss = p.sum();
  CHECK(off.scale(loss).sameAs(loss));
  opt.zeroGrad();
  loss.backward();
  CHECK(off.step(opt));
  off.update();
  CHECK_THROWS_AS(nn::GradScaler({.backoffFactor = 1.5}), InvalidArgumentError);
  CHECK_THROWS_AS(nn::GradScaler({.growthInterval = 0}), InvalidArgumentError);
}

TEST_CASE("a GradScaler's state round-trips through stateDict and bad state is refused whole") {
  nn::GradScaler a({.initScale = 256.0, .growthFactor = 4.0, .backoffFactor = 0.125, .growthInterval = 5});
  Tensor p = ones({2}).requiresGrad_();
  nn::optim::SGD opt({p}, {.lr = 0.1});
  for (int i = 0; i < 3; ++i) {
    opt.zeroGrad();
    a.scale(p.sum()).backward();
    a.step(opt);
    a.update();
  }
  nn::StateDict sd = a.stateDict();
  CHECK(sd.at("scale").dtype() == DType::Float64);
  CHECK(sd.at("growth_tracker").item<int64_t>() == 3);
  nn::GradScaler b;
  b.loadStateDict(sd);
  CHECK(b.getScale() == 256.0);
  CHECK(b.growthTracker() == 3);
  CHECK(b.options().growthFactor == 4.0);
  CHECK(b.options().backoffFactor == 0.125);
  CHECK(b.options().growthInterval == 5);
  // Both grow at the same step from here.
  for (nn::GradScaler* s : {&a, &b}) {
    for (int i = 0; i < 2; ++i) {
      opt.zeroGrad();
      s->scale(p.sum()).backward();
      s->step(opt);
      s->update();
    }
  }
  CHECK(a.getScale() == 1024.0);
  CHECK(b.getScale() == a.getScale());

  nn::GradScaler c;
  nn::StateDict bad = sd;
  bad["growth_tracker"] = scalarTensor(9, DType::Int64);
  CHECK_THROWS_WITH_AS(c.loadStateDict(bad), doctest::Contains("growth_tracker"), InvalidArgumentError);
  bad = sd;
  bad.erase("scale");
  CHECK_THROWS_WITH_AS(c.loadStateDict(bad), doctest::Contains("missing key 'scale'"), InvalidArgumentError);
  bad = sd;
  bad["backoff_factor"] = scalarTensor(2.0, DType::Float64);
  CHECK_THROWS_WITH_AS(c.loadStateDict(bad), doctest::Contains("backoffFactor"), InvalidArgumentError);
  CHECK(c.getScale() == 65536.0);  // nothing changed
  CHECK(c.options().backoffFactor == 0.5);
}

TEST_CASE("optimizers update bfloat16 and float16 parameters through float32 arithmetic") {
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    const std::string dtype = dtypeName(dt);
    CAPTURE(dtype);
    Tensor start = fromVector<float>({0.5f, -1.25f, 2.0f, 0.75f});
    Tensor p = start.to(dt).requiresGrad_(), p32 = start.to(dt).to(DType::Float32).requiresGrad_();
    nn::optim::AdamW opt({p}, {.lr = 0.1});
    nn::optim::AdamW opt32({p32}, {.lr = 0.1});
    for (int i = 0; i < 3; ++i) {
      opt.zeroGrad();
      opt32.zeroGrad();
      (p * p).sum().backward();
      (p32 * p32).sum().backward();
      opt.step();
      opt32.step();
    }
    CHECK(p.dtype() == dt);
    CHECK(opt.state()[0].at("exp_avg").dtype() == dt);
    // Within the 16-bit type's precision of the float32 run (state rounded each step).
    CHECK(allclose(p.detach().to(DType::Float32), p32.detach(), dt == DType::BFloat16 ? 3e-2 : 4e-3, 1e-2));
  }
}
