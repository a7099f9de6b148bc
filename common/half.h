// The two 16-bit floating element types, bfloat16 and IEEE half, as C++
// value types: what data<BFloat16>(), fromVector and item use, and the
// conversions every kernel that reads or writes them goes through.
//
//   weft::BFloat16 b(3.14159f);    // 3.140625: 8 significant bits
//   float f = b;                   // exact: bfloat16 is the top half of a float32
//   weft::Float16 h(65520.0f);     // inf: past half's largest finite value
//   uint16_t bits = h.bits;        // 0x7c00
//
// Arithmetic is done in float32 (both convert to float implicitly); a value
// converted back rounds once. The conversions are PyTorch's (c10/util/BFloat16.h,
// c10/util/Half.h), bit for bit:
//   float32 -> bfloat16: round to nearest, ties to even; overflow gives inf;
//     a NaN stays a NaN of the same sign (the quiet bit is set, the top
//     payload bits are kept).
//   float32 -> float16: round to nearest, ties to even, with half's subnormals
//     (down to 2^-24), overflow to inf, NaN to 0x7e00 with its sign.
//   bfloat16/float16 -> float32: exact.
// A float64 converts through float32 (as PyTorch's constructors take float),
// so it may round twice. The conversions are plain integer and float
// arithmetic without branches on the value, so loops over them vectorise; they
// rely on round-to-nearest and on denormals being kept (no flush-to-zero).
#pragma once

#include <bit>
#include <concepts>
#include <cstdint>
#include <type_traits>

namespace weft {

namespace detail {

inline uint16_t bfloat16FromFloat(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
}

inline float floatFromBFloat16(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// Exponent arithmetic in float does the rounding: scaling by 2^112 then 2^-110
// moves overflowing values to inf, and adding a power of two chosen from the
// exponent makes the float adder round the mantissa to half's precision
// (subnormals included). Selections are masks and comparisons are on values
// below 2^31, as signed integers (SSE2 has no unsigned vector compare), so
// loops over these conversions vectorise.
inline uint16_t float16FromFloat(float f) {
  const float scaleToInf = std::bit_cast<float>(0x77800000u);   // 2^112
  const float scaleToZero = std::bit_cast<float>(0x08800000u);  // 2^-110
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const auto magnitude = static_cast<int32_t>(w & 0x7fffffffu);
  float base = (std::bit_cast<float>(static_cast<uint32_t>(magnitude)) * scaleToInf) * scaleToZero;
  const uint32_t sign = w & 0x80000000u;
  uint32_t exponent = w & 0x7f800000u;
  const uint32_t small = 0u - static_cast<uint32_t>(static_cast<int32_t>(exponent) < 0x38800000);
  exponent = (exponent & ~small) | (0x38800000u & small);
  base = std::bit_cast<float>(exponent + 0x07800000u) + base;
  const uint32_t bits = std::bit_cast<uint32_t>(base);
  const uint32_t expBits = (bits >> 13) & 0x00007c00u;
  const uint32_t mantissaBits = bits & 0x00000fffu;
  const uint32_t nonsign = expBits + mantissaBits;
  const uint32_t nan = 0u - static_cast<uint32_t>(magnitude > 0x7f800000);
  return static_cast<uint16_t>((sign >> 16) | (nonsign & ~nan) | (0x7e00u & nan));
}

inline float floatFromFloat16(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t twoW = w + w;
  const float expScale = std::bit_cast<float>(0x07800000u);  // 2^-112
  const float normalized = std::bit_cast<float>((twoW >> 4) + (0xe0u << 23)) * expScale;
  const float denormalized = std::bit_cast<float>((twoW >> 17) | (126u << 23)) - 0.5f;
  const uint32_t subnormal = 0u - static_cast<uint32_t>(static_cast<int32_t>(h & 0x7fffu) < 0x400);
  const uint32_t result =
      sign | (std::bit_cast<uint32_t>(denormalized) & subnormal) | (std::bit_cast<uint32_t>(normalized) & ~subnormal);
  return std::bit_cast<float>(result);
}

}  // namespace detail

struct BFloat16 {
  uint16_t bits = 0;

  BFloat16() = default;
  BFloat16(float f) : bits(detail::bfloat16FromFloat(f)) {}  // NOLINT: implicit, as a float
  BFloat16(double d) : BFloat16(static_cast<float>(d)) {}    // NOLINT
  template <std::integral I>
  BFloat16(I v) : BFloat16(static_cast<float>(v)) {}  // NOLINT
  static BFloat16 fromBits(uint16_t b) {
    BFloat16 r;
    r.bits = b;
    return r;
  }
  operator float() const { return detail::floatFromBFloat16(bits); }  // NOLINT: exact
};

struct Float16 {
  uint16_t bits = 0;

  Float16() = default;
  Float16(float f) : bits(detail::float16FromFloat(f)) {}  // NOLINT: implicit, as a float
  Float16(double d) : Float16(static_cast<float>(d)) {}    // NOLINT
  template <std::integral I>
  Float16(I v) : Float16(static_cast<float>(v)) {}  // NOLINT
  static Float16 fromBits(uint16_t b) {
    Float16 r;
    r.bits = b;
    return r;
  }
  operator float() const { return detail::floatFromFloat16(bits); }  // NOLINT: exact
};

static_assert(sizeof(BFloat16) == 2 && sizeof(Float16) == 2);

// True for the two 16-bit floating types.
template <class T>
inline constexpr bool kIsHalfType = std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;

}  // namespace weft
