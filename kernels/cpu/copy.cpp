#include "kernels/cpu/copy.h"

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

void halfToFloat(DType type, const void* src, float* dst, int64_t n) {
  if (type == DType::BFloat16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = weft::detail::floatFromBFloat16(s[i]);
  } else {
    WEFT_CHECK(type == DType::Float16) << dtypeName(type);
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = weft::detail::floatFromFloat16(s[i]);
  }
}

void floatToHalf(DType type, const float* src, void* dst, int64_t n) {
  if (type == DType::BFloat16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = weft::detail::bfloat16FromFloat(src[i]);
  } else {
    WEFT_CHECK(type == DType::Float16) << dtypeName(type);
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = weft::detail::float16FromFloat(src[i]);
  }
}

}  // namespace weft::kernels::cpu
