// Types and limits shared by the frame fuzzer and the program that writes its seed corpus, so
// the seeds exercise exactly the signatures the fuzzer decodes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "rpc/codec.h"

namespace fuzz {

// Small limits keep each run fast and make the limit checks reachable.
inline constexpr weft::rpc::FrameLimits kLimits{
    .maxFrameBytes = 1 << 20, .maxSegments = 16, .maxBuffers = 64, .maxNesting = 32, .readChunkBytes = 256};

struct Point {
  double x = 0;
  std::string label;
};
WEFT_CODEC_FIELDS(Point, x, label);

// Recursive, so its nesting depth is decided by the bytes.
struct Node {
  int32_t value = 0;
  std::vector<Node> children;
  std::optional<weft::Tensor> payload;
};
WEFT_CODEC_FIELDS(Node, value, children, payload);

using ResultList = std::vector<std::map<std::string, std::optional<std::tuple<int32_t, weft::Tensor>>>>;

}  // namespace fuzz
