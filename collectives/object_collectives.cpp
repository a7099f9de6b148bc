#include "collectives/object_collectives.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "tensor/tensor.h"

namespace weft::collectives::detail {

namespace {
// Bytes travel as int64 words (any dtype moves; int64 is on every backend).
constexpr size_t kWord = sizeof(int64_t);
size_t wordsFor(size_t bytes) { return (bytes + kWord - 1) / kWord; }
}  // namespace

rpc::IncomingFrame decodeObjectFrame(const std::vector<std::byte>& bytes, const std::string& what) {
  rpc::FrameDecoder decoder;
  Status s = decoder.feed(bytes.data(), bytes.size());
  WEFT_ENFORCE(s.ok(), ProtocolError, what, ": the bytes are no weft frame: ", s.toString());
  std::optional<rpc::IncomingFrame> frame = decoder.next();
  WEFT_ENFORCE(frame.has_value(), ProtocolError, what, ": the bytes end inside a frame (", bytes.size(), " bytes)");
  try {
    WEFT_ENFORCE(frame->message().which() == rpc::wire::Message::CALL, ProtocolError, what,
                 ": the frame holds no value");
  } catch (const kj::Exception& e) {
    throw ProtocolError(what + ": malformed frame: " + e.getDescription().cStr());
  }
  return std::move(*frame);
}

std::vector<std::vector<std::byte>> allGatherBytes(ProcessGroup& pg, const std::vector<std::byte>& mine) {
  const int n = pg.size();
  Tensor length = empty({1}, {.dtype = DType::Int64});
  length.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  Tensor lengths = empty({n}, {.dtype = DType::Int64});
  pg.allGatherInto(lengths, length).wait();
  const int64_t* len = lengths.data<int64_t>();
  int64_t longest = 0;
  for (int r = 0; r < n; ++r) {
    WEFT_ENFORCE(len[r] >= 0, ProtocolError, "allGatherObject: rank ", r, " announced ", len[r], " bytes");
    longest = std::max(longest, len[r]);
  }
  const int64_t words = static_cast<int64_t>(wordsFor(static_cast<size_t>(longest)));
  Tensor in = zeros({words}, {.dtype = DType::Int64});
  if (!mine.empty()) std::memcpy(in.rawData(), mine.data(), mine.size());
  Tensor out = empty({words * n}, {.dtype = DType::Int64});
  pg.allGatherInto(out, in).wait();
  std::vector<std::vector<std::byte>> all(static_cast<size_t>(n));
  const auto* base = static_cast<const std::byte*>(out.rawData());
  for (int r = 0; r < n; ++r) {
    const std::byte* from = base + static_cast<size_t>(r) * static_cast<size_t>(words) * kWord;
    all[static_cast<size_t>(r)].assign(from, from + len[r]);
  }
  return all;
}

std::vector<std::byte> broadcastBytes(ProcessGroup& pg, const std::vector<std::byte>& bytes, int root) {
  const bool isRoot = pg.rank() == root;
  Tensor length = empty({1}, {.dtype = DType::Int64});
  length.data<int64_t>()[0] = isRoot ? static_cast<int64_t>(bytes.size()) : 0;
  pg.broadcast(length, root).wait();
  const int64_t len = length.data<int64_t>()[0];
  WEFT_ENFORCE(len >= 0, ProtocolError, "broadcastObject: rank ", root, " announced ", len, " bytes");
  Tensor data = zeros({static_cast<int64_t>(wordsFor(static_cast<size_t>(len)))}, {.dtype = DType::Int64});
  if (isRoot && !bytes.empty()) std::memcpy(data.rawData(), bytes.data(), bytes.size());
  pg.broadcast(data, root).wait();
  if (isRoot) return bytes;
  const auto* from = static_cast<const std::byte*>(data.rawData());
  return std::vector<std::byte>(from, from + len);
}

}  // namespace weft::collectives::detail
