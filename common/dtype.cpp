#include "common/dtype.h"

#include "common/error.h"

namespace weft {

size_t elementSize(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::BFloat16: return 2;
    case DType::Float16: return 2;
    case DType::Int32: return 4;
    case DType::UInt8: return 1;
    case DType::Bool: return 1;
  }
  throw InvalidArgumentError(detail::concat("unknown dtype code ", static_cast<int>(t)));
}

const char* dtypeName(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
    case DType::Int32: return "int32";
    case DType::UInt8: return "uint8";
    case DType::Bool: return "bool";
  }
  return "unknown";
}

bool isFloating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::BFloat16 || t == DType::Float16;
}

bool isIntegral(DType t) { return t == DType::Int64 || t == DType::Int32 || t == DType::UInt8; }

bool isLowPrecision(DType t) { return t == DType::BFloat16 || t == DType::Float16; }

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtypeName(t); }

std::string Device::str() const {
  return isCpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5) {
    size_t used = 0;
    int idx = -1;
    try {
      idx = std::stoi(s.substr(5), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == s.size() - 5 && idx >= 0) return cuda(idx);
  }
  throw InvalidArgumentError("invalid device string '" + s + "': expected 'cpu', 'cuda' or 'cuda:N'");
}

std::ostream& operator<<(std::ostream& os, Device d) { return os << d.str(); }

void throwUnsupportedDType(const char* op, DType t) {
  throw InvalidArgumentError(detail::concat(op, ": dtype ", dtypeName(t), " is not supported"));
}

}  // namespace weft
