#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "nn/nn.h"
#include "weft_test.h"

using namespace weft;

namespace {

constexpr TensorOptions kI64{.dtype = DType::Int64};

// ---- the PyTorch fixture (tests/nn/fixtures/gen_gpt_fixture.py) ---------------

struct Record {
  Shape shape;
  std::vector<double> values;  // float64 records
  std::vector<int64_t> ints;   // int64 records
};

struct Fixture {
  std::map<std::string, Record> records;
  std::vector<std::string> paramNames;  // in the file's (PyTorch's) order

  const Record& at(const std::string& name) const {
    auto it = records.find(name);
    REQUIRE_MESSAGE(it != records.end(), "fixture record missing: " << name);
    return it->second;
  }
  Tensor floats(const std::string& name) const { return fromVector(at(name).values, at(name).shape); }
  Tensor ints(const std::string& name) const { return fromVector(at(name).ints, at(name).shape); }
  int64_t config(int i) const { return at("config").ints[static_cast<size_t>(i)]; }
};

template <class T>
T readPod(std::ifstream& in) {
  T v{};
  in.read(reinterpret_cast<char*>(&v), sizeof(T));
  return v;
}

const Fixture& fixture() {
  static const Fixture fx = [] {
    Fixture f;
    const auto path = std::filesystem::path(WEFT_NN_FIXTURES_DIR) / "gpt_fixture.bin";
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot open " << path);
    while (in.peek() != std::char_traits<char>::eof()) {
      const auto nameLen = readPod<uint32_t>(in);
      std::string name(nameLen, '\0');
      in.read(name.data(), nameLen);
      const auto kind = readPod<uint8_t>(in);
      const auto ndim = readPod<uint32_t>(in);
      Record r;
      for (uint32_t d = 0; d < ndim; ++d) r.shape.push_back(readPod<int64_t>(in));
      const auto n = static_cast<size_t>(shapeNumel(r.shape));
      if (kind == 1) {
        r.ints.resize(n);
        in.read(reinterpret_cast<char*>(r.ints.data()), static_cast<std::streamsize>(n * 8));
      } else {
        r.values.resize(n);
        in.read(reinterpret_cast<char*>(r.values.data()), static_cast<std::streamsize>(n * 8));
      }
      REQUIRE_MESSAGE(in.good(), "truncated fixture record " << name);
      if (name.rfind("init:", 0) == 0) f.paramNames.push_back(name.substr(5));
      f.records.emplace(name, std::move(r));
    }
    return f;
  }();
  return fx;
}

nn::GPTConfig fixtureConfig() {
  const Fixture& fx = fixture();
  return {.vocabSize = fx.config(0),
          .blockSize = fx.config(1),
          .layers = fx.config(2),
          .heads = fx.config(3),
          .width = fx.config(4)};
}

// w[i] = offset + scale * sin(0.37 * i + phase), as the generator script.
Tensor wave(const Shape& shape, double offset, double scale, double phase) {
  std::vector<double> v(static_cast<size_t>(shapeNumel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = offset + scale * std::sin(0.37 * static_cast<double>(i) + phase);
  return fromVector(v, shape);
}

std::shared_ptr<nn::GPT> fixtureGpt(DType dtype) {
  const Fixture& fx = fixture();
  auto gpt = std::make_shared<nn::GPT>(fixtureConfig());
  gpt->to(dtype);
  nn::StateDict sd;
  for (const auto& name : fx.paramNames) {
    const auto& r = fx.at("init:" + name).values;
    sd[name] = wave(gpt->namedTensor(name).shape(), r[0], r[1], r[2]);
  }
  gpt->loadStateDict(sd);
  return gpt;
}

// max |actual - expected| / max |expected|, in float64.
double relativeError(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.shape() == expected.shape());
  const auto a = actual.toVector<double>();
  const auto e = expected.toVector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - e[i]));
    scale = std::max(scale, std::abs(e[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

void checkAgainstTorch(DType dtype, double tol) {
  const Fixture& fx = fixture();
  auto gpt = fixtureGpt(dtype);
  Tensor idx = fx.ints("idx");
  Tensor logits = gpt->forward(idx);
  CHECK(logits.dtype() == dtype);
  CHECK(relativeError(logits, fx.floats("logits")) <= tol);
  Tensor loss = gpt->loss(idx, fx.ints("targets"));
  CHECK(std::abs(loss.item<double>() - fx.at("loss").values[0]) <= tol * std::abs(fx.at("loss").values[0]));
  loss.backward();
  for (const auto& name : fx.paramNames) {
    INFO(name);
    Tensor g = gpt->namedTensor(name).grad();
    REQUIRE(g.defined());
    CHECK(relativeError(g, fx.floats("grad:" + name)) <= tol);
  }
}

Tensor tokens(std::vector<int64_t> ids, Shape shape) { return fromVector(ids, std::move(shape)); }

double stddev(const Tensor& t) {
  const auto v = t.toVector<double>();
  double mean = 0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  double var = 0;
  for (double x : v) var += (x - mean) * (x - mean);
  return std::sqrt(var / static_cast<double>(v.size()));
}

// |actual - expected| <= rel * |expected| (doctest::Approx adds an absolute
// margin of about epsilon, far too loose for a std of 0.02).
bool near(double actual, double expected, double rel) {
  return std::abs(actual - expected) <= rel * std::abs(expected);
}

Generator defaultGeneratorCopy() {
  std::lock_guard<std::mutex> lock(defaultGeneratorMutex());
  return defaultGenerator();
}

nn::GPTConfig smallConfig() { return {.vocabSize = 24, .blockSize = 8, .layers = 2, .heads = 2, .width = 16}; }

}  // namespace

// ---- against PyTorch ----------------------------------------------------------------------

TEST_CASE("GPT's logits, loss and every gradient match PyTorch 1.13 in float64") {
  checkAgainstTorch(DType::Float64, 1e-10);
}

TEST_CASE("GPT's logits, loss and every gradient match PyTorch 1.13 in float32") {
  checkAgainstTorch(DType::Float32, 1e-5);
}

TEST_CASE("GPT's parameters carry nanoGPT's names, shapes and order") {
  const Fixture& fx = fixture();
  auto gpt = std::make_shared<nn::GPT>(fixtureConfig());
  auto named = gpt->namedParameters();
  REQUIRE(named.size() == fx.paramNames.size());
  for (size_t i = 0; i < named.size(); ++i) {
    CHECK(named[i].first == fx.paramNames[i]);
    CHECK(named[i].second.shape() == fx.at("grad:" + fx.paramNames[i]).shape);
  }
  // The pieces are reachable as submodules for parallel layouts.
  std::set<std::string> modules;
  for (const auto& [name, m] : gpt->namedModules()) modules.insert(name);
  for (const char* name : {"wte", "wpe", "h", "h.0", "h.1", "h.1.attn", "h.1.mlp", "ln_f"}) {
    CHECK_MESSAGE(modules.count(name) == 1, name);
  }
}

// ---- structure ----------------------------------------------------------------------------

TEST_CASE("numParameters follows the GPT-2 formula with and without biases, the head counted once") {
  for (bool bias : {true, false}) {
    for (auto [v, b, l, c] : std::vector<std::array<int64_t, 4>>{{256, 128, 4, 128}, {50, 10, 3, 24}}) {
      nn::GPT gpt({.vocabSize = v, .blockSize = b, .layers = l, .heads = 4, .width = c, .bias = bias});
      const int64_t expected =
          bias ? v * c + b * c + l * (12 * c * c + 13 * c) + 2 * c : v * c + b * c + l * (12 * c * c + 2 * c) + c;
      CHECK(gpt.numParameters() == expected);
      int64_t byHand = 0;
      for (const auto& p : gpt.parameters()) byHand += p.numel();
      CHECK(byHand == expected);
    }
  }
}

TEST_CASE("the LM head is the token embedding: logits are features times wte transposed") {
  Generator g(3);
  auto gpt = std::make_shared<nn::GPT>(smallConfig(), &g);
  Tensor idx = randint(0, 24, {2, 5}, kI64, &g);
  Tensor logits = gpt->forward(idx);
  Tensor byHand = matmul(gpt->features(idx), gpt->wte()->weight().t());
  CHECK(relativeError(logits, byHand) <= 1e-6);
  for (const auto& [name, p] : gpt->namedParameters()) CHECK(name.find("lm_head") == std::string::npos);
  // Changing wte changes the head: its gradient collects both uses.
  gpt->loss(idx, randint(0, 24, {2, 5}, kI64, &g)).backward();
  Tensor grad = gpt->wte()->weight().grad();
  const auto rows = abs(grad).sum({1}).toVector<double>();
  // Tokens never fed in still get a gradient through the head.
  const auto ids = idx.toVector<int64_t>();
  for (int64_t v = 0; v < 24; ++v) {
    if (std::find(ids.begin(), ids.end(), v) == ids.end()) CHECK(rows[static_cast<size_t>(v)] > 0);
  }
}

TEST_CASE("GPT-2 initialisation: N(0, 0.02), scaled residual projections, zero biases, unit norms") {
  Generator g(11);
  nn::GPTConfig c{.vocabSize = 256, .blockSize = 128, .layers = 8, .heads = 4, .width = 128};
  nn::GPT gpt(c, &g);
  const double residual = 0.02 / std::sqrt(2.0 * 8);
  CHECK(near(stddev(gpt.wte()->weight()), 0.02, 0.03));
  CHECK(near(stddev(gpt.wpe()->weight()), 0.02, 0.03));
  for (const auto& [name, p] : gpt.namedParameters()) {
    INFO(name);
    if (name.ends_with("c_proj.weight")) {
      CHECK(near(stddev(p), residual, 0.05));
    } else if (name.ends_with("c_attn.weight") || name.ends_with("c_fc.weight")) {
      CHECK(near(stddev(p), 0.02, 0.03));
    } else if (name.ends_with("bias")) {
      CHECK(abs(p).sum().item<double>() == 0.0);
    } else if (name.find("ln_") != std::string::npos) {
      CHECK(allclose(p, onesLike(p), 0, 0));
    }
  }
}

TEST_CASE("GPT's initialisation is reproducible from its generator and leaves the default generator alone") {
  Generator before = defaultGeneratorCopy();
  Generator g1(5), g2(5);
  nn::GPT a(smallConfig(), &g1);
  nn::GPT b(smallConfig(), &g2);
  Generator after = defaultGeneratorCopy();
  CHECK(before.nextU64() == after.nextU64());
  auto pa = a.namedParameters(), pb = b.namedParameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(allclose(pa[i].second, pb[i].second, 0, 0));
  Generator g3(6);
  nn::GPT c(smallConfig(), &g3);
  CHECK_FALSE(allclose(a.wte()->weight(), c.wte()->weight(), 0, 0));
}

TEST_CASE("a transformer block's input gradient matches finite differences, checkpointed or not") {
  Generator g(31);
  nn::GPTConfig c{.vocabSize = 8, .blockSize = 4, .layers = 1, .heads = 2, .width = 8};
  auto block = std::make_shared<nn::TransformerBlock>(c);
  block->to(DType::Float64);
  for (const auto& p : block->parameters()) {
    NoGradGuard ng;
    Tensor(p).copy_(randn(p.shape(), testing::kF64, &g) * 0.3);
  }
  Tensor x = randn({2, 4, 8}, testing::kF64, &g);
  CHECK(testing::gradcheck([&](const std::vector<Tensor>& in) { return block->forward(in[0]); }, {x}));
  CHECK(testing::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return checkpoint([&](const Tensor& t) { return block->forward(t); }, in[0]);
      },
      {x}));
}

TEST_CASE("GPT's dropout acts in training mode only") {
  nn::GPTConfig c = smallConfig();
  c.dropout = 0.2;
  Generator g1(41), g2(41);
  auto dropping = std::make_shared<nn::GPT>(c, &g1);
  auto plain = std::make_shared<nn::GPT>(smallConfig(), &g2);  // same weights, no dropout
  Tensor idx = tokens({1, 5, 9, 2, 7, 3}, {2, 3});
  NoGradGuard ng;
  Tensor reference = plain->forward(idx);
  CHECK_FALSE(allclose(dropping->forward(idx), reference, 1e-6, 1e-7));
  dropping->eval();
  CHECK(allclose(dropping->forward(idx), reference, 0, 0));
}

TEST_CASE("LayerNorm normalises the trailing dimensions as the formula says") {
  nn::LayerNorm ln({3, 4});
  CHECK(ln.namedParameters().size() == 2);
  Generator g(2);
  Tensor x = randn({2, 3, 4}, {.dtype = DType::Float64}, &g);
  ln.to(DType::Float64);
  {
    NoGradGuard ng;
    Tensor(ln.weight()).copy_(randn({3, 4}, {.dtype = DType::Float64}, &g));
    Tensor(ln.bias()).copy_(randn({3, 4}, {.dtype = DType::Float64}, &g));
  }
  Tensor y = ln.forward(x);
  const auto xs = x.toVector<double>(), ys = y.toVector<double>();
  const auto w = ln.weight().toVector<double>(), b = ln.bias().toVector<double>();
  for (int r = 0; r < 2; ++r) {
    double mean = 0, var = 0;
    for (int i = 0; i < 12; ++i) mean += xs[r * 12 + i] / 12;
    for (int i = 0; i < 12; ++i) var += (xs[r * 12 + i] - mean) * (xs[r * 12 + i] - mean) / 12;
    for (int i = 0; i < 12; ++i) {
      CHECK(near(ys[r * 12 + i], (xs[r * 12 + i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i], 1e-12));
    }
  }
  CHECK(nn::LayerNorm({8}, 1e-5, true, false).namedParameters().size() == 1);
  CHECK(nn::LayerNorm({8}, 1e-5, false).namedParameters().empty());
  CHECK_THROWS_AS(ln.forward(randn({2, 4, 3})), InvalidArgumentError);
  CHECK_THROWS_AS(nn::LayerNorm({}), InvalidArgumentError);
  CHECK_THROWS_AS(nn::LayerNorm({4}, 0.0), InvalidArgumentError);
}

// ---- generate -----------------------------------------------------------------------------

TEST_CASE("greedy generation appends the argmax of the last position, run by run") {
  Generator g(21);
  auto gpt = std::make_shared<nn::GPT>(smallConfig(), &g);
  gpt->eval();
  Tensor prompt = tokens({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  Tensor out = gpt->generate(prompt, 3, 0.0);
  REQUIRE(out.shape() == Shape{2, 7});
  CHECK(allclose(out.narrow(1, 0, 4), prompt, 0, 0));
  // Reference: forward on the whole sequence, argmax of the last logits.
  Tensor seq = prompt;
  for (int step = 0; step < 3; ++step) {
    NoGradGuard ng;
    Tensor last = gpt->forward(seq).select(1, seq.size(1) - 1);
    seq = cat({seq, argmax(last, 1, true)}, 1);
  }
  CHECK(allclose(out, seq, 0, 0));
  CHECK(allclose(gpt->generate(prompt, 3, 0.0), out, 0, 0));
  // topK = 1 leaves only the argmax to sample, whatever the temperature.
  Generator s(4);
  CHECK(allclose(gpt->generate(prompt, 3, 1.5, 1, &s), out, 0, 0));
  CHECK(gpt->generate(prompt, 0, 0.0).shape() == Shape{2, 4});
}

TEST_CASE("generation crops the context to the last blockSize tokens") {
  Generator g(22);
  auto gpt = std::make_shared<nn::GPT>(smallConfig(), &g);  // blockSize 8
  gpt->eval();
  std::vector<int64_t> ids;
  for (int i = 0; i < 11; ++i) ids.push_back((i * 5 + 3) % 24);
  Tensor prompt = tokens(ids, {1, 11});
  Tensor out = gpt->generate(prompt, 4, 0.0);
  REQUIRE(out.shape() == Shape{1, 15});
  Tensor seq = prompt;
  for (int step = 0; step < 4; ++step) {
    NoGradGuard ng;
    Tensor ctx = seq.narrow(1, seq.size(1) - 8, 8);
    seq = cat({seq, argmax(gpt->forward(ctx).select(1, 7), 1, true)}, 1);
  }
  CHECK(allclose(out, seq, 0, 0));
}

TEST_CASE("sampling is reproducible from its generator and follows softmax(logits / temperature) within top-k") {
  Generator g(23);
  auto gpt = std::make_shared<nn::GPT>(smallConfig(), &g);
  gpt->eval();
  Tensor prompt = tokens({3, 1, 4}, {1, 3});
  Generator s1(99), s2(99), s3(100);
  Tensor a = gpt->generate(prompt, 6, 1.0, 0, &s1);
  CHECK(allclose(a, gpt->generate(prompt, 6, 1.0, 0, &s2), 0, 0));
  CHECK(a.shape() == Shape{1, 9});
  Generator s4(101);
  CHECK_FALSE(allclose(gpt->generate(prompt.expand({4, 3}).contiguous(), 6, 1.0, 0, &s4), a.expand({4, 9}), 0, 0));

  // One step from the same prompt, many times: the empirical frequencies
  // against the softmax of the scaled logits computed here. The initial
  // logits are small: a low temperature sharpens them to test the shape, and
  // temperature 1 with top-k spreads the draws over the kept tokens.
  std::vector<double> logits;
  {
    NoGradGuard ng;
    logits = gpt->forward(prompt).select(1, 2).toVector<double>();
  }
  const int draws = 4000;
  for (auto [temperature, topK] : std::vector<std::pair<double, int64_t>>{{0.02, 0}, {1.0, 5}, {0.05, 3}}) {
    std::vector<double> sorted = logits;
    std::sort(sorted.rbegin(), sorted.rend());
    const double threshold = topK == 0 ? sorted.back() : sorted[static_cast<size_t>(topK - 1)];
    std::vector<double> p(24);
    double total = 0;
    for (int v = 0; v < 24; ++v) {
      p[v] = logits[v] >= threshold ? std::exp((logits[v] - sorted[0]) / temperature) : 0.0;
      total += p[v];
    }
    std::vector<int> counts(24);
    Tensor many = gpt->generate(prompt.expand({draws, 3}).contiguous(), 1, temperature, topK, &s3);
    for (int64_t t : many.select(1, 3).toVector<int64_t>()) counts[static_cast<size_t>(t)]++;
    for (int v = 0; v < 24; ++v) {
      INFO("temperature " << temperature << " topK " << topK << " token " << v << " p " << p[v] / total << " count "
                          << counts[v]);
      const double expect = draws * p[v] / total;
      if (p[v] == 0) {
        CHECK(counts[v] == 0);
      } else {
        // Six binomial standard deviations, plus one for tiny probabilities.
        CHECK(std::abs(counts[v] - expect) <= 6 * std::sqrt(expect * (1 - p[v] / total)) + 1);
      }
    }
  }
}

// ---- errors -------------------------------------------------------------------------------

TEST_CASE("bad configs, token ids and lengths are typed errors naming the value") {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nn::GPTConfig c = smallConfig();
  c.heads = 3;
  CHECK_THROWS_AS(nn::GPT{c}, InvalidArgumentError);
  CHECK(message([&] { nn::GPT{c}; }).find("heads (3) must divide width (16)") != std::string::npos);
  c = smallConfig();
  c.dropout = 1.0;
  CHECK_THROWS_AS(nn::GPT{c}, InvalidArgumentError);
  c = smallConfig();
  c.layers = 0;
  CHECK(message([&] { nn::GPT{c}; }).find("layers must be positive, got 0") != std::string::npos);

  auto gpt = std::make_shared<nn::GPT>(smallConfig());
  Tensor tooLong = zeros({1, 9}, kI64);
  CHECK_THROWS_AS(gpt->forward(tooLong), InvalidArgumentError);
  CHECK(message([&] { gpt->forward(tooLong); }).find("T = 9") != std::string::npos);
  Tensor badId = tokens({1, 24, 2}, {1, 3});
  CHECK_THROWS_AS(gpt->forward(badId), IndexError);
  CHECK(message([&] { gpt->forward(badId); }).find("token id 24 at [0, 1]") != std::string::npos);
  CHECK_THROWS_AS(gpt->forward(tokens({-1}, {1, 1})), IndexError);
  CHECK_THROWS_AS(gpt->forward(zeros({1, 3})), InvalidArgumentError);
  CHECK_THROWS_AS(gpt->forward(zeros({3}, kI64)), InvalidArgumentError);
  CHECK_THROWS_AS(gpt->loss(zeros({1, 3}, kI64), zeros({1, 4}, kI64)), InvalidArgumentError);
  CHECK_THROWS_AS(gpt->loss(zeros({1, 3}, kI64), tokens({0, 24, 0}, {1, 3})), IndexError);
  CHECK_THROWS_AS(gpt->generate(zeros({1, 3}, kI64), -1), InvalidArgumentError);
  CHECK_THROWS_AS(gpt->generate(zeros({1, 3}, kI64), 1, -0.5), InvalidArgumentError);
  CHECK_THROWS_AS(gpt->generate(zeros({1, 3}, kI64), 1, 1.0, -2), InvalidArgumentError);
  CHECK_THROWS_AS(gpt->generate(zeros({1, 0}, kI64), 1), InvalidArgumentError);
  CHECK_THROWS_AS(gpt->generate(tokens({30}, {1, 1}), 1), IndexError);
  CHECK_THROWS_AS(nn::CausalSelfAttention(smallConfig()).forward(zeros({1, 2, 8})), InvalidArgumentError);
  CHECK_THROWS_AS(nn::CheckpointPolicy::every(0), InvalidArgumentError);
}

// ---- activation checkpointing ---------------------------------------------------------------

TEST_CASE("checkpoint policies start segments at the documented blocks") {
  auto starts = [](const nn::CheckpointPolicy& p, int layers) {
    std::vector<int> s;
    for (int b = 0; b < layers; ++b) {
      if (p.at(b, layers)) s.push_back(b);
    }
    return s;
  };
  CHECK(starts(nn::CheckpointPolicy::none(), 6).empty());
  CHECK_FALSE(nn::CheckpointPolicy().enabled());
  CHECK(starts(nn::CheckpointPolicy::everyBlock(), 4) == std::vector<int>{0, 1, 2, 3});
  CHECK(starts(nn::CheckpointPolicy::every(2), 5) == std::vector<int>{0, 2, 4});
  CHECK(starts(nn::CheckpointPolicy::sqrtN(), 1) == std::vector<int>{0});
  CHECK(starts(nn::CheckpointPolicy::sqrtN(), 4) == std::vector<int>{0, 2});
  CHECK(starts(nn::CheckpointPolicy::sqrtN(), 9) == std::vector<int>{0, 3, 6});
  CHECK(starts(nn::CheckpointPolicy::sqrtN(), 10) == std::vector<int>{0, 4, 8});
  CHECK_FALSE(nn::CheckpointPolicy::everyBlock().at(4, 4));
}

namespace {

struct StepResult {
  Tensor loss;
  std::vector<Tensor> grads;
  size_t peakBytes = 0;
};

// One training step of a dropout GPT from fixed weights and a fixed default
// generator state; reports the peak bytes held by storages during it.
StepResult trainingStep(nn::CheckpointPolicy policy) {
  nn::GPTConfig c{
      .vocabSize = 64, .blockSize = 64, .layers = 4, .heads = 4, .width = 64, .dropout = 0.1, .checkpoint = policy};
  Generator init(8);
  auto gpt = std::make_shared<nn::GPT>(c, &init);
  Generator data(9);
  Tensor x = randint(0, 64, {8, 64}, kI64, &data);
  Tensor y = randint(0, 64, {8, 64}, kI64, &data);
  manualSeed(77);
  Storage::resetPeakBytes();
  StepResult r;
  r.loss = gpt->loss(x, y);
  r.loss.backward();
  r.peakBytes = Storage::memoryStats().peakBytes;
  for (const auto& p : gpt->parameters()) r.grads.push_back(p.grad());
  return r;
}

}  // namespace

TEST_CASE("checkpointed blocks give bit-identical gradients with dropout and hold fewer bytes") {
  StepResult plain = trainingStep(nn::CheckpointPolicy::none());
  for (auto policy :
       {nn::CheckpointPolicy::everyBlock(), nn::CheckpointPolicy::every(2), nn::CheckpointPolicy::sqrtN()}) {
    StepResult ck = trainingStep(policy);
    CHECK(ck.loss.item<float>() == plain.loss.item<float>());
    REQUIRE(ck.grads.size() == plain.grads.size());
    for (size_t i = 0; i < ck.grads.size(); ++i) {
      INFO("parameter " << i);
      CHECK(allclose(ck.grads[i], plain.grads[i], 0, 0));
    }
  }
  StepResult every = trainingStep(nn::CheckpointPolicy::everyBlock());
  INFO("peak bytes: none " << plain.peakBytes << ", everyBlock " << every.peakBytes);
  CHECK(every.peakBytes < plain.peakBytes);
}
