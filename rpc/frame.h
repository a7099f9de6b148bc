// Frames: how one wire::Message (rpc/protocol.capnp) and the bytes of its tensors travel on a
// byte stream, and how they are taken back off it.
//
//   // sending
//   rpc::FrameWriter writer;
//   auto call = writer.message().initCall();
//   call.setCallId(7);
//   rpc::EncodeContext ctx(writer);                         // rpc/codec.h
//   rpc::encodeArguments(ctx, call.initArgs(2), a, b);      // tensors become out-of-band buffers
//   rpc::OutgoingFrame frame = std::move(writer).finish();
//   for (auto span : frame.spans()) ...                     // one writev / uv_write, in order
//
//   // receiving (on the loop thread that owns the socket)
//   rpc::FrameDecoder decoder(limits);
//   std::span<std::byte> dst = decoder.prepareRead();      // read(fd, dst.data(), dst.size())
//   weft::Status s = decoder.commitRead(n);                 // not ok: close the connection
//   while (auto frame = decoder.next()) handle(frame->message(), frame->buffers());
//
// Wire layout of a frame (all integers little-endian):
//
//   offset  size  field
//   0       4     magic          the bytes 'W' 'E' 'F' 'T' (kFrameMagic)
//   4       2     version        kProtocolVersion; anything else is rejected
//   6       2     flags          0 (no flag is defined in version 1; others are rejected)
//   8       4     segmentCount   Cap'n Proto segments, 1..limits.maxSegments
//   12      4     bufferCount    out-of-band buffers (one per distinct tensor), 0..limits.maxBuffers
//   16      8     messageWords   total size of the segments, in 8-byte words
//   24      8     bufferBytes    total size of the out-of-band buffers, in bytes
//   32      4*segmentCount, then zero padding to a multiple of 8: each segment's size in words
//   ..      8*bufferCount: each buffer's size in bytes
//   ..      the segments, back to back (8*messageWords bytes)
//   ..      the buffers, back to back, unpadded (bufferBytes bytes)
//
// The preamble is validated before anything is allocated for the frame: magic, version, flags,
// segment and buffer counts against their limits, and the whole frame size (preamble, tables,
// segments and buffers, computed without overflow) against limits.maxFrameBytes. The tables are
// then read (their size is bounded by the counts just checked) and must add up exactly to
// messageWords and bufferBytes. Only then is the segment memory allocated, and each buffer's
// Storage when the stream reaches it; the message's root is checked as soon as the segments are
// in, before any buffer is allocated. Cap'n Proto then reads the segments with a nesting limit
// and a traversal limit derived from the frame (see FrameDecoder). Every failure is a
// Status{protocol} naming what was wrong; the decoder never aborts and never allocates more than
// the limits allow.
//
// No copy of tensor bytes, on either side:
//  - Sending: OutgoingFrame::spans() are (1) the preamble and tables, a small buffer the frame
//    owns, (2) each Cap'n Proto segment, owned by the frame's message builder, and (3) each
//    out-of-band buffer, pointing straight into the tensor's Storage (the frame holds a
//    shared_ptr to it until destroyed). The transport hands the spans to writev/uv_write, so
//    the kernel copies tensor bytes from the Storage to the socket directly. The only copy on
//    the sending side is the one a non-contiguous view needs to become contiguous (rpc/codec.h).
//    Consequence: the bytes are read when the transport writes, so a tensor must not be
//    modified in place until its frame has been written.
//  - Receiving: while the decoder is inside an out-of-band buffer, prepareRead() returns the
//    rest of that buffer's freshly allocated Storage (Storage::allocate, 64-byte aligned), so
//    the kernel's read() lands the bytes in the Storage the decoded tensor will own; the frame
//    hands that same Storage to the codec. Between frames prepareRead() returns a small staging
//    buffer (limits.readChunkBytes) so that many small frames are taken in one read(); tensor
//    bytes that arrive in such a read, together with their frame's preamble, are copied once
//    from it: at most readChunkBytes per frame, counted by stagedTensorBytes(). With
//    readChunkBytes = kPreambleBytes no tensor byte is ever staged, at the cost of one more
//    read() per frame. feed() is for bytes already in memory (a worker's loopback to itself,
//    object collectives, tests, the fuzzer): it copies each byte once into its final place,
//    tensor bytes straight into their Storage.
//
// Threading: a FrameWriter, OutgoingFrame and FrameDecoder belong to one thread at a time (the
// loop thread for a decoder). An IncomingFrame may be moved to another thread and read there.
#pragma once

#include <capnp/message.h>
#include <kj/exception.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/type_tag.h"
#include "common/status.h"
#include "rpc/protocol.capnp.h"
#include "tensor/storage.h"

namespace weft {
class Tensor;
}  // namespace weft

namespace weft::rpc {

// The bytes 'W' 'E' 'F' 'T' read as a little-endian 32-bit integer.
inline constexpr uint32_t kFrameMagic = 0x54464557u;
inline constexpr uint16_t kProtocolVersion = wire::PROTOCOL_VERSION;
inline constexpr size_t kPreambleBytes = 32;

// 64-bit FNV-1a of a name's bytes: the id under which functions travel (wire::Call.functionId).
// Any implementation can compute it from the name alone.
constexpr uint64_t nameId(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// What a decoder accepts, and what a writer refuses to produce (so an oversized message fails
// at the sender with InvalidArgumentError instead of killing the connection at the receiver).
struct FrameLimits {
  // Whole frame: preamble, tables, segments and out-of-band buffers.
  uint64_t maxFrameBytes = uint64_t{4} << 30;
  // Cap'n Proto segments per frame (a builder grows geometrically: 64 MiB of message is ~20).
  uint32_t maxSegments = 512;
  // Out-of-band buffers, i.e. distinct tensors, per frame.
  uint32_t maxBuffers = 16384;
  // How deeply values may nest (a vector of maps of vectors is 3). Cap'n Proto's own pointer
  // nesting limit is derived from it (three times this, the most pointers one level of Value
  // takes, plus the envelope), so deeper messages are rejected while reading, before any
  // recursion could exhaust the stack.
  uint32_t maxNesting = 64;
  // Size of the staging buffer prepareRead() offers between frames (see "No copy" above).
  size_t readChunkBytes = size_t{64} << 10;
};

// ---- sending --------------------------------------------------------------------------

// A complete frame ready to be written: spans() in order are its bytes. Owns everything the
// spans point to (the header, the message segments, references to the tensor Storages), so it
// must live until the transport reports the write done. Move-only; moving keeps spans valid.
class OutgoingFrame {
 public:
  OutgoingFrame(OutgoingFrame&&) noexcept = default;
  OutgoingFrame& operator=(OutgoingFrame&&) noexcept = default;
  ~OutgoingFrame();

  // The frame's bytes, in order: header (preamble and tables), each segment, each buffer.
  // Zero-length buffers appear as empty spans. A transport with an iovec limit (IOV_MAX,
  // usually 1024) writes them in batches.
  std::span<const std::span<const std::byte>> spans() const { return spans_; }
  uint64_t byteSize() const { return byteSize_; }
  size_t bufferCount() const { return storages_.size(); }
  // Appends the frame's bytes to out: a copy, for coalescing small frames into one write,
  // for a worker's loopback to itself, object collectives and tests.
  void appendTo(std::vector<std::byte>& out) const;

 private:
  friend class FrameWriter;
  OutgoingFrame() = default;

  std::unique_ptr<capnp::MallocMessageBuilder> message_;
  std::vector<std::byte> header_;
  std::vector<std::shared_ptr<Storage>> storages_;
  std::vector<std::span<const std::byte>> spans_;
  uint64_t byteSize_ = 0;
};

// Builds one outgoing frame: fill message(), add the out-of-band buffers its TensorDescs name,
// then finish(). Use once.
class FrameWriter {
 public:
  // firstSegmentWords: size of the builder's first segment; most messages fit in the default.
  explicit FrameWriter(unsigned firstSegmentWords = 256);
  ~FrameWriter();
  FrameWriter(const FrameWriter&) = delete;
  FrameWriter& operator=(const FrameWriter&) = delete;

  // The message's root (created on first use).
  wire::Message::Builder message();
  capnp::MessageBuilder& builder() { return *message_; }

  // Appends an out-of-band buffer: `size` bytes at `offset` in `storage`, which the frame keeps
  // alive. Returns its index (for wire::TensorDesc.buffer). The bytes are not copied; they are
  // read when the frame is written. storage may be null only when size is 0. A storage on a
  // non-CPU device is an InvalidArgumentError; a range past the storage's end is a bug (aborts).
  uint32_t addBuffer(std::shared_ptr<Storage> storage, size_t offset, size_t size);
  size_t bufferCount() const { return buffers_.size(); }

  // Lays out the header and the spans. Throws InvalidArgumentError naming the limit when the
  // frame would exceed one of `limits` (the receiver would reject it).
  OutgoingFrame finish(const FrameLimits& limits = {}) &&;

 private:
  struct Buffer {
    std::shared_ptr<Storage> storage;
    size_t offset;
    size_t size;
  };
  std::unique_ptr<capnp::MallocMessageBuilder> message_;
  std::vector<Buffer> buffers_;
  bool hasRoot_ = false;
};

// ---- receiving --------------------------------------------------------------------------

// What distributed autograd (dist_autograd/) attaches to a frame recorded in a context
// (IncomingFrame::attach<FrameAutograd>): it links the frame's tensors that require grad to the
// receiver's recv node, and keeps the context current while the user code the frame runs.
class FrameAutograd {
 public:
  virtual ~FrameAutograd() = default;
  // Called by the tensor codec for each tensor decoded from a descriptor with requiresGrad;
  // slot is its TensorDesc.gradSlot. Throws ProtocolError for a slot out of range.
  virtual void link(Tensor& t, uint32_t slot) = 0;
  // Makes the context current on this thread until the returned token is destroyed.
  virtual std::shared_ptr<void> enterScope() = 0;
};

// One decoded frame: the message and the Storages of its out-of-band buffers. Its root has been
// checked, and its kind is one this build knows; reading deeper parts of the message may still
// throw kj::Exception on malformed data (a pointer out of bounds, a list where a struct should
// be), so read it inside guardRead() below. Move-only.
class IncomingFrame {
 public:
  IncomingFrame(IncomingFrame&&) noexcept;
  IncomingFrame& operator=(IncomingFrame&&) noexcept;
  ~IncomingFrame();

  wire::Message::Reader message() const { return root_; }
  // Buffer i is the Storage its bytes were read into, exactly as long as the buffer table said.
  const std::vector<std::shared_ptr<Storage>>& buffers() const { return buffers_; }
  uint64_t byteSize() const { return byteSize_; }
  // The decoder's FrameLimits::maxNesting, which decoding this frame's values should respect.
  uint32_t maxNesting() const { return maxNesting_; }

  // Objects a layer above rpc ties to this frame when it arrives (the RRef handles a frame
  // carries, rref/), found later by type while its values are decoded; they live as long as
  // the frame.
  template <class X>
  void attach(std::shared_ptr<X> x) {
    attachments_.emplace_back(typeTag<X>(), std::move(x));
  }
  template <class X>
  X* attachment() const {
    for (auto& [tag, object] : attachments_) {
      if (tag == typeTag<X>()) return static_cast<X*>(object.get());
    }
    return nullptr;
  }

 private:
  friend class FrameDecoder;
  IncomingFrame();

  std::unique_ptr<capnp::word[]> words_;
  std::vector<kj::ArrayPtr<const capnp::word>> segments_;
  std::unique_ptr<capnp::SegmentArrayMessageReader> reader_;
  wire::Message::Reader root_;
  std::vector<std::shared_ptr<Storage>> buffers_;
  uint64_t byteSize_ = 0;
  uint32_t maxNesting_ = 0;
  std::vector<std::pair<const void*, std::shared_ptr<void>>> attachments_;
};

// Entered by whoever runs user code for a frame (a handler body, a remote object's method):
// keeps what the frame's layers need current on this thread (a distributed autograd context)
// until the returned token is destroyed. Null when nothing is attached.
inline std::shared_ptr<void> enterFrameScope(const IncomingFrame& frame) {
  FrameAutograd* a = frame.attachment<FrameAutograd>();
  return a != nullptr ? a->enterScope() : nullptr;
}

// Runs fn, which reads a received message, and returns what malformed data made it throw as
// Status{protocol}: a kj::Exception from Cap'n Proto ("malformed message: ...") or a
// ProtocolError from the codec (its message). Anything else propagates.
//
//   Status s = rpc::guardRead([&] { handleCall(frame.message().getCall()); });
template <class Fn>
Status guardRead(Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
    return {};
  } catch (const ProtocolError& e) {
    return Status::protocol(e.what());
  } catch (const kj::Exception& e) {
    return Status::protocol(std::string("malformed message: ") + e.getDescription().cStr());
  }
}

// Incremental decoder for one byte stream: bytes arrive in arbitrary chunks; complete frames
// come out of next() in order. The first error is sticky: every later call returns it, and the
// connection must be closed. Never throws for anything the peer sent.
//
// Cap'n Proto reads each frame with ReaderOptions{nestingLimit = 3 * maxNesting + 8,
// traversalLimitInWords = 4 * messageWords + 8192}: the traversal limit stops a small message
// whose pointers alias (or a list of zero-sized elements) from being read as a huge one.
class FrameDecoder {
 public:
  explicit FrameDecoder(FrameLimits limits = {});
  ~FrameDecoder();
  FrameDecoder(const FrameDecoder&) = delete;
  FrameDecoder& operator=(const FrameDecoder&) = delete;

  // Where the next read from the socket should put its bytes, and at most how many: inside an
  // out-of-band buffer, the rest of its Storage; inside the preamble, tables or segments, the
  // rest of them; between frames, the staging buffer. Never empty. Call commitRead(n) with the number
  // of bytes actually read (0 <= n <= size) before calling prepareRead() or feed() again.
  std::span<std::byte> prepareRead();
  Status commitRead(size_t n);

  // Takes bytes that are already in memory, copying each into its final place.
  Status feed(std::span<const std::byte> bytes);
  Status feed(const void* data, size_t size) { return feed({static_cast<const std::byte*>(data), size}); }

  // The oldest complete frame not yet taken, if any.
  std::optional<IncomingFrame> next();

  // Call when the stream ended: ok when it ended between frames, otherwise Status{protocol}
  // saying how much of which frame was missing (a truncated frame).
  Status endOfStream() const;

  const Status& status() const { return status_; }
  const FrameLimits& limits() const { return limits_; }
  // Replaces the limits for the frames whose preamble is parsed from now on (a
  // connection reads its handshake under tight limits, then widens them); a frame
  // already past its preamble keeps the limits it was checked against.
  // readChunkBytes keeps its value.
  void setLimits(FrameLimits limits);

  // Tensor bytes that went through the staging buffer (see the header comment): zero for
  // frames read through prepareRead() except the part of a frame's buffers that arrived in the
  // same read as its preamble.
  uint64_t stagedTensorBytes() const { return stagedTensorBytes_; }
  // The most bytes allocated for any one frame so far (its tables, segments and buffer
  // Storages), including frames rejected part way. Never more than limits.maxFrameBytes.
  uint64_t peakFrameAllocation() const { return peakAllocation_; }

 private:
  enum class Stage { Preamble, Tables, Segments, Buffers };

  // The bytes the current stage still needs.
  std::span<std::byte> target();
  void consume(const std::byte* data, size_t size, bool fromStaging);
  // Called when the current stage's target is full; moves to the next stage (eagerly through
  // zero-length ones). Sets status_ on a violation.
  void completeStage();
  void parsePreamble();
  void parseTables();
  void checkMessage();
  void enterBuffer();
  void finishFrame();
  void fail(std::string message);
  void noteAllocation(uint64_t bytes);
  uint64_t frameOffset() const;

  FrameLimits limits_;
  Status status_;
  Stage stage_ = Stage::Preamble;
  size_t stagePos_ = 0;  // bytes of the current stage's target already filled

  // The frame being decoded.
  std::byte preamble_[kPreambleBytes];
  uint32_t segmentCount_ = 0;
  uint32_t bufferCount_ = 0;
  uint64_t messageWords_ = 0;
  uint64_t bufferBytes_ = 0;
  uint64_t frameBytes_ = 0;
  std::vector<std::byte> tables_;
  std::vector<uint64_t> bufferSizes_;
  std::unique_ptr<IncomingFrame> frame_;
  size_t bufferIndex_ = 0;
  uint64_t frameAllocation_ = 0;
  uint64_t peakAllocation_ = 0;

  std::vector<std::byte> staging_;
  bool stagingLent_ = false;  // the last prepareRead() returned the staging buffer
  std::deque<IncomingFrame> ready_;
  uint64_t stagedTensorBytes_ = 0;
};

}  // namespace weft::rpc
