#include "kernels/cpu/vec_math.h"

#include "kernels/cpu/elementwise.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "weft_test.h"

using namespace weft::kernels::cpu;

namespace {

// Distance in units in the last place between two floats of the same sign.
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if ((ia < 0) != (ib < 0)) return a == b ? 0 : std::numeric_limits<int32_t>::max();
  return std::abs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

// Every float32 in [lo, hi] with step `step`, plus the ends.
std::vector<float> sweep(float lo, float hi, float step) {
  std::vector<float> v;
  for (double x = lo; x <= hi; x += step) v.push_back(static_cast<float>(x));
  v.push_back(hi);
  return v;
}

using RowFn = void (*)(const float*, float*, int64_t, vecmath::Isa);

std::vector<float> mapAll(RowFn f, const std::vector<float>& in, vecmath::Isa isa) {
  std::vector<float> out(in.size());
  f(in.data(), out.data(), static_cast<int64_t>(in.size()), isa);
  return out;
}

// Every instruction set this CPU runs (SSE2 always).
std::vector<vecmath::Isa> isas() {
  std::vector<vecmath::Isa> v;
  for (vecmath::Isa isa : {vecmath::Isa::Sse2, vecmath::Isa::Avx2, vecmath::Isa::Avx512}) {
    if (vecmath::supports(isa)) v.push_back(isa);
  }
  return v;
}

// The largest distance in ulp between f over `x` and `reference` (float64)
// rounded to float32, over the values whose reference is at least `from` in
// magnitude; *worstAbs gets the largest absolute error below it.
template <class Ref>
int64_t worstUlps(RowFn f, vecmath::Isa isa, const std::vector<float>& x, Ref reference, float from = 0.0f,
                  double* worstAbs = nullptr) {
  std::vector<float> y = mapAll(f, x, isa);
  int64_t worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = static_cast<float>(reference(static_cast<double>(x[i])));
    if (std::abs(want) < from) {
      *worstAbs = std::max(*worstAbs, static_cast<double>(std::abs(y[i] - want)));
    } else {
      worst = std::max(worst, ulps(y[i], want));
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("vectorised exp is within 2 ulp of exp over its whole range") {
  for (vecmath::Isa isa : isas()) {
    CAPTURE(vecmath::isaName(isa));
    CHECK(worstUlps(vecmath::expRow, isa, sweep(-87.0f, 88.0f, 0.0137f), [](double v) { return std::exp(v); }) <= 2);
  }
}

TEST_CASE("vectorised sigmoid is within 2 ulp and saturates without overflow") {
  for (vecmath::Isa isa : isas()) {
    CAPTURE(vecmath::isaName(isa));
    CHECK(worstUlps(vecmath::sigmoidRow, isa, sweep(-30.0f, 30.0f, 0.00731f),
                    [](double v) { return 1.0 / (1.0 + std::exp(-v)); }) <= 2);
    std::vector<float> extreme =
        mapAll(vecmath::sigmoidRow, {-1e30f, -200.0f, 200.0f, 1e30f, std::numeric_limits<float>::infinity()}, isa);
    CHECK(extreme[0] >= 0.0f);
    CHECK(extreme[0] < 1e-37f);
    CHECK(extreme[1] < 1e-37f);
    CHECK(extreme[2] == 1.0f);
    CHECK(extreme[3] == 1.0f);
    CHECK(extreme[4] == 1.0f);
  }
}

TEST_CASE("vectorised tanh is within 3 ulp, odd, and exact at 0 and the saturation ends") {
  for (vecmath::Isa isa : isas()) {
    CAPTURE(vecmath::isaName(isa));
    double worstAbs = 0;
    CHECK(worstUlps(
              vecmath::tanhRow, isa, sweep(-20.0f, 20.0f, 0.00317f), [](double v) { return std::tanh(v); }, 1e-3f,
              &worstAbs) <= 3);
    CHECK(worstAbs <= 1e-7);
    std::vector<float> odd =
        mapAll(vecmath::tanhRow, {0.0f, 0.3f, -0.3f, 2.0f, -2.0f, 1e-20f, 50.0f, -50.0f, 1e30f}, isa);
    CHECK(odd[0] == 0.0f);
    CHECK(odd[1] == -odd[2]);
    CHECK(odd[3] == -odd[4]);
    CHECK(odd[5] == 1e-20f);
    CHECK(odd[6] == 1.0f);
    CHECK(odd[7] == -1.0f);
    CHECK(odd[8] == 1.0f);
  }
}

TEST_CASE("vectorised exp, sigmoid, tanh, erf and GELU keep NaN and give a value the same bits in any position") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (vecmath::Isa isa : isas()) {
    CAPTURE(vecmath::isaName(isa));
    for (RowFn f : {RowFn{vecmath::expRow}, RowFn{vecmath::sigmoidRow}, RowFn{vecmath::tanhRow},
                    RowFn{vecmath::erfRow}, RowFn{vecmath::geluRow}}) {
      std::vector<float> y = mapAll(f, {1.0f, nan, -1.0f}, isa);
      CHECK(std::isnan(y[1]));
      // 0.7 first in a row of 40, in the middle, and in a short tail.
      std::vector<float> row(40, 0.25f);
      row[0] = 0.7f;
      std::vector<float> first = mapAll(f, row, isa);
      row[0] = 0.25f;
      row[21] = 0.7f;
      std::vector<float> middle = mapAll(f, row, isa);
      row.resize(37);
      row[21] = 0.25f;
      row[36] = 0.7f;
      std::vector<float> tail = mapAll(f, row, isa);
      CHECK(first[0] == middle[21]);
      CHECK(first[0] == tail[36]);
    }
  }
}

double geluReference(double x) { return 0.5 * x * std::erfc(-x * M_SQRT1_2); }

TEST_CASE("vectorised erf is within 3 ulp of erf, odd, and exact at 0 and the saturation ends") {
  const float inf = std::numeric_limits<float>::infinity();
  for (vecmath::Isa isa : isas()) {
    CAPTURE(vecmath::isaName(isa));
    // Dense around the branch point at 1 and through the tail to where erf rounds to 1.
    CHECK(worstUlps(vecmath::erfRow, isa, sweep(-6.0f, 6.0f, 0.000613f), [](double v) { return std::erf(v); }) <= 3);
    CHECK(worstUlps(vecmath::erfRow, isa, sweep(0.99f, 1.01f, 1.3e-7f), [](double v) { return std::erf(v); }) <= 3);
    CHECK(worstUlps(vecmath::erfRow, isa, sweep(1e-30f, 1e-3f, 3.7e-7f), [](double v) { return std::erf(v); }) <= 3);
    std::vector<float> y = mapAll(vecmath::erfRow, {0.0f, 0.5f, -0.5f, 2.5f, -2.5f, 1e-20f, 9.0f, -40.0f, inf, -inf},
                                  isa);
    CHECK(y[0] == 0.0f);
    CHECK(y[1] == -y[2]);
    CHECK(y[3] == -y[4]);
    CHECK(y[5] == static_cast<float>(std::erf(1e-20)));
    CHECK(y[6] == 1.0f);
    CHECK(y[7] == -1.0f);
    CHECK(y[8] == 1.0f);
    CHECK(y[9] == -1.0f);
  }
}

TEST_CASE("vectorised exact GELU is within 16 ulp of x·Φ(x), its negative tail included") {
  for (vecmath::Isa isa : isas()) {
    CAPTURE(vecmath::isaName(isa));
    // Φ for x <= -√2 comes from erfc, so the tail down to -13 keeps its relative accuracy; the
    // worst case is just above -√2, where 1 - erf(|x|/√2) loses a few bits.
    double worstAbs = 0;
    CHECK(worstUlps(vecmath::geluRow, isa, sweep(-13.0f, 10.0f, 0.000917f), geluReference, 1e-35f, &worstAbs) <= 16);
    CHECK(worstAbs <= 1e-35);
    std::vector<float> y = mapAll(vecmath::geluRow, {0.0f, 30.0f, -30.0f, -1e30f, 1e30f}, isa);
    CHECK(y[0] == 0.0f);
    CHECK(y[1] == 30.0f);
    CHECK(y[2] == 0.0f);
    CHECK(y[3] == 0.0f);
    CHECK(y[4] == 1e30f);
  }
}

TEST_CASE("vectorised GELU backward matches g·(Φ(x) + x·φ(x)) in float64") {
  // Φ(x) + x·φ(x) cancels for x < 0, so the error is measured against the size of its terms.
  std::vector<float> x = sweep(-13.0f, 10.0f, 0.000731f), g(x.size()), gx(x.size());
  for (size_t i = 0; i < x.size(); ++i) g[i] = 0.5f + static_cast<float>(i % 7) * 0.25f;
  for (vecmath::Isa isa : isas()) {
    CAPTURE(vecmath::isaName(isa));
    vecmath::geluBackwardRow(x.data(), g.data(), gx.data(), static_cast<int64_t>(x.size()), isa);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double v = x[i], cdf = 0.5 * std::erfc(-v * M_SQRT1_2), xpdf = v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
      const double scale = g[i] * (cdf + std::abs(xpdf)) + 1e-35;
      worst = std::max(worst, std::abs(gx[i] - g[i] * (cdf + xpdf)) / scale);
    }
    CHECK(worst <= 8 * 0x1p-24);
    // In place (gx = g), and a NaN stays NaN.
    std::vector<float> in{1.5f, std::numeric_limits<float>::quiet_NaN(), -0.5f}, grad{2.0f, 1.0f, 3.0f};
    vecmath::geluBackwardRow(in.data(), grad.data(), grad.data(), 3, isa);
    CHECK(std::isnan(grad[1]));
    CHECK(grad[0] == doctest::Approx(2.0 * (0.5 * std::erfc(-1.5 * M_SQRT1_2) + 1.5 * std::exp(-1.125) / std::sqrt(2 * M_PI))).epsilon(1e-6));
  }
}

TEST_CASE("an instruction set the CPU lacks is refused by name") {
  for (vecmath::Isa isa : {vecmath::Isa::Avx2, vecmath::Isa::Avx512}) {
    if (vecmath::supports(isa)) continue;
    float v = 0;
    CHECK_THROWS_WITH_AS(vecmath::expRow(&v, &v, 1, isa), doctest::Contains(vecmath::isaName(isa)),
                         weft::InvalidArgumentError);
  }
  CHECK(vecmath::supports(vecmath::bestIsa()));
}

TEST_CASE("the float32 tanh and sigmoid ops run the vectorised functions, within their ulps of float64") {
  // Long enough to be cut over the kernel threads, with a tail.
  const std::vector<float> x = sweep(-30.0f, 30.0f, 0.000917f);
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> op(x.size()), row(x.size());
  weft::kernels::cpu::unary(weft::kernels::cpu::UnaryOp::Tanh, weft::DType::Float32, x.data(), op.data(), n);
  vecmath::tanhRow(x.data(), row.data(), n);
  CHECK(std::memcmp(op.data(), row.data(), sizeof(float) * x.size()) == 0);
  int64_t worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::tanh(static_cast<double>(x[i]));
    if (std::abs(want) >= 1e-3) worst = std::max(worst, ulps(op[i], static_cast<float>(want)));
  }
  CHECK(worst <= 3);
  weft::kernels::cpu::unary(weft::kernels::cpu::UnaryOp::Sigmoid, weft::DType::Float32, x.data(), op.data(), n);
  vecmath::sigmoidRow(x.data(), row.data(), n);
  CHECK(std::memcmp(op.data(), row.data(), sizeof(float) * x.size()) == 0);
  worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, ulps(op[i], static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x[i]))))));
  }
  CHECK(worst <= 2);
}
