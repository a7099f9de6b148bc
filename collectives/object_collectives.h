// Object collectives: allGather and broadcast of any value the RPC codecs
// encode (rpc/codec.h): strings, numbers, vectors, maps, optionals, tuples,
// tensors and WEFT_CODEC_FIELDS structs of those, like PyTorch's
// all_gather_object and broadcast_object_list (without pickle).
//
//   struct Stats { int64_t seen; double loss; std::string host; };
//   WEFT_CODEC_FIELDS(Stats, seen, loss, host);
//
//   std::vector<Stats> all = weft::collectives::allGatherObject(*pg, Stats{n, loss, host});  // all[r]: rank r's
//   Config cfg;
//   if (pg->rank() == 0) cfg = readConfig();
//   weft::collectives::broadcastObject(*pg, cfg, /*root=*/0);                                 // rank 0's everywhere
//
// Both are collective (every rank of the group calls them, in the same order
// as its other collectives, with the same T) and blocking: each encodes the
// value into one RPC frame on the calling thread and runs two collectives of
// the group (the frames' lengths, then the frames, padded to the longest),
// then decodes. Tensors come back as new contiguous CPU tensors (a CUDA
// tensor is refused with InvalidArgumentError, as in RPC); values that only
// mean something inside an agent (RRefs) have no place here.
//
// Errors: those of the group's collectives (process_group.h: TimeoutError,
// DisconnectedError, StateError, ...); InvalidArgumentError when a value
// cannot be encoded; ProtocolError when a rank's bytes do not decode as T
// (ranks that passed different types), naming the rank ("allGatherObject:
// rank 1's value: expected string, got int"). The group stays usable after
// a ProtocolError.
#pragma once

#include <cstddef>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/process_group.h"
#include "rpc/codec.h"
#include "rpc/frame.h"

namespace weft::collectives {

namespace detail {
// The frame of one call whose single argument encodes `value`, flattened.
template <class T>
std::vector<std::byte> encodeObject(const T& value) {
  rpc::FrameWriter writer;
  auto call = writer.message().initCall();
  rpc::EncodeContext ctx(writer);
  rpc::encodeArguments(ctx, call.initArgs(1), value);
  std::vector<std::byte> bytes;
  std::move(writer).finish().appendTo(bytes);
  return bytes;
}

// Decodes `bytes` (one frame) back into a call frame; ProtocolError naming
// `what` when they are not one.
rpc::IncomingFrame decodeObjectFrame(const std::vector<std::byte>& bytes, const std::string& what);

template <class T>
T decodeObject(const std::vector<std::byte>& bytes, const std::string& what) {
  rpc::IncomingFrame frame = decodeObjectFrame(bytes, what);
  rpc::DecodeContext ctx(frame);
  auto args = frame.message().getCall().getArgs();
  if (args.size() != 1) throw ProtocolError(what + ": expected one value, got " + std::to_string(args.size()));
  return rpc::detail::decodingAt([&] { return what; }, [&] { return rpc::decodeValue<T>(args[0], ctx); });
}

// Every rank's bytes, by rank.
std::vector<std::vector<std::byte>> allGatherBytes(ProcessGroup& pg, const std::vector<std::byte>& mine);
// root's bytes (`bytes` on root, ignored elsewhere).
std::vector<std::byte> broadcastBytes(ProcessGroup& pg, const std::vector<std::byte>& bytes, int root);
}  // namespace detail

// Every rank's `value`, by rank (element r from rank r).
template <class T>
std::vector<T> allGatherObject(ProcessGroup& pg, const T& value) {
  std::vector<std::vector<std::byte>> all = detail::allGatherBytes(pg, detail::encodeObject(value));
  std::vector<T> out;
  out.reserve(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    out.push_back(detail::decodeObject<T>(all[r], "allGatherObject: rank " + std::to_string(r) + "'s value"));
  }
  return out;
}

// Replaces `value` on every rank but root with root's.
template <class T>
void broadcastObject(ProcessGroup& pg, T& value, int root) {
  std::vector<std::byte> mine;
  if (pg.rank() == root) mine = detail::encodeObject(value);
  std::vector<std::byte> bytes = detail::broadcastBytes(pg, mine, root);
  if (pg.rank() != root) {
    value = detail::decodeObject<T>(bytes, "broadcastObject: rank " + std::to_string(root) + "'s value");
  }
}

}  // namespace weft::collectives
