// Element types and devices: the vocabulary shared by kernels, tensors and the
// wire format.
//
//   weft::DType t = weft::DType::Float32;
//   size_t bytes = weft::elementSize(t) * n;
//   WEFT_DISPATCH_FLOATING(t, "relu", [&]<class T>() { run<T>(); });
//
// What each CPU dtype supports (others give InvalidArgumentError naming the
// op and the dtype, e.g. "exp: dtype int32 is not supported"):
//   every dtype (float32, float64, bfloat16, float16, int64, int32, uint8,
//   bool): creation (empty, zeros, ones, full, fromVector, arange), printing,
//   element access (data<T>, item<T>, toVector<T>), to(dtype) in both
//   directions between any two of them, views, contiguous, clone, copy_,
//   fill_, cat/stack/split/indexSelect, where, maskedFill, triu, tril,
//   gather, comparisons (eq, gt, lt -> bool), max/min/argmax/argmin, sum and
//   cumsum (integers and bool sum to int64, as in PyTorch), RPC
//   (rpc/codec.h), every collective that moves data (send, broadcast,
//   allGather, ...), state files (nn/serialize.h).
//   Numeric dtypes (float32, float64, bfloat16, float16, int64, int32,
//   uint8): add, sub, mul, div (integer division truncates; by zero is an
//   error), maximum, minimum, pow, neg, abs, square, relu, clamp, scatterAdd,
//   the scalar forms (x + 2, x * 3); reductions across ranks take the dtypes
//   collectives/process_group.h lists per backend (gloo: not bfloat16).
//   Floating dtypes (float32, float64, bfloat16, float16): autograd
//   (requiresGrad), mean, exp, log, sqrt, tanh, sigmoid, gelu, pow by a
//   scalar, 1 / x, softmax, matmul, the nn layers, losses, optimizers and
//   initialisers.
// bfloat16 and float16 (common/half.h) compute in float32: an op converts its
// operands to float32, runs the float32 kernel (accumulating in float32) and
// rounds the result back once, so a result matches PyTorch's CPU result for
// the same inputs up to the float32 kernel's own rounding. Gradients of a
// bfloat16/float16 tensor are of its dtype. Mixed dtypes are an error outside
// an autocast scope (tensor/autocast.h).
// Conversions follow PyTorch: to bool is `x != 0`; from bool gives 0 or 1;
// between integer types the value wraps modulo 2^bits; a floating value
// converted to an integer type is truncated toward zero, saturates at the
// type's limits, and NaN becomes 0 (where PyTorch leaves it undefined); to
// bfloat16/float16 rounds to nearest even (common/half.h), from float64 and
// the integers through float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

#include "common/half.h"

namespace weft {

// Most dimensions a tensor may have (the kernels size their index arrays by it).
inline constexpr int kMaxDims = 16;

// The numeric values are part of the wire format: never renumber.
enum class DType : uint8_t {
  Float32 = 0,
  Float64 = 1,
  Int64 = 2,
  BFloat16 = 3,  // weft::BFloat16 (common/half.h)
  Float16 = 4,  // weft::Float16, IEEE half
  Int32 = 5,
  UInt8 = 6,
  Bool = 7,  // one byte per element, always 0 or 1
};
// The largest DType value: codes above it are unknown (wire format, files).
inline constexpr DType kLastDType = DType::Bool;

size_t elementSize(DType t);
const char* dtypeName(DType t);  // "float32", "float64", ...
bool isFloating(DType t);  // float32, float64, bfloat16, float16
bool isIntegral(DType t);  // int64, int32, uint8 (not bool)
bool isLowPrecision(DType t);  // bfloat16, float16: computed through float32
std::ostream& operator<<(std::ostream& os, DType t);

template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::Float64;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::Int64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::Int32;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::UInt8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::Bool;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::BFloat16;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::Float16;
};
// True for the C++ types that have a DType (float, double, BFloat16, Float16,
// int64_t, int32_t, uint8_t, bool): what fromVector, item and toVector accept.
template <class T>
inline constexpr bool kIsElementType = requires { DTypeOf<T>::value; };
template <class T>
inline constexpr DType kDTypeOf = DTypeOf<T>::value;

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // meaningful for CUDA only

  static constexpr Device cpu() { return {}; }
  static constexpr Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool isCpu() const { return type == DeviceType::CPU; }
  bool isCuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
  // Parses "cpu", "cuda", "cuda:N"; throws InvalidArgumentError otherwise.
  static Device parse(const std::string& s);
};
std::ostream& operator<<(std::ostream& os, Device d);

[[noreturn]] void throwUnsupportedDType(const char* op, DType t);

}  // namespace weft

// Calls `fn.template operator()<T>()` with T the C++ type of `dtype`; any
// other dtype throws InvalidArgumentError naming `opname` and the dtype.
// FLOATING: float32, float64. NUMERIC: those and int64, int32, uint8.
// ALL: the numeric ones and bool. ALL_AND_HALF, NUMERIC_AND_HALF: those and
// BFloat16, Float16 (for kernels that move, compare or accumulate elements;
// arithmetic on the 16-bit types goes through float32 blocks).
#define WEFT_DISPATCH_FLOATING(dtype, opname, ...)                         \
  do {                                                                    \
    switch (dtype) {                                                      \
      case ::weft::DType::Float32: (__VA_ARGS__).template operator()<float>(); break;  \
      case ::weft::DType::Float64: (__VA_ARGS__).template operator()<double>(); break; \
      default: ::weft::throwUnsupportedDType(opname, dtype);              \
    }                                                                     \
  } while (0)

#define WEFT_DISPATCH_NUMERIC_CASES(...)                                                 \
  case ::weft::DType::Float32: (__VA_ARGS__).template operator()<float>(); break;    \
  case ::weft::DType::Float64: (__VA_ARGS__).template operator()<double>(); break;   \
  case ::weft::DType::Int64: (__VA_ARGS__).template operator()<int64_t>(); break;    \
  case ::weft::DType::Int32: (__VA_ARGS__).template operator()<int32_t>(); break;    \
  case ::weft::DType::UInt8: (__VA_ARGS__).template operator()<uint8_t>(); break;

#define WEFT_DISPATCH_NUMERIC(dtype, opname, ...)                          \
  do {                                                                    \
    switch (dtype) {                                                      \
      WEFT_DISPATCH_NUMERIC_CASES(__VA_ARGS__)                            \
      default: ::weft::throwUnsupportedDType(opname, dtype);              \
    }                                                                     \
  } while (0)

#define WEFT_DISPATCH_ALL(dtype, opname, ...)                              \
  do {                                                                    \
    switch (dtype) {                                                      \
      WEFT_DISPATCH_NUMERIC_CASES(__VA_ARGS__)                            \
      case ::weft::DType::Bool: (__VA_ARGS__).template operator()<bool>(); break;      \
      default: ::weft::throwUnsupportedDType(opname, dtype);              \
    }                                                                     \
  } while (0)

#define WEFT_DISPATCH_ALL_AND_HALF(dtype, opname, ...)                     \
  do {                                                                    \
    switch (dtype) {                                                      \
      WEFT_DISPATCH_NUMERIC_CASES(__VA_ARGS__)                            \
      case ::weft::DType::Bool: (__VA_ARGS__).template operator()<bool>(); break;      \
      case ::weft::DType::BFloat16: (__VA_ARGS__).template operator()<::weft::BFloat16>(); break; \
      case ::weft::DType::Float16: (__VA_ARGS__).template operator()<::weft::Float16>(); break;   \
      default: ::weft::throwUnsupportedDType(opname, dtype);              \
    }                                                                     \
  } while (0)

#define WEFT_DISPATCH_NUMERIC_AND_HALF(dtype, opname, ...)                 \
  do {                                                                    \
    switch (dtype) {                                                      \
      WEFT_DISPATCH_NUMERIC_CASES(__VA_ARGS__)                            \
      case ::weft::DType::BFloat16: (__VA_ARGS__).template operator()<::weft::BFloat16>(); break; \
      case ::weft::DType::Float16: (__VA_ARGS__).template operator()<::weft::Float16>(); break;   \
      default: ::weft::throwUnsupportedDType(opname, dtype);              \
    }                                                                     \
  } while (0)
