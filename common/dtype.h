// Element types and devices: the vocabulary shared by kernels, tensors and the
// wire format.
//
//   weft::DType t = weft::DType::Float32;
//   size_t bytes = weft::elementSize(t) * n;
//   WEFT_DISPATCH_FLOATING(t, "relu", [&]<class T>() { run<T>(); });
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

namespace weft {

// Most dimensions a tensor may have (the kernels size their index arrays by it).
inline constexpr int kMaxDims = 16;

// The numeric values are part of the wire format: never renumber.
enum class DType : uint8_t {
  Float32 = 0,
  Float64 = 1,
  Int64 = 2,
  // Storage-only types reserved for GPU work; CPU kernels reject them.
  BFloat16 = 3,
  Float16 = 4,
};

size_t elementSize(DType t);
const char* dtypeName(DType t);  // "float32", "float64", ...
bool isFloating(DType t);
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

// Calls `fn.template operator()<T>()` with T the C++ type of `dtype`.
#define WEFT_DISPATCH_FLOATING(dtype, opname, ...)                         \
  do {                                                                    \
    switch (dtype) {                                                      \
      case ::weft::DType::Float32: (__VA_ARGS__).template operator()<float>(); break;  \
      case ::weft::DType::Float64: (__VA_ARGS__).template operator()<double>(); break; \
      default: ::weft::throwUnsupportedDType(opname, dtype);              \
    }                                                                     \
  } while (0)

#define WEFT_DISPATCH_ALL(dtype, opname, ...)                              \
  do {                                                                    \
    switch (dtype) {                                                      \
      case ::weft::DType::Float32: (__VA_ARGS__).template operator()<float>(); break;  \
      case ::weft::DType::Float64: (__VA_ARGS__).template operator()<double>(); break; \
      case ::weft::DType::Int64: (__VA_ARGS__).template operator()<int64_t>(); break;  \
      default: ::weft::throwUnsupportedDType(opname, dtype);              \
    }                                                                     \
  } while (0)
