// Generator state and activation checkpointing: a restored generator repeats
// its numbers; checkpointed networks (with dropout) give bit-identical
// gradients to the same network run plainly, nested or not, for outputs that
// need no grad, through autograd::grad, and hold clearly fewer bytes at peak.
#include <cmath>
#include <cstdint>
#include <vector>

#include "tensor/storage.h"
#include "weft_test.h"

using namespace weft;

TEST_SUITE_BEGIN("checkpoint");

namespace {

// A small MLP: layers of linear -> tanh -> dropout, float32 parameters that
// require grad.
struct Mlp {
  std::vector<Tensor> weights;
  std::vector<Tensor> biases;
  double p = 0.0;
  Generator* gen = nullptr;  // dropout's generator; the default one when null

  Mlp(int layers, int64_t width, double dropoutP, uint64_t seed) : p(dropoutP) {
    Generator g(seed);
    for (int i = 0; i < layers; ++i) {
      weights.push_back((randn({width, width}, {}, &g) * (1.0 / std::sqrt(double(width)))).requiresGrad_());
      biases.push_back((randn({width}, {}, &g) * 0.1).requiresGrad_());
    }
  }
  Tensor layer(int i, const Tensor& x) const {
    Tensor h = tanh(linear(x, weights[i], biases[i]));
    return p > 0 ? dropout(h, p, true, gen) : h;
  }
  std::vector<Tensor> params() const {
    std::vector<Tensor> all = weights;
    all.insert(all.end(), biases.begin(), biases.end());
    return all;
  }
  void zeroGrad() const {
    for (const Tensor& t : params()) t.setGrad(Tensor());
  }
};

// Layers [from, to) as one function.
std::function<Tensor(const Tensor&)> segment(const Mlp& m, int from, int to) {
  return [&m, from, to](const Tensor& x) {
    Tensor h = x;
    for (int i = from; i < to; ++i) h = m.layer(i, h);
    return h;
  };
}

std::vector<std::vector<float>> gradsOf(const std::vector<Tensor>& ts) {
  std::vector<std::vector<float>> out;
  for (const Tensor& t : ts) {
    REQUIRE(t.grad().defined());
    out.push_back(t.grad().toVector<float>());
  }
  return out;
}

}  // namespace

TEST_CASE("a generator set back to a saved state repeats its numbers, the cached normal included") {
  Generator g(11);
  (void)g.nextNormal();  // leaves the second normal of the pair cached
  GeneratorState s = g.state();
  CHECK(s.haveSpare);
  std::vector<double> first;
  for (int i = 0; i < 5; ++i) first.push_back(g.nextNormal());
  first.push_back(g.nextDouble());
  Tensor a = randn({7}, {}, &g);
  g.setState(s);
  std::vector<double> again;
  for (int i = 0; i < 5; ++i) again.push_back(g.nextNormal());
  again.push_back(g.nextDouble());
  Tensor b = randn({7}, {}, &g);
  CHECK(first == again);
  CHECK(a.toVector<float>() == b.toVector<float>());
  Generator other(99);
  other.setState(s);
  CHECK(other.state() == s);
  CHECK(other.nextNormal() == first[0]);
}

TEST_CASE("the default generator's state round-trips and an all-zero state is refused") {
  manualSeed(5);
  GeneratorState s = defaultGeneratorState();
  Tensor a = randn({4});
  setDefaultGeneratorState(s);
  Tensor b = randn({4});
  CHECK(a.toVector<float>() == b.toVector<float>());
  Generator g;
  CHECK_THROWS_WITH_AS(g.setState(GeneratorState{}), doctest::Contains("all zero"), InvalidArgumentError);
}

TEST_CASE("device fills reserve Philox counters without moving the CPU stream, and the state keeps them") {
  Generator g(21), plain(21);
  const PhiloxKey a = g.reservePhilox(1000);
  const PhiloxKey b = g.reservePhilox(5);
  CHECK(a.seed == 21);
  CHECK(a.offset == 0);
  CHECK(b.seed == 21);
  CHECK(b.offset == 1000);
  // The xoshiro stream is untouched: CPU numbers as from a generator never used on a device.
  CHECK(randn({9}, {}, &g).toVector<float>() == randn({9}, {}, &plain).toVector<float>());
  const GeneratorState s = g.state();
  CHECK(s.philoxOffset == 1005);
  CHECK(g.reservePhilox(7).offset == 1005);
  g.setState(s);
  CHECK(g.reservePhilox(7).offset == 1005);
  g.seed(3);
  const PhiloxKey c = g.reservePhilox(1);
  CHECK(c.seed == 3);
  CHECK(c.offset == 0);
  // The default generator, under its mutex.
  manualSeed(8);
  CHECK(reservePhilox(nullptr, 10).offset == 0);
  CHECK(reservePhilox(nullptr, 10).offset == 10);
  CHECK(defaultGeneratorState().philoxSeed == 8);
}

TEST_CASE("checkpointed segments with dropout give bit-identical gradients and leave the generators as a plain run") {
  Mlp m(6, 16, 0.3, 1);
  Generator explicitGen(3);
  Tensor x0 = randn({5, 16}, {}, &explicitGen);

  auto run = [&](bool ckpt, bool explicitGenerator) {
    m.zeroGrad();
    m.gen = explicitGenerator ? &explicitGen : nullptr;
    explicitGen.seed(21);
    manualSeed(77);
    Tensor x = x0.detach().clone().requiresGrad_();
    Tensor h = x;
    CheckpointOptions o;
    if (explicitGenerator) o.generators.push_back(&explicitGen);
    for (int s = 0; s < 3; ++s) {
      h = ckpt ? checkpoint(segment(m, 2 * s, 2 * s + 2), h, o) : segment(m, 2 * s, 2 * s + 2)(h);
    }
    Tensor loss = (h * h).sum();
    loss.backward();
    std::vector<std::vector<float>> g = gradsOf(m.params());
    g.push_back(x.grad().toVector<float>());
    g.push_back(h.detach().toVector<float>());
    // What the generators give after backward: the recomputation must not show.
    g.push_back({explicitGen.nextFloat()});
    g.push_back(randn({1}).toVector<float>());
    return g;
  };
  for (bool explicitGenerator : {false, true}) {
    CAPTURE(explicitGenerator);
    auto plain = run(false, explicitGenerator);
    auto ckpt = run(true, explicitGenerator);
    REQUIRE(plain.size() == ckpt.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      CAPTURE(i);
      CHECK(plain[i] == ckpt[i]);
    }
  }
  m.gen = nullptr;
}

TEST_CASE("a segment checkpointed under autocast is recomputed in the forward's low precision") {
  Mlp m(4, 16, 0.2, 5);
  Generator g(9);
  Tensor x0 = randn({6, 16}, {}, &g);
  auto run = [&](bool ckpt, DType low) {
    m.zeroGrad();
    manualSeed(13);
    Tensor x = x0.detach().clone().requiresGrad_();
    Tensor h;
    {
      autocast::Scope amp(low);
      h = ckpt ? checkpoint(segment(m, 0, 4), x) : segment(m, 0, 4)(x);
    }
    CHECK(h.dtype() == low);
    Tensor loss = (h.to(DType::Float32) * h.to(DType::Float32)).sum();
    loss.backward();
    std::vector<std::vector<float>> out = gradsOf(m.params());
    out.push_back(x.grad().toVector<float>());
    return out;
  };
  for (DType low : {DType::BFloat16, DType::Float16}) {
    CAPTURE(dtypeName(low));
    auto plain = run(false, low);
    auto ckpt = run(true, low);
    REQUIRE(plain.size() == ckpt.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      CAPTURE(i);
      CHECK(plain[i] == ckpt[i]);
    }
  }
}

TEST_CASE("without restoring the generator the recomputed dropout masks differ") {
  // The counterpart of the test above: the comparison can fail.
  Mlp m(2, 16, 0.5, 2);
  Tensor x0 = randn({4, 16});
  auto grads = [&](bool ckpt, bool preserve) {
    m.zeroGrad();
    manualSeed(8);
    Tensor x = x0.detach().clone().requiresGrad_();
    Tensor h = ckpt ? checkpoint(segment(m, 0, 2), x, CheckpointOptions{.generators = {}, .preserveRngState = preserve})
                    : segment(m, 0, 2)(x);
    h.sum().backward();
    return x.grad().toVector<float>();
  };
  CHECK(grads(false, true) == grads(true, true));
  CHECK(grads(false, true) != grads(true, false));
}

TEST_CASE("nested checkpoints give the plain run's gradients") {
  Mlp m(4, 8, 0.25, 4);
  Tensor x0 = randn({3, 8});
  auto run = [&](bool ckpt) {
    m.zeroGrad();
    manualSeed(12);
    Tensor x = x0.detach().clone().requiresGrad_();
    Tensor h;
    if (ckpt) {
      h = checkpoint(
          [&m](const Tensor& t) {
            Tensor a = checkpoint(segment(m, 0, 2), t);
            Tensor b = m.layer(2, a);
            return checkpoint(segment(m, 3, 4), b);
          },
          x);
    } else {
      h = segment(m, 0, 4)(x);
    }
    (h * h).sum().backward();
    auto g = gradsOf(m.params());
    g.push_back(x.grad().toVector<float>());
    return g;
  };
  auto plain = run(false);
  auto ckpt = run(true);
  for (size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(plain[i] == ckpt[i]);
  }
}

TEST_CASE("a checkpointed function whose inputs need no grad still gives its parameters their gradients") {
  Mlp m(2, 8, 0.0, 5);
  Tensor x = randn({3, 8});  // no grad
  Tensor plainOut = segment(m, 0, 2)(x);
  plainOut.sum().backward();
  auto plain = gradsOf(m.params());
  m.zeroGrad();
  Tensor out = checkpoint(segment(m, 0, 2), x);
  CHECK(out.requiresGrad());
  out.sum().backward();
  CHECK(gradsOf(m.params()) == plain);
  {
    NoGradGuard ng;
    Tensor y = checkpoint(segment(m, 0, 2), x.detach().requiresGrad_());
    CHECK_FALSE(y.requiresGrad());
    CHECK(y.toVector<float>() == plainOut.detach().toVector<float>());
  }
}

TEST_CASE("outputs that need no grad are left alone: an index output and one independent of the inputs") {
  Mlp m(1, 6, 0.0, 6);
  Tensor x0 = randn({4, 6});
  Tensor constant = fromVector<float>({1, 2, 3});
  auto fn = [&m, &constant](const std::vector<Tensor>& in) {
    Tensor h = m.layer(0, in[0]);
    return std::vector<Tensor>{h, argmax(h, 1), constant * 2.0};
  };
  Tensor x = x0.detach().clone().requiresGrad_();
  std::vector<Tensor> outs = checkpoint(fn, {x});
  REQUIRE(outs.size() == 3);
  CHECK(outs[0].requiresGrad());
  CHECK_FALSE(outs[1].requiresGrad());
  CHECK(outs[1].dtype() == DType::Int64);
  CHECK(outs[2].requiresGrad());  // floating: recorded; its recomputation needs none
  (outs[0].sum() + outs[2].sum()).backward();
  Tensor ref = x0.detach().clone().requiresGrad_();
  auto wGradCkpt = m.weights[0].grad().toVector<float>();
  m.zeroGrad();
  m.layer(0, ref).sum().backward();
  CHECK(x.grad().toVector<float>() == ref.grad().toVector<float>());
  CHECK(wGradCkpt == m.weights[0].grad().toVector<float>());
  CHECK_FALSE(constant.requiresGrad());
}

TEST_CASE("autograd::grad reaches parameters used inside a checkpoint without touching .grad") {
  Mlp m(2, 8, 0.0, 7);
  Tensor x = randn({3, 8}).requiresGrad_();
  auto plain = autograd::grad({segment(m, 0, 2)(x).sum()}, {m.weights[0], x});
  Tensor loss = checkpoint(segment(m, 0, 2), x).sum();
  auto ckpt = autograd::grad({loss}, {m.weights[0], x});
  CHECK(ckpt[0].toVector<float>() == plain[0].toVector<float>());
  CHECK(ckpt[1].toVector<float>() == plain[1].toVector<float>());
  CHECK_FALSE(m.weights[0].grad().defined());
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("checkpoint errors: an input changed in place, a recomputation of another arity") {
  Mlp m(1, 4, 0.0, 8);
  Tensor x = randn({2, 4}).requiresGrad_();
  Tensor a = x * 1.0;
  Tensor y = checkpoint(segment(m, 0, 1), a);
  {
    NoGradGuard ng;
    a.add_(onesLike(a));
  }
  CHECK_THROWS_WITH_AS(y.sum().backward(), doctest::Contains("checkpoint"), StateError);

  int calls = 0;
  auto fickle = [&calls](const std::vector<Tensor>& in) {
    ++calls;
    std::vector<Tensor> out{in[0] * 2.0};
    if (calls > 1) out.push_back(in[0]);
    return out;
  };
  Tensor z = checkpoint(fickle, {x})[0];
  CHECK_THROWS_WITH_AS(z.sum().backward(), doctest::Contains("the recomputation returned 2 tensors"), StateError);
}

TEST_CASE("checkpointing a deep MLP clearly lowers the peak bytes held by tensors") {
  const int layers = 64;
  const int per = 8;  // layers per checkpointed segment
  Mlp m(layers, 64, 0.0, 9);
  Tensor x0 = randn({1024, 64});
  auto peak = [&](bool ckpt) {
    m.zeroGrad();
    Tensor x = x0.detach().clone().requiresGrad_();
    Storage::resetPeakBytes();
    const size_t before = Storage::memoryStats().liveBytes;
    {
      Tensor h = x;
      for (int s = 0; s < layers / per; ++s) {
        h = ckpt ? checkpoint(segment(m, s * per, (s + 1) * per), h) : segment(m, s * per, (s + 1) * per)(h);
      }
      h.sum().backward();
    }
    return Storage::memoryStats().peakBytes - before;
  };
  const size_t plain = peak(false);
  const size_t ckpt = peak(true);
  MESSAGE("peak bytes above the start: plain " << plain << ", checkpointed " << ckpt);
  // Plain keeps one [1024, 64] activation per layer (tanh's output, which is
  // also the next linear's input): 64 of them. Checkpointed, the 8 segment
  // inputs and one segment's 8 activations live at once, plus a few gradient
  // buffers and the parameters' gradients (small at width 64): about 20 of
  // them, a ratio near 0.3.
  CHECK(double(ckpt) < 0.5 * double(plain));
}

TEST_CASE("a parameter shared by two checkpoints and the outer graph gets every contribution") {
  Tensor w = randn({4, 4}).requiresGrad_();
  Tensor x0 = randn({3, 4});
  auto fn = [&w](const Tensor& t) { return tanh(matmul(t, w)); };
  // usedBefore: w also feeds the checkpoints' input, so its accumulator still waits for that
  // gradient when the checkpoints deliver theirs. Otherwise w's only outer use comes after the
  // checkpoints: its accumulator has run by then and runs again with their gradients.
  auto run = [&](bool ckpt, bool usedBefore) {
    w.setGrad(Tensor());
    Tensor x = x0.detach().clone().requiresGrad_();
    Tensor h = usedBefore ? matmul(x, w) : x * 2.0;
    h = ckpt ? checkpoint(fn, h) : fn(h);
    h = ckpt ? checkpoint(fn, h) : fn(h);
    Tensor out = matmul(h, w);
    (out * out).sum().backward();
    return std::vector<std::vector<float>>{w.grad().toVector<float>(), x.grad().toVector<float>()};
  };
  for (bool usedBefore : {true, false}) {
    CAPTURE(usedBefore);
    auto plain = run(false, usedBefore);
    auto ckpt = run(true, usedBefore);
    CHECK(plain[1] == ckpt[1]);
    // The contributions are summed in another order: equal to rounding.
    CHECK(allclose(fromVector(ckpt[0]), fromVector(plain[0]), 1e-6, 1e-6));
  }
}

TEST_CASE("with retainGraph a checkpointed graph runs backward twice and gradients accumulate") {
  Mlp m(2, 6, 0.3, 10);
  Tensor x = randn({2, 6}).requiresGrad_();
  manualSeed(4);
  Tensor loss = checkpoint(segment(m, 0, 2), x).sum();
  loss.backward(Tensor(), true);
  auto once = x.grad().toVector<float>();
  loss.backward();
  auto twice = x.grad().toVector<float>();
  REQUIRE(once.size() == twice.size());
  for (size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == 2 * once[i]);
}
