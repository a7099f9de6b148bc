// Vectorised float32 exp, sigmoid, tanh, erf and the exact (erf) GELU with its
// derivative for the CPU kernels, written once over GCC vector types and
// compiled for the widest instruction set the CPU has (AVX-512, AVX2 + FMA, or
// SSE2, which every x86-64 CPU has), chosen once per process. glibc's scalar
// expf / tanhf / erf are a function call per value and do not vectorise; these
// process a whole vector register per step.
//
//   vecmath::sigmoidRow(in, out, n);                 // out[i] = sigmoid(in[i])
//   vecmath::tanhRow(in, out, n, vecmath::Isa::Sse2);  // a given instruction set
//   vecmath::geluBackwardRow(x, g, gx, n);           // gx[i] = g[i] * GELU'(x[i])
//
// Accuracy (checked in tests/kernels against float64, for every instruction set
// the CPU has): exp and sigmoid within 2 ulp over [-30, 30], tanh within 3 ulp,
// or 1e-7 absolute near 0; erf within 3 ulp; GELU within 16 ulp down to
// x = -13 (its negative tail comes from erfc, not 1 + erf, so it keeps its
// relative accuracy; the worst case is just above -sqrt(2), where the
// polynomial for erf hands over to erfc), and 0 below 1e-35 in magnitude; GELU's
// derivative within 8 * 2^-24 of the size of its terms Phi(x) and x phi(x).
// exp clamps its input to [-87, 88] (no
// overflow, no denormals), so sigmoid and tanh saturate cleanly; NaN stays NaN.
// A value gets the same bits wherever it sits in a row (tails run through the
// same vector code, padded). Different instruction sets may differ in the last
// bit (FMA rounds once), so results are reproducible on one machine.
//
// Kernels that fuse these with other arithmetic (kernels/cpu/lstm.cpp) use the
// templates below inside functions compiled for each instruction set, and
// pick one with bestIsa().
#pragma once

#include <cstdint>
#include <cstring>

namespace weft::kernels::cpu::vecmath {

enum class Isa { Sse2, Avx2, Avx512 };
// The widest of the three this CPU runs (AVX2 counts only with FMA).
Isa bestIsa();
// Whether this CPU runs `isa`.
bool supports(Isa isa);
const char* isaName(Isa isa);

// out[i] = f(in[i]) for i < n (in and out may be the same array), with the
// given instruction set (InvalidArgumentError if the CPU lacks it) or bestIsa().
void expRow(const float* in, float* out, int64_t n, Isa isa);
void sigmoidRow(const float* in, float* out, int64_t n, Isa isa);
void tanhRow(const float* in, float* out, int64_t n, Isa isa);
inline void expRow(const float* in, float* out, int64_t n) { expRow(in, out, n, bestIsa()); }
inline void sigmoidRow(const float* in, float* out, int64_t n) { sigmoidRow(in, out, n, bestIsa()); }
inline void tanhRow(const float* in, float* out, int64_t n) { tanhRow(in, out, n, bestIsa()); }
void erfRow(const float* in, float* out, int64_t n, Isa isa);
void geluRow(const float* in, float* out, int64_t n, Isa isa);
inline void erfRow(const float* in, float* out, int64_t n) { erfRow(in, out, n, bestIsa()); }
inline void geluRow(const float* in, float* out, int64_t n) { geluRow(in, out, n, bestIsa()); }
// gx[i] = g[i] · GELU'(x[i]) (gx may be g).
void geluBackwardRow(const float* x, const float* g, float* gx, int64_t n, Isa isa);
inline void geluBackwardRow(const float* x, const float* g, float* gx, int64_t n) {
  geluBackwardRow(x, g, gx, n, bestIsa());
}

// ---- the generic vector code -------------------------------------------------------
// V is one of the float vector types below; its lane count is Lanes<V>.
typedef float F4 __attribute__((vector_size(16)));
typedef float F8 __attribute__((vector_size(32)));
typedef float F16 __attribute__((vector_size(64)));

template <class V>
inline constexpr int64_t Lanes = static_cast<int64_t>(sizeof(V) / sizeof(float));
// The matching int32 vector (what comparisons of V return).
template <class V>
using IntOf = decltype(V{} < V{});

// Everything here is inlined into the caller, so that it is compiled for the
// caller's target; a lambda passed to forEachVector needs WEFT_VEC_LAMBDA
// (after its parameter list) for the same reason.
#define WEFT_VEC_INLINE inline __attribute__((always_inline))
#define WEFT_VEC_LAMBDA __attribute__((always_inline))

// The first n (<= lanes) floats at p, zero-padded; and the inverse.
template <class V>
WEFT_VEC_INLINE V load(const float* p, int64_t n = Lanes<V>) {
  V v{};
  std::memcpy(&v, p, sizeof(float) * static_cast<size_t>(n));
  return v;
}
template <class V>
WEFT_VEC_INLINE void store(float* p, V v, int64_t n = Lanes<V>) {
  std::memcpy(p, &v, sizeof(float) * static_cast<size_t>(n));
}

// exp(x): Cephes' expf. n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts,
// so r is exact), exp(r) by a degree-5 polynomial, scaled by 2^n through the
// exponent bits. A NaN passes through the clamp (the comparisons are false)
// and stays NaN through the arithmetic.
template <class V>
WEFT_VEC_INLINE V exp(V x) {
  using I = IntOf<V>;
  x = x < -87.0f ? V{} - 87.0f : x;
  x = x > 88.0f ? V{} + 88.0f : x;
  V fx = x * 1.44269504088896341f + 0.5f;
  const V truncated = __builtin_convertvector(__builtin_convertvector(fx, I), V);
  fx = truncated > fx ? truncated - 1.0f : truncated;  // floor
  x = x - fx * 0.693359375f;
  x = x - fx * -2.12194440e-4f;
  const V z = x * x;
  V y = V{} + 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.0f;
  const I n = (__builtin_convertvector(fx, I) + 127) << 23;
  return y * (V)n;
}

// 1 / (1 + exp(-x))
template <class V>
WEFT_VEC_INLINE V sigmoid(V x) {
  return 1.0f / (1.0f + exp(-x));
}

// tanh(x): Cephes' tanhf. An odd polynomial for |x| < 0.625, where
// 1 - 2 / (exp(2|x|) + 1) would cancel; that formula with x's sign above.
template <class V>
WEFT_VEC_INLINE V tanh(V x) {
  using I = IntOf<V>;
  const I signBit = I{} + static_cast<int32_t>(0x80000000u);
  const I bits = (I)x;
  const V ax = (V)(bits & ~signBit);
  const V s = x * x;
  V p = V{} - 5.70498872745e-3f;
  p = p * s + 2.06390887954e-2f;
  p = p * s - 5.37397155531e-2f;
  p = p * s + 1.33314422036e-1f;
  p = p * s - 3.33332819422e-1f;
  const V small = p * s * x + x;
  const V large = 1.0f - 2.0f / (exp(ax + ax) + 1.0f);
  return ax < 0.625f ? small : (V)((I)large | (bits & signBit));
}

// ---- erf and the exact GELU ----------------------------------------------------------
// With a = s·|x| (s = 1 for erf, √½ for GELU's Φ): erf(a) below a = 1 as
// a·P(a²), erfc(a) from a = 1 as exp(-a²)·R(1/a), R a polynomial for
// erfc(a)·exp(a²) over a in [1, 10] (Chebyshev fits). exp(-a²) is taken with
// x² split into an exact high part (x with 12 significant bits, squared) and a
// small low part whose exp is a Taylor series, so that the rounding of x² does
// not cost erfc its relative accuracy in the tail. Past a = 9.3 (exp's clamp
// at -87) erfc is 0.
namespace detail {

template <class V>
WEFT_VEC_INLINE V erfSmall(V a) {
  const V s = a * a;
  V p = V{} - 9.673594832e-06f;
  p = p * s + 1.126825882e-04f;
  p = p * s - 8.484397549e-04f;
  p = p * s + 5.221053492e-03f;
  p = p * s - 2.686543763e-02f;
  p = p * s + 1.128378287e-01f;
  p = p * s - 3.761263788e-01f;
  p = p * s + 1.128379226e+00f;
  return a * p;
}

template <class V>
WEFT_VEC_INLINE V erfcScaled(V t) {  // erfc(a)·exp(a²) at t = 1/a, a in [1, 10]
  V p = V{} - 5.019777268e-02f;
  p = p * t + 3.386603892e-01f;
  p = p * t - 1.011747718e+00f;
  p = p * t + 1.740353346e+00f;
  p = p * t - 1.842315435e+00f;
  p = p * t + 1.113137484e+00f;
  p = p * t - 1.660349965e-01f;
  p = p * t - 2.560308874e-01f;
  p = p * t - 2.570737153e-03f;
  p = p * t + 5.643334389e-01f;
  return p * t - 3.460949301e-06f;
}

// exp(-k·x²) for x >= 0 and k = 1 or 1/2.
template <class V>
WEFT_VEC_INLINE V expNegSquare(V x, float k) {
  using I = IntOf<V>;
  const V hi = (V)((I)x & static_cast<int32_t>(0xFFFFF000u));
  const V lo = x - hi;
  const V sqHi = hi * hi * k;  // exact
  const V sqLo = (hi + hi + lo) * lo * k;
  V p = V{} - 1.0f / 120.0f;
  p = p * sqLo + 1.0f / 24.0f;
  p = p * sqLo - 1.0f / 6.0f;
  p = p * sqLo + 0.5f;
  p = p * sqLo - 1.0f;
  p = p * sqLo + 1.0f;
  return exp(V{} - sqHi) * p;
}

// For ax = |x| >= 0 and a = s·ax (k = s²): erf(a) where a < 1, erfc(a) where
// a >= 1; *e gets exp(-a²) (0 past the clamp).
template <class V>
WEFT_VEC_INLINE V erfOrErfc(V ax, float s, float k, V* e) {
  const V a = ax * s;
  const float limit = 9.3f / s;
  const V xc = ax < limit ? ax : V{} + limit;
  const V ex = expNegSquare(xc, k);
  *e = a > 9.3f ? V{} : ex;
  const V erfc = *e * erfcScaled(1.0f / (a < 1.0f ? V{} + 1.0f : a));
  return a < 1.0f ? erfSmall(a) : erfc;
}

// Φ(x) = (1 + erf(x/√2)) / 2 and exp(-x²/2); NaN in, NaN out.
template <class V>
WEFT_VEC_INLINE V normalCdf(V x, V* e) {
  using I = IntOf<V>;
  const I signBit = I{} + static_cast<int32_t>(0x80000000u);
  const V ax = (V)((I)x & ~signBit);
  const V r = erfOrErfc(ax, 0.70710678118654752f, 0.5f, e);
  const V small = 0.5f + 0.5f * (V)((I)r | ((I)x & signBit));
  const V large = x > 0.0f ? 1.0f - 0.5f * r : 0.5f * r;
  const V cdf = ax * 0.70710678118654752f < 1.0f ? small : large;
  return x != x ? x : cdf;
}

}  // namespace detail

// erf(x): odd; ±1 from |x| = 4 on; NaN stays NaN.
template <class V>
WEFT_VEC_INLINE V erf(V x) {
  using I = IntOf<V>;
  const I signBit = I{} + static_cast<int32_t>(0x80000000u);
  const V ax = (V)((I)x & ~signBit);
  V e;
  const V r = detail::erfOrErfc(ax, 1.0f, 1.0f, &e);
  const V m = ax < 1.0f ? r : 1.0f - r;
  return x != x ? x : (V)((I)m | ((I)x & signBit));
}

// The exact GELU x·Φ(x); for x < 0 Φ comes from erfc, so the negative tail
// keeps its relative accuracy instead of cancelling in 1 + erf.
template <class V>
WEFT_VEC_INLINE V gelu(V x) {
  V e;
  return x * detail::normalCdf(x, &e);
}

// d/dx GELU(x) times g: g·(Φ(x) + x·φ(x)), φ(x) = exp(-x²/2) / √(2π).
template <class V>
WEFT_VEC_INLINE V geluBackward(V x, V g) {
  V e;
  const V cdf = detail::normalCdf(x, &e);
  return g * (cdf + x * e * 0.39894228040143268f);
}

// body(j, count) for j = 0, L, 2L, ... < n (L = Lanes<V>), count = L except
// for a shorter last one: load<V>(p + j, count) / store(p + j, v, count)
// then read and write exactly the row's elements.
template <class V, class Body>
WEFT_VEC_INLINE void forEachVector(int64_t n, Body&& body) {
  int64_t j = 0;
  for (; j + Lanes<V> <= n; j += Lanes<V>) body(j, Lanes<V>);
  if (j < n) body(j, n - j);
}

// out[i] = f(in[i]) over a row.
template <class V, class F>
WEFT_VEC_INLINE void mapRow(const float* in, float* out, int64_t n, F f) {
  forEachVector<V>(n, [&](int64_t j, int64_t count) WEFT_VEC_LAMBDA { store(out + j, f(load<V>(in + j, count)), count); });
}

}  // namespace weft::kernels::cpu::vecmath
