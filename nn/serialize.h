// The weft state file: named tensors (a module's or an optimizer's state) in
// a small, versioned, self-validating binary format.
//
//   nn::saveStateDict(net->stateDict(), "ckpt.weft");      // atomic replace
//   nn::StateDict d = nn::loadStateDictFile("ckpt.weft");  // CPU tensors
//   net->loadStateDict(d);
//   std::string bytes = nn::serializeStateDict(d);         // same bytes, in memory
//
// Format, version 1. Every integer is little-endian.
//
//   header   magic    8 bytes   "WEFTSTAT"
//            version  u32       1
//            count    u64       number of records
//   record   nameLen  u32       1 .. kMaxStateNameLength
//   (count)  name     nameLen   bytes, no '\0'; unique within the file
//            dtype    u8        weft::DType value (float32 0, float64 1, int64 2,
//                               bfloat16 3, float16 4, int32 5, uint8 6,
//                               bool 7: one byte each, 0 or 1)
//            ndim     u8        0 .. kMaxDims
//            dims     i64 × ndim, each >= 0
//            nbytes   u64       must equal numel(dims) × elementSize(dtype)
//            data     nbytes    elements in row-major order, little-endian
//   The file ends right after the last record.
//
// Records are written in name order. Reading validates every field against
// these rules and against the bytes actually left before allocating anything,
// so a truncated, corrupt or hostile file raises InvalidArgumentError naming
// the source, the record and the field — never a crash or a huge allocation.
// A missing or unreadable file raises NotFoundError.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "nn/module.h"

namespace weft::nn {

inline constexpr char kStateFileMagic[8] = {'W', 'E', 'F', 'T', 'S', 'T', 'A', 'T'};
inline constexpr uint32_t kStateFileVersion = 1;
inline constexpr uint32_t kMaxStateNameLength = 4096;

// The file image of `dict`. Tensors on other devices are copied to the host;
// undefined tensors are an InvalidArgumentError naming the key.
std::string serializeStateDict(const StateDict& dict);
// Parses a file image; `source` names it in error messages. Tensors are CPU,
// contiguous and independent of `bytes`.
StateDict deserializeStateDict(std::string_view bytes, const std::string& source = "<memory>");

// Writes `dict` to `path` through a temporary file in the same directory that
// is renamed over `path`, so a reader (or a crash) never sees a partial file.
void saveStateDict(const StateDict& dict, const std::string& path);
// Reads a file written by saveStateDict, streaming each tensor's bytes
// straight into its storage.
StateDict loadStateDictFile(const std::string& path);

}  // namespace weft::nn
