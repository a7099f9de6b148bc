// Hostile bytes against a live Agent. The test opens plain TCP connections to
// rank 0's RPC listener and writes what a broken or malicious peer might send:
// garbage, truncated frames, preambles claiming 100 GiB, a wrong version or
// flags, Hellos that must be refused (token, world size, rank), a Call before
// any Hello, a flood of silent connections. Then, playing a worker that passed
// the handshake, it sends calls the agent must answer with an error response
// (unknown function, arguments of the wrong kinds) and bytes that must cost it
// that connection. After each case the agent has closed the connection (after
// an Abort naming the problem where the protocol calls for one), counted it in
// AgentStats::connectionsRejected, logged exactly one line about it, and rank 1
// still calls rank 0 with the right result. Every wait is bounded.
//
// The cases follow rpc/protocol.capnp: a failed handshake or a protocol error
// is "abort, then close"; an unknown function or arguments that do not decode
// are an error Response on a connection that stays open.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/logging.h"
#include "rpc/agent.h"
#include "rpc/agent_group.h"
#include "rpc/codec.h"
#include "rpc/frame.h"
#include "rpc/store.h"
#include "rate_limited_log.h"
#include "captured_text.h"

using namespace weft;
using namespace weft::rpc;
using namespace std::chrono_literals;
using std::chrono::milliseconds;
using weft::testing::AgentGroup;

using weft::testing::contains;
using weft::testing::EveryLineLogged;
using weft::testing::heldBack;

namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::byte>;

const Function<int64_t(int64_t, int64_t)> hostileAdd{"hostile.add"};
const std::string kToken = "hostile-suite-token";

// Polls pred until it holds (true) or the bound passes (false, after one last look).
template <class Pred>
bool waitUntil(Pred&& pred, milliseconds bound) {
  auto deadline = Clock::now() + bound;
  while (!pred()) {
    if (Clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// ---- bytes on the wire ----------------------------------------------------------------------

Bytes bytesOf(OutgoingFrame frame) {
  Bytes out;
  frame.appendTo(out);
  return out;
}

Bytes bytesOf(std::string_view text) {
  Bytes out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

void putLE(Bytes& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xff));
}

// A frame preamble (rpc/frame.h, "Wire layout of a frame") with the fields given.
Bytes preamble(uint16_t version, uint16_t flags, uint32_t segments, uint32_t buffers, uint64_t messageWords,
               uint64_t bufferBytes) {
  Bytes out;
  putLE(out, kFrameMagic, 4);
  putLE(out, version, 2);
  putLE(out, flags, 2);
  putLE(out, segments, 4);
  putLE(out, buffers, 4);
  putLE(out, messageWords, 8);
  putLE(out, bufferBytes, 8);
  return out;
}

struct HelloFields {
  uint16_t version = kProtocolVersion;
  std::string name = "intruder";
  uint32_t rank = 1;
  uint32_t worldSize = 2;
  std::string token = kToken;
};

Bytes helloFrame(const HelloFields& f) {
  FrameWriter w(64);
  auto hello = w.message().initHello();
  hello.setProtocolVersion(f.version);
  hello.setWorkerName(f.name);
  hello.setRank(f.rank);
  hello.setWorldSize(f.worldSize);
  hello.setIncarnation(0x5eed);
  hello.setAuthToken(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(f.token.data()), f.token.size()));
  return bytesOf(std::move(w).finish());
}

Bytes welcomeFrame() {
  FrameWriter w(64);
  auto welcome = w.message().initWelcome();
  welcome.setProtocolVersion(kProtocolVersion);
  welcome.setWorkerName("worker0");
  welcome.setRank(0);
  welcome.setWorldSize(2);
  welcome.setIncarnation(0x5eed);
  return bytesOf(std::move(w).finish());
}

// A Call of the function named `name` under the id `functionId`, carrying args
// encoded as their C++ types (so a test can send kinds the callee does not expect).
template <class... Args>
Bytes callFrame(uint64_t callId, const std::string& name, uint64_t functionId, uint32_t flags, const Args&... args) {
  FrameWriter w;
  auto call = w.message().initCall();
  call.setCallId(callId);
  call.setFunctionId(functionId);
  call.setFunctionName(name);
  call.setTimeoutMs(5000);
  call.setFlags(flags);
  EncodeContext enc(w);
  encodeArguments(enc, call.initArgs(sizeof...(Args)), args...);
  return bytesOf(std::move(w).finish());
}

Bytes randomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  Bytes out(n);
  for (auto& b : out) b = static_cast<std::byte>(gen() & 0xff);
  out[0] = std::byte{'X'};  // never the magic, however the seed falls
  return out;
}

// ---- a connection of the test's own ----------------------------------------------------------

// The Abort an agent sent before closing: its code and message.
struct AbortSeen {
  wire::StatusCode code;
  std::string message;
};

// A plain TCP connection to an agent's listener: writes bytes of the test's
// choosing and decodes what the agent answers with its own FrameDecoder.
class RawConnection {
 public:
  explicit RawConnection(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    sockaddr_in local{};
    socklen_t len = sizeof local;
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &len) == 0);
    local_ = "127.0.0.1:" + std::to_string(ntohs(local.sin_port));
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  // "127.0.0.1:port" of this end: how the agent names the connection in its log.
  const std::string& localAddress() const { return local_; }

  // Writes what the socket takes; false when the agent closed it first.
  bool send(const Bytes& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Ends this side's stream (the agent reads end of stream) but keeps reading.
  void halfClose() { ::shutdown(fd_, SHUT_WR); }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Closes with a reset (RST) instead of an end of stream, as a process that dies with bytes
  // unread does.
  void reset() {
    if (fd_ < 0) return;
    linger l{.l_onoff = 1, .l_linger = 0};
    CHECK(::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0);
    close();
  }

  // The next frame the agent sends; nullopt when it closes first or the bound passes.
  std::optional<IncomingFrame> readFrame(milliseconds bound) {
    auto deadline = Clock::now() + bound;
    while (true) {
      if (auto f = decoder_.next()) return f;
      if (ended_ || !pump(deadline)) return std::nullopt;
    }
  }

  // True when the agent closed the connection (end of stream or reset) within
  // the bound. Frames it sent first are kept for abort().
  bool closedWithin(milliseconds bound) {
    auto deadline = Clock::now() + bound;
    while (!ended_) {
      if (!pump(deadline)) return false;
    }
    while (auto f = decoder_.next()) received_.push_back(std::move(*f));
    return true;
  }

  // The Abort among the frames received before the close, if any.
  std::optional<AbortSeen> abort() const {
    for (const auto& f : received_) {
      std::optional<AbortSeen> seen;
      Status s = guardRead([&] {
        if (f.message().which() != wire::Message::ABORT) return;
        auto a = f.message().getAbort();
        seen = AbortSeen{a.getCode(), a.getMessage().cStr()};
      });
      if (!s.ok()) FAIL_CHECK("the agent sent a malformed frame: " << s.message());
      if (seen) return seen;
    }
    return std::nullopt;
  }
  // Whatever the agent sent that did not decode (it must always send sound frames).
  const Status& decodeError() const { return decoder_.status(); }

 private:
  // Reads once; false when the deadline passed first.
  bool pump(Clock::time_point deadline) {
    while (true) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      int ready = ::poll(&p, 1, static_cast<int>(left));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) continue;
      std::byte buf[65536];
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n > 0) {
        decoder_.feed(buf, static_cast<size_t>(n));
        return true;
      }
      if (n < 0 && errno == EINTR) continue;
      ended_ = true;  // end of stream, or a reset (ECONNRESET)
      return true;
    }
  }

  int fd_ = -1;
  std::string local_;
  FrameDecoder decoder_;
  std::vector<IncomingFrame> received_;
  bool ended_ = false;
};

// ---- what the process says and holds -----------------------------------------------------

// Built with -fsanitize=address (WEFT_SANITIZE, which adds undefined as well).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// What the process writes to stderr (the logger's lines) while it lives.
// Not in sanitized builds: UBSan writes its report to stderr whatever
// log_path says and exits at once, so a capture would swallow the report.
// There capturing() is false and text() empty; checks on log lines are the
// plain build's.
class StderrCapture {
 public:
  StderrCapture() {
    if (kSanitized) return;
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    file_ = std::tmpfile();
    REQUIRE(file_ != nullptr);
    ::dup2(::fileno(file_), STDERR_FILENO);
  }
  ~StderrCapture() {
    restore();
    if (file_ != nullptr) std::fclose(file_);
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  bool capturing() const { return file_ != nullptr; }

  // Stops capturing and returns what was written (once: the file is closed).
  std::string text() {
    restore();
    std::string out;
    if (file_ == nullptr) return out;
    std::rewind(file_);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, file_)) > 0) out.append(buf, n);
    std::fclose(file_);
    file_ = nullptr;
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  int saved_ = -1;
  std::FILE* file_ = nullptr;
};

// How many times `what` occurs in text.
size_t countOf(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++count;
  return count;
}

// Lines of text that mention `what`, where what is not followed by a digit (so
// "127.0.0.1:4000" does not count a line about "127.0.0.1:40001").
size_t linesMentioning(const std::string& text, const std::string& what) {
  size_t count = 0;
  size_t lineStart = 0;
  while (lineStart < text.size()) {
    size_t lineEnd = text.find('\n', lineStart);
    if (lineEnd == std::string::npos) lineEnd = text.size();
    for (size_t pos = text.find(what, lineStart); pos != std::string::npos && pos < lineEnd;
         pos = text.find(what, pos + 1)) {
      size_t after = pos + what.size();
      if (after >= text.size() || !std::isdigit(static_cast<unsigned char>(text[after]))) {
        ++count;
        break;
      }
    }
    lineStart = lineEnd + 1;
  }
  return count;
}

// A field of /proc/self/status, in KiB (VmRSS, VmPeak, ...).
uint64_t procStatusKiB(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  }
  FAIL("no " << field << " in /proc/self/status");
  return 0;
}

size_t openDescriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// ---- the agents under attack -------------------------------------------------------------

void hostileOptions(int, Options& o) {
  o.authToken = kToken;
  o.logLevel = logging::Level::Warn;  // the level at which rejections are logged
}

// Two agents with a token; rank 0 serves hostileAdd and is the target.
class LiveAgents {
 public:
  LiveAgents() : group_(2, hostileOptions) {
    group_.agent(0).registry().impl(hostileAdd, [](int64_t a, int64_t b) { return a + b; });
    group_.start();
  }

  Agent& target() { return group_.agent(0); }
  uint16_t port() { return target().listenPort(); }
  uint64_t rejected() { return target().stats().connectionsRejected; }

  // Rank 1 still calls rank 0 and gets the right result.
  void checkServing() {
    int64_t sum = -1;
    CHECK_NOTHROW(sum = group_.agent(1).call(0, hostileAdd, CallOptions{.timeout = 5s}, 40, 2));
    CHECK(sum == 42);
    CHECK(target().isAlive(1));
    CHECK(group_.agent(1).isAlive(0));
  }

 private:
  AgentGroup group_;
};

struct HostileCase {
  std::string name;
  Bytes bytes;
  // End this side's stream after the bytes (what a peer that dies mid-frame does).
  bool halfClose = false;
  // The Abort the agent must send before closing; nullopt when none is required
  // (the peer already ended its stream, or gave the agent nothing to answer).
  std::optional<wire::StatusCode> abortCode;
  std::string abortText;  // what the Abort's message must contain
};

enum class Checks { All, CloseOnly };

// Sends the case's bytes on conn and checks that the agent closes it, after the
// Abort the case requires.
void sendAndExpectClose(RawConnection& conn, const HostileCase& c) {
  conn.send(c.bytes);
  if (c.halfClose) conn.halfClose();
  CHECK_MESSAGE(conn.closedWithin(5s), "the agent did not close the connection within 5 s");
  CHECK(conn.decodeError().ok());
  auto abort = conn.abort();
  if (c.abortCode) {
    REQUIRE_MESSAGE(abort.has_value(), "no Abort frame before the close");
    CHECK(abort->code == *c.abortCode);
    INFO("abort message: " << abort->message);
    CHECK(contains(abort->message, c.abortText));
  }
}

// Sends one case on a connection of its own and checks everything the agent
// owes a hostile peer: the close, the Abort, one count, one log line, and that
// it still serves rank 1 (CloseOnly: the close and the Abort).
void expectRejected(LiveAgents& live, const HostileCase& c, Checks checks = Checks::All) {
  INFO("case: " << c.name);
  uint64_t before = live.rejected();
  StderrCapture log;
  std::string local;
  {
    RawConnection conn(live.port());
    local = conn.localAddress();
    sendAndExpectClose(conn, c);
  }
  if (checks == Checks::CloseOnly) return;
  CHECK_MESSAGE(waitUntil([&] { return live.rejected() >= before + 1; }, 2s),
                "AgentStats::connectionsRejected did not count the connection");
  bool logged = log.capturing();
  std::string text = log.text();
  INFO("log:\n" << text);
  CHECK(live.rejected() == before + 1);
  if (logged) CHECK(linesMentioning(text, local) == 1);
  live.checkServing();
}

std::vector<HostileCase> handshakeCases() {
  const Bytes hello = helloFrame({});
  std::vector<HostileCase> cases;
  cases.push_back({"4 KiB of random bytes", randomBytes(4096, 7), false, wire::StatusCode::PROTOCOL, "bad magic"});
  cases.push_back({"an HTTP request", bytesOf("GET / HTTP/1.1\r\nHost: worker0\r\n\r\n"), false,
                   wire::StatusCode::PROTOCOL, "bad magic"});
  cases.push_back({"a preamble cut short, then end of stream", Bytes(hello.begin(), hello.begin() + 20), true,
                   std::nullopt, ""});
  cases.push_back({"a Hello cut short after its preamble, then end of stream", Bytes(hello.begin(), hello.end() - 8),
                   true, std::nullopt, ""});
  // No buffer count: the handshake allows none, and that check would come first.
  cases.push_back({"a preamble claiming 100 GiB of tensor bytes", preamble(kProtocolVersion, 0, 1, 0, 1, 100ull << 30),
                   false, wire::StatusCode::PROTOCOL, "over the frame limit"});
  cases.push_back({"a preamble claiming 100 GiB of message", preamble(kProtocolVersion, 0, 1, 0, (100ull << 30) / 8, 0),
                   false, wire::StatusCode::PROTOCOL, "over the frame limit"});
  Bytes version2 = hello;
  version2[4] = std::byte{2};
  cases.push_back({"a frame of protocol version 2", version2, false, wire::StatusCode::PROTOCOL, "protocol version 2"});
  Bytes flagged = hello;
  flagged[6] = std::byte{1};
  cases.push_back({"a frame with an undefined flag", flagged, false, wire::StatusCode::PROTOCOL, "unknown flags"});
  Bytes badTable = hello;
  badTable[32] = std::byte{0x7f};  // the first segment's size, no longer what the preamble sums to
  cases.push_back({"a segment table that disagrees with the preamble", badTable, false, wire::StatusCode::PROTOCOL,
                   "segment table"});
  cases.push_back({"a frame carrying a tensor buffer during the handshake", preamble(kProtocolVersion, 0, 1, 1, 4, 8),
                   false, wire::StatusCode::PROTOCOL, "tensor buffers"});
  cases.push_back({"a Hello claiming protocol version 2", helloFrame({.version = 2}), false, wire::StatusCode::PROTOCOL,
                   "protocol version 2"});
  cases.push_back({"a Hello with a wrong token", helloFrame({.rank = 1, .token = "not-the-token"}), false,
                   wire::StatusCode::INVALID_ARGUMENT, "token"});
  cases.push_back({"a Hello without a token", helloFrame({.rank = 1, .token = ""}), false,
                   wire::StatusCode::INVALID_ARGUMENT, "token"});
  cases.push_back({"a Hello with a wrong world size", helloFrame({.rank = 1, .worldSize = 3}), false,
                   wire::StatusCode::INVALID_ARGUMENT, "world size"});
  cases.push_back({"a Hello from a rank out of range", helloFrame({.rank = 5}), false,
                   wire::StatusCode::INVALID_ARGUMENT, "rank 5"});
  cases.push_back({"a Hello from rank 0 to rank 0", helloFrame({.rank = 0}), false, wire::StatusCode::INVALID_ARGUMENT,
                   "rank 0"});
  cases.push_back({"a Hello from a rank already connected", helloFrame({.name = "worker1", .rank = 1}), false,
                   wire::StatusCode::INVALID_ARGUMENT, "already connected"});
  cases.push_back({"a Call before any Hello", callFrame(1, hostileAdd.name(), hostileAdd.id(), 0, int64_t{40}, int64_t{2}),
                   false, wire::StatusCode::PROTOCOL, "expected a Hello"});
  cases.push_back({"a Welcome from the side that dialled", welcomeFrame(), false, wire::StatusCode::PROTOCOL,
                   "expected a Hello"});
  return cases;
}

// Ranks 0 and 1 are real agents; rank 2 is played by the test over raw
// connections, so that it can speak to rank 0 as an established peer. It
// registers in the rendezvous store the way Agent::start does
// (rpc/agent_handshake.cpp, claimIdentity: the key "weft/worker/<rank>" holds
// "<name>\n<host:port>"), reads the others' addresses from it, dials both,
// completes the handshakes by hand and enters the barrier that ends every
// worker's start.
class ImpostorWorld {
 public:
  static constexpr const char* kName = "impostor";

  ImpostorWorld()
      : group_(3, [](int r, Options& o) {
          hostileOptions(r, o);
          o.heartbeatInterval = 60s;  // the impostor never pings nor answers pings
          o.shutdownTimeout = 5s;
        }) {
    group_.agent(0).registry().impl(hostileAdd, [](int64_t a, int64_t b) { return a + b; });
    std::vector<std::exception_ptr> errors(2);
    std::vector<std::thread> starters;
    for (int r = 0; r < 2; ++r) {
      starters.emplace_back([&, r] {
        try {
          group_.agent(r).start();
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    }
    std::exception_ptr mine;
    try {
      StoreClient::Config cc;
      cc.host = "127.0.0.1";
      cc.port = group_.storePort();
      cc.token = kToken;
      cc.connectTimeout = 20s;
      cc.timeout = 20s;
      StoreClient store(cc);
      store.set("weft/worker/2", std::string(kName) + "\n127.0.0.1:9");
      to0_ = dial(store, 0);
      to1_ = dial(store, 1);
      store.barrier("weft/started", 3, 20s);  // as the last step of Agent::start
    } catch (...) {
      mine = std::current_exception();
    }
    for (auto& t : starters) t.join();
    if (mine) std::rethrow_exception(mine);
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
  }

  Agent& target() { return group_.agent(0); }
  RawConnection& toTarget() { return *to0_; }
  uint64_t rejected() { return target().stats().connectionsRejected; }

  void checkServing() {
    int64_t sum = -1;
    CHECK_NOTHROW(sum = group_.agent(1).call(0, hostileAdd, CallOptions{.timeout = 5s}, 40, 2));
    CHECK(sum == 42);
    CHECK(target().isAlive(1));
  }
  Agent& other() { return group_.agent(1); }
  RawConnection& toOther() { return *to1_; }

 private:
  std::unique_ptr<RawConnection> dial(StoreClient& store, int rank) {
    std::string reg = store.get("weft/worker/" + std::to_string(rank));
    auto colon = reg.rfind(':');
    REQUIRE(colon != std::string::npos);
    auto conn = std::make_unique<RawConnection>(static_cast<uint16_t>(std::stoi(reg.substr(colon + 1))));
    REQUIRE(conn->send(helloFrame({.name = kName, .rank = 2, .worldSize = 3})));
    auto reply = conn->readFrame(10s);
    REQUIRE_MESSAGE(reply.has_value(), "rank " << rank << " sent no Welcome");
    REQUIRE(reply->message().which() == wire::Message::WELCOME);
    CHECK(reply->message().getWelcome().getRank() == static_cast<uint32_t>(rank));
    return conn;
  }

  AgentGroup group_;
  // Declared after group_: closed before the agents shut down.
  std::unique_ptr<RawConnection> to0_;
  std::unique_ptr<RawConnection> to1_;
};

// The error a Response to callId carries (its code and message), or the int it returns.
struct ResponseSeen {
  bool isError = false;
  wire::StatusCode code = wire::StatusCode::OK;
  std::string message;
  int64_t value = 0;
};

ResponseSeen readResponse(RawConnection& conn, uint64_t callId) {
  auto frame = conn.readFrame(5s);
  REQUIRE_MESSAGE(frame.has_value(), "no response to call " << callId << " within 5 s");
  ResponseSeen out;
  Status s = guardRead([&] {
    REQUIRE(frame->message().which() == wire::Message::RESPONSE);
    auto resp = frame->message().getResponse();
    CHECK(resp.getCallId() == callId);
    if (resp.which() == wire::Response::ERROR) {
      out.isError = true;
      out.code = resp.getError().getCode();
      out.message = resp.getError().getMessage().cStr();
    } else {
      REQUIRE(resp.getValue().which() == wire::Value::INT);
      out.value = resp.getValue().getInt();
    }
  });
  REQUIRE_MESSAGE(s.ok(), s.message());
  return out;
}

}  // namespace

// ---- before the handshake -----------------------------------------------------------------

TEST_CASE("hostile bytes before the handshake cost only their connection: abort, close, one count, one log line") {
  EveryLineLogged all;  // one line per case, however many cases come from this one address
  LiveAgents live;
  live.checkServing();
  for (const HostileCase& c : handshakeCases()) expectRejected(live, c);
}

TEST_CASE("connections closed at once, without a byte, are released and leave the agent serving") {
  LiveAgents live;
  size_t fdsBefore = openDescriptors();
  for (int i = 0; i < 20; ++i) {
    RawConnection conn(live.port());
    conn.close();
  }
  live.checkServing();
  // The agent's ends of them are closed too (this process holds both ends).
  CHECK(waitUntil([&] { return openDescriptors() <= fdsBefore; }, 2s));
  CHECK(live.target().stats().liveConnections == 1);
}

TEST_CASE("a preamble claiming 100 GiB is refused from the preamble alone, allocating nothing") {
  LiveAgents live;
  uint64_t peakBefore = procStatusKiB("VmPeak");
  uint64_t rssBefore = procStatusKiB("VmRSS");
  for (int i = 0; i < 5; ++i) {
    expectRejected(live, {"a preamble claiming 100 GiB of tensor bytes, connection left open",
                          preamble(kProtocolVersion, 0, 1, 0, 1, 100ull << 30), false, wire::StatusCode::PROTOCOL,
                          "over the frame limit"},
                   Checks::CloseOnly);
  }
  live.checkServing();
  // Not even address space for it, however briefly: the peak virtual size moved by far less.
  CHECK(procStatusKiB("VmPeak") - peakBefore < (uint64_t{10} << 20));
  CHECK(procStatusKiB("VmRSS") < rssBefore + (uint64_t{64} << 10));
}

TEST_CASE("a preamble claiming 100 GiB from a worker past the handshake is refused against the frame limit") {
  ImpostorWorld world;
  uint64_t peakBefore = procStatusKiB("VmPeak");
  RawConnection& conn = world.toTarget();
  REQUIRE(conn.send(preamble(kProtocolVersion, 0, 1, 1, 1, 100ull << 30)));
  REQUIRE(conn.closedWithin(5s));
  auto abort = conn.abort();
  REQUIRE(abort.has_value());
  CHECK(abort->code == wire::StatusCode::PROTOCOL);
  INFO("abort message: " << abort->message);
  CHECK(contains(abort->message, "over the frame limit"));
  CHECK(procStatusKiB("VmPeak") - peakBefore < (uint64_t{10} << 20));
  world.checkServing();
}

TEST_CASE("three rounds of every hostile case against one agent keep its memory moderate") {
  LiveAgents live;
  auto cases = handshakeCases();
  // One warm-up round: first-use allocations (log buffers, pools) are not growth.
  for (const HostileCase& c : cases) expectRejected(live, c, Checks::CloseOnly);
  uint64_t rssBefore = procStatusKiB("VmRSS");
  size_t fdsBefore = openDescriptors();
  for (int round = 0; round < 3; ++round) {
    for (const HostileCase& c : cases) expectRejected(live, c, Checks::CloseOnly);
    live.checkServing();
  }
  uint64_t rssAfter = procStatusKiB("VmRSS");
  MESSAGE("VmRSS " << rssBefore << " KiB before three rounds, " << rssAfter << " KiB after");
  // ASan keeps freed memory in quarantine (256 MiB by default): only gross growth is visible there.
  uint64_t allowed = kSanitized ? (uint64_t{512} << 10) : (uint64_t{32} << 10);
  CHECK(rssAfter < rssBefore + allowed);
  CHECK(waitUntil([&] { return openDescriptors() <= fdsBefore; }, 2s));
}

TEST_CASE("a flood of 200 silent connections: the agent keeps serving, then closes every one of them, logging "
          "a few lines and a summary") {
  auto agents = std::make_unique<LiveAgents>();
  LiveAgents& live = *agents;
  uint64_t before = live.rejected();
  constexpr int kFlood = 200;
  auto logStarted = Clock::now();
  StderrCapture log;
  size_t fdsBefore = openDescriptors();
  std::vector<std::unique_ptr<RawConnection>> flood;
  for (int i = 0; i < kFlood; ++i) flood.push_back(std::make_unique<RawConnection>(live.port()));
  // Calls over the established connection are untouched by the flood.
  live.checkServing();
  // Hostile bytes on yet another connection are still read and refused.
  {
    RawConnection garbage(live.port());
    garbage.send(randomBytes(512, 11));
    CHECK(garbage.closedWithin(5s));
  }
  // Every silent connection is closed: at once when the agent has too many
  // waiting for a Hello, otherwise by the handshake timeout (10 s).
  auto started = Clock::now();
  int closed = 0;
  for (auto& c : flood) {
    auto left = std::chrono::duration_cast<milliseconds>(started + 20s - Clock::now());
    if (c->closedWithin(std::max(left, milliseconds(1)))) ++closed;
  }
  double took = std::chrono::duration<double>(Clock::now() - started).count();
  MESSAGE("the flood was closed within " << took << " s");
  CHECK(closed == kFlood);
  CHECK(waitUntil([&] { return live.rejected() == before + kFlood + 1; }, 2s));
  flood.clear();
  live.checkServing();
  // Nothing held on to: every descriptor of the flood is released on both sides.
  CHECK(waitUntil([&] { return openDescriptors() <= fdsBefore; }, 2s));
  CHECK(live.target().stats().liveConnections == 1);

  // The log: a few lines from 127.0.0.1 per 10 s, and summaries (the last one written as the
  // agents close) that account for every other rejection: not one line per connection.
  agents.reset();
  double logSeconds = std::chrono::duration<double>(Clock::now() - logStarted).count();
  if (log.capturing()) {
    std::string text = log.text();
    size_t shown = countOf(text, "] rpc: connection from 127.0.0.1:") +
                   countOf(text, "] rpc: refused a connection from 127.0.0.1:");
    uint64_t held = heldBack(text, "rpc", "127.0.0.1");
    MESSAGE((kFlood + 1) << " rejections in " << logSeconds << " s: " << shown << " lines and " << held
                       << " held back");
    CHECK(shown + held == kFlood + 1);
    CHECK(shown <= static_cast<size_t>(3 * (1 + logSeconds / 10)));
    CHECK(held > 0);
    INFO(text);
    CHECK(shown > 0);
  }
}

TEST_CASE("3,000 connections of garbage from one address cost a few log lines and a summary, not a line each") {
  constexpr int kConnections = 3000;
  auto agents = std::make_unique<LiveAgents>();
  uint64_t before = agents->rejected();
  StderrCapture log;
  auto started = Clock::now();
  Bytes garbage = randomBytes(64, 17);
  for (int i = 0; i < kConnections; ++i) {
    RawConnection conn(agents->port());
    conn.send(garbage);
  }
  CHECK(waitUntil([&] { return agents->rejected() == before + kConnections; }, 20s));
  double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  agents->checkServing();
  agents.reset();  // the last summary is written as the agents close
  if (log.capturing()) {
    std::string text = log.text();
    size_t shown = countOf(text, "] rpc: connection from 127.0.0.1:") +
                   countOf(text, "] rpc: refused a connection from 127.0.0.1:");
    uint64_t held = heldBack(text, "rpc", "127.0.0.1");
    MESSAGE(kConnections << " connections in " << seconds << " s: " << shown << " lines and " << held
                         << " held back");
    INFO(text);
    CHECK(shown + held == kConnections);
    CHECK(shown >= 3);
    CHECK(shown <= static_cast<size_t>(3 * (1 + seconds / 10)));
  }
}

// ---- after the handshake --------------------------------------------------------------------

TEST_CASE("a worker past the handshake gets error responses for unknown functions and wrong arguments, and keeps "
          "its connection") {
  ImpostorWorld world;
  RawConnection& conn = world.toTarget();
  uint64_t before = world.rejected();
  StderrCapture log;

  REQUIRE(conn.send(callFrame(1, "hostile.nope", nameId("hostile.nope"), 0, int64_t{1})));
  ResponseSeen r = readResponse(conn, 1);
  CHECK(r.isError);
  CHECK(r.code == wire::StatusCode::NOT_FOUND);
  CHECK(contains(r.message, "hostile.nope"));

  // The id of hostile.add under another name: a hash collision, not a match.
  REQUIRE(conn.send(callFrame(2, "hostile.other", hostileAdd.id(), 0, int64_t{1}, int64_t{2})));
  r = readResponse(conn, 2);
  CHECK(r.isError);
  CHECK(r.code == wire::StatusCode::NOT_FOUND);
  CHECK(contains(r.message, "hostile.other"));

  REQUIRE(conn.send(callFrame(3, hostileAdd.name(), hostileAdd.id(), 0, std::string("forty"), 2.5)));
  r = readResponse(conn, 3);
  CHECK(r.isError);
  CHECK(r.code == wire::StatusCode::PROTOCOL);
  INFO("message: " << r.message);
  CHECK(contains(r.message, "hostile.add: argument 0"));

  REQUIRE(conn.send(callFrame(4, hostileAdd.name(), hostileAdd.id(), 0, int64_t{40})));
  r = readResponse(conn, 4);
  CHECK(r.isError);
  CHECK(r.code == wire::StatusCode::PROTOCOL);
  CHECK(contains(r.message, "expected 2 arguments"));

  REQUIRE(conn.send(callFrame(5, hostileAdd.name(), hostileAdd.id(), 0, int64_t{40}, int64_t{2}, int64_t{0})));
  r = readResponse(conn, 5);
  CHECK(r.isError);
  CHECK(r.code == wire::StatusCode::PROTOCOL);

  // The same connection still carries a sound call.
  REQUIRE(conn.send(callFrame(6, hostileAdd.name(), hostileAdd.id(), 0, int64_t{40}, int64_t{2})));
  r = readResponse(conn, 6);
  CHECK_FALSE(r.isError);
  CHECK(r.value == 42);

  bool logged = log.capturing();
  std::string text = log.text();
  INFO("log:\n" << text);
  CHECK(world.rejected() == before);
  CHECK(world.target().isAlive(2));
  if (logged) CHECK(linesMentioning(text, ImpostorWorld::kName) == 0);
  world.checkServing();
}

TEST_CASE("a worker past the handshake that breaks the protocol loses its connection, and only that one") {
  std::vector<HostileCase> cases;
  cases.push_back({"4 KiB of random bytes", randomBytes(4096, 13), false, wire::StatusCode::PROTOCOL, "bad magic"});
  cases.push_back({"a preamble claiming 100 GiB", preamble(kProtocolVersion, 0, 1, 1, 1, 100ull << 30), false,
                   wire::StatusCode::PROTOCOL, "over the frame limit"});
  cases.push_back({"a second Hello", helloFrame({.name = ImpostorWorld::kName, .rank = 2, .worldSize = 3}), false,
                   wire::StatusCode::PROTOCOL, "second handshake"});
  cases.push_back({"a call with id 0", callFrame(0, hostileAdd.name(), hostileAdd.id(), 0, int64_t{1}, int64_t{2}),
                   false, wire::StatusCode::PROTOCOL, "id 0"});
  cases.push_back({"a call with undefined flags",
                   callFrame(7, hostileAdd.name(), hostileAdd.id(), 0x80, int64_t{1}, int64_t{2}), false,
                   wire::StatusCode::PROTOCOL, "unknown flags"});
  Bytes call = callFrame(8, hostileAdd.name(), hostileAdd.id(), 0, int64_t{1}, int64_t{2});
  cases.push_back({"a call cut short, then end of stream", Bytes(call.begin(), call.end() - 16), true, std::nullopt, ""});

  for (const HostileCase& c : cases) {
    INFO("case: " << c.name);
    ImpostorWorld world;
    RawConnection& conn = world.toTarget();
    uint64_t before = world.rejected();
    StderrCapture log;
    sendAndExpectClose(conn, c);
    CHECK(waitUntil([&] { return !world.target().isAlive(2); }, 2s));
    CHECK_MESSAGE(waitUntil([&] { return world.rejected() >= before + 1; }, 2s),
                  "AgentStats::connectionsRejected did not count the connection");
    bool logged = log.capturing();
    std::string text = log.text();
    INFO("log:\n" << text);
    CHECK(world.rejected() == before + 1);
    // Rank 0 logs the loss once (rank 1 still holds its own connection to the impostor).
    if (logged) CHECK(linesMentioning(text, std::string("'") + ImpostorWorld::kName + "'") == 1);
    // Later calls to the lost worker fail at once; everything else is untouched.
    auto t0 = Clock::now();
    CHECK_THROWS_AS(world.target().call(2, hostileAdd, CallOptions{.timeout = 5s}, 1, 2), DisconnectedError);
    CHECK(Clock::now() - t0 < 1s);
    CHECK(world.other().isAlive(2));
    world.checkServing();
  }
}

// ---- a worker that resets its connections ---------------------------------------------------

TEST_CASE("workers leaving a failed shutdown barrier leave at once when a peer resets its connections instead "
          "of ending them") {
  ImpostorWorld world;
  std::array<ShutdownReport, 2> reports;
  std::array<std::atomic<double>, 2> leftAt;
  for (auto& a : leftAt) a = -1;
  auto t0 = Clock::now();
  auto since = [&t0] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  std::thread s0([&] {
    reports[0] = world.target().shutdown();
    leftAt[0] = since();
  });
  std::thread s1([&] {
    reports[1] = world.other().shutdown();
    leftAt[1] = since();
  });
  std::this_thread::sleep_for(300ms);
  CHECK(leftAt[0] < 0);  // the impostor never joins: both wait
  CHECK(leftAt[1] < 0);

  // The impostor leaves the barrier as a worker that lost another one does. Rank 0 fails its
  // barrier and tells rank 1, which tells the impostor in turn (rank 0 knows it gone); both
  // half-close their connections to the impostor and wait for its end of stream. (CHECK, not
  // REQUIRE, until the shutdown threads are joined.)
  FrameWriter w(128);
  auto notice = w.message().initShutdownProceed();
  notice.setRound(0);
  notice.setDone(true);
  notice.initMissing(1).set(0, "lost-worker");
  CHECK(world.toTarget().send(bytesOf(std::move(w).finish())));
  auto frame = world.toOther().readFrame(5s);
  CHECK(frame.has_value());
  if (frame) {
    CHECK(frame->message().which() == wire::Message::SHUTDOWN_PROCEED);
    if (frame->message().which() == wire::Message::SHUTDOWN_PROCEED) {
      CHECK(frame->message().getShutdownProceed().getRound() == 0);
    }
  }
  CHECK(world.toTarget().closedWithin(5s));
  CHECK(world.toOther().closedWithin(5s));
  CHECK(leftAt[0] < 0);  // the connections to the impostor are still open
  CHECK(leftAt[1] < 0);

  // It resets them instead of ending its streams: nothing more will come, and both leave now,
  // not at the end of the time they allow a peer to close its side.
  double resetAt = since();
  world.toTarget().reset();
  world.toOther().reset();
  s0.join();
  s1.join();
  for (size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    INFO("rank " << r << " left " << (leftAt[r] - resetAt) * 1000 << " ms after the reset");
    CHECK(leftAt[r] - resetAt < 1.0);
    CHECK(reports[r].graceful);
    std::string missing;
    for (auto& m : reports[r].missing) missing += (missing.empty() ? "" : ", ") + m;
    CHECK(missing == "lost-worker");
  }
}
