#include "kernels/cpu/copy.h"

#include <immintrin.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/error.h"
#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

// One element converted as common/dtype.h describes: to bool is x != 0;
// floating to integer truncates, saturates and maps NaN to 0; integer to
// integer wraps.
template <class D, class S>
D convertElement(S v) {
  if constexpr (kIsHalfType<S> && !std::is_same_v<D, S>) {
    return convertElement<D>(static_cast<float>(v));
  } else if constexpr (kIsHalfType<D> && !std::is_same_v<D, S>) {
    // Through float32, as PyTorch's BFloat16/Half constructors.
    if constexpr (std::is_same_v<S, bool>) return D(v ? 1.0f : 0.0f);
    else return D(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, bool>) {
    return v != S(0);
  } else if constexpr (std::is_integral_v<D> && std::is_floating_point_v<S>) {
    if (std::isnan(v)) return D(0);
    // The largest integer values are not exact in S: compare against 2^k as S.
    constexpr S lo = static_cast<S>(std::numeric_limits<D>::lowest());
    constexpr S hiExclusive = static_cast<S>(std::numeric_limits<D>::max() / 2 + 1) * S(2);
    if (v <= lo) return std::numeric_limits<D>::lowest();
    if (v >= hiExclusive) return std::numeric_limits<D>::max();
    return static_cast<D>(v);
  } else {
    return static_cast<D>(v);
  }
}

template <class S, class D>
void copyTyped(const S* src, std::span<const int64_t> shape, std::span<const int64_t> srcStrides, D* dst) {
  // The destination is contiguous: its strides are the row-major ones.
  int nd = static_cast<int>(shape.size());
  int64_t dstStrides[16];
  int64_t acc = 1;
  for (int d = nd - 1; d >= 0; --d) {
    dstStrides[d] = acc;
    acc *= shape[d];
  }
  const std::span<const int64_t> strides[2] = {srcStrides, std::span<const int64_t>(dstStrides, nd)};
  forEachRow<2>(shape, strides, [&](const int64_t* off, int64_t n, const int64_t* inner) {
    const S* s = src + off[0];
    D* d = dst + off[1];
    if (inner[0] == 1) {
      if constexpr (std::is_same_v<S, D>) {
        std::memcpy(d, s, sizeof(S) * n);
      } else if constexpr (std::is_same_v<S, float> && kIsHalfType<D>) {
        floatToHalf(kDTypeOf<D>, s, d, n);
      } else if constexpr (kIsHalfType<S> && std::is_same_v<D, float>) {
        halfToFloat(kDTypeOf<S>, s, d, n);
      } else {
        for (int64_t i = 0; i < n; ++i) d[i] = convertElement<D>(s[i]);
      }
    } else {
      int64_t st = inner[0];
      for (int64_t i = 0; i < n; ++i) d[i] = convertElement<D>(s[i * st]);
    }
  });
}

}  // namespace

void copyStridedToContiguous(DType srcType, const void* src, std::span<const int64_t> shape,
                             std::span<const int64_t> srcStrides, DType dstType, void* dst) {
  WEFT_DISPATCH_ALL_AND_HALF(srcType, "copy", [&]<class S>() {
    WEFT_DISPATCH_ALL_AND_HALF(dstType, "copy", [&]<class D>() {
      copyTyped<S, D>(static_cast<const S*>(src), shape, srcStrides, static_cast<D*>(dst));
    });
  });
}

void copyContiguousToStrided(DType type, const void* src, std::span<const int64_t> shape, void* dst,
                             std::span<const int64_t> dstStrides) {
  WEFT_DISPATCH_ALL_AND_HALF(type, "copy", [&]<class T>() {
    int nd = static_cast<int>(shape.size());
    int64_t srcStrides[16];
    int64_t acc = 1;
    for (int d = nd - 1; d >= 0; --d) {
      srcStrides[d] = acc;
      acc *= shape[d];
    }
    const T* s = static_cast<const T*>(src);
    T* o = static_cast<T*>(dst);
    const std::span<const int64_t> strides[2] = {std::span<const int64_t>(srcStrides, nd), dstStrides};
    forEachRow<2>(shape, strides, [&](const int64_t* off, int64_t n, const int64_t* inner) {
      for (int64_t i = 0; i < n; ++i) o[off[1] + i * inner[1]] = s[off[0] + i * inner[0]];
    });
  });
}

void fill(DType type, void* dst, int64_t n, double value) {
  if (n <= 0) return;
  WEFT_DISPATCH_ALL_AND_HALF(type, "fill", [&]<class T>() {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      WEFT_ENFORCE(std::isfinite(value) && std::trunc(value) >= static_cast<double>(std::numeric_limits<T>::lowest()) &&
                       std::trunc(value) <= static_cast<double>(std::numeric_limits<T>::max()),
                   InvalidArgumentError, "fill: value ", value, " cannot be converted to ", dtypeName(type),
                   " without overflow");
    }
    T v = convertElement<T>(value);
    T* d = static_cast<T*>(dst);
    if (static_cast<double>(v) == 0.0 && !std::signbit(static_cast<double>(v))) {
      std::memset(static_cast<void*>(d), 0, sizeof(T) * n);
      return;
    }
    parallelFor(n, kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) d[i] = v;
    });
  });
}

namespace {

// float16 conversions with the CPU's F16C instructions (8 values per
// instruction, round to nearest even, subnormals kept), chosen at run time
// when the CPU has them. Bit for bit the software conversions of
// common/half.h: a float32 NaN is first made the quiet NaN of its sign, which
// both turn into 0x7e00 | sign; tails go through the same instructions,
// padded, so a value's bits do not depend on where it sits.
bool haveF16c() {
  static const bool have = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return have;
}

__attribute__((target("avx,f16c"))) void float16ToFloatF16c(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  }
  if (i < n) {
    alignas(16) uint16_t in[8] = {};
    alignas(32) float out[8];
    std::memcpy(in, s + i, sizeof(uint16_t) * static_cast<size_t>(n - i));
    _mm256_store_ps(out, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(in))));
    std::memcpy(d + i, out, sizeof(float) * static_cast<size_t>(n - i));
  }
}

__attribute__((target("avx,f16c"))) inline __m128i floatToFloat16Vector(__m256 x) {
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 quiet = _mm256_or_ps(_mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))),
                                    _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
  return _mm256_cvtps_ph(_mm256_blendv_ps(x, quiet, nan), _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("avx,f16c"))) void floatToFloat16F16c(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), floatToFloat16Vector(_mm256_loadu_ps(s + i)));
  }
  if (i < n) {
    alignas(32) float in[8] = {};
    alignas(16) uint16_t out[8];
    std::memcpy(in, s + i, sizeof(float) * static_cast<size_t>(n - i));
    _mm_store_si128(reinterpret_cast<__m128i*>(out), floatToFloat16Vector(_mm256_load_ps(in)));
    std::memcpy(d + i, out, sizeof(uint16_t) * static_cast<size_t>(n - i));
  }
}

// bfloat16 conversions are shifts and integer adds: compiled for AVX2 and
// AVX-512 too, the widest the CPU runs picked at load time.
__attribute__((target_clones("avx512f", "avx2", "default"))) void bfloat16ToFloatLoop(const uint16_t* s, float* d,
                                                                                      int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = weft::detail::floatFromBFloat16(s[i]);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void floatToBfloat16Loop(const float* s, uint16_t* d,
                                                                                      int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = weft::detail::bfloat16FromFloat(s[i]);
}

}  // namespace

void halfToFloat(DType type, const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (type == DType::BFloat16) {
    bfloat16ToFloatLoop(s, dst, n);
  } else {
    WEFT_CHECK(type == DType::Float16) << dtypeName(type);
    if (haveF16c()) {
      float16ToFloatF16c(s, dst, n);
      return;
    }
    for (int64_t i = 0; i < n; ++i) dst[i] = weft::detail::floatFromFloat16(s[i]);
  }
}

void floatToHalf(DType type, const float* src, void* dst, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (type == DType::BFloat16) {
    floatToBfloat16Loop(src, d, n);
  } else {
    WEFT_CHECK(type == DType::Float16) << dtypeName(type);
    if (haveF16c()) {
      floatToFloat16F16c(src, d, n);
      return;
    }
    for (int64_t i = 0; i < n; ++i) d[i] = weft::detail::float16FromFloat(src[i]);
  }
}

void halfToFloatPortable(DType type, const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = type == DType::BFloat16 ? weft::detail::floatFromBFloat16(s[i]) : weft::detail::floatFromFloat16(s[i]);
  }
}

void floatToHalfPortable(DType type, const float* src, void* dst, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    d[i] = type == DType::BFloat16 ? weft::detail::bfloat16FromFloat(src[i]) : weft::detail::float16FromFloat(src[i]);
  }
}

}  // namespace weft::kernels::cpu
