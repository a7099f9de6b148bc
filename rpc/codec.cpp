#include "rpc/codec.h"

namespace weft::rpc {

std::string describeKind(wire::Value::Reader in) {
  switch (in.which()) {
    case wire::Value::NONE:
      return "none";
    case wire::Value::BOOLEAN:
      return "bool";
    case wire::Value::INT:
      return "int";
    case wire::Value::UINT:
      return "uint";
    case wire::Value::FLOAT32:
      return "float32";
    case wire::Value::FLOAT64:
      return "float64";
    case wire::Value::TEXT:
      return "string";
    case wire::Value::BYTES:
      return "bytes";
    case wire::Value::TENSOR:
      return "tensor";
    case wire::Value::LIST:
      return "list";
    case wire::Value::TUPLE:
      return "tuple";
    case wire::Value::MAP:
      return "map";
    case wire::Value::RECORD:
      return "struct";
    case wire::Value::RREF:
      return "RRef";
    case wire::Value::INT_LIST:
      return "list of int";
    case wire::Value::UINT_LIST:
      return "list of uint";
    case wire::Value::FLOAT32_LIST:
      return "list of float32";
    case wire::Value::FLOAT64_LIST:
      return "list of float64";
    case wire::Value::BOOL_LIST:
      return "list of bool";
  }
  return "unknown value kind " + std::to_string(static_cast<unsigned>(in.which()));
}

void throwKindMismatch(const std::string& expected, wire::Value::Reader in) {
  throw ProtocolError("expected " + expected + ", got " + describeKind(in));
}

namespace detail {

void throwOutOfRange(const char* typeName, std::string value) {
  throw ProtocolError("value " + value + " is out of range for " + typeName);
}

std::string recordFieldName(const RecordInfo& info, size_t i) {
  std::string_view names = info.fieldNames;
  for (size_t k = 0; k < i; ++k) {
    size_t comma = names.find(',');
    if (comma == std::string_view::npos) return std::to_string(i);
    names.remove_prefix(comma + 1);
  }
  names = names.substr(0, names.find(','));
  while (!names.empty() && names.front() == ' ') names.remove_prefix(1);
  while (!names.empty() && names.back() == ' ') names.remove_suffix(1);
  return std::string(names);
}

}  // namespace detail
}  // namespace weft::rpc
