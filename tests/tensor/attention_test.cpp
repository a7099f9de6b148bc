// scaledDotProductAttention and mergeAttention against the naive formula
// softmax(q k^T * scale + mask) v written with matmul and softmax, finite
// differences, and PyTorch 1.13's numbers (fixtures/attention_cases.inc).
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "gradcheck.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/parallel.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::expectClose;
using weft::testing::gradcheck;
using weft::testing::kF64;

namespace {

constexpr double kHidden = -1e300;  // an additive mask entry that exp() turns into exactly 0

struct Case {
  int64_t B, H, Sq, Sk, D;
  bool causal;
  int64_t queryOffset, keyOffset;
};

bool sees(const Case& c, int64_t i, int64_t j) { return !c.causal || j + c.keyOffset <= i + c.queryOffset; }
bool rowSeesAny(const Case& c, int64_t i) { return c.Sk > 0 && sees(c, i, 0); }

// The additive mask [Sq, Sk] (0 or kHidden) and [Sq, 1] (1 for a row that
// sees some key, else 0).
std::pair<Tensor, Tensor> masks(const Case& c, DType dt) {
  std::vector<double> add(static_cast<size_t>(c.Sq * c.Sk)), any(static_cast<size_t>(c.Sq));
  for (int64_t i = 0; i < c.Sq; ++i) {
    any[i] = rowSeesAny(c, i) ? 1.0 : 0.0;
    for (int64_t j = 0; j < c.Sk; ++j) add[i * c.Sk + j] = sees(c, i, j) ? 0.0 : kHidden;
  }
  return {fromVector(add, {c.Sq, c.Sk}).to(dt), fromVector(any, {c.Sq, 1}).to(dt)};
}

// softmax(q k^T * scale + mask) (∘ dropScale) v, and the log-sum-exp of the
// masked scores (for rows that see some key).
AttentionOutput naive(const Tensor& q, const Tensor& k, const Tensor& v, const Case& c, double scale,
                      const Tensor& dropScale = Tensor()) {
  auto [add, any] = masks(c, q.dtype());
  Tensor s = matmul(q, k.transpose(-2, -1)) * scale + add;
  Tensor p = softmax(s, -1);
  if (dropScale.defined()) p = p * dropScale;
  Tensor out = matmul(p, v) * any;
  Tensor mx = max(s, -1, true).first.detach();
  Tensor lse = log(sum(exp(s - mx), {-1})) + mx.squeeze(-1);
  return {out, lse};
}

std::vector<Tensor> inputs(const Case& c, DType dt, uint64_t seed) {
  Generator g(seed);
  TensorOptions o{.dtype = dt};
  return {randn({c.B, c.H, c.Sq, c.D}, o, &g), randn({c.B, c.H, c.Sk, c.D}, o, &g),
          randn({c.B, c.H, c.Sk, c.D}, o, &g)};
}

AttentionOptions optionsOf(const Case& c) {
  return {.causal = c.causal, .queryOffset = c.queryOffset, .keyOffset = c.keyOffset};
}

// out, lse and d(sum(out*wo) + sum(lse*wl))/d(q, k, v) of `f` on fresh leaves.
struct Result {
  Tensor out, lse;
  std::vector<Tensor> grads;
};
template <class F>
Result evaluate(F&& f, const std::vector<Tensor>& in, uint64_t seed, bool throughLse = true) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : in) leaves.push_back(t.detach().clone().requiresGrad_());
  AttentionOutput o = f(leaves[0], leaves[1], leaves[2]);
  Generator g(seed);
  Tensor wo = randn(o.out.shape(), {.dtype = o.out.dtype()}, &g);
  Tensor wl = randn(o.lse.shape(), {.dtype = o.lse.dtype()}, &g);
  Tensor loss = sum(o.out * wo);
  if (throughLse) loss = loss + sum(o.lse * wl);
  return {o.out.detach(), o.lse.detach(), autograd::grad({loss}, leaves)};
}

// lse of rows that see no key is -inf; elsewhere as expected.
void checkLse(const Tensor& got, const Tensor& expected, const Case& c, double rtol, double atol) {
  std::vector<double> a = got.toVector<double>(), e = expected.toVector<double>();
  REQUIRE(a.size() == e.size());
  for (size_t r = 0; r < a.size(); ++r) {
    const int64_t i = static_cast<int64_t>(r) % c.Sq;
    CAPTURE(r);
    if (!rowSeesAny(c, i)) {
      CHECK(a[r] == -std::numeric_limits<double>::infinity());
    } else {
      CHECK(std::abs(a[r] - e[r]) <= atol + rtol * std::abs(e[r]));
    }
  }
}

// The PyTorch 1.13 references of fixtures/gen_attention_cases.py.
struct AttentionCase {
  const char* name;
  DType dtype;
  int64_t B, H, Sq, Sk, D;
  bool causal;
  int64_t queryOffset, keyOffset;
  double scale;  // 0: the default
  std::vector<double> out, lse, dq, dk, dv;
};
#include "fixtures/attention_cases.inc"

// wave(shape, phase, scale)[i] = scale * sin(0.37 * i + phase) in float64,
// then converted to dt: the inputs the fixture's generator used.
Tensor wave(Shape shape, double phase, DType dt, double scale = 1.0) {
  std::vector<double> v(static_cast<size_t>(shapeNumel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(0.37 * static_cast<double>(i) + phase);
  return fromVector(v, std::move(shape)).to(dt);
}

}  // namespace

// ---- against PyTorch -----------------------------------------------------------------------

TEST_CASE("attention matches PyTorch 1.13's softmax(q k^T * scale + mask) v, lse and gradients") {
  for (const AttentionCase& c : kAttentionCases) {
    const std::string name = c.name;
    CAPTURE(name);
    const DType dt = c.dtype;
    Tensor q = wave({c.B, c.H, c.Sq, c.D}, 0.1, dt).requiresGrad_();
    Tensor k = wave({c.B, c.H, c.Sk, c.D}, 0.6, dt, 0.8).requiresGrad_();
    Tensor v = wave({c.B, c.H, c.Sk, c.D}, 1.3, dt).requiresGrad_();
    AttentionOptions o{.causal = c.causal, .queryOffset = c.queryOffset, .keyOffset = c.keyOffset};
    if (c.scale != 0.0) o.scale = c.scale;
    AttentionOutput r = scaledDotProductAttentionWithLse(q, k, v, o);
    Tensor loss = sum(r.out * wave(r.out.shape(), 2.1, dt)) + sum(r.lse * wave(r.lse.shape(), 2.9, dt));
    std::vector<Tensor> g = autograd::grad({loss}, {q, k, v});
    // float32 to 1e-5 relative (an absolute floor of 1e-6 for values near
    // zero, where both sides' rounding dominates), float64 to 1e-10.
    const double rtol = dt == DType::Float32 ? 1e-5 : 1e-10, atol = dt == DType::Float32 ? 1e-6 : 1e-12;
    auto ref = [](const std::vector<double>& values, const Tensor& like) { return fromVector(values, like.shape()); };
    expectClose(r.out.to(DType::Float64), ref(c.out, r.out), rtol, atol);
    expectClose(r.lse.to(DType::Float64), ref(c.lse, r.lse), rtol, atol);
    expectClose(g[0].to(DType::Float64), ref(c.dq, q), rtol, atol);
    expectClose(g[1].to(DType::Float64), ref(c.dk, k), rtol, atol);
    expectClose(g[2].to(DType::Float64), ref(c.dv, v), rtol, atol);
  }
}

// ---- against the naive formula ------------------------------------------------------

TEST_CASE("attention matches softmax(q k^T * scale + mask) v in out, lse and every gradient") {
  // Lengths below, at and above the blocks (128 queries, 128 keys), odd ones,
  // Sq != Sk both ways, offsets placing the queries after the keys.
  const std::vector<Case> cases = {
      {1, 1, 37, 53, 24, false, 0, 0},    {2, 3, 37, 53, 24, true, 0, 0},    {1, 2, 53, 37, 24, true, 0, 0},
      {1, 1, 5, 3, 8, false, 0, 0},        {1, 2, 130, 300, 16, false, 0, 0}, {2, 1, 200, 200, 16, true, 0, 0},
      {1, 2, 37, 53, 24, true, 100, 60},   {1, 1, 70, 260, 8, true, 190, 0},  {1, 1, 128, 128, 8, true, 0, 0},
      {1, 1, 129, 257, 8, true, 128, 0},
  };
  for (const Case& c : cases) {
    CAPTURE(c.Sq);
    CAPTURE(c.Sk);
    CAPTURE(c.causal);
    CAPTURE(c.queryOffset);
    std::vector<Tensor> in = inputs(c, DType::Float64, 1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    Result flash = evaluate(
        [&](const Tensor& q, const Tensor& k, const Tensor& v) {
          return scaledDotProductAttentionWithLse(q, k, v, optionsOf(c));
        },
        in, 2);
    Result ref = evaluate([&](const Tensor& q, const Tensor& k, const Tensor& v) { return naive(q, k, v, c, scale); },
                          in, 2);
    expectClose(flash.out, ref.out, 1e-10, 1e-12);
    checkLse(flash.lse, ref.lse, c, 1e-12, 1e-12);
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      expectClose(flash.grads[i], ref.grads[i], 1e-9, 1e-11);
    }
  }
}

TEST_CASE("attention rows that see no key give out 0, lse -inf and no gradient, the other rows exact") {
  // Keys start 20 positions after the queries: queries 0..19 see nothing,
  // including a whole query block of 128 when the offset is larger.
  for (const Case& c : {Case{1, 2, 37, 53, 16, true, 0, 20}, Case{1, 1, 150, 40, 8, true, 0, 140}}) {
    CAPTURE(c.keyOffset);
    std::vector<Tensor> in = inputs(c, DType::Float64, 3);
    const double scale = 0.3;
    AttentionOptions o = optionsOf(c);
    o.scale = scale;
    // The loss reads out only: lse is -inf on the rows that see nothing.
    Result flash = evaluate(
        [&](const Tensor& q, const Tensor& k, const Tensor& v) { return scaledDotProductAttentionWithLse(q, k, v, o); },
        in, 4, false);
    Result ref =
        evaluate([&](const Tensor& q, const Tensor& k, const Tensor& v) { return naive(q, k, v, c, scale); }, in, 4,
                 false);
    expectClose(flash.out, ref.out, 1e-10, 1e-12);
    checkLse(flash.lse, ref.lse, c, 1e-12, 1e-12);
    std::vector<double> out = flash.out.toVector<double>(), gq = flash.grads[0].toVector<double>();
    for (int64_t r = 0; r < c.B * c.H * c.Sq; ++r) {
      if (rowSeesAny(c, r % c.Sq)) continue;
      for (int64_t d = 0; d < c.D; ++d) {
        CHECK(out[r * c.D + d] == 0.0);
        CHECK(gq[r * c.D + d] == 0.0);
      }
    }
    for (int i = 0; i < 3; ++i) expectClose(flash.grads[i], ref.grads[i], 1e-9, 1e-11);
  }
}

TEST_CASE("attention over no keys gives zeros and lse -inf, over no queries empty results") {
  Tensor q = randn({1, 2, 3, 4}, kF64).requiresGrad_(), k = randn({1, 2, 0, 4}, kF64).requiresGrad_();
  Tensor v = randn({1, 2, 0, 4}, kF64).requiresGrad_();
  AttentionOutput r = scaledDotProductAttentionWithLse(q, k, v);
  CHECK(r.out.toVector<double>() == std::vector<double>(24, 0.0));
  CHECK(r.lse.toVector<double>() == std::vector<double>(6, -std::numeric_limits<double>::infinity()));
  sum(r.out).backward();
  CHECK(q.grad().toVector<double>() == std::vector<double>(24, 0.0));
  CHECK(k.grad().numel() == 0);
  Tensor none = randn({1, 2, 0, 4}, kF64).requiresGrad_();
  AttentionOutput e = scaledDotProductAttentionWithLse(none, q, q);
  CHECK(e.out.shape() == Shape{1, 2, 0, 4});
  CHECK(e.lse.shape() == Shape{1, 2, 0});
  sum(e.out).backward();
  CHECK(q.grad().toVector<double>() == std::vector<double>(24, 0.0));
}

TEST_CASE("attention in float32 agrees with float64") {
  const Case c{2, 2, 100, 150, 32, true, 0, 0};
  std::vector<Tensor> in64 = inputs(c, DType::Float64, 5), in32;
  for (const Tensor& t : in64) in32.push_back(t.to(DType::Float32));
  auto f = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
    return scaledDotProductAttentionWithLse(q, k, v, optionsOf(c));
  };
  Result a = evaluate(f, in64, 6), b = evaluate(f, in32, 6);
  CHECK(b.out.dtype() == DType::Float32);
  CHECK(b.lse.dtype() == DType::Float32);
  expectClose(b.out.to(DType::Float64), a.out, 1e-4, 1e-5);
  expectClose(b.lse.to(DType::Float64), a.lse, 1e-5, 1e-5);
  for (int i = 0; i < 3; ++i) expectClose(b.grads[i].to(DType::Float64), a.grads[i], 1e-3, 1e-4);
}

// ---- finite differences -------------------------------------------------------------------

TEST_CASE("attention passes gradcheck through out and lse, causal, offset and with dropout") {
  for (const Case& c : {Case{1, 2, 5, 7, 3, false, 0, 0}, Case{2, 1, 6, 4, 3, true, 0, 0},
                        Case{1, 1, 7, 6, 2, true, 3, 5}}) {
    for (double p : {0.0, 0.3}) {
      CAPTURE(c.Sq);
      CAPTURE(c.causal);
      CAPTURE(p);
      std::vector<Tensor> in = inputs(c, DType::Float64, 7);
      CHECK(gradcheck(
          [&](const std::vector<Tensor>& x) {
            Generator g(11);  // the same mask in every evaluation
            AttentionOptions o = optionsOf(c);
            o.dropout = p;
            o.generator = &g;
            o.scale = 0.7;
            AttentionOutput r = scaledDotProductAttentionWithLse(x[0], x[1], x[2], o);
            // Both outputs in one: out's rows summed, plus lse (finite here).
            return sum(r.out, {-1}) * 0.5 + r.lse;
          },
          in));
      CHECK(gradcheck(
          [&](const std::vector<Tensor>& x) {
            Generator g(11);
            AttentionOptions o = optionsOf(c);
            o.dropout = p;
            o.generator = &g;
            return scaledDotProductAttention(x[0], x[1], x[2], o);
          },
          in));
    }
  }
}

// ---- dropout ---------------------------------------------------------------------------------

TEST_CASE("attention dropout is reproducible from the generator's state and differs between seeds") {
  const Case c{2, 2, 40, 70, 8, true, 0, 0};
  std::vector<Tensor> in = inputs(c, DType::Float32, 12);
  auto run = [&](Generator* g) {
    AttentionOptions o = optionsOf(c);
    o.dropout = 0.4;
    o.generator = g;
    return scaledDotProductAttention(in[0], in[1], in[2], o).toVector<float>();
  };
  Generator a(3), b(3), other(4);
  const std::vector<float> fromA = run(&a);
  CHECK(fromA == run(&b));
  CHECK(a.nextU64() == b.nextU64());  // and both advanced alike
  CHECK(fromA != run(&other));
  manualSeed(21);
  std::vector<float> first = run(nullptr);
  manualSeed(21);
  CHECK(run(nullptr) == first);
}

TEST_CASE("a dropout frame gives a call its part of a larger attention's mask: heads, query rows, key blocks") {
  const Case c{2, 4, 40, 40, 8, true, 0, 0};
  std::vector<Tensor> in = inputs(c, DType::Float64, 31);
  const Tensor gradOut = randn({2, 4, 40, 8}, {.dtype = DType::Float64}, nullptr);
  // The whole attention, with dropout from a generator of seed 5; out and the gradients of sum(out·gradOut).
  std::vector<Tensor> leaves;
  for (const Tensor& t : in) leaves.push_back(t.detach().clone().requiresGrad_());
  Generator whole(5);
  Tensor out = scaledDotProductAttention(leaves[0], leaves[1], leaves[2],
                                         {.causal = true, .dropout = 0.3, .generator = &whole});
  sum(mul(out, gradOut)).backward();
  using Frame = AttentionOptions::DropoutFrame;
  const Frame frame{.heads = 4, .headOffset = 0, .queries = 40, .keys = 40};
  SUBCASE("two calls of two heads each") {
    for (int64_t h0 : {0, 2}) {
      CAPTURE(h0);
      std::vector<Tensor> part;
      for (const Tensor& t : in) part.push_back(t.narrow(1, h0, 2).contiguous().requiresGrad_());
      Generator g(5);
      Frame f = frame;
      f.headOffset = h0;
      Tensor y = scaledDotProductAttention(part[0], part[1], part[2],
                                           {.causal = true, .dropout = 0.3, .generator = &g, .dropoutFrame = f});
      sum(mul(y, gradOut.narrow(1, h0, 2))).backward();
      CHECK(max(abs(y - out.narrow(1, h0, 2))).item<double>() < 1e-12);
      for (size_t i = 0; i < 3; ++i) {
        CHECK(max(abs(part[i].grad() - leaves[i].grad().narrow(1, h0, 2))).item<double>() < 1e-12);
      }
      // Without the frame the second pair of heads would draw the first pair's mask.
      Generator again(5);
      Tensor plain = scaledDotProductAttention(part[0], part[1], part[2],
                                               {.causal = true, .dropout = 0.3, .generator = &again});
      if (h0 == 2) CHECK(max(abs(plain - out.narrow(1, h0, 2))).item<double>() > 1e-3);
    }
  }
  SUBCASE("the last 16 query rows against two key blocks, merged") {
    Tensor q = in[0].narrow(2, 24, 16).contiguous();
    AttentionOutput parts[2];
    for (int blk = 0; blk < 2; ++blk) {
      Generator g(5);
      parts[blk] = scaledDotProductAttentionWithLse(
          q, in[1].narrow(2, 20 * blk, 20).contiguous(), in[2].narrow(2, 20 * blk, 20).contiguous(),
          {.causal = true, .queryOffset = 24, .keyOffset = 20 * blk, .dropout = 0.3, .generator = &g,
           .dropoutFrame = frame});
    }
    CHECK(max(abs(mergeAttention(parts[0], parts[1]).out - out.narrow(2, 24, 16))).item<double>() < 1e-12);
  }
  SUBCASE("a frame that does not hold the call") {
    Frame small = frame;
    small.headOffset = 1;
    CHECK_THROWS_WITH_AS(scaledDotProductAttention(in[0], in[1], in[2], {.dropout = 0.3, .dropoutFrame = small}),
                         doctest::Contains("does not hold q of shape [2, 4, 40, 8]"), InvalidArgumentError);
  }
}

TEST_CASE("attention dropout drops about p of the probabilities, independently per head, and scales the rest") {
  // With v the identity (Sk = D), out is the matrix of probabilities itself:
  // P ∘ Z, Z = 0 or 1/(1-p).
  const int64_t B = 2, H = 4, S = 64;
  Generator gq(13);
  Tensor q = randn({B, 1, S, S}, kF64, &gq).expand({B, H, S, S}).contiguous();
  Tensor k = randn({B, 1, S, S}, kF64, &gq).expand({B, H, S, S}).contiguous();
  std::vector<double> eye(static_cast<size_t>(S * S), 0.0);
  for (int64_t i = 0; i < S; ++i) eye[i * S + i] = 1.0;
  Tensor v = fromVector(eye, {1, 1, S, S}).expand({B, H, S, S}).contiguous();
  std::vector<double> probs = scaledDotProductAttention(q, k, v).toVector<double>();
  for (double p : {0.1, 0.3, 0.5}) {
    CAPTURE(p);
    Generator g(17);
    std::vector<double> dropped =
        scaledDotProductAttention(q, k, v, {.dropout = p, .generator = &g}).toVector<double>();
    int64_t zeros = 0, wrong = 0, sameAsHead0 = 0;
    for (size_t e = 0; e < probs.size(); ++e) {
      if (dropped[e] == 0.0) {
        ++zeros;
      } else if (std::abs(dropped[e] - probs[e] / (1.0 - p)) > 1e-12 * probs[e]) {
        ++wrong;
      }
      // Heads share their inputs: only their masks tell them apart.
      const size_t head = (e / static_cast<size_t>(S * S)) % H;
      const size_t head0 = e - head * static_cast<size_t>(S * S);
      if (head != 0 && (dropped[e] == 0.0) == (dropped[head0] == 0.0)) ++sameAsHead0;
    }
    CHECK(wrong == 0);
    const double n = static_cast<double>(probs.size());
    // The standard deviation of the fraction is at most 0.002.
    CHECK(std::abs(static_cast<double>(zeros) / n - p) < 0.01);
    // Independent masks agree on a fraction p^2 + (1-p)^2 of the elements.
    const double agree = static_cast<double>(sameAsHead0) / (n * (H - 1) / H);
    CHECK(std::abs(agree - (p * p + (1 - p) * (1 - p))) < 0.02);
  }
}

TEST_CASE("attention dropout leaves the expected output unchanged") {
  const Case c{1, 1, 8, 16, 4, false, 0, 0};
  std::vector<Tensor> in = inputs(c, DType::Float64, 14);
  Tensor plain = scaledDotProductAttention(in[0], in[1], in[2]);
  Tensor total = zerosLike(plain);
  Generator g(15);
  const int runs = 2000;
  for (int r = 0; r < runs; ++r) {
    total = total + scaledDotProductAttention(in[0], in[1], in[2], {.dropout = 0.3, .generator = &g});
  }
  // Each element's standard error over the runs is below 0.006.
  expectClose(total / static_cast<double>(runs), plain, 0.0, 0.04);
}

// ---- merging partial attentions ----------------------------------------------------------

namespace {

// Attention of q over all keys, and the merge of its two halves split at m,
// with out, lse and the gradients of both.
void checkMergeEqualsWhole(const Case& c, int64_t m, bool throughLse) {
  CAPTURE(c.Sq);
  CAPTURE(c.Sk);
  CAPTURE(m);
  CAPTURE(c.queryOffset);
  CAPTURE(c.keyOffset);
  std::vector<Tensor> in = inputs(c, DType::Float64, 16);
  Result whole = evaluate(
      [&](const Tensor& q, const Tensor& k, const Tensor& v) {
        return scaledDotProductAttentionWithLse(q, k, v, optionsOf(c));
      },
      in, 17, throughLse);
  Result merged = evaluate(
      [&](const Tensor& q, const Tensor& k, const Tensor& v) {
        AttentionOptions first = optionsOf(c), second = optionsOf(c);
        second.keyOffset = c.keyOffset + m;
        AttentionOutput a = scaledDotProductAttentionWithLse(q, k.narrow(2, 0, m), v.narrow(2, 0, m), first);
        AttentionOutput b =
            scaledDotProductAttentionWithLse(q, k.narrow(2, m, c.Sk - m), v.narrow(2, m, c.Sk - m), second);
        return mergeAttention(a, b);
      },
      in, 17, throughLse);
  expectClose(merged.out, whole.out, 1e-12, 1e-13);
  checkLse(merged.lse, whole.lse, c, 1e-12, 1e-13);
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    for (double x : merged.grads[i].toVector<double>()) CHECK(std::isfinite(x));
    expectClose(merged.grads[i], whole.grads[i], 1e-10, 1e-12);
  }
}

}  // namespace

TEST_CASE("mergeAttention of two key blocks equals attention over all keys, values and gradients") {
  checkMergeEqualsWhole({2, 2, 37, 53, 8, false, 0, 0}, 20, true);
  // Causal blocks of one sequence: the queries sit after the first block.
  checkMergeEqualsWhole({1, 2, 37, 53, 8, true, 16, 0}, 20, true);
  // The second block is partly in the future of every query, wholly for some.
  checkMergeEqualsWhole({1, 1, 37, 53, 8, true, 0, 0}, 30, true);
  // ... and wholly in the future of every query (lse -inf on every row of it).
  checkMergeEqualsWhole({1, 2, 20, 53, 8, true, 0, 0}, 30, true);
  // The first five queries see neither block: out 0, lse -inf, no NaN.
  checkMergeEqualsWhole({1, 1, 37, 53, 8, true, 0, 5}, 30, false);
}

TEST_CASE("mergeAttention passes gradcheck in all four tensors and handles -inf rows") {
  Generator g(18);
  Tensor oa = randn({2, 3, 4}, kF64, &g), ob = randn({2, 3, 4}, kF64, &g);
  Tensor la = randn({2, 3}, kF64, &g), lb = randn({2, 3}, kF64, &g);
  CHECK(gradcheck(
      [](const std::vector<Tensor>& x) {
        AttentionOutput r = mergeAttention({x[0], x[1]}, {x[2], x[3]});
        return r.out * 0.5 + r.lse.unsqueeze(-1);
      },
      {oa, la, ob, lb}));
  // Rows of lse -inf: on one side the other passes through unchanged; on
  // both the row is 0 with lse -inf.
  const double inf = std::numeric_limits<double>::infinity();
  Tensor lseA = fromVector(std::vector<double>{-inf, 0.5, -inf}, {3});
  Tensor lseB = fromVector(std::vector<double>{1.5, -inf, -inf}, {3});
  Tensor outA = randn({3, 4}, kF64, &g).requiresGrad_(), outB = randn({3, 4}, kF64, &g).requiresGrad_();
  Tensor la2 = lseA.clone().requiresGrad_(), lb2 = lseB.clone().requiresGrad_();
  AttentionOutput r = mergeAttention({outA, la2}, {outB, lb2});
  expectClose(r.out.narrow(0, 0, 1), outB.detach().narrow(0, 0, 1), 0, 0);
  expectClose(r.out.narrow(0, 1, 1), outA.detach().narrow(0, 1, 1), 0, 0);
  CHECK(r.out.narrow(0, 2, 1).toVector<double>() == std::vector<double>(4, 0.0));
  CHECK(r.lse.toVector<double>() == std::vector<double>{1.5, 0.5, -inf});
  sum(r.out * randn({3, 4}, kF64, &g)).backward();
  for (const Tensor& t : {outA, outB, la2, lb2}) {
    for (double x : t.grad().toVector<double>()) CHECK(std::isfinite(x));
  }
  CHECK(outA.grad().narrow(0, 0, 1).toVector<double>() == std::vector<double>(4, 0.0));
  CHECK(outA.grad().narrow(0, 2, 1).toVector<double>() == std::vector<double>(4, 0.0));
}

TEST_CASE("mergeAttention names the shapes that do not fit") {
  Tensor o = randn({1, 2, 5, 4}), l = randn({1, 2, 5});
  CHECK_THROWS_WITH_AS(mergeAttention({o, l}, {randn({1, 2, 6, 4}), randn({1, 2, 6})}),
                       doctest::Contains("mergeAttention: the two attentions differ in shape: out [1, 2, 5, 4] and "
                                         "[1, 2, 6, 4]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(mergeAttention({o, randn({1, 2, 4})}, {o, randn({1, 2, 4})}),
                       doctest::Contains("lse of shape [1, 2, 4] does not fit out of shape [1, 2, 5, 4]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(mergeAttention({o, l}, {o.to(DType::Float64), l.to(DType::Float64)}),
                       doctest::Contains("dtype mismatch"), InvalidArgumentError);
}

// ---- threads ---------------------------------------------------------------------------------

TEST_CASE("attention gives the same bits with one thread or several, in one backward pass or two") {
  const int saved = kernels::cpu::numThreads();
  // 3 batch-heads: one thread takes the single backward pass (batch-heads >= 2 x threads), two
  // and three threads the two passes; several query and key blocks, causal, with dropout.
  const Case c{1, 3, 150, 270, 16, true, 0, 0};
  auto run = [&](int threads) {
    kernels::cpu::setNumThreads(threads);
    std::vector<Tensor> in = inputs(c, DType::Float32, 8);
    Generator g(1);
    AttentionOptions o = optionsOf(c);
    o.dropout = 0.2;
    o.generator = &g;
    Result r = evaluate([&](const Tensor& q, const Tensor& k, const Tensor& v) {
      return scaledDotProductAttentionWithLse(q, k, v, o);
    }, in, 9);
    std::vector<std::vector<float>> got{r.out.toVector<float>(), r.lse.toVector<float>()};
    for (const Tensor& t : r.grads) got.push_back(t.toVector<float>());
    return got;
  };
  auto one = run(1), two = run(2), three = run(3);
  kernels::cpu::setNumThreads(saved);
  CHECK(one == two);
  CHECK(one == three);
}

// ---- layouts ----------------------------------------------------------------------------------

TEST_CASE("attention reads strided q, k and v in place and writes out and gradients in their order, with the "
          "bits of contiguous copies") {
  // q, k, v as the views a fused QKV projection gives: [B, S, 3, H, D] memory, [B, H, S, D] shape. The
  // reference runs on contiguous copies of the same values. Causal with dropout, several query and key
  // blocks and odd lengths; k and v also narrowed along the sequence with a key offset (ring attention's
  // blocks), so that their head stride is not S·D.
  const int64_t B = 2, H = 3, S = 150, D = 16, C = H * D;
  for (bool narrowKeys : {false, true}) {
    CAPTURE(narrowKeys);
    Generator g(21);
    Tensor qkvValues = randn({B, S, 3, H, D}, {}, &g);
    Tensor wOut = randn({B, S, C}, {}, &g), wLse = randn({B, H, S}, {}, &g);
    AttentionOptions o{.causal = true, .dropout = 0.25, .dropoutSeed = 77};
    const int64_t k0 = narrowKeys ? 10 : 0, kLen = narrowKeys ? 131 : S;
    if (narrowKeys) o.keyOffset = k0;
    // Strided: views of one leaf.
    Tensor qkv = qkvValues.clone().requiresGrad_();
    auto head = [&](const Tensor& t, int64_t i) { return t.select(2, i).transpose(1, 2); };
    Tensor q = head(qkv, 0), k = head(qkv, 1).narrow(2, k0, kLen), v = head(qkv, 2).narrow(2, k0, kLen);
    REQUIRE(!q.isContiguous());
    AttentionOutput a = scaledDotProductAttentionWithLse(q, k, v, o);
    // out comes in q's [B, S, H, D] order: back to [B, S, C] without a copy.
    CHECK(a.out.transpose(1, 2).isContiguous());
    Tensor loss = sum(a.out.transpose(1, 2).reshape({B, S, C}) * wOut) + sum(a.lse * wLse);
    Tensor gQkv = autograd::grad({loss}, {qkv})[0];
    // Contiguous copies.
    std::vector<Tensor> leaves{head(qkvValues, 0).contiguous().requiresGrad_(),
                               head(qkvValues, 1).narrow(2, k0, kLen).contiguous().requiresGrad_(),
                               head(qkvValues, 2).narrow(2, k0, kLen).contiguous().requiresGrad_()};
    AttentionOutput r = scaledDotProductAttentionWithLse(leaves[0], leaves[1], leaves[2], o);
    CHECK(r.out.isContiguous());
    Tensor refLoss = sum(r.out.transpose(1, 2).reshape({B, S, C}) * wOut) + sum(r.lse * wLse);
    std::vector<Tensor> refGrads = autograd::grad({refLoss}, leaves);
    CHECK(a.out.contiguous().toVector<float>() == r.out.toVector<float>());
    CHECK(a.lse.toVector<float>() == r.lse.toVector<float>());
    CHECK(head(gQkv, 0).contiguous().toVector<float>() == refGrads[0].toVector<float>());
    CHECK(head(gQkv, 1).narrow(2, k0, kLen).contiguous().toVector<float>() == refGrads[1].toVector<float>());
    CHECK(head(gQkv, 2).narrow(2, k0, kLen).contiguous().toVector<float>() == refGrads[2].toVector<float>());
    if (narrowKeys) {
      // Keys outside the narrowed block get no gradient.
      CHECK(sum(abs(head(gQkv, 1).narrow(2, 0, k0))).item<double>() == 0.0);
    }
  }
}

// ---- errors -----------------------------------------------------------------------------------

TEST_CASE("attention names the op and the shapes on bad input") {
  Tensor q = randn({1, 2, 5, 4}), k = randn({1, 2, 6, 4});
  CHECK_THROWS_WITH_AS(scaledDotProductAttention(randn({2, 5, 4}), k, k),
                       doctest::Contains("scaledDotProductAttention: q, k and v must be 4-D [B, H, S, D], got q of "
                                         "shape [2, 5, 4]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(scaledDotProductAttention(q, randn({1, 3, 6, 4}), randn({1, 3, 6, 4})),
                       doctest::Contains("q of shape [1, 2, 5, 4] and k of shape [1, 3, 6, 4] must have the same "
                                         "batch and head counts"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(scaledDotProductAttention(randn({2, 2, 5, 4}), k, k), doctest::Contains("batch and head"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(scaledDotProductAttention(q, k, randn({1, 2, 7, 4})),
                       doctest::Contains("k of shape [1, 2, 6, 4] and v of shape [1, 2, 7, 4] must have the same "
                                         "shape"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(scaledDotProductAttention(q, randn({1, 2, 6, 3}), randn({1, 2, 6, 3})),
                       doctest::Contains("must have the same head dimension"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(scaledDotProductAttention(q, k.to(DType::Float64), k.to(DType::Float64)),
                       doctest::Contains("dtype mismatch"), InvalidArgumentError);
  Tensor qi = zeros({1, 2, 5, 4}, {.dtype = DType::Int64});
  CHECK_THROWS_WITH_AS(scaledDotProductAttention(qi, qi, qi), doctest::Contains("expected a floating-point tensor"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(scaledDotProductAttention(q, k, k, {.dropout = 1.5}),
                       doctest::Contains("dropout probability has to be between 0 and 1, got 1.5"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(scaledDotProductAttention(randn({1, 1, 3, 0}), randn({1, 1, 3, 0}), randn({1, 1, 3, 0})),
                       doctest::Contains("head dimension must be positive"), InvalidArgumentError);
}
