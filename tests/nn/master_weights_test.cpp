#include <cmath>
#include <string>
#include <vector>

#include "nn/master_weights.h"
#include "nn/optim.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "weft_test.h"

using namespace weft;
namespace optim = weft::nn::optim;

namespace {

// A leaf of `dtype` with values exactly representable in bfloat16.
Tensor leaf(const Tensor& values, DType dtype) {
  Tensor t = values.to(DType::BFloat16).to(dtype).detach();
  t.requiresGrad_(true);
  return t;
}

}  // namespace

TEST_CASE("MasterWeightOptimizer steps float32 masters exactly as AdamW steps float32 parameters, and rounds them "
          "into the bfloat16 parameters") {
  Generator gen(3);
  const Tensor init = randn({7, 5}, {}, &gen);
  Tensor p16 = leaf(init, DType::BFloat16);
  Tensor p32 = leaf(init, DType::Float32);
  const optim::AdamWOptions options{.lr = 1e-2, .betas = {0.9, 0.95}, .weightDecay = 0.1};
  optim::MasterWeightOptimizer mixed({p16}, options);
  optim::AdamW plain({p32}, options);
  CHECK(mixed.masters()[0].dtype() == DType::Float32);
  CHECK_FALSE(mixed.masters()[0].sameAs(p16));
  CHECK(mixed.masterBytes() == 35 * 4);
  for (int s = 0; s < 5; ++s) {
    // The same gradient on both sides: bfloat16 values, exact in float32.
    const Tensor g = randn({7, 5}, {}, &gen).to(DType::BFloat16);
    mixed.zeroGrad();
    plain.zeroGrad();
    p16.setGrad(g);
    p32.setGrad(g.to(DType::Float32));
    mixed.step();
    plain.step();
    CHECK(mixed.masters()[0].toVector<float>() == p32.toVector<float>());
    CHECK(p16.dtype() == DType::BFloat16);
    CHECK(p16.to(DType::Float32).toVector<float>() == p32.to(DType::BFloat16).to(DType::Float32).toVector<float>());
  }
  CHECK(mixed.stateBytes() == 2 * 35 * 4);
}

TEST_CASE("MasterWeightOptimizer accumulates updates too small for a bfloat16 weight, which plain AdamW on the "
          "bfloat16 weight loses") {
  // At 1.0 a bfloat16 step is 2^-7 above and 2^-8 below: an update of 1e-3 rounds away each time.
  const optim::AdamOptions options{.lr = 1e-3};
  Tensor a = leaf(ones({4}), DType::BFloat16);
  Tensor b = leaf(ones({4}), DType::BFloat16);
  optim::MasterWeightOptimizer mixed({a}, options);
  optim::Adam plain({b}, options);
  for (int s = 0; s < 10; ++s) {
    a.setGrad(ones({4}, {.dtype = DType::BFloat16}));
    b.setGrad(ones({4}, {.dtype = DType::BFloat16}));
    mixed.step();
    plain.step();
  }
  // Adam's first steps are lr each: 10 of them move the master by 1e-2, the parameter by its rounding.
  CHECK(mixed.masters()[0].toVector<float>()[0] == doctest::Approx(1.0 - 1e-2).epsilon(1e-4));
  CHECK(a.to(DType::Float32).toVector<float>()[0] == doctest::Approx(1.0 - 1e-2).epsilon(2e-3));
  CHECK(b.to(DType::Float32).toVector<float>()[0] == 1.0f);
}

TEST_CASE("MasterWeightOptimizer keeps float32 parameters as their own masters and skips parameters without .grad") {
  Tensor p = leaf(ones({3}), DType::Float32);
  Tensor q = leaf(ones({3}), DType::BFloat16);
  optim::MasterWeightOptimizer opt({p, q}, optim::SGDOptions{.lr = 0.5});
  CHECK(opt.masters()[0].sameAs(p));
  CHECK(opt.masterBytes() == 3 * 4);
  p.setGrad(ones({3}));
  opt.step();
  CHECK(p.toVector<float>() == std::vector<float>{0.5f, 0.5f, 0.5f});
  CHECK(q.to(DType::Float32).toVector<float>() == std::vector<float>{1.0f, 1.0f, 1.0f});
  CHECK(opt.masters()[1].toVector<float>() == std::vector<float>{1.0f, 1.0f, 1.0f});
  CHECK_THROWS_AS(optim::MasterWeightOptimizer({p, p}, optim::SGDOptions{.lr = 0.5}), InvalidArgumentError);
}

TEST_CASE("MasterWeightOptimizer's state dict holds the masters: reloaded over the rounded parameters, training "
          "resumes to the bit, which the optimizer state alone does not give") {
  Generator gen(8);
  const Tensor init = randn({6, 4}, {}, &gen);
  const optim::AdamWOptions options{.lr = 3e-3, .weightDecay = 0.1};
  std::vector<Tensor> grads;
  for (int s = 0; s < 6; ++s) grads.push_back(randn({6, 4}, {}, &gen).to(DType::BFloat16));
  auto stepWith = [](optim::MasterWeightOptimizer& opt, Tensor& p, const Tensor& g) {
    p.setGrad(g.clone());
    opt.step();
  };
  Tensor a = leaf(init, DType::BFloat16);
  optim::MasterWeightOptimizer first({a}, options);
  for (int s = 0; s < 3; ++s) stepWith(first, a, grads[static_cast<size_t>(s)]);
  const nn::StateDict saved = first.stateDict();
  REQUIRE(saved.count("master.0") == 1);
  CHECK(saved.at("master.0").dtype() == DType::Float32);

  Tensor b = leaf(a.to(DType::Float32), DType::BFloat16);  // what a module state dict restores
  optim::MasterWeightOptimizer resumed({b}, options);
  resumed.loadStateDict(saved);
  Tensor c = leaf(a.to(DType::Float32), DType::BFloat16);
  optim::MasterWeightOptimizer withoutMasters({c}, options);
  nn::StateDict stateOnly = saved;
  stateOnly.erase("master.0");
  withoutMasters.loadStateDict(stateOnly);
  for (int s = 3; s < 6; ++s) {
    stepWith(first, a, grads[static_cast<size_t>(s)]);
    stepWith(resumed, b, grads[static_cast<size_t>(s)]);
    stepWith(withoutMasters, c, grads[static_cast<size_t>(s)]);
  }
  CHECK(resumed.masters()[0].toVector<float>() == first.masters()[0].toVector<float>());
  CHECK(b.to(DType::Float32).toVector<float>() == a.to(DType::Float32).toVector<float>());
  CHECK(withoutMasters.masters()[0].toVector<float>() != first.masters()[0].toVector<float>());
}

TEST_CASE("MasterWeightOptimizer.loadStateDict names a bad master key and changes nothing") {
  Tensor p = leaf(ones({2, 3}), DType::BFloat16);
  Tensor q = leaf(ones({3}), DType::Float32);
  optim::MasterWeightOptimizer opt({p, q}, optim::SGDOptions{.lr = 0.1});
  const std::vector<float> before = opt.masters()[0].toVector<float>();
  auto fails = [&](const std::string& key, const Tensor& value, const std::string& message) {
    nn::StateDict dict = opt.stateDict();
    dict[key] = value;
    CHECK_THROWS_WITH_AS(opt.loadStateDict(dict), doctest::Contains(message.c_str()), InvalidArgumentError);
  };
  fails("master.x", zeros({2, 3}), "malformed key 'master.x'");
  fails("master.5", zeros({2, 3}), "key 'master.5' refers to parameter 5 but the optimizer has 2");
  fails("master.1", zeros({3}), "parameter 1 is float32 and is its own master");
  fails("master.0", zeros({3, 2}), "'master.0' has shape [3, 2]");
  CHECK(opt.masters()[0].toVector<float>() == before);
}
