#include "rpc/frame.h"

#include <kj/exception.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

#include "common/error.h"

namespace weft::rpc {
namespace {

void storeLE16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void storeLE32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void storeLE64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t loadLE(const std::byte* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// Bytes of the segment table (padded to whole words) plus the buffer table.
uint64_t tablesBytes(uint64_t segments, uint64_t buffers) { return (segments * 4 + 7) / 8 * 8 + buffers * 8; }

// "107374182400 bytes (100.0 GiB)" for messages a human reads.
std::string bytesString(uint64_t n) {
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::string s = std::to_string(n) + " bytes";
  if (n < 1024) return s;
  double v = static_cast<double>(n);
  int u = -1;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, " (%.1f %s)", v, units[u]);
  return s + buf;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Update when a message kind is appended to wire::Message.
constexpr uint16_t kLastMessageKind = wire::Message::SHUTDOWN_PROCEED;

}  // namespace

// ---- OutgoingFrame / FrameWriter ---------------------------------------------------------

OutgoingFrame::~OutgoingFrame() = default;

void OutgoingFrame::appendTo(std::vector<std::byte>& out) const {
  out.reserve(out.size() + byteSize_);
  for (auto span : spans_) out.insert(out.end(), span.begin(), span.end());
}

FrameWriter::FrameWriter(unsigned firstSegmentWords)
    : message_(std::make_unique<capnp::MallocMessageBuilder>(firstSegmentWords)) {}

FrameWriter::~FrameWriter() = default;

wire::Message::Builder FrameWriter::message() {
  if (!hasRoot_) {
    hasRoot_ = true;
    return message_->initRoot<wire::Message>();
  }
  return message_->getRoot<wire::Message>();
}

uint32_t FrameWriter::addBuffer(std::shared_ptr<Storage> storage, size_t offset, size_t size) {
  if (size > 0) {
    WEFT_CHECK(storage != nullptr) << "addBuffer: a null storage for " << size << " bytes";
    WEFT_ENFORCE(storage->device().isCpu(), InvalidArgumentError, "rpc frame: cannot send bytes of a storage on ",
                 storage->device(), " as an out-of-band buffer; move the tensor to the CPU first");
    WEFT_CHECK(offset <= storage->nbytes() && size <= storage->nbytes() - offset)
        << "addBuffer: range [" << offset << ", " << offset + size << ") past a storage of " << storage->nbytes()
        << " bytes";
  }
  buffers_.push_back({std::move(storage), offset, size});
  return static_cast<uint32_t>(buffers_.size() - 1);
}

OutgoingFrame FrameWriter::finish(const FrameLimits& limits) && {
  WEFT_CHECK(hasRoot_) << "FrameWriter::finish without a message";
  auto segments = message_->getSegmentsForOutput();
  uint64_t words = 0;
  for (auto s : segments) words += s.size();
  uint64_t bufferBytes = 0;
  for (const Buffer& b : buffers_) bufferBytes += b.size;
  WEFT_ENFORCE(segments.size() <= limits.maxSegments, InvalidArgumentError, "rpc frame: the message has ",
               segments.size(), " segments, over the limit of ", limits.maxSegments);
  WEFT_ENFORCE(buffers_.size() <= limits.maxBuffers, InvalidArgumentError, "rpc frame: the message carries ",
               buffers_.size(), " tensors, over the limit of ", limits.maxBuffers, " per frame");
  uint64_t header = kPreambleBytes + tablesBytes(segments.size(), buffers_.size());
  uint64_t total = header + words * 8 + bufferBytes;
  WEFT_ENFORCE(total <= limits.maxFrameBytes, InvalidArgumentError, "rpc frame: the message is ",
               bytesString(total), " (", bytesString(bufferBytes), " of tensors), over the frame limit of ",
               bytesString(limits.maxFrameBytes));

  OutgoingFrame frame;
  frame.header_.assign(header, std::byte{0});
  std::byte* p = frame.header_.data();
  storeLE32(p, kFrameMagic);
  storeLE16(p + 4, kProtocolVersion);
  storeLE16(p + 6, 0);
  storeLE32(p + 8, static_cast<uint32_t>(segments.size()));
  storeLE32(p + 12, static_cast<uint32_t>(buffers_.size()));
  storeLE64(p + 16, words);
  storeLE64(p + 24, bufferBytes);
  p += kPreambleBytes;
  for (size_t i = 0; i < segments.size(); ++i) storeLE32(p + 4 * i, static_cast<uint32_t>(segments[i].size()));
  p += (segments.size() * 4 + 7) / 8 * 8;
  for (size_t i = 0; i < buffers_.size(); ++i) storeLE64(p + 8 * i, buffers_[i].size);

  frame.spans_.reserve(1 + segments.size() + buffers_.size());
  frame.spans_.emplace_back(frame.header_.data(), frame.header_.size());
  for (auto s : segments) frame.spans_.push_back(std::as_bytes(std::span(s.begin(), s.size())));
  frame.storages_.reserve(buffers_.size());
  for (Buffer& b : buffers_) {
    const std::byte* data = b.size ? static_cast<const std::byte*>(b.storage->data()) + b.offset : nullptr;
    frame.spans_.emplace_back(data, b.size);
    frame.storages_.push_back(std::move(b.storage));
  }
  frame.message_ = std::move(message_);
  frame.byteSize_ = total;
  buffers_.clear();
  return frame;
}

// ---- IncomingFrame ----------------------------------------------------------------------

IncomingFrame::IncomingFrame() = default;
IncomingFrame::IncomingFrame(IncomingFrame&&) noexcept = default;
IncomingFrame& IncomingFrame::operator=(IncomingFrame&&) noexcept = default;
IncomingFrame::~IncomingFrame() = default;

// ---- FrameDecoder -----------------------------------------------------------------------

void FrameDecoder::setLimits(FrameLimits limits) {
  limits.readChunkBytes = limits_.readChunkBytes;
  limits_ = limits;
}

FrameDecoder::FrameDecoder(FrameLimits limits) : limits_(limits) {
  limits_.readChunkBytes = std::max<size_t>(limits_.readChunkBytes, 1);
}

FrameDecoder::~FrameDecoder() = default;

std::span<std::byte> FrameDecoder::target() {
  switch (stage_) {
    case Stage::Preamble:
      return std::span(preamble_).subspan(stagePos_);
    case Stage::Tables:
      return std::span(tables_).subspan(stagePos_);
    case Stage::Segments: {
      auto* words = reinterpret_cast<std::byte*>(frame_->words_.get());
      return std::span(words + stagePos_, messageWords_ * 8 - stagePos_);
    }
    case Stage::Buffers: {
      const auto& storage = frame_->buffers_[bufferIndex_];
      return std::span(static_cast<std::byte*>(storage->data()) + stagePos_, storage->nbytes() - stagePos_);
    }
  }
  WEFT_CHECK(false) << "unreachable decoder stage";
  return {};
}

std::span<std::byte> FrameDecoder::prepareRead() {
  // A preamble already begun is finished with a read of exactly its rest, so the staging
  // buffer is only lent between frames.
  if (!status_.ok() || (stage_ == Stage::Preamble && stagePos_ == 0)) {
    if (staging_.size() != limits_.readChunkBytes) staging_.resize(limits_.readChunkBytes);
    stagingLent_ = true;
    return staging_;
  }
  stagingLent_ = false;
  return target();
}

Status FrameDecoder::commitRead(size_t n) {
  if (!status_.ok()) return status_;
  if (stagingLent_) {
    WEFT_CHECK(n <= staging_.size()) << "commitRead(" << n << ") after lending " << staging_.size() << " bytes";
    stagingLent_ = false;
    consume(staging_.data(), n, true);
    return status_;
  }
  auto t = target();
  WEFT_CHECK(n <= t.size()) << "commitRead(" << n << ") after lending " << t.size() << " bytes";
  stagePos_ += n;
  if (n == t.size()) completeStage();
  return status_;
}

Status FrameDecoder::feed(std::span<const std::byte> bytes) {
  if (!status_.ok()) return status_;
  stagingLent_ = false;
  consume(bytes.data(), bytes.size(), false);
  return status_;
}

void FrameDecoder::consume(const std::byte* data, size_t size, bool fromStaging) {
  while (size > 0 && status_.ok()) {
    auto t = target();
    size_t n = std::min(size, t.size());
    std::memcpy(t.data(), data, n);
    if (fromStaging && stage_ == Stage::Buffers) stagedTensorBytes_ += n;
    data += n;
    size -= n;
    stagePos_ += n;
    if (n == t.size()) completeStage();
  }
}

void FrameDecoder::completeStage() {
  switch (stage_) {
    case Stage::Preamble:
      parsePreamble();
      break;
    case Stage::Tables:
      parseTables();
      break;
    case Stage::Segments:
      checkMessage();
      if (status_.ok()) {
        bufferIndex_ = 0;
        enterBuffer();
      }
      break;
    case Stage::Buffers:
      ++bufferIndex_;
      enterBuffer();
      break;
  }
}

void FrameDecoder::parsePreamble() {
  const std::byte* p = preamble_;
  uint32_t magic = static_cast<uint32_t>(loadLE(p, 4));
  if (magic != kFrameMagic) {
    return fail("frame: bad magic " + hex32(magic) + " (expected " + hex32(kFrameMagic) +
                ", 'WEFT'): the peer is not a weft worker or the stream lost its framing");
  }
  uint16_t version = static_cast<uint16_t>(loadLE(p + 4, 2));
  if (version != kProtocolVersion) {
    return fail("frame: protocol version " + std::to_string(version) + ", but this build speaks version " +
                std::to_string(kProtocolVersion));
  }
  uint16_t flags = static_cast<uint16_t>(loadLE(p + 6, 2));
  if (flags != 0) return fail("frame: unknown flags " + hex32(flags) + " (version 1 defines none)");
  segmentCount_ = static_cast<uint32_t>(loadLE(p + 8, 4));
  bufferCount_ = static_cast<uint32_t>(loadLE(p + 12, 4));
  messageWords_ = loadLE(p + 16, 8);
  bufferBytes_ = loadLE(p + 24, 8);
  if (segmentCount_ == 0) return fail("frame: 0 segments (a message has at least one)");
  if (segmentCount_ > limits_.maxSegments) {
    return fail("frame: " + std::to_string(segmentCount_) + " segments, over the limit of " +
                std::to_string(limits_.maxSegments));
  }
  if (bufferCount_ > limits_.maxBuffers) {
    return fail("frame: " + std::to_string(bufferCount_) + " tensor buffers, over the limit of " +
                std::to_string(limits_.maxBuffers) + " per frame");
  }
  if (messageWords_ == 0) return fail("frame: empty message (0 words)");
  // Each term is checked on its own first, so the sum cannot overflow.
  uint64_t tables = tablesBytes(segmentCount_, bufferCount_);
  uint64_t max = limits_.maxFrameBytes;
  bool fits = messageWords_ <= max / 8 && bufferBytes_ <= max && tables <= max;
  uint64_t total = 0;
  if (fits) {
    fits = !__builtin_add_overflow(kPreambleBytes + tables, messageWords_ * 8, &total) &&
           !__builtin_add_overflow(total, bufferBytes_, &total) && total <= max;
  }
  if (!fits) {
    std::string claimed = messageWords_ <= UINT64_MAX / 8 && bufferBytes_ <= UINT64_MAX - messageWords_ * 8
                              ? bytesString(messageWords_ * 8 + bufferBytes_)
                              : "more than 2^64 bytes";
    return fail("frame: claims " + claimed + " (message " + std::to_string(messageWords_) + " words, tensors " +
                bytesString(bufferBytes_) + "), over the frame limit of " + bytesString(max));
  }
  frameBytes_ = total;
  tables_.assign(tables, std::byte{0});
  frameAllocation_ = 0;
  noteAllocation(tables);
  stage_ = Stage::Tables;
  stagePos_ = 0;
}

void FrameDecoder::parseTables() {
  const std::byte* p = tables_.data();
  uint64_t words = 0;
  for (uint32_t i = 0; i < segmentCount_; ++i) words += loadLE(p + 4 * i, 4);
  if (loadLE(p, 4) == 0) return fail("frame: the first segment is empty");
  if (words != messageWords_) {
    return fail("frame: the segment table adds up to " + std::to_string(words) + " words, but the preamble says " +
                std::to_string(messageWords_));
  }
  size_t segmentTable = (size_t{segmentCount_} * 4 + 7) / 8 * 8;
  for (size_t i = size_t{segmentCount_} * 4; i < segmentTable; ++i) {
    if (p[i] != std::byte{0}) return fail("frame: nonzero padding after the segment table");
  }
  p += segmentTable;
  bufferSizes_.resize(bufferCount_);
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < bufferCount_; ++i) {
    bufferSizes_[i] = loadLE(p + 8 * i, 8);
    if (__builtin_add_overflow(bytes, bufferSizes_[i], &bytes)) bytes = UINT64_MAX;
  }
  if (bytes != bufferBytes_) {
    return fail("frame: the buffer table adds up to " + (bytes == UINT64_MAX ? std::string("more than 2^64 bytes")
                                                                               : bytesString(bytes)) +
                ", but the preamble says " + bytesString(bufferBytes_));
  }

  frame_.reset(new IncomingFrame());
  try {
    frame_->words_.reset(new capnp::word[messageWords_]);
    frame_->buffers_.reserve(bufferCount_);
  } catch (const std::bad_alloc&) {
    return fail("frame: cannot allocate " + bytesString(messageWords_ * 8) + " for the message (out of memory)");
  }
  noteAllocation(messageWords_ * 8);
  frame_->segments_.reserve(segmentCount_);
  const capnp::word* w = frame_->words_.get();
  for (uint32_t i = 0; i < segmentCount_; ++i) {
    size_t n = loadLE(tables_.data() + 4 * i, 4);
    frame_->segments_.emplace_back(w, n);
    w += n;
  }
  stage_ = Stage::Segments;
  stagePos_ = 0;
}

void FrameDecoder::checkMessage() {
  capnp::ReaderOptions options;
  options.nestingLimit = static_cast<int>(std::min<uint64_t>(3 * uint64_t{limits_.maxNesting} + 8, INT32_MAX));
  options.traversalLimitInWords = 4 * messageWords_ + 8192;
  try {
    frame_->reader_ = std::make_unique<capnp::SegmentArrayMessageReader>(
        kj::arrayPtr(frame_->segments_.data(), frame_->segments_.size()), options);
    frame_->root_ = frame_->reader_->getRoot<wire::Message>();
    auto kind = static_cast<uint16_t>(frame_->root_.which());
    if (kind > kLastMessageKind) {
      return fail("frame: unknown message kind " + std::to_string(kind) + " (this build knows 0.." +
                  std::to_string(kLastMessageKind) + ")");
    }
  } catch (const kj::Exception& e) {
    return fail(std::string("frame: malformed message: ") + e.getDescription().cStr());
  }
}

void FrameDecoder::enterBuffer() {
  while (bufferIndex_ < bufferCount_) {
    uint64_t size = bufferSizes_[bufferIndex_];
    try {
      frame_->buffers_.push_back(Storage::allocate(size, Device::cpu()));
    } catch (const std::bad_alloc&) {
      return fail("frame: cannot allocate " + bytesString(size) + " for tensor buffer " +
                  std::to_string(bufferIndex_) + " (out of memory)");
    }
    noteAllocation(size);
    if (size > 0) {
      stage_ = Stage::Buffers;
      stagePos_ = 0;
      return;
    }
    ++bufferIndex_;
  }
  finishFrame();
}

void FrameDecoder::finishFrame() {
  frame_->byteSize_ = frameBytes_;
  frame_->maxNesting_ = limits_.maxNesting;
  ready_.push_back(std::move(*frame_));
  frame_.reset();
  stage_ = Stage::Preamble;
  stagePos_ = 0;
  frameAllocation_ = 0;
}

void FrameDecoder::fail(std::string message) {
  status_ = Status::protocol(std::move(message));
  // Release whatever the broken frame holds; the stream is unusable from here on.
  frame_.reset();
  tables_ = {};
  bufferSizes_ = {};
  frameAllocation_ = 0;
}

void FrameDecoder::noteAllocation(uint64_t bytes) {
  frameAllocation_ += bytes;
  peakAllocation_ = std::max(peakAllocation_, frameAllocation_);
}

uint64_t FrameDecoder::frameOffset() const {
  uint64_t tables = tablesBytes(segmentCount_, bufferCount_);
  switch (stage_) {
    case Stage::Preamble:
      return stagePos_;
    case Stage::Tables:
      return kPreambleBytes + stagePos_;
    case Stage::Segments:
      return kPreambleBytes + tables + stagePos_;
    case Stage::Buffers: {
      uint64_t done = kPreambleBytes + tables + messageWords_ * 8;
      for (size_t i = 0; i < bufferIndex_; ++i) done += bufferSizes_[i];
      return done + stagePos_;
    }
  }
  return 0;
}

std::optional<IncomingFrame> FrameDecoder::next() {
  if (ready_.empty()) return std::nullopt;
  IncomingFrame f = std::move(ready_.front());
  ready_.pop_front();
  return f;
}

Status FrameDecoder::endOfStream() const {
  if (!status_.ok()) return status_;
  if (stage_ == Stage::Preamble && stagePos_ == 0) return {};
  if (stage_ == Stage::Preamble) {
    return Status::protocol("frame: truncated: the stream ended after " + std::to_string(stagePos_) + " of the " +
                            std::to_string(kPreambleBytes) + " preamble bytes");
  }
  return Status::protocol("frame: truncated: the stream ended after " + std::to_string(frameOffset()) + " of the " +
                          bytesString(frameBytes_) + " of a frame");
}

}  // namespace weft::rpc
