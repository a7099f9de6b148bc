// Writes the seed corpus of frame_fuzz: valid frames of every message kind, calls whose
// arguments match the signatures the fuzzer decodes, and a few streams of several frames.
// Each file is one fuzzer input: a mode byte (chunking, see frame_fuzz.cpp) then the bytes.
//
//   build/tests/fuzz/frame_fuzz_corpus tests/fuzz/corpus
//
// Deterministic: rerunning it rewrites the same files.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "fuzz_types.h"
#include "rpc/codec.h"
#include "rpc/frame.h"

using namespace weft;
using namespace weft::rpc;

namespace {

using Bytes = std::vector<std::byte>;

Bytes frame(const std::function<void(FrameWriter&, EncodeContext&)>& fill) {
  FrameWriter writer;
  EncodeContext ctx(writer);
  fill(writer, ctx);
  Bytes out;
  std::move(writer).finish(fuzz::kLimits).appendTo(out);
  return out;
}

template <class... Args>
Bytes call(uint64_t id, const char* name, const Args&... args) {
  return frame([&](FrameWriter& w, EncodeContext& ctx) {
    auto c = w.message().initCall();
    c.setCallId(id);
    c.setFunctionId(nameId(name));
    c.setFunctionName(name);
    c.setTimeoutMs(60000);
    encodeArguments(ctx, c.initArgs(sizeof...(Args)), args...);
  });
}

template <class T>
Bytes response(uint64_t id, const T& value) {
  return frame([&](FrameWriter& w, EncodeContext& ctx) {
    auto r = w.message().initResponse();
    r.setCallId(id);
    encodeValue(value, r.initValue(), ctx);
  });
}

Tensor seq(int64_t n, DType dtype = DType::Float32) { return arange(0, static_cast<double>(n), 1, {.dtype = dtype}); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus directory>\n", argv[0]);
    return 2;
  }
  std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);

  std::vector<std::pair<std::string, Bytes>> seeds;
  seeds.emplace_back("hello", frame([](FrameWriter& w, EncodeContext&) {
                       auto h = w.message().initHello();
                       h.setProtocolVersion(kProtocolVersion);
                       h.setWorkerName("trainer1");
                       h.setRank(1);
                       h.setWorldSize(4);
                       h.setIncarnation(0x1234567890abcdefull);
                       h.setAuthToken(capnp::Data::Reader(reinterpret_cast<const kj::byte*>("secret"), 6));
                     }));
  seeds.emplace_back("welcome", frame([](FrameWriter& w, EncodeContext&) {
                       auto h = w.message().initWelcome();
                       h.setProtocolVersion(kProtocolVersion);
                       h.setWorkerName("ps");
                       h.setRank(0);
                       h.setWorldSize(4);
                       h.setIncarnation(42);
                     }));
  seeds.emplace_back("abort", frame([](FrameWriter& w, EncodeContext&) {
                       auto e = w.message().initAbort();
                       e.setCode(wire::StatusCode::INVALID_ARGUMENT);
                       e.setMessage("wrong token");
                       e.setWorker("ps");
                     }));
  seeds.emplace_back("cancel", frame([](FrameWriter& w, EncodeContext&) { w.message().initCancel().setCallId(7); }));
  seeds.emplace_back("ping", frame([](FrameWriter& w, EncodeContext&) { w.message().initPing().setSequence(3); }));
  seeds.emplace_back("pong", frame([](FrameWriter& w, EncodeContext&) { w.message().initPong().setSequence(3); }));
  seeds.emplace_back("shutdown_join", frame([](FrameWriter& w, EncodeContext&) {
                       auto j = w.message().initShutdownJoin();
                       j.setRound(2);
                       j.setIdle(true);
                     }));
  seeds.emplace_back("shutdown_proceed", frame([](FrameWriter& w, EncodeContext&) {
                       auto p = w.message().initShutdownProceed();
                       p.setRound(2);
                       p.setDone(true);
                       auto missing = p.initMissing(2);
                       missing.set(0, "w3");
                       missing.set(1, "w4");
                     }));
  seeds.emplace_back("response_error", frame([](FrameWriter& w, EncodeContext&) {
                       auto r = w.message().initResponse();
                       r.setCallId(9);
                       auto e = r.initError();
                       e.setCode(wire::StatusCode::FAILED);
                       e.setMessage("std::runtime_error: boom");
                       e.setWorker("w1");
                       e.setFunction("add");
                     }));

  Tensor a = seq(6).view({2, 3});
  seeds.emplace_back("call_add", call(1, "add", a, seq(6).view({2, 3}).t()));
  seeds.emplace_back("call_add_autograd", [&] {
    return frame([&](FrameWriter& w, EncodeContext& ctx) {
      auto c = w.message().initCall();
      c.setCallId(2);
      c.setFunctionId(nameId("add"));
      c.setFunctionName("add");
      auto ag = c.initAutograd();
      ag.setContextId((int64_t{1} << 48) | 5);
      ag.setMessageId((int64_t{1} << 48) | 9);
      Tensor g = seq(4).requiresGrad_();
      encodeArguments(ctx, c.initArgs(2), g, g);
    });
  }());
  seeds.emplace_back("call_tensors_map",
                     call(3, "stash", std::vector<Tensor>{seq(0), seq(3, DType::Int64), seq(2, DType::Float64)},
                          std::map<std::string, std::vector<int64_t>>{{"a", {1, 2}}, {"b", {}}}));
  seeds.emplace_back("call_optional_bytes",
                     call(4, "opt", std::optional<std::tuple<double, std::string, bool>>(std::make_tuple(1.5, "x", true)),
                          std::vector<uint8_t>{0, 1, 2, 255}));
  seeds.emplace_back("call_points", call(5, "plot", std::vector<fuzz::Point>{{1, "a"}, {2, "bb"}},
                                         std::unordered_map<int64_t, std::optional<float>>{{1, 2.5f}, {2, std::nullopt}}));
  fuzz::Node tree{1, {{2, {}, std::nullopt}, {3, {{4, {}, seq(2)}}, std::nullopt}}, seq(3, DType::Float64)};
  seeds.emplace_back("call_tree", call(6, "walk", tree));
  seeds.emplace_back("call_pair_bools", call(7, "mix", std::pair<int8_t, uint16_t>{-3, 65535},
                                             std::vector<std::vector<bool>>{{true, false}, {}}, std::string("s")));
  seeds.emplace_back("response_tree", response(8, tree));
  fuzz::ResultList results = {{{"k", std::make_tuple(1, seq(2))}, {"n", std::nullopt}}, {}};
  seeds.emplace_back("response_results", response(9, results));

  // Streams: several frames back to back.
  Bytes stream;
  for (const auto& [name, bytes] : seeds) stream.insert(stream.end(), bytes.begin(), bytes.end());

  int written = 0;
  auto write = [&](const std::string& name, uint8_t mode, const Bytes& bytes) {
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.put(static_cast<char>(mode));
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    ++written;
  };
  for (const auto& [name, bytes] : seeds) write(name, 0x00, bytes);
  // The same frames through the socket path and in small chunks.
  write("call_add_socket_7", 0x87, seeds[9].second);
  write("call_tree_socket_1", 0x81, seeds[14].second);
  write("call_points_chunks_3", 0x03, seeds[13].second);
  write("stream_whole", 0x00, stream);
  write("stream_socket_63", 0xbf, stream);
  std::printf("wrote %d seeds to %s\n", written, dir.c_str());
  return 0;
}
