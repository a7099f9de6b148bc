#include "rpc/store_protocol.h"

#include <algorithm>
#include <cstdio>

namespace weft::rpc::store {
namespace {

constexpr size_t kReadChunk = 64 * 1024;

template <class T>
void appendLittleEndian(std::string& buf, T v) {
  char bytes[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) bytes[i] = static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
  buf.append(bytes, sizeof(T));
}

template <class T>
T loadLittleEndian(const char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return static_cast<T>(v);
}

}  // namespace

std::string opName(uint8_t op) {
  switch (static_cast<Op>(op)) {
    case Op::Hello: return "hello";
    case Op::Set: return "set";
    case Op::Get: return "get";
    case Op::Wait: return "wait";
    case Op::Check: return "check";
    case Op::Add: return "add";
    case Op::CompareSet: return "compareSet";
    case Op::Delete: return "deleteKey";
    case Op::NumKeys: return "numKeys";
  }
  return "op " + std::to_string(op);
}

uint64_t Limits::maxRequestBody() const {
  uint64_t str = 4;
  uint64_t key = str + maxKeyBytes;
  uint64_t value = str + maxValueBytes;
  uint64_t hello = 4 + 2 + str + maxTokenBytes + 8;
  uint64_t compareSet = key + 2 * value + 8;
  uint64_t wait = 4 + static_cast<uint64_t>(maxKeysPerRequest) * key + 8;
  return kBodyHeaderBytes + std::max({hello, compareSet, wait});
}

uint64_t Limits::maxReplyBody() const {
  return kBodyHeaderBytes + 4 + std::max<uint64_t>(maxValueBytes, kMaxMessageBytes);
}

// ---- FrameWriter ------------------------------------------------------------------

FrameWriter::FrameWriter(uint64_t requestId, uint8_t opOrStatus) {
  buf_.resize(kLengthBytes);
  u64(requestId);
  u8(opOrStatus);
}

FrameWriter& FrameWriter::u8(uint8_t v) {
  buf_.push_back(static_cast<char>(v));
  return *this;
}
FrameWriter& FrameWriter::u16(uint16_t v) {
  appendLittleEndian(buf_, v);
  return *this;
}
FrameWriter& FrameWriter::u32(uint32_t v) {
  appendLittleEndian(buf_, v);
  return *this;
}
FrameWriter& FrameWriter::u64(uint64_t v) {
  appendLittleEndian(buf_, v);
  return *this;
}
FrameWriter& FrameWriter::str(std::string_view s) {
  WEFT_CHECK(s.size() <= UINT32_MAX) << "store frame string of " << s.size() << " bytes";
  u32(static_cast<uint32_t>(s.size()));
  buf_.append(s.data(), s.size());
  return *this;
}
FrameWriter& FrameWriter::keys(const std::vector<std::string>& ks) {
  u32(static_cast<uint32_t>(ks.size()));
  for (const std::string& k : ks) str(k);
  return *this;
}

std::string FrameWriter::finish() {
  uint64_t body = buf_.size() - kLengthBytes;
  WEFT_CHECK(body <= UINT32_MAX) << "store frame body of " << body << " bytes";
  std::string prefix;
  appendLittleEndian(prefix, static_cast<uint32_t>(body));
  std::memcpy(buf_.data(), prefix.data(), kLengthBytes);
  return std::move(buf_);
}

void patchTrailingU64(std::string& frame, uint64_t v) {
  WEFT_CHECK(frame.size() >= kLengthBytes + kBodyHeaderBytes + 8) << "store frame of " << frame.size()
                                                                  << " bytes has no trailing u64";
  for (size_t i = 0; i < 8; ++i) frame[frame.size() - 8 + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// ---- BodyReader --------------------------------------------------------------------

void BodyReader::need(size_t n, const char* field) {
  WEFT_ENFORCE(remaining() >= n, ProtocolError, "store: truncated message: ", field, " needs ", n, " bytes, ",
               remaining(), " left");
}

uint8_t BodyReader::u8(const char* field) {
  need(1, field);
  return static_cast<uint8_t>(*p_++);
}
uint16_t BodyReader::u16(const char* field) {
  need(2, field);
  uint16_t v = loadLittleEndian<uint16_t>(p_);
  p_ += 2;
  return v;
}
uint32_t BodyReader::u32(const char* field) {
  need(4, field);
  uint32_t v = loadLittleEndian<uint32_t>(p_);
  p_ += 4;
  return v;
}
uint64_t BodyReader::u64(const char* field) {
  need(8, field);
  uint64_t v = loadLittleEndian<uint64_t>(p_);
  p_ += 8;
  return v;
}

std::string_view BodyReader::str(const char* field, uint32_t maxBytes) {
  uint32_t n = u32(field);
  WEFT_ENFORCE(n <= maxBytes, ProtocolError, "store: ", field, " of ", n, " bytes exceeds the limit of ", maxBytes);
  need(n, field);
  std::string_view s(p_, n);
  p_ += n;
  return s;
}

std::vector<std::string> BodyReader::keys(uint32_t maxCount, uint32_t maxKeyBytes) {
  uint32_t count = u32("key count");
  WEFT_ENFORCE(count <= maxCount, ProtocolError, "store: ", count, " keys in one request exceed the limit of ",
               maxCount);
  // Each key takes at least its 4-byte length: a count the bytes cannot hold
  // is refused before the vector is sized for it.
  WEFT_ENFORCE(static_cast<uint64_t>(count) * 4 <= remaining(), ProtocolError, "store: truncated message: ", count,
               " keys announced, ", remaining(), " bytes left");
  std::vector<std::string> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) out.emplace_back(str("key", maxKeyBytes));
  return out;
}

void BodyReader::expectEnd(const char* what) {
  WEFT_ENFORCE(remaining() == 0, ProtocolError, "store: ", remaining(), " unexpected bytes after the ", what,
               " message");
}

// ---- FrameBuffer -------------------------------------------------------------------

char* FrameBuffer::readSpace(size_t* size) {
  size_t buffered = end_ - start_;
  if (data_.size() - end_ < kReadChunk) {
    if (start_ > 0) compact();
    size_t want = end_ + kReadChunk;
    if (want > data_.size()) {
      // Geometric growth bounded by what has actually arrived.
      size_t grown = std::min(std::max(want, data_.size() * 2), 2 * buffered + kReadChunk);
      data_.resize(std::max(want, grown));
    }
  }
  *size = data_.size() - end_;
  return data_.data() + end_;
}

bool FrameBuffer::next(std::string_view* body) {
  if (end_ - start_ < kLengthBytes) return false;
  uint32_t length = loadLittleEndian<uint32_t>(data_.data() + start_);
  WEFT_ENFORCE(length >= kBodyHeaderBytes && length <= maxBody_, ProtocolError, "store: a frame announces ", length,
               " bytes; valid frames hold ", kBodyHeaderBytes, " to ", maxBody_);
  if (end_ - start_ < kLengthBytes + length) return false;
  *body = std::string_view(data_.data() + start_ + kLengthBytes, length);
  start_ += kLengthBytes + length;
  return true;
}

void FrameBuffer::compact() {
  if (start_ == end_) {
    start_ = end_ = 0;
    // A large frame has been handled: give its memory back.
    if (data_.size() > 4 * kReadChunk) {
      data_.clear();
      data_.shrink_to_fit();
    }
    return;
  }
  if (start_ == 0) return;
  std::memmove(data_.data(), data_.data() + start_, end_ - start_);
  end_ -= start_;
  start_ = 0;
}

// ---- messages ----------------------------------------------------------------------

std::string describeKey(std::string_view key) {
  constexpr size_t kShown = 64;
  std::string out = "'";
  for (size_t i = 0; i < key.size() && i < kShown; ++i) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    }
  }
  if (key.size() > kShown) out += "...(" + std::to_string(key.size()) + " bytes)";
  return out + "'";
}

std::string describeKeys(const std::vector<std::string>& keys) {
  constexpr size_t kListed = 8;
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kListed; ++i) out += (i ? ", " : "") + describeKey(keys[i]);
  if (keys.size() > kListed) out += " and " + std::to_string(keys.size() - kListed) + " more";
  return out;
}

std::string describeDuration(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

}  // namespace weft::rpc::store
