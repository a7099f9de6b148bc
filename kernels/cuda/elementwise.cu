#include "kernels/cuda/elementwise.h"

#include <cmath>

#include "kernels/cuda/loops.cuh"

namespace weft::kernels::cuda {
namespace {

// ---- integer-safe arithmetic (as kernels/cpu/elementwise.cpp) ----------------------

template <class T>
__device__ __forceinline__ T wrapAdd(T x, T y) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));
  } else {
    return static_cast<T>(x + y);
  }
}
template <class T>
__device__ __forceinline__ T wrapSub(T x, T y) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(x) - static_cast<U>(y));
  } else {
    return static_cast<T>(x - y);
  }
}
template <class T>
__device__ __forceinline__ T wrapMul(T x, T y) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(x) * static_cast<U>(y));
  } else {
    return static_cast<T>(x * y);
  }
}
template <class T>
__device__ __forceinline__ T ipow(T base, T exp) {
  if constexpr (std::is_integral_v<T>) {
    if constexpr (std::is_signed_v<T>) {
      if (exp < 0) return base == 1 ? T(1) : (base == T(-1) ? ((exp & 1) ? T(-1) : T(1)) : T(0));
    }
    T r = 1;
    while (exp) {
      if (exp & 1) r = wrapMul(r, base);
      base = wrapMul(base, base);
      exp >>= 1;
    }
    return r;
  } else {
    return ::pow(base, exp);
  }
}

// A scalar parameter as T (as the CPU's scalarAs: integers through int64).
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

// ---- binary --------------------------------------------------------------------

// T the storage type, C the compute type (float for the 16-bit types).
template <class T, class F>
void binaryLoop(const T* a, std::span<const int64_t> as, const T* b, std::span<const int64_t> bs, T* out,
                std::span<const int64_t> shape, int64_t n, F f, const char* op) {
  int64_t os[kMaxDims];
  contiguousStridesOf(shape, os);
  const std::span<const int64_t> strides[3] = {std::span<const int64_t>(os, shape.size()), as, bs};
  StridedOffsets<3> off(shape, strides);
  if (off.dims <= 1) {
    const int64_t sa = off.dims ? off.strides[1][0] : 0, sb = off.dims ? off.strides[2][0] : 0;
    if (sa == 1 && sb == 1) {
      launchContiguous(n, [=] __device__(int64_t i) { out[i] = fromAcc<T>(f(toAcc(a[i]), toAcc(b[i]))); }, op);
    } else if (sa == 1 && sb == 0) {
      launchContiguous(n, [=] __device__(int64_t i) { out[i] = fromAcc<T>(f(toAcc(a[i]), toAcc(b[0]))); }, op);
    } else {
      launchContiguous(n, [=] __device__(int64_t i) { out[i] = fromAcc<T>(f(toAcc(a[i * sa]), toAcc(b[i * sb]))); },
                       op);
    }
    return;
  }
  launchStrided<3>(n, off, [=] __device__(int64_t i, const int64_t* o) {
    out[o[0]] = fromAcc<T>(f(toAcc(a[o[1]]), toAcc(b[o[2]])));
  }, op);
}

template <class T>
void binaryTyped(BinaryOp op, const T* a, std::span<const int64_t> as, const T* b, std::span<const int64_t> bs,
                 T* out, std::span<const int64_t> shape, int64_t n) {
  using C = Acc<T>;
  switch (op) {
    case BinaryOp::Add: binaryLoop(a, as, b, bs, out, shape, n, [] __device__(C x, C y) { return wrapAdd(x, y); }, "add"); break;
    case BinaryOp::Sub: binaryLoop(a, as, b, bs, out, shape, n, [] __device__(C x, C y) { return wrapSub(x, y); }, "sub"); break;
    case BinaryOp::Mul: binaryLoop(a, as, b, bs, out, shape, n, [] __device__(C x, C y) { return wrapMul(x, y); }, "mul"); break;
    case BinaryOp::Div:
      if constexpr (std::is_integral_v<T>) {
        // A flag in device memory, read back once: division by zero is an error, as on the CPU.
        DeviceFlag zero;
        int* flag = zero.get();
        binaryLoop(a, as, b, bs, out, shape, n, [flag] __device__(C x, C y) {
          if (y == 0) {
            *flag = 1;
            return C(0);
          }
          if constexpr (std::is_signed_v<C>) {
            if (y == C(-1)) return wrapSub(C(0), x);
          }
          return static_cast<C>(x / y);
        }, "div");
        if (zero.read()) throw InvalidArgumentError("div: integer division by zero");
      } else {
        binaryLoop(a, as, b, bs, out, shape, n, [] __device__(C x, C y) { return x / y; }, "div");
      }
      break;
    case BinaryOp::Pow: binaryLoop(a, as, b, bs, out, shape, n, [] __device__(C x, C y) { return ipow(x, y); }, "pow"); break;
    case BinaryOp::Maximum:
      binaryLoop(a, as, b, bs, out, shape, n, [] __device__(C x, C y) { return x > y ? x : y; }, "maximum");
      break;
    case BinaryOp::Minimum:
      binaryLoop(a, as, b, bs, out, shape, n, [] __device__(C x, C y) { return x < y ? x : y; }, "minimum");
      break;
  }
}

// ---- unary ---------------------------------------------------------------------

template <class T, class F>
void unaryLoop(const T* in, T* out, int64_t n, F f, const char* op) {
  launchContiguous(n, [=] __device__(int64_t i) { out[i] = fromAcc<T>(f(toAcc(in[i]))); }, op);
}

__device__ __forceinline__ float erfOf(float x) { return erff(x); }
__device__ __forceinline__ double erfOf(double x) { return erf(x); }

template <class T>
void unaryTyped(UnaryOp op, DType type, const T* in, T* out, int64_t n, double p0, double p1) {
  using C = Acc<T>;
  const bool usesScalars = op == UnaryOp::Clamp || op == UnaryOp::AddScalar || op == UnaryOp::MulScalar;
  const C a = usesScalars ? scalarAs<C>(p0, type) : C(0);
  const C b = op == UnaryOp::Clamp ? scalarAs<C>(p1, type) : C(0);
  switch (op) {
    case UnaryOp::Neg: unaryLoop(in, out, n, [] __device__(C x) { return wrapSub(C(0), x); }, "neg"); break;
    case UnaryOp::Exp: unaryLoop(in, out, n, [] __device__(C x) { return static_cast<C>(exp(x)); }, "exp"); break;
    case UnaryOp::Log: unaryLoop(in, out, n, [] __device__(C x) { return static_cast<C>(log(x)); }, "log"); break;
    case UnaryOp::Sqrt: unaryLoop(in, out, n, [] __device__(C x) { return static_cast<C>(sqrt(x)); }, "sqrt"); break;
    case UnaryOp::Abs:
      if constexpr (std::is_unsigned_v<C>) {
        unaryLoop(in, out, n, [] __device__(C x) { return x; }, "abs");
      } else if constexpr (std::is_floating_point_v<C>) {
        unaryLoop(in, out, n, [] __device__(C x) { return static_cast<C>(fabs(x)); }, "abs");
      } else {
        unaryLoop(in, out, n, [] __device__(C x) { return x < 0 ? wrapSub(C(0), x) : x; }, "abs");
      }
      break;
    case UnaryOp::Sign:
      if constexpr (std::is_unsigned_v<C>) {
        unaryLoop(in, out, n, [] __device__(C x) { return static_cast<C>(x > 0); }, "sign");
      } else {
        unaryLoop(in, out, n, [] __device__(C x) { return static_cast<C>((x > 0) - (x < 0)); }, "sign");
      }
      break;
    case UnaryOp::Relu: unaryLoop(in, out, n, [] __device__(C x) { return x > 0 ? x : C(0); }, "relu"); break;
    case UnaryOp::Tanh: unaryLoop(in, out, n, [] __device__(C x) { return static_cast<C>(tanh(x)); }, "tanh"); break;
    case UnaryOp::Sigmoid:
      if constexpr (std::is_same_v<C, float>) {
        unaryLoop(in, out, n, [] __device__(C x) { return 1.0f / (1.0f + expf(-x)); }, "sigmoid");
      } else {
        unaryLoop(in, out, n, [] __device__(C x) { return static_cast<C>(1.0 / (1.0 + exp(-static_cast<double>(x)))); },
                  "sigmoid");
      }
      break;
    case UnaryOp::Gelu:
      if constexpr (std::is_floating_point_v<C>) {
        unaryLoop(in, out, n, [] __device__(C x) { return C(0.5) * x * (C(1) + erfOf(x * C(M_SQRT1_2))); }, "gelu");
      }
      break;
    case UnaryOp::PowScalar:
      // Through double, as the CPU.
      unaryLoop(in, out, n, [p0] __device__(C x) { return static_cast<C>(::pow(static_cast<double>(x), p0)); }, "pow");
      break;
    case UnaryOp::Clamp: unaryLoop(in, out, n, [a, b] __device__(C x) { return x < a ? a : (x > b ? b : x); }, "clamp"); break;
    case UnaryOp::AddScalar: unaryLoop(in, out, n, [a] __device__(C x) { return wrapAdd(x, a); }, "add"); break;
    case UnaryOp::MulScalar: unaryLoop(in, out, n, [a] __device__(C x) { return wrapMul(x, a); }, "mul"); break;
    case UnaryOp::Square: unaryLoop(in, out, n, [] __device__(C x) { return wrapMul(x, x); }, "square"); break;
    case UnaryOp::Reciprocal: unaryLoop(in, out, n, [] __device__(C x) { return static_cast<C>(C(1) / x); }, "reciprocal"); break;
  }
}

// ---- unary backward ------------------------------------------------------------

template <class T, class F>
void gradLoop(const T* x, const T* y, const T* g, T* gx, int64_t n, F f, const char* op) {
  using C = Acc<T>;
  launchContiguous(n, [=] __device__(int64_t i) {
    gx[i] = fromAcc<T>(f(x ? toAcc(x[i]) : C(0), y ? toAcc(y[i]) : C(0), toAcc(g[i])));
  }, op);
}

template <class T>
void unaryBackwardTyped(UnaryOp op, const T* px, const T* py, const T* pg, T* po, int64_t n, double p0, double p1) {
  using C = Acc<T>;
  const C a = static_cast<C>(p0), b = static_cast<C>(p1);
  switch (op) {
    case UnaryOp::Neg: gradLoop(px, py, pg, po, n, [] __device__(C, C, C d) { return -d; }, "neg backward"); break;
    case UnaryOp::Exp: gradLoop(px, py, pg, po, n, [] __device__(C, C v, C d) { return d * v; }, "exp backward"); break;
    case UnaryOp::Log: gradLoop(px, py, pg, po, n, [] __device__(C u, C, C d) { return d / u; }, "log backward"); break;
    case UnaryOp::Sqrt: gradLoop(px, py, pg, po, n, [] __device__(C, C v, C d) { return d / (C(2) * v); }, "sqrt backward"); break;
    case UnaryOp::Abs:
      gradLoop(px, py, pg, po, n, [] __device__(C u, C, C d) { return u > 0 ? d : (u < 0 ? -d : C(0)); }, "abs backward");
      break;
    case UnaryOp::Sign: gradLoop(px, py, pg, po, n, [] __device__(C, C, C) { return C(0); }, "sign backward"); break;
    case UnaryOp::Relu: gradLoop(px, py, pg, po, n, [] __device__(C u, C, C d) { return u > 0 ? d : C(0); }, "relu backward"); break;
    case UnaryOp::Tanh: gradLoop(px, py, pg, po, n, [] __device__(C, C v, C d) { return d * (C(1) - v * v); }, "tanh backward"); break;
    case UnaryOp::Sigmoid:
      gradLoop(px, py, pg, po, n, [] __device__(C, C v, C d) { return d * v * (C(1) - v); }, "sigmoid backward");
      break;
    case UnaryOp::Gelu:
      gradLoop(px, py, pg, po, n, [] __device__(C u, C, C d) {
        const C cdf = C(0.5) * (C(1) + erfOf(u * C(M_SQRT1_2)));
        const C pdf = exp(C(-0.5) * u * u) * C(0.3989422804014327);
        return d * (cdf + u * pdf);
      }, "gelu backward");
      break;
    case UnaryOp::PowScalar:
      gradLoop(px, py, pg, po, n, [p0] __device__(C u, C, C d) {
        if (p0 == 0) return C(0);
        return static_cast<C>(static_cast<double>(d) * p0 * ::pow(static_cast<double>(u), p0 - 1));
      }, "pow backward");
      break;
    case UnaryOp::Clamp:
      gradLoop(px, py, pg, po, n, [a, b] __device__(C u, C, C d) { return u >= a && u <= b ? d : C(0); }, "clamp backward");
      break;
    case UnaryOp::AddScalar: gradLoop(px, py, pg, po, n, [] __device__(C, C, C d) { return d; }, "add backward"); break;
    case UnaryOp::MulScalar: gradLoop(px, py, pg, po, n, [a] __device__(C, C, C d) { return d * a; }, "mul backward"); break;
    case UnaryOp::Square: gradLoop(px, py, pg, po, n, [] __device__(C u, C, C d) { return C(2) * u * d; }, "square backward"); break;
    case UnaryOp::Reciprocal:
      gradLoop(px, py, pg, po, n, [] __device__(C, C v, C d) { return -d * v * v; }, "reciprocal backward");
      break;
  }
}

// ---- the rest ------------------------------------------------------------------

template <class T>
void axpyTyped(T* a, const T* b, int64_t n, double alpha) {
  using C = Acc<T>;
  const C al = static_cast<C>(alpha);
  if (al == C(1)) {
    launchContiguous(n, [=] __device__(int64_t i) { a[i] = fromAcc<T>(wrapAdd(toAcc(a[i]), toAcc(b[i]))); }, "axpy");
  } else {
    launchContiguous(n, [=] __device__(int64_t i) { a[i] = fromAcc<T>(wrapAdd(toAcc(a[i]), wrapMul(al, toAcc(b[i])))); },
                     "axpy");
  }
}

template <class T>
void scaleFlagTyped(T* x, int64_t n, double scale, int* flag) {
  using C = Acc<T>;
  const C s = static_cast<C>(scale);
  launchContiguous(n, [=] __device__(int64_t i) {
    const C v = toAcc(x[i]);
    if (!(fabs(v) <= std::numeric_limits<C>::max())) *flag = 1;
    x[i] = fromAcc<T>(v * s);
  }, "scaleAndCheckFinite");
}

template <class T>
void compareTyped(CompareOp op, const T* a, std::span<const int64_t> as, const T* b, std::span<const int64_t> bs,
                  bool* out, std::span<const int64_t> shape, int64_t n) {
  int64_t os[kMaxDims];
  contiguousStridesOf(shape, os);
  const std::span<const int64_t> strides[3] = {std::span<const int64_t>(os, shape.size()), as, bs};
  StridedOffsets<3> off(shape, strides);
  const int code = static_cast<int>(op);
  const int eq = static_cast<int>(CompareOp::Eq), gt = static_cast<int>(CompareOp::Gt);
  launchStrided<3>(n, off, [=] __device__(int64_t i, const int64_t* o) {
    const auto x = toAcc(a[o[1]]), y = toAcc(b[o[2]]);
    out[o[0]] = code == eq ? x == y : (code == gt ? x > y : x < y);
  }, "compare");
}

int64_t numelOf(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

void checkDims(std::span<const int64_t> shape, const char* op) {
  WEFT_ENFORCE(shape.size() <= static_cast<size_t>(kMaxDims), InvalidArgumentError, op, ": ", shape.size(),
               " dimensions; CUDA kernels take at most ", kMaxDims);
}

}  // namespace

void binary(BinaryOp op, DType type, const void* a, std::span<const int64_t> aStrides, const void* b,
            std::span<const int64_t> bStrides, void* out, std::span<const int64_t> shape) {
  const int64_t n = numelOf(shape);
  if (n == 0) return;
  checkDims(shape, "binary op");
  WEFT_CUDA_DISPATCH_NUMERIC_AND_HALF(type, "binary op", [&]<class T>() {
    binaryTyped<T>(op, static_cast<const T*>(a), aStrides, static_cast<const T*>(b), bStrides, static_cast<T*>(out),
                   shape, n);
  });
}

void unary(UnaryOp op, DType type, const void* in, void* out, int64_t n, double p0, double p1) {
  if (n <= 0) return;
  WEFT_CUDA_DISPATCH_NUMERIC_AND_HALF(type, "unary op", [&]<class T>() {
    unaryTyped<T>(op, type, static_cast<const T*>(in), static_cast<T*>(out), n, p0, p1);
  });
}

void axpy(DType type, double alpha, const void* b, void* a, int64_t n) {
  if (n <= 0) return;
  WEFT_CUDA_DISPATCH_NUMERIC_AND_HALF(type, "axpy", [&]<class T>() {
    axpyTyped<T>(static_cast<T*>(a), static_cast<const T*>(b), n, alpha);
  });
}

void scaleAndFlagNonFinite(DType type, void* x, int64_t n, double scale, int* flag) {
  if (n <= 0) return;
  WEFT_CUDA_DISPATCH_FLOATING_AND_HALF(type, "scaleAndCheckFinite", [&]<class T>() {
    scaleFlagTyped<T>(static_cast<T*>(x), n, scale, flag);
  });
}

bool scaleAndCheckFinite(DType type, void* x, int64_t n, double scale) {
  if (n <= 0) return false;
  DeviceFlag flag;
  scaleAndFlagNonFinite(type, x, n, scale, flag.get());
  return flag.read() != 0;
}

void unaryBackward(UnaryOp op, DType type, const void* x, const void* y, const void* g, void* gx, int64_t n,
                   double p0, double p1) {
  if (n <= 0) return;
  WEFT_CUDA_DISPATCH_FLOATING_AND_HALF(type, "unary backward", [&]<class T>() {
    unaryBackwardTyped<T>(op, static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(g),
                          static_cast<T*>(gx), n, p0, p1);
  });
}

void compare(CompareOp op, DType type, const void* a, std::span<const int64_t> aStrides, const void* b,
             std::span<const int64_t> bStrides, bool* out, std::span<const int64_t> shape) {
  const int64_t n = numelOf(shape);
  if (n == 0) return;
  checkDims(shape, "compare");
  WEFT_CUDA_DISPATCH_ALL_AND_HALF(type, "compare", [&]<class T>() {
    compareTyped<T>(op, static_cast<const T*>(a), aStrides, static_cast<const T*>(b), bStrides, out, shape, n);
  });
}

}  // namespace weft::kernels::cuda
