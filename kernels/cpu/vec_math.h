// Vectorised float32 exp, sigmoid and tanh for the CPU kernels, written once
// over GCC vector types and compiled for the widest instruction set the CPU
// has (AVX-512, AVX2 + FMA, or SSE2, which every x86-64 CPU has), chosen once
// per process. glibc's scalar expf / tanhf are a function call per value and
// do not vectorise; these process a whole vector register per step.
//
//   vecmath::sigmoidRow(in, out, n);                 // out[i] = sigmoid(in[i])
//   vecmath::tanhRow(in, out, n, vecmath::Isa::Sse2);  // a given instruction set
//
// Accuracy (checked in tests/kernels against float64 over [-30, 30], for every
// instruction set the CPU has): exp and sigmoid within 2 ulp, tanh within 3
// ulp, or 1e-7 absolute near 0. exp clamps its input to [-87, 88] (no
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
