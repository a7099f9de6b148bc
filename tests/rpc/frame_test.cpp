// Frames: round trips in arbitrary chunks, the no-copy property on both sides, and hostile
// bytes (each rejected with a protocol Status, within the configured limits).
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "rpc/codec.h"
#include "rpc/frame.h"
#include "weft_test.h"

using namespace weft;
using namespace weft::rpc;

namespace {

using Bytes = std::vector<std::byte>;

// A call message carrying the given tensors as arguments.
OutgoingFrame makeCallFrame(const std::vector<Tensor>& tensors, uint64_t callId = 42, const FrameLimits& limits = {}) {
  FrameWriter writer;
  auto call = writer.message().initCall();
  call.setCallId(callId);
  call.setFunctionId(nameId("consume"));
  call.setFunctionName("consume");
  call.setTimeoutMs(1500);
  EncodeContext ctx(writer);
  auto args = call.initArgs(static_cast<unsigned>(tensors.size()));
  for (size_t i = 0; i < tensors.size(); ++i) encodeValue(tensors[i], args[static_cast<unsigned>(i)], ctx);
  return std::move(writer).finish(limits);
}

Bytes flatten(const OutgoingFrame& f) {
  Bytes out;
  f.appendTo(out);
  return out;
}

// Feeds bytes in chunks whose sizes come from `nextChunk`.
template <class NextChunk>
Status feedInChunks(FrameDecoder& d, const Bytes& bytes, NextChunk nextChunk) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t n = std::min(bytes.size() - pos, nextChunk());
    Status s = d.feed(bytes.data() + pos, n);
    if (!s.ok()) return s;
    pos += n;
  }
  return d.status();
}

// Reads bytes as a socket would: into whatever prepareRead() offers, at most maxRead per read.
// Records the destinations the decoder lent.
struct SimulatedSocket {
  std::vector<std::span<std::byte>> lent;
  Status readAll(FrameDecoder& d, const Bytes& bytes, size_t maxRead) {
    size_t pos = 0;
    while (pos < bytes.size()) {
      std::span<std::byte> dst = d.prepareRead();
      REQUIRE(!dst.empty());
      size_t n = std::min({dst.size(), maxRead, bytes.size() - pos});
      std::memcpy(dst.data(), bytes.data() + pos, n);
      lent.push_back(dst.first(n));
      Status s = d.commitRead(n);
      if (!s.ok()) return s;
      pos += n;
    }
    return d.status();
  }
};

Tensor patterned(int64_t n, DType dtype = DType::Float32) {
  return arange(0, static_cast<double>(n), 1, {.dtype = dtype});
}

void checkCallFrame(const IncomingFrame& f, const std::vector<Tensor>& expected, uint64_t callId = 42) {
  auto msg = f.message();
  REQUIRE(msg.which() == wire::Message::CALL);
  auto call = msg.getCall();
  CHECK(call.getCallId() == callId);
  CHECK(call.getFunctionId() == nameId("consume"));
  CHECK(std::string(call.getFunctionName().cStr()) == "consume");
  CHECK(call.getTimeoutMs() == 1500);
  REQUIRE(call.getArgs().size() == expected.size());
  DecodeContext ctx(f);
  for (size_t i = 0; i < expected.size(); ++i) {
    Tensor t = decodeValue<Tensor>(call.getArgs()[static_cast<unsigned>(i)], ctx);
    REQUIRE(t.shape() == expected[i].shape());
    REQUIRE(t.dtype() == expected[i].dtype());
    if (t.nbytes() > 0) CHECK(std::memcmp(t.rawData(), expected[i].contiguous().rawData(), t.nbytes()) == 0);
  }
}

// A hand-made preamble, for lying to the decoder.
Bytes preamble(uint32_t magic, uint16_t version, uint16_t flags, uint32_t segments, uint32_t buffers, uint64_t words,
               uint64_t bufferBytes) {
  Bytes b(kPreambleBytes);
  auto put = [&](size_t off, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b[off + i] = static_cast<std::byte>(v >> (8 * i));
  };
  put(0, magic, 4);
  put(4, version, 2);
  put(6, flags, 2);
  put(8, segments, 4);
  put(12, buffers, 4);
  put(16, words, 8);
  put(24, bufferBytes, 8);
  return b;
}

void putLE(Bytes& b, size_t off, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b[off + i] = static_cast<std::byte>(v >> (8 * i));
}

// A fresh decoder that was fed `bytes` in one piece.
std::unique_ptr<FrameDecoder> decodeAll(const Bytes& bytes, const FrameLimits& limits) {
  auto d = std::make_unique<FrameDecoder>(limits);
  (void)d->feed(bytes.data(), bytes.size());
  return d;
}

}  // namespace

TEST_CASE("a frame round-trips whatever the chunk sizes of its bytes") {
  std::vector<Tensor> tensors = {patterned(0), patterned(256), patterned(777, DType::Float64),
                                 patterned(5, DType::Int64)};
  Bytes bytes = flatten(makeCallFrame(tensors));
  std::mt19937 rng(7);
  std::vector<std::pair<const char*, std::function<size_t()>>> schedules = {
      {"1 byte", [] { return size_t{1}; }},
      {"3 bytes", [] { return size_t{3}; }},
      {"31 bytes", [] { return size_t{31}; }},
      {"random", [&] { return size_t{1} + rng() % 200; }},
      {"whole", [&] { return bytes.size(); }},
  };
  for (auto& [name, chunk] : schedules) {
    INFO("chunks: " << name);
    FrameDecoder d;
    REQUIRE(feedInChunks(d, bytes, chunk).ok());
    auto f = d.next();
    REQUIRE(f.has_value());
    CHECK(f->byteSize() == bytes.size());
    checkCallFrame(*f, tensors);
    CHECK_FALSE(d.next().has_value());
    CHECK(d.endOfStream().ok());
  }
}

TEST_CASE("frames read through prepareRead arrive intact for any read size") {
  std::vector<Tensor> tensors = {patterned(1000), patterned(0), patterned(3, DType::Int64)};
  Bytes one = flatten(makeCallFrame(tensors, 1));
  Bytes two = flatten(makeCallFrame(tensors, 2));
  Bytes both = one;
  both.insert(both.end(), two.begin(), two.end());
  for (size_t maxRead : {size_t{1}, size_t{5}, size_t{64}, size_t{1000}, both.size()}) {
    INFO("max read " << maxRead);
    FrameDecoder d(FrameLimits{.readChunkBytes = 128});
    SimulatedSocket sock;
    REQUIRE(sock.readAll(d, both, maxRead).ok());
    auto f1 = d.next();
    auto f2 = d.next();
    REQUIRE(f1.has_value());
    REQUIRE(f2.has_value());
    checkCallFrame(*f1, tensors, 1);
    checkCallFrame(*f2, tensors, 2);
    CHECK(d.endOfStream().ok());
  }
}

TEST_CASE("several small frames in one chunk all come out, in order") {
  Bytes stream;
  for (uint64_t id = 1; id <= 50; ++id) {
    FrameWriter w;
    w.message().initCancel().setCallId(id);
    std::move(w).finish().appendTo(stream);
  }
  FrameDecoder d;
  REQUIRE(d.feed(stream.data(), stream.size()).ok());
  for (uint64_t id = 1; id <= 50; ++id) {
    auto f = d.next();
    REQUIRE(f.has_value());
    REQUIRE(f->message().which() == wire::Message::CANCEL);
    CHECK(f->message().getCancel().getCallId() == id);
  }
  CHECK_FALSE(d.next().has_value());
}

TEST_CASE("the encoded frame points straight into the tensor's storage") {
  Tensor big = patterned(1 << 16);
  Tensor narrowed = patterned(100).narrow(0, 10, 50);  // contiguous, at an offset in its storage
  OutgoingFrame f = makeCallFrame({big, narrowed});
  auto spans = f.spans();
  REQUIRE(spans.size() >= 3);
  auto tensorSpan0 = spans[spans.size() - 2];
  auto tensorSpan1 = spans[spans.size() - 1];
  CHECK(static_cast<const void*>(tensorSpan0.data()) == big.rawData());
  CHECK(tensorSpan0.size() == big.nbytes());
  CHECK(static_cast<const void*>(tensorSpan1.data()) == narrowed.rawData());
  CHECK(tensorSpan1.size() == narrowed.nbytes());
  uint64_t total = 0;
  for (auto s : spans) total += s.size();
  CHECK(total == f.byteSize());
  // The frame keeps the storage alive after the tensor handle is gone.
  std::weak_ptr<Storage> storage = big.storage();
  big = Tensor();
  CHECK_FALSE(storage.expired());
  { OutgoingFrame gone = std::move(f); }
  CHECK(storage.expired());
}

TEST_CASE("a 64 MiB tensor is read by the socket straight into the decoded tensor's storage") {
  Tensor t = patterned(int64_t{16} << 20);  // 64 MiB of float32
  Bytes bytes = flatten(makeCallFrame({t}));
  FrameLimits limits;
  FrameDecoder d(limits);
  SimulatedSocket sock;
  REQUIRE(sock.readAll(d, bytes, size_t{1} << 20).ok());
  auto f = d.next();
  REQUIRE(f.has_value());
  REQUIRE(f->buffers().size() == 1);
  const std::shared_ptr<Storage>& storage = f->buffers()[0];
  DecodeContext ctx(*f);
  Tensor got = decodeValue<Tensor>(f->message().getCall().getArgs()[0], ctx);
  CHECK(got.storage() == storage);
  CHECK(std::memcmp(got.rawData(), t.rawData(), t.nbytes()) == 0);
  // Every byte of the tensor beyond what came in the preamble's read landed in place.
  auto* begin = static_cast<std::byte*>(storage->data());
  auto* end = begin + storage->nbytes();
  uint64_t inPlace = 0;
  for (auto span : sock.lent) {
    if (span.data() >= begin && span.data() < end) inPlace += span.size();
  }
  CHECK(d.stagedTensorBytes() <= limits.readChunkBytes);
  CHECK(inPlace + d.stagedTensorBytes() == t.nbytes());
  CHECK(d.peakFrameAllocation() <= bytes.size());
}

TEST_CASE("with a preamble-sized staging buffer no tensor byte is ever staged") {
  Tensor t = patterned(int64_t{1} << 16);  // 256 KiB
  Bytes two = flatten(makeCallFrame({t}, 1));
  Bytes second = flatten(makeCallFrame({t}, 2));
  two.insert(two.end(), second.begin(), second.end());
  for (size_t maxRead : {size_t{1}, size_t{7}, size_t{64} << 10}) {
    INFO("max read " << maxRead);
    FrameDecoder d(FrameLimits{.readChunkBytes = kPreambleBytes});
    SimulatedSocket sock;
    REQUIRE(sock.readAll(d, two, maxRead).ok());
    CHECK(d.stagedTensorBytes() == 0);
    auto f1 = d.next();
    auto f2 = d.next();
    REQUIRE(f1.has_value());
    REQUIRE(f2.has_value());
    checkCallFrame(*f2, {t}, 2);
  }
}

TEST_CASE("a frame written with writev to a socket is decoded from read() into its storages") {
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  Tensor a = patterned(int64_t{4} << 20);
  Tensor b = patterned(12345, DType::Int64);
  OutgoingFrame frame = makeCallFrame({a, b, a});  // a twice: sent once
  CHECK(frame.bufferCount() == 2);
  std::thread writer([&] {
    std::vector<iovec> iov;
    for (auto s : frame.spans()) iov.push_back({const_cast<std::byte*>(s.data()), s.size()});
    size_t first = 0;
    while (first < iov.size()) {
      ssize_t n = writev(fds[0], iov.data() + first, static_cast<int>(iov.size() - first));
      if (n <= 0) break;
      auto left = static_cast<size_t>(n);
      while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
      if (first < iov.size()) {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
      }
    }
    close(fds[0]);
  });
  FrameDecoder d;
  for (;;) {
    auto dst = d.prepareRead();
    ssize_t n = read(fds[1], dst.data(), dst.size());
    REQUIRE(n >= 0);
    if (n == 0) break;
    REQUIRE(d.commitRead(static_cast<size_t>(n)).ok());
  }
  writer.join();
  close(fds[1]);
  CHECK(d.endOfStream().ok());
  auto f = d.next();
  REQUIRE(f.has_value());
  DecodeContext ctx(*f);
  auto args = f->message().getCall().getArgs();
  Tensor ga = decodeValue<Tensor>(args[0], ctx);
  Tensor gb = decodeValue<Tensor>(args[1], ctx);
  Tensor ga2 = decodeValue<Tensor>(args[2], ctx);
  CHECK(std::memcmp(ga.rawData(), a.rawData(), a.nbytes()) == 0);
  CHECK(std::memcmp(gb.rawData(), b.rawData(), b.nbytes()) == 0);
  CHECK(ga2.storage() == ga.storage());
  CHECK(d.stagedTensorBytes() <= FrameLimits{}.readChunkBytes);
}

TEST_CASE("a frame over the writer's limits is refused at the sender") {
  FrameLimits limits{.maxFrameBytes = 4096};
  CHECK_THROWS_AS(makeCallFrame({patterned(2000)}, 1, limits), InvalidArgumentError);
  CHECK_NOTHROW(makeCallFrame({patterned(100)}, 1, limits));
  FrameLimits fewTensors{.maxBuffers = 2};
  CHECK_THROWS_WITH_AS(makeCallFrame({patterned(1), patterned(2), patterned(3)}, 1, fewTensors),
                       doctest::Contains("3 tensors, over the limit of 2"), InvalidArgumentError);
}

TEST_CASE("a frame exactly at the decoder's limit is accepted and one byte more is not") {
  Bytes bytes = flatten(makeCallFrame({patterned(300)}));
  auto d = decodeAll(bytes, FrameLimits{.maxFrameBytes = bytes.size()});
  CHECK(d->status().ok());
  CHECK(d->next().has_value());
  d = decodeAll(bytes, FrameLimits{.maxFrameBytes = bytes.size() - 1});
  Status s = d->status();
  CHECK(s.code() == StatusCode::Protocol);
  CHECK(s.message().find("over the frame limit") != std::string::npos);
  CHECK(d->peakFrameAllocation() == 0);
}

// ---- hostile bytes -----------------------------------------------------------------------------

TEST_CASE("hostile preambles are rejected before anything is allocated") {
  const FrameLimits limits{.maxFrameBytes = 1 << 20, .maxSegments = 8, .maxBuffers = 4};
  struct Case {
    const char* what;
    Bytes bytes;
    const char* message;
  };
  std::vector<Case> cases = {
      {"garbage", Bytes(64, std::byte{0x5a}), "bad magic 0x5a5a5a5a"},
      {"an HTTP request", [] {
         std::string s = "GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: curl\r\n\r\n";
         Bytes b(s.size());
         std::memcpy(b.data(), s.data(), s.size());
         return b;
       }(),
       "bad magic"},
      {"a wrong version", preamble(kFrameMagic, 2, 0, 1, 0, 4, 0), "protocol version 2, but this build speaks version 1"},
      {"unknown flags", preamble(kFrameMagic, kProtocolVersion, 4, 1, 0, 4, 0), "unknown flags"},
      {"no segment", preamble(kFrameMagic, kProtocolVersion, 0, 0, 0, 4, 0), "0 segments"},
      {"too many segments", preamble(kFrameMagic, kProtocolVersion, 0, 9, 0, 9, 0), "9 segments, over the limit of 8"},
      {"too many tensors", preamble(kFrameMagic, kProtocolVersion, 0, 1, 5, 4, 0), "5 tensor buffers, over the limit of 4"},
      {"an empty message", preamble(kFrameMagic, kProtocolVersion, 0, 1, 0, 0, 0), "empty message"},
      {"100 GiB of tensors", preamble(kFrameMagic, kProtocolVersion, 0, 1, 1, 4, uint64_t{100} << 30),
       "claims 107374182432 bytes (100.0 GiB)"},
      {"2^61 message words", preamble(kFrameMagic, kProtocolVersion, 0, 1, 0, uint64_t{1} << 61, 0), "over the frame limit"},
      {"sizes that overflow", preamble(kFrameMagic, kProtocolVersion, 0, 1, 1, UINT64_MAX / 8, UINT64_MAX), "more than 2^64"},
      {"just over the limit", preamble(kFrameMagic, kProtocolVersion, 0, 1, 1, 4, (1 << 20) - 32 - 16 - 32 + 1),
       "over the frame limit of 1048576 bytes (1.0 MiB)"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto d = decodeAll(c.bytes, limits);
    Status s = d->status();
    CHECK(s.code() == StatusCode::Protocol);
    CHECK_MESSAGE(s.message().find(c.message) != std::string::npos, s.message());
    CHECK(d->peakFrameAllocation() == 0);
    CHECK_FALSE(d->next().has_value());
    // The error is sticky.
    CHECK(d->feed(c.bytes.data(), 1).code() == StatusCode::Protocol);
    CHECK(d->commitRead(0).code() == StatusCode::Protocol);
    CHECK(d->endOfStream().code() == StatusCode::Protocol);
  }
}

TEST_CASE("tables that contradict the preamble are rejected before the message is allocated") {
  const FrameLimits limits{.maxFrameBytes = 1 << 20};
  Bytes good = flatten(makeCallFrame({patterned(10)}));
  // Layout: preamble, segment table (1 segment, padded to 8 bytes), buffer table (1 entry).
  SUBCASE("segment table sums to more than the preamble says") {
    Bytes b = good;
    putLE(b, 32, 1000, 4);
    auto d = decodeAll(b, limits);
    Status s = d->status();
    CHECK(s.message().find("segment table adds up to 1000 words") != std::string::npos);
    CHECK(d->peakFrameAllocation() <= 16);
  }
  SUBCASE("an empty first segment") {
    Bytes b = good;
    putLE(b, 32, 0, 4);
    CHECK(decodeAll(b, limits)->status().message().find("first segment is empty") != std::string::npos);
  }
  SUBCASE("nonzero padding") {
    Bytes b = good;
    putLE(b, 36, 7, 4);
    CHECK(decodeAll(b, limits)->status().message().find("nonzero padding") != std::string::npos);
  }
  SUBCASE("buffer table sums to less than the preamble says") {
    Bytes b = good;
    putLE(b, 40, 8, 8);
    auto d = decodeAll(b, limits);
    Status s = d->status();
    CHECK(s.message().find("buffer table adds up to 8 bytes, but the preamble says 40 bytes") != std::string::npos);
    CHECK(d->peakFrameAllocation() <= 16);
  }
  SUBCASE("buffer table entries that overflow") {
    Bytes b = preamble(kFrameMagic, kProtocolVersion, 0, 1, 2, 4, 40);
    b.resize(b.size() + 8 + 16);
    putLE(b, 32, 4, 4);
    putLE(b, 40, UINT64_MAX, 8);
    putLE(b, 48, 41, 8);
    CHECK(decodeAll(b, limits)->status().message().find("more than 2^64 bytes") != std::string::npos);
  }
}

TEST_CASE("a message whose root does not parse is rejected before its tensors are allocated") {
  Bytes good = flatten(makeCallFrame({patterned(1000)}));
  Bytes b = good;
  // The root pointer is the first word of the first segment (after 32 + 8 + 8 header bytes):
  // point it far outside the segment.
  putLE(b, 48, 0x00000001'7ffffff0ull, 8);
  auto d = decodeAll(b, {});
  Status s = d->status();
  CHECK(s.code() == StatusCode::Protocol);
  CHECK_MESSAGE(s.message().find("malformed message") != std::string::npos, s.message());
  CHECK(d->peakFrameAllocation() < 4000);  // the 4000-byte tensor buffer was never allocated
}

TEST_CASE("a message kind from a newer protocol is rejected") {
  FrameWriter w;
  w.message().initPing().setSequence(1);
  Bytes b = flatten(std::move(w).finish());
  // The union discriminant of Message sits in its data section, the word after the root pointer
  // (the segment starts after the 32-byte preamble and the 8-byte segment table).
  putLE(b, 40 + 8, 200, 2);
  Status s = decodeAll(b, {})->status();
  CHECK_MESSAGE(s.message().find("unknown message kind 200") != std::string::npos, s.message());
}

TEST_CASE("a stream that ends inside a frame reports a truncated frame") {
  Bytes bytes = flatten(makeCallFrame({patterned(100)}));
  for (size_t cut : {size_t{0}, size_t{10}, size_t{40}, bytes.size() / 2, bytes.size() - 1, bytes.size()}) {
    INFO("cut at " << cut);
    FrameDecoder d;
    REQUIRE(d.feed(bytes.data(), cut).ok());
    Status s = d.endOfStream();
    if (cut == 0 || cut == bytes.size()) {
      CHECK(s.ok());
    } else {
      CHECK(s.code() == StatusCode::Protocol);
      CHECK(s.message().find("truncated") != std::string::npos);
      CHECK(s.message().find("after " + std::to_string(cut) + " of the") != std::string::npos);
    }
  }
}

TEST_CASE("frames decoded before an error are still delivered") {
  Bytes stream = flatten(makeCallFrame({patterned(4)}, 1));
  Bytes garbage(40, std::byte{0xff});
  stream.insert(stream.end(), garbage.begin(), garbage.end());
  FrameDecoder d;
  CHECK(d.feed(stream.data(), stream.size()).code() == StatusCode::Protocol);
  auto f = d.next();
  REQUIRE(f.has_value());
  CHECK(f->message().getCall().getCallId() == 1);
}

TEST_CASE("randomly corrupted frames never crash the decoder or the value decoding") {
  Bytes good = [] {
    FrameWriter w;
    auto call = w.message().initCall();
    call.setCallId(9);
    EncodeContext ctx(w);
    std::map<std::string, std::vector<int64_t>> m = {{"a", {1, 2, 3}}, {"bb", {}}};
    std::optional<std::tuple<double, std::string>> o = std::make_tuple(2.5, std::string("x"));
    encodeArguments(ctx, call.initArgs(3), patterned(33), m, o);
    return flatten(std::move(w).finish());
  }();
  std::mt19937_64 rng(12345);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    Bytes b = good;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] = static_cast<std::byte>(rng());
    FrameDecoder d(FrameLimits{.maxFrameBytes = 1 << 16});
    Status s = d.feed(b.data(), b.size());
    if (!s.ok()) {
      CHECK(s.code() == StatusCode::Protocol);
      ++rejected;
      continue;
    }
    while (auto f = d.next()) {
      if (f->message().which() != wire::Message::CALL) continue;
      Status read = guardRead([&] {
        DecodeContext ctx(*f);
        decodeArguments<Tensor, std::map<std::string, std::vector<int64_t>>,
                        std::optional<std::tuple<double, std::string>>>("corrupt", f->message().getCall().getArgs(),
                                                                        ctx);
      });
      if (read.ok()) {
        ++accepted;
      } else {
        CHECK(read.code() == StatusCode::Protocol);
        bool named = read.message().rfind("corrupt: ", 0) == 0 || read.message().rfind("malformed message: ", 0) == 0;
        CHECK_MESSAGE(named, read.message());
        ++rejected;
      }
    }
  }
  MESSAGE("corrupted frames accepted: " << accepted << ", rejected: " << rejected);
  CHECK(rejected > 0);
}

// ---- benchmark -------------------------------------------------------------------------------

TEST_CASE("encode and decode a frame carrying a 64 MiB tensor" * doctest::test_suite("benchmark") * doctest::skip()) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  const size_t n = size_t{64} << 20;
  Tensor t = patterned(static_cast<int64_t>(n / 4));
  Bytes wire = flatten(makeCallFrame({t}));
  Bytes copyDst(n);
  const int reps = 10;
  double encode = 1e9, decodeFeed = 1e9, decodeRead = 1e9, memcpyTime = 1e9, memcpyFresh = 1e9;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    OutgoingFrame f = makeCallFrame({t});
    encode = std::min(encode, seconds(Clock::now() - t0));
    REQUIRE(static_cast<const void*>(f.spans().back().data()) == t.rawData());

    t0 = Clock::now();
    std::memcpy(copyDst.data(), wire.data() + (wire.size() - n), n);
    memcpyTime = std::min(memcpyTime, seconds(Clock::now() - t0));

    // The same copy into memory allocated for it, as a receiver must: page faults included.
    t0 = Clock::now();
    {
      auto fresh = Storage::allocate(n, Device::cpu());
      std::memcpy(fresh->data(), wire.data() + (wire.size() - n), n);
    }
    memcpyFresh = std::min(memcpyFresh, seconds(Clock::now() - t0));

    t0 = Clock::now();
    {
      FrameDecoder d;
      REQUIRE(feedInChunks(d, wire, [] { return size_t{1} << 20; }).ok());
      auto frame = d.next();
      REQUIRE(frame.has_value());
      DecodeContext ctx(*frame);
      Tensor got = decodeValue<Tensor>(frame->message().getCall().getArgs()[0], ctx);
      REQUIRE(got.nbytes() == n);
    }
    decodeFeed = std::min(decodeFeed, seconds(Clock::now() - t0));

    t0 = Clock::now();
    {
      FrameDecoder d;
      SimulatedSocket sock;
      REQUIRE(sock.readAll(d, wire, size_t{1} << 20).ok());
      REQUIRE(d.next().has_value());
    }
    decodeRead = std::min(decodeRead, seconds(Clock::now() - t0));
  }
  // Small calls: encode, frame, decode and decode the arguments, as one call's request costs.
  const int calls = 200000;
  Bytes small;
  auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) {
    FrameWriter w;
    auto call = w.message().initCall();
    call.setCallId(static_cast<uint64_t>(i) + 1);
    call.setFunctionId(nameId("add"));
    call.setFunctionName("add");
    EncodeContext ectx(w);
    encodeArguments(ectx, call.initArgs(3), int64_t{i}, 2.5, std::string("eight by"));
    OutgoingFrame f = std::move(w).finish();
    small.clear();
    f.appendTo(small);
  }
  double encodeSmall = seconds(Clock::now() - t0) / calls;
  Bytes stream;
  for (int i = 0; i < 1000; ++i) stream.insert(stream.end(), small.begin(), small.end());
  FrameDecoder sd;
  int64_t sum = 0;
  t0 = Clock::now();
  for (int rep = 0; rep < calls / 1000; ++rep) {
    REQUIRE(feedInChunks(sd, stream, [] { return size_t{64} << 10; }).ok());
    while (auto f = sd.next()) {
      DecodeContext dctx(*f);
      auto [a, b, c] = decodeArguments<int64_t, double, std::string>("add", f->message().getCall().getArgs(), dctx);
      sum += a + static_cast<int64_t>(b) + static_cast<int64_t>(c.size());
    }
  }
  double decodeSmall = seconds(Clock::now() - t0) / calls;
  CHECK(sum > 0);
  MESSAGE("small call frame (" << small.size() << " bytes, 3 scalar arguments): encode " << encodeSmall * 1e9
          << " ns, decode " << decodeSmall * 1e9 << " ns per frame");

  double gb = static_cast<double>(n) / 1e9;
  MESSAGE("64 MiB tensor frame (best of " << reps << "): encode " << encode * 1e6 << " us (no byte copied); "
          << "decode via feed() in 1 MiB chunks " << gb / decodeFeed << " GB/s; decode via prepareRead() in 1 MiB "
          << "reads (the memcpy stands in for read()) " << gb / decodeRead << " GB/s; memcpy of the same bytes into "
          << "freshly allocated memory " << gb / memcpyFresh << " GB/s, into reused memory " << gb / memcpyTime
          << " GB/s; decode/fresh-memcpy ratio " << memcpyFresh / decodeFeed);
}
