// scaledDotProductAttention and mergeAttention against the naive formula
// softmax(q k^T * scale + mask) v written with matmul and softmax, finite
// differences, and PyTorch 1.13's numbers (fixtures/attention_cases.inc).
#include <cmath>
#include <limits>
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

}  // namespace

// ---- against the naive formula ------------------------------------------------------

TEST_CASE("attention matches softmax(q k^T * scale + mask) v in out, lse and every gradient") {
  // Lengths below, at and above the blocks (64 queries, 128 keys), odd ones,
  // Sq != Sk both ways, offsets placing the queries after the keys.
  const std::vector<Case> cases = {
      {1, 1, 37, 53, 24, false, 0, 0},  {2, 3, 37, 53, 24, true, 0, 0},  {1, 2, 53, 37, 24, true, 0, 0},
      {1, 1, 5, 3, 8, false, 0, 0},      {1, 2, 130, 300, 16, false, 0, 0}, {2, 1, 200, 200, 16, true, 0, 0},
      {1, 2, 37, 53, 24, true, 100, 60}, {1, 1, 70, 260, 8, true, 190, 0}, {1, 1, 64, 128, 8, true, 0, 0},
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

TEST_CASE("attention rows that see no key give out 0, lse -inf and no gradient; the others are exact") {
  // Keys start 20 positions after the queries: queries 0..19 see nothing,
  // including whole query blocks of 64 when the offset is larger.
  for (const Case& c : {Case{1, 2, 37, 53, 16, true, 0, 20}, Case{1, 1, 150, 40, 8, true, 0, 100}}) {
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

// ---- threads ---------------------------------------------------------------------------------

TEST_CASE("attention gives the same bits with one thread or several") {
  const int saved = kernels::cpu::numThreads();
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
