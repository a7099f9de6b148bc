#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include <vector>

#include "common/error.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/vec_math.h"

namespace weft::kernels::cpu {
namespace {

template <class T>
T ipow(T base, T exp) {
  if constexpr (std::is_integral_v<T>) {
    if (exp < 0) return base == 1 ? 1 : (base == -1 ? ((exp & 1) ? -1 : 1) : 0);
    T r = 1;
    while (exp) {
      if (exp & 1) r *= base;
      base *= base;
      exp >>= 1;
    }
    return r;
  } else {
    return std::pow(base, exp);
  }
}

// +, -, * that wrap around in signed integer types (computed in the unsigned
// type, where overflow is defined) instead of being undefined; plain
// arithmetic otherwise. uint8 promotes to int and is cut back to 8 bits.
template <class T>
T wrapAdd(T x, T y) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));
  } else {
    return static_cast<T>(x + y);
  }
}
template <class T>
T wrapSub(T x, T y) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(x) - static_cast<U>(y));
  } else {
    return static_cast<T>(x - y);
  }
}
template <class T>
T wrapMul(T x, T y) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(x) * static_cast<U>(y));
  } else {
    return static_cast<T>(x * y);
  }
}

template <class T, class F>
void binaryTyped(const T* a, std::span<const int64_t> as, const T* b, std::span<const int64_t> bs, T* out,
                 std::span<const int64_t> shape, F f) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  // Fast paths: both contiguous, or one side a single broadcast scalar.
  bool aFlat = true, bFlat = true, bScalar = true, aScalar = true;
  int64_t expect = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] != 1) {
      aFlat &= as[d] == expect;
      bFlat &= bs[d] == expect;
      aScalar &= as[d] == 0;
      bScalar &= bs[d] == 0;
    }
    expect *= shape[d];
  }
  if (aFlat && bFlat) {
    parallelFor(n, kParallelGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) out[i] = f(a[i], b[i]);
    });
    return;
  }
  if (aFlat && bScalar) {
    T bv = b[0];
    parallelFor(n, kParallelGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) out[i] = f(a[i], bv);
    });
    return;
  }
  if (aScalar && bFlat) {
    T av = a[0];
    parallelFor(n, kParallelGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) out[i] = f(av, b[i]);
    });
    return;
  }
  int nd = static_cast<int>(shape.size());
  int64_t os[kMaxDims];
  int64_t acc = 1;
  for (int d = nd - 1; d >= 0; --d) {
    os[d] = acc;
    acc *= shape[d];
  }
  const std::span<const int64_t> strides[3] = {as, bs, std::span<const int64_t>(os, nd)};
  forEachRow<3>(shape, strides, [&](const int64_t* off, int64_t len, const int64_t* inner) {
    const T* pa = a + off[0];
    const T* pb = b + off[1];
    T* po = out + off[2];
    int64_t sa = inner[0], sb = inner[1];
    if (sa == 1 && sb == 1) {
      for (int64_t i = 0; i < len; ++i) po[i] = f(pa[i], pb[i]);
    } else if (sa == 1 && sb == 0) {
      T bv = pb[0];
      for (int64_t i = 0; i < len; ++i) po[i] = f(pa[i], bv);
    } else {
      for (int64_t i = 0; i < len; ++i) po[i] = f(pa[i * sa], pb[i * sb]);
    }
  });
}

// A scalar parameter as T: integers go through int64 first, so that a
// negative scalar wraps in an unsigned type (x + -1 on uint8 is x - 1) instead
// of being undefined. Finite and within int64 (InvalidArgumentError otherwise).
template <class T>
T scalarAs(double v, DType type) {
  if constexpr (std::is_integral_v<T>) {
    WEFT_ENFORCE(std::isfinite(v) && v >= -9223372036854775808.0 && v < 9223372036854775808.0, InvalidArgumentError,
                 "scalar ", v, " cannot be used with a tensor of dtype ", dtypeName(type));
    return static_cast<T>(static_cast<int64_t>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <class T, class F>
void unaryTyped(const T* in, T* out, int64_t n, F f) {
  parallelFor(n, kParallelGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) out[i] = f(in[i]);
  });
}

// ---- bfloat16 / float16: through float32 blocks -------------------------------------

// fn(begin, length) over [0, n) in blocks of at most kHalfBlock, in parallel
// when n is large.
template <class F>
void forEachHalfBlock(int64_t n, F&& fn) {
  parallelFor(n, kParallelGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i += kHalfBlock) fn(i, std::min(kHalfBlock, e - i));
  });
}

// An operand of a 16-bit binary op as float32: one value when it is a
// broadcast scalar (all strides 0), else the whole `shape` made contiguous.
struct FloatOperand {
  std::vector<float> values;
  std::vector<int64_t> strides;
};

FloatOperand floatOperand(DType type, const void* p, std::span<const int64_t> strides, std::span<const int64_t> shape) {
  FloatOperand f;
  bool scalar = std::all_of(strides.begin(), strides.end(), [](int64_t s) { return s == 0; });
  if (scalar) {
    f.values.resize(1);
    halfToFloat(type, p, f.values.data(), 1);
    f.strides.assign(shape.size(), 0);
    return f;
  }
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  f.values.resize(static_cast<size_t>(n));
  copyStridedToContiguous(type, p, shape, strides, DType::Float32, f.values.data());
  f.strides.resize(shape.size());
  int64_t acc = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    f.strides[static_cast<size_t>(d)] = acc;
    acc *= shape[static_cast<size_t>(d)];
  }
  return f;
}


}  // namespace

void binary(BinaryOp op, DType type, const void* a, std::span<const int64_t> aStrides, const void* b,
            std::span<const int64_t> bStrides, void* out, std::span<const int64_t> shape) {
  if (isLowPrecision(type)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    // Each operand contiguous over `shape` or one broadcast value: blocks on the stack.
    bool aFlat = true, bFlat = true, aScalar = true, bScalar = true;
    int64_t expect = 1;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (shape[d] != 1) {
        aFlat &= aStrides[d] == expect;
        bFlat &= bStrides[d] == expect;
        aScalar &= aStrides[d] == 0;
        bScalar &= bStrides[d] == 0;
      }
      expect *= shape[d];
    }
    if ((aFlat || aScalar) && (bFlat || bScalar)) {
      forEachHalfBlock(n, [&](int64_t i, int64_t len) {
        float fa[kHalfBlock], fb[kHalfBlock], fo[kHalfBlock];
        const int64_t unit = 1, none = 0;
        halfToFloat(type, static_cast<const char*>(a) + (aFlat ? 2 * i : 0), fa, aFlat ? len : 1);
        halfToFloat(type, static_cast<const char*>(b) + (bFlat ? 2 * i : 0), fb, bFlat ? len : 1);
        binary(op, DType::Float32, fa, {aFlat ? &unit : &none, 1}, fb, {bFlat ? &unit : &none, 1}, fo, {&len, 1});
        floatToHalf(type, fo, static_cast<char*>(out) + 2 * i, len);
      });
      return;
    }
    FloatOperand fa = floatOperand(type, a, aStrides, shape), fb = floatOperand(type, b, bStrides, shape);
    std::vector<float> fo(static_cast<size_t>(n));
    binary(op, DType::Float32, fa.values.data(), fa.strides, fb.values.data(), fb.strides, fo.data(), shape);
    forEachHalfBlock(n, [&](int64_t i, int64_t len) {
      floatToHalf(type, fo.data() + i, static_cast<char*>(out) + 2 * i, len);
    });
    return;
  }
  WEFT_DISPATCH_NUMERIC(type, "binary op", [&]<class T>() {
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    switch (op) {
      case BinaryOp::Add: binaryTyped(pa, aStrides, pb, bStrides, po, shape, [](T x, T y) { return wrapAdd(x, y); }); break;
      case BinaryOp::Sub: binaryTyped(pa, aStrides, pb, bStrides, po, shape, [](T x, T y) { return wrapSub(x, y); }); break;
      case BinaryOp::Mul: binaryTyped(pa, aStrides, pb, bStrides, po, shape, [](T x, T y) { return wrapMul(x, y); }); break;
      case BinaryOp::Div:
        if constexpr (std::is_integral_v<T>) {
          // Flag, then throw once every chunk is done (a throw would stop the others midway).
          std::atomic<bool> zero{false};
          binaryTyped(pa, aStrides, pb, bStrides, po, shape, [&zero](T x, T y) {
            if (y == 0) {
              zero.store(true, std::memory_order_relaxed);
              return T(0);
            }
            if constexpr (std::is_signed_v<T>) {
              // lowest / -1 overflows (the CPU traps): negate with wrap-around instead.
              if (y == T(-1)) return wrapSub(T(0), x);
            }
            return static_cast<T>(x / y);
          });
          if (zero.load()) throw InvalidArgumentError("div: integer division by zero");
        } else {
          binaryTyped(pa, aStrides, pb, bStrides, po, shape, [](T x, T y) { return x / y; });
        }
        break;
      case BinaryOp::Pow: binaryTyped(pa, aStrides, pb, bStrides, po, shape, [](T x, T y) { return ipow(x, y); }); break;
      case BinaryOp::Maximum: binaryTyped(pa, aStrides, pb, bStrides, po, shape, [](T x, T y) { return x > y ? x : y; }); break;
      case BinaryOp::Minimum: binaryTyped(pa, aStrides, pb, bStrides, po, shape, [](T x, T y) { return x < y ? x : y; }); break;
    }
  });
}

void unary(UnaryOp op, DType type, const void* in, void* out, int64_t n, double p0, double p1) {
  if (isLowPrecision(type)) {
    forEachHalfBlock(n, [&](int64_t i, int64_t len) {
      float buf[kHalfBlock];
      halfToFloat(type, static_cast<const char*>(in) + 2 * i, buf, len);
      unary(op, DType::Float32, buf, buf, len, p0, p1);
      floatToHalf(type, buf, static_cast<char*>(out) + 2 * i, len);
    });
    return;
  }
  WEFT_DISPATCH_NUMERIC(type, "unary op", [&]<class T>() {
    const T* pi = static_cast<const T*>(in);
    T* po = static_cast<T*>(out);
    const bool usesScalars = op == UnaryOp::Clamp || op == UnaryOp::AddScalar || op == UnaryOp::MulScalar;
    T a = usesScalars ? scalarAs<T>(p0, type) : T(0);
    T b = op == UnaryOp::Clamp ? scalarAs<T>(p1, type) : T(0);
    switch (op) {
      case UnaryOp::Neg: unaryTyped(pi, po, n, [](T x) { return wrapSub(T(0), x); }); break;
      case UnaryOp::Exp: unaryTyped(pi, po, n, [](T x) { return static_cast<T>(std::exp(x)); }); break;
      case UnaryOp::Log: unaryTyped(pi, po, n, [](T x) { return static_cast<T>(std::log(x)); }); break;
      case UnaryOp::Sqrt: unaryTyped(pi, po, n, [](T x) { return static_cast<T>(std::sqrt(x)); }); break;
      case UnaryOp::Abs:
        if constexpr (std::is_unsigned_v<T>) {
          unaryTyped(pi, po, n, [](T x) { return x; });
        } else if constexpr (std::is_floating_point_v<T>) {
          // Clears the sign bit: branch-free (vectorised), and |-0| = +0.
          unaryTyped(pi, po, n, [](T x) { return std::abs(x); });
        } else {
          unaryTyped(pi, po, n, [](T x) { return x < 0 ? wrapSub(T(0), x) : x; });
        }
        break;
      case UnaryOp::Sign: unaryTyped(pi, po, n, [](T x) { return static_cast<T>((x > 0) - (x < 0)); }); break;
      case UnaryOp::Relu: unaryTyped(pi, po, n, [](T x) { return x > 0 ? x : T(0); }); break;
      case UnaryOp::Tanh:
        // float32: vectorised, within 3 ulp (kernels/cpu/vec_math.h), saturating
        // to +-1; sigmoid within 2 ulp (its exp's clamp at -87 puts a floor of
        // 1.6e-38 under sigmoid(x < -87), where the exact value is smaller).
        if constexpr (std::is_same_v<T, float>) {
          parallelFor(n, kParallelGrain, [&](int64_t s, int64_t e) { vecmath::tanhRow(pi + s, po + s, e - s); });
          break;
        }
        unaryTyped(pi, po, n, [](T x) { return static_cast<T>(std::tanh(x)); });
        break;
      case UnaryOp::Sigmoid:
        if constexpr (std::is_same_v<T, float>) {
          parallelFor(n, kParallelGrain, [&](int64_t s, int64_t e) { vecmath::sigmoidRow(pi + s, po + s, e - s); });
          break;
        }
        unaryTyped(pi, po, n, [](T x) { return static_cast<T>(1.0 / (1.0 + std::exp(-static_cast<double>(x)))); });
        break;
      case UnaryOp::Gelu:
        if constexpr (std::is_same_v<T, float>) {
          parallelFor(n, kParallelGrain, [&](int64_t s, int64_t e) { vecmath::geluRow(pi + s, po + s, e - s); });
          break;
        }
        unaryTyped(pi, po, n, [](T x) {
          double v = static_cast<double>(x);
          return static_cast<T>(0.5 * v * (1.0 + std::erf(v * M_SQRT1_2)));
        });
        break;
      case UnaryOp::PowScalar:
        unaryTyped(pi, po, n, [p0](T x) { return static_cast<T>(std::pow(static_cast<double>(x), p0)); });
        break;
      case UnaryOp::Clamp: unaryTyped(pi, po, n, [a, b](T x) { return x < a ? a : (x > b ? b : x); }); break;
      case UnaryOp::AddScalar: unaryTyped(pi, po, n, [a](T x) { return wrapAdd(x, a); }); break;
      case UnaryOp::MulScalar: unaryTyped(pi, po, n, [a](T x) { return wrapMul(x, a); }); break;
      case UnaryOp::Square: unaryTyped(pi, po, n, [](T x) { return wrapMul(x, x); }); break;
      case UnaryOp::Reciprocal: unaryTyped(pi, po, n, [](T x) { return static_cast<T>(T(1) / x); }); break;
    }
  });
}

void axpy(DType type, double alpha, const void* b, void* a, int64_t n) {
  if (isLowPrecision(type)) {
    forEachHalfBlock(n, [&](int64_t i, int64_t len) {
      float fa[kHalfBlock], fb[kHalfBlock];
      halfToFloat(type, static_cast<const char*>(a) + 2 * i, fa, len);
      halfToFloat(type, static_cast<const char*>(b) + 2 * i, fb, len);
      axpy(DType::Float32, alpha, fb, fa, len);
      floatToHalf(type, fa, static_cast<char*>(a) + 2 * i, len);
    });
    return;
  }
  WEFT_DISPATCH_NUMERIC(type, "axpy", [&]<class T>() {
    const T* pb = static_cast<const T*>(b);
    T* pa = static_cast<T*>(a);
    T al = static_cast<T>(alpha);
    parallelFor(n, kParallelGrain, [&](int64_t s, int64_t e) {
      if (al == T(1)) {
        for (int64_t i = s; i < e; ++i) pa[i] = wrapAdd(pa[i], pb[i]);
      } else {
        for (int64_t i = s; i < e; ++i) pa[i] = wrapAdd(pa[i], wrapMul(al, pb[i]));
      }
    });
  });
}

bool scaleAndCheckFinite(DType type, void* x, int64_t n, double scale) {
  std::atomic<bool> nonFinite{false};
  // Branch-free per block: |v| <= max is false for inf and NaN alike.
  auto pass = [&nonFinite]<class T>(T* p, int64_t len, T s) {
    bool bad = false;
    for (int64_t i = 0; i < len; ++i) {
      bad |= !(std::abs(p[i]) <= std::numeric_limits<T>::max());
      p[i] *= s;
    }
    if (bad) nonFinite.store(true, std::memory_order_relaxed);
  };
  if (isLowPrecision(type)) {
    forEachHalfBlock(n, [&](int64_t i, int64_t len) {
      float buf[kHalfBlock];
      halfToFloat(type, static_cast<char*>(x) + 2 * i, buf, len);
      pass(buf, len, static_cast<float>(scale));
      floatToHalf(type, buf, static_cast<char*>(x) + 2 * i, len);
    });
    return nonFinite.load();
  }
  WEFT_DISPATCH_FLOATING(type, "scaleAndCheckFinite", [&]<class T>() {
    T* p = static_cast<T*>(x);
    parallelFor(n, kParallelGrain, [&](int64_t b, int64_t e) { pass(p + b, e - b, static_cast<T>(scale)); });
  });
  return nonFinite.load();
}

}  // namespace weft::kernels::cpu

namespace weft::kernels::cpu {
namespace {

template <class T, class F>
void gradLoop(const T* x, const T* y, const T* g, T* gx, int64_t n, F f) {
  parallelFor(n, kParallelGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) gx[i] = f(x ? x[i] : T(0), y ? y[i] : T(0), g[i]);
  });
}

}  // namespace

void unaryBackward(UnaryOp op, DType type, const void* x, const void* y, const void* g, void* gx, int64_t n,
                   double p0, double p1) {
  if (isLowPrecision(type)) {
    forEachHalfBlock(n, [&](int64_t i, int64_t len) {
      float fx[kHalfBlock], fy[kHalfBlock], fg[kHalfBlock];
      if (x) halfToFloat(type, static_cast<const char*>(x) + 2 * i, fx, len);
      if (y) halfToFloat(type, static_cast<const char*>(y) + 2 * i, fy, len);
      halfToFloat(type, static_cast<const char*>(g) + 2 * i, fg, len);
      unaryBackward(op, DType::Float32, x ? fx : nullptr, y ? fy : nullptr, fg, fg, len, p0, p1);
      floatToHalf(type, fg, static_cast<char*>(gx) + 2 * i, len);
    });
    return;
  }
  WEFT_DISPATCH_FLOATING(type, "unary backward", [&]<class T>() {
    const T* px = static_cast<const T*>(x);
    const T* py = static_cast<const T*>(y);
    const T* pg = static_cast<const T*>(g);
    T* po = static_cast<T*>(gx);
    T a = static_cast<T>(p0), b = static_cast<T>(p1);
    switch (op) {
      case UnaryOp::Neg: gradLoop(px, py, pg, po, n, [](T, T, T d) { return -d; }); break;
      case UnaryOp::Exp: gradLoop(px, py, pg, po, n, [](T, T v, T d) { return d * v; }); break;
      case UnaryOp::Log: gradLoop(px, py, pg, po, n, [](T u, T, T d) { return d / u; }); break;
      case UnaryOp::Sqrt: gradLoop(px, py, pg, po, n, [](T, T v, T d) { return d / (T(2) * v); }); break;
      case UnaryOp::Abs:
        gradLoop(px, py, pg, po, n, [](T u, T, T d) { return u > 0 ? d : (u < 0 ? -d : T(0)); });
        break;
      case UnaryOp::Sign: gradLoop(px, py, pg, po, n, [](T, T, T) { return T(0); }); break;
      case UnaryOp::Relu: gradLoop(px, py, pg, po, n, [](T u, T, T d) { return u > 0 ? d : T(0); }); break;
      case UnaryOp::Tanh: gradLoop(px, py, pg, po, n, [](T, T v, T d) { return d * (T(1) - v * v); }); break;
      case UnaryOp::Sigmoid: gradLoop(px, py, pg, po, n, [](T, T v, T d) { return d * v * (T(1) - v); }); break;
      case UnaryOp::Gelu:
        if constexpr (std::is_same_v<T, float>) {
          parallelFor(n, kParallelGrain,
                      [&](int64_t s, int64_t e) { vecmath::geluBackwardRow(px + s, pg + s, po + s, e - s); });
          break;
        }
        gradLoop(px, py, pg, po, n, [](T u, T, T d) {
          double v = static_cast<double>(u);
          double cdf = 0.5 * (1.0 + std::erf(v * M_SQRT1_2));
          double pdf = std::exp(-0.5 * v * v) * 0.3989422804014327;  // 1/sqrt(2*pi)
          return static_cast<T>(static_cast<double>(d) * (cdf + v * pdf));
        });
        break;
      case UnaryOp::PowScalar:
        gradLoop(px, py, pg, po, n, [p0](T u, T, T d) {
          if (p0 == 0) return T(0);
          return static_cast<T>(static_cast<double>(d) * p0 * std::pow(static_cast<double>(u), p0 - 1));
        });
        break;
      case UnaryOp::Clamp: gradLoop(px, py, pg, po, n, [a, b](T u, T, T d) { return u >= a && u <= b ? d : T(0); }); break;
      case UnaryOp::AddScalar: gradLoop(px, py, pg, po, n, [](T, T, T d) { return d; }); break;
      case UnaryOp::MulScalar: gradLoop(px, py, pg, po, n, [a](T, T, T d) { return d * a; }); break;
      case UnaryOp::Square: gradLoop(px, py, pg, po, n, [](T u, T, T d) { return T(2) * u * d; }); break;
      case UnaryOp::Reciprocal: gradLoop(px, py, pg, po, n, [](T, T v, T d) { return -d * v * v; }); break;
    }
  });
}

void compare(CompareOp op, DType type, const void* a, std::span<const int64_t> aStrides, const void* b,
             std::span<const int64_t> bStrides, bool* out, std::span<const int64_t> shape) {
  WEFT_DISPATCH_ALL_AND_HALF(type, "compare", [&]<class T>() {
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    int nd = static_cast<int>(shape.size());
    int64_t os[kMaxDims];
    int64_t acc = 1;
    for (int d = nd - 1; d >= 0; --d) {
      os[d] = acc;
      acc *= shape[d];
    }
    const std::span<const int64_t> strides[3] = {aStrides, bStrides, std::span<const int64_t>(os, nd)};
    forEachRow<3>(shape, strides, [&](const int64_t* off, int64_t len, const int64_t* inner) {
      for (int64_t i = 0; i < len; ++i) {
        T x = pa[off[0] + i * inner[0]], y = pb[off[1] + i * inner[1]];
        bool r = op == CompareOp::Eq ? x == y : (op == CompareOp::Gt ? x > y : x < y);
        out[off[2] + i] = r;
      }
    });
  });
}

}  // namespace weft::kernels::cpu
