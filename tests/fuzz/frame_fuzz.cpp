// libFuzzer target for everything that reads bytes from a peer: FrameDecoder (both the copying
// feed() path and the prepareRead()/commitRead() path, in chunk sizes the input chooses), the
// envelope of every message kind, and the codec decoding call arguments and results as a set of
// declared signatures.
//
// Input layout: byte 0 picks the chunking, the rest is the byte stream. Anything the decoder or
// the codec does other than return a protocol Status / throw ProtocolError (a crash, an abort,
// another exception type, a sanitizer report, an allocation past the limits) is a finding.
//
// Built with clang++ -fsanitize=fuzzer,address,undefined by tests/fuzz/CMakeLists.txt.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "fuzz_types.h"
#include "rpc/codec.h"
#include "rpc/frame.h"

namespace {

using namespace weft;
using namespace weft::rpc;


[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "frame_fuzz: %s\n", what);
  std::abort();
}

void checkStatus(const Status& s) {
  if (!s.ok() && s.code() != StatusCode::Protocol) finding("a decoder status other than ok or protocol");
}

// Reads every field of the envelope, as the agent will.
void readEnvelope(wire::Message::Reader m) {
  size_t sink = 0;
  switch (m.which()) {
    case wire::Message::HELLO: {
      auto h = m.getHello();
      sink += h.getWorkerName().size() + h.getAuthToken().size() + h.getRank() + h.getWorldSize();
      sink += h.getProtocolVersion() + h.getIncarnation();
      break;
    }
    case wire::Message::WELCOME: {
      auto w = m.getWelcome();
      sink += w.getWorkerName().size() + w.getRank() + w.getWorldSize() + w.getIncarnation();
      break;
    }
    case wire::Message::ABORT: {
      auto e = m.getAbort();
      sink += e.getMessage().size() + e.getWorker().size() + e.getFunction().size();
      if (statusCodeFromWire(static_cast<uint32_t>(e.getCode()))) ++sink;
      break;
    }
    case wire::Message::CALL: {
      auto c = m.getCall();
      sink += c.getCallId() + c.getFunctionId() + c.getFunctionName().size() + c.getTimeoutMs() + c.getFlags();
      if (c.hasAutograd()) {
        sink += static_cast<uint64_t>(c.getAutograd().getContextId());
        sink += static_cast<uint64_t>(c.getAutograd().getMessageId());
      }
      break;
    }
    case wire::Message::RESPONSE: {
      auto r = m.getResponse();
      sink += r.getCallId();
      if (r.which() == wire::Response::ERROR) sink += r.getError().getMessage().size();
      break;
    }
    case wire::Message::CANCEL:
      sink += m.getCancel().getCallId();
      break;
    case wire::Message::PING:
      sink += m.getPing().getSequence();
      break;
    case wire::Message::PONG:
      sink += m.getPong().getSequence();
      break;
    case wire::Message::SHUTDOWN_JOIN:
      sink += m.getShutdownJoin().getRound();
      break;
    case wire::Message::SHUTDOWN_PROCEED:
      for (auto name : m.getShutdownProceed().getMissing()) sink += name.size();
      break;
  }
  static volatile size_t keep;
  keep = sink;
}

template <class... Args>
void decodeCall(const IncomingFrame& f, capnp::List<wire::Value>::Reader args) {
  Status s = guardRead([&] {
    DecodeContext ctx(f, fuzz::kLimits.maxNesting);
    auto values = decodeArguments<Args...>("fuzzed", args, ctx);
    // Touch what was decoded: tensors must be readable over their whole byte length.
    std::apply(
        [](const auto&... v) {
          auto touch = [](const auto& x) {
            if constexpr (std::is_same_v<std::decay_t<decltype(x)>, Tensor>) {
              if (x.defined() && x.nbytes() > 0) {
                volatile auto first = static_cast<const unsigned char*>(x.rawData())[0];
                volatile auto last = static_cast<const unsigned char*>(x.rawData())[x.nbytes() - 1];
                (void)first;
                (void)last;
              }
            }
          };
          (touch(v), ...);
        },
        values);
  });
  checkStatus(s);
}

void handle(const IncomingFrame& f) {
  Status s = guardRead([&] { readEnvelope(f.message()); });
  checkStatus(s);
  if (!s.ok()) return;
  auto m = f.message();
  if (m.which() == wire::Message::CALL) {
    capnp::List<wire::Value>::Reader args;
    checkStatus(guardRead([&] { args = m.getCall().getArgs(); }));
    decodeCall<Tensor, Tensor>(f, args);
    decodeCall<std::vector<Tensor>, std::map<std::string, std::vector<int64_t>>>(f, args);
    decodeCall<std::optional<std::tuple<double, std::string, bool>>, std::vector<uint8_t>>(f, args);
    decodeCall<std::vector<fuzz::Point>, std::unordered_map<int64_t, std::optional<float>>>(f, args);
    decodeCall<fuzz::Node>(f, args);
    decodeCall<std::pair<int8_t, uint16_t>, std::vector<std::vector<bool>>, std::string>(f, args);
  } else if (m.which() == wire::Message::RESPONSE) {
    wire::Value::Reader value;
    bool hasValue = false;
    checkStatus(guardRead([&] {
      auto r = m.getResponse();
      hasValue = r.which() == wire::Response::VALUE;
      if (hasValue) value = r.getValue();
    }));
    if (!hasValue) return;
    checkStatus(guardRead([&] {
      DecodeContext ctx(f, fuzz::kLimits.maxNesting);
      decodeResult<fuzz::Node>("fuzzed", value, ctx);
    }));
    checkStatus(guardRead([&] {
      DecodeContext ctx(f, fuzz::kLimits.maxNesting);
      decodeResult<fuzz::ResultList>("fuzzed", value, ctx);
    }));
  }
}

void drain(FrameDecoder& d) {
  while (auto f = d.next()) handle(*f);
  if (d.peakFrameAllocation() > fuzz::kLimits.maxFrameBytes) finding("allocation past the frame limit");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const auto* bytes = reinterpret_cast<const std::byte*>(data + 1);
  size_t n = size - 1;
  // Chunk sizes: 1, 2, ..., 64 bytes, or everything at once.
  size_t chunk = (mode & 0x3f) == 0 ? n : static_cast<size_t>(mode & 0x3f);

  FrameDecoder decoder(fuzz::kLimits);
  if (mode & 0x80) {
    // The socket path: bytes go wherever prepareRead() says, at most `chunk` per read.
    size_t pos = 0;
    while (pos < n) {
      std::span<std::byte> dst = decoder.prepareRead();
      if (dst.empty()) finding("prepareRead lent nothing");
      size_t k = std::min({dst.size(), chunk, n - pos});
      std::memcpy(dst.data(), bytes + pos, k);
      pos += k;
      Status s = decoder.commitRead(k);
      checkStatus(s);
      drain(decoder);
      if (!s.ok()) break;
    }
  } else {
    for (size_t pos = 0; pos < n; pos += chunk) {
      Status s = decoder.feed(bytes + pos, std::min(chunk, n - pos));
      checkStatus(s);
      drain(decoder);
      if (!s.ok()) break;
    }
  }
  checkStatus(decoder.endOfStream());
  return 0;
}
