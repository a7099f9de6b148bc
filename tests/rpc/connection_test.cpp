// transport::Connection over a real TCP connection on 127.0.0.1 whose other end
// this test holds as a plain socket: how the connection ends when that end
// resets, closes, or takes bytes only once the socket is full, and how a
// graceful close ends it.
#include "rpc/transport/connection.h"

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/future.h"
#include "rpc/uv_loop.h"
#include "captured_text.h"

using namespace weft;
using namespace weft::rpc;
using namespace std::chrono_literals;
using weft::testing::contains;

namespace {

// A connected pair of TCP sockets on 127.0.0.1: `ours` for the Connection, `theirs` held raw.
struct TcpPair {
  int ours = -1;
  int theirs = -1;

  TcpPair() {
    int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(listener >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(listener, 1) == 0);
    socklen_t len = sizeof(addr);
    REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    ours = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(::connect(ours, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    theirs = ::accept(listener, nullptr, nullptr);
    ::close(listener);
    REQUIRE(theirs >= 0);
  }
  ~TcpPair() {
    if (theirs >= 0) ::close(theirs);
  }
  // The Connection owns `ours` from here on.
  int release() { return std::exchange(ours, -1); }
};

OutgoingFrame ping(uint64_t sequence) {
  FrameWriter w(16);
  w.message().initPing().setSequence(sequence);
  return std::move(w).finish();
}

// A started connection on `fd` whose first close is reported through `closed`.
std::shared_ptr<transport::Connection> startConnection(UvLoop& loop, int fd, Promise<Status> closed,
                                                       std::atomic<int>* frames = nullptr) {
  auto c = transport::Connection::create(
      loop, fd, FrameLimits{},
      {.onFrame = [frames](transport::Connection&, IncomingFrame) {
         if (frames) ++*frames;
       },
       .onClosed = [closed](transport::Connection&, const Status& why) mutable { closed.trySetValue(why); }},
      "test connection");
  loop.call([&] { c->startOnLoop(); });
  return c;
}

// Waits (bounded) until `fd` has bytes to read.
bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 5000) == 1;
}

// The sequences of the pings read from `fd` until its end of stream; nullopt when that
// takes more than 10 s.
std::optional<std::vector<uint64_t>> pingsUntilEnd(int fd) {
  FrameDecoder decoder;
  std::vector<uint64_t> out;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    std::byte buf[65536];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    REQUIRE(n >= 0);
    if (n == 0) break;
    REQUIRE(decoder.feed(buf, static_cast<size_t>(n)).ok());
    while (auto f = decoder.next()) {
      REQUIRE(f->message().which() == wire::Message::PING);
      out.push_back(f->message().getPing().getSequence());
    }
  }
  CHECK(decoder.status().ok());
  return out;
}

std::vector<uint64_t> sequence(uint64_t from, uint64_t to) {
  std::vector<uint64_t> out;
  for (uint64_t s = from; s < to; ++s) out.push_back(s);
  return out;
}

}  // namespace

TEST_CASE("a connection whose peer resets it (closed with our bytes unread) closes at once, naming the reset") {
  UvLoop loop("test-conn");
  TcpPair pair;
  Promise<Status> closed;
  Future<Status> f = closed.getFuture();
  auto c = startConnection(loop, pair.release(), closed);

  // Bytes the peer never reads: closing its socket then sends a reset, not an end of stream.
  REQUIRE(c->send(ping(1)));
  REQUIRE(readable(pair.theirs));
  ::close(pair.theirs);
  pair.theirs = -1;

  // Nothing is written after the reset, so only the socket error itself can end the
  // connection: without it, the connection would wait for a write that never comes.
  REQUIRE(f.waitFor(2s));
  Status why = f.get();
  CHECK(why.code() == StatusCode::Disconnected);
  CHECK(contains(why.message(), "reset"));
  CHECK(c->closed());
  CHECK_FALSE(c->send(ping(2)));
  loop.call([&] { c->close(Status::disconnected("done")); });
}

TEST_CASE("frames that arrived before a reset are delivered before the connection reports it closed") {
  UvLoop loop("test-conn");
  TcpPair pair;
  Promise<Status> closed;
  Future<Status> f = closed.getFuture();
  std::atomic<int> frames{0};
  // Three pings from the peer, then a reset (SO_LINGER 0), written before the
  // connection starts watching, so that all of it is waiting at once.
  std::vector<std::byte> bytes;
  for (uint64_t s = 1; s <= 3; ++s) ping(s).appendTo(bytes);
  REQUIRE(::write(pair.theirs, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  linger hard{1, 0};
  REQUIRE(::setsockopt(pair.theirs, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard)) == 0);
  ::close(pair.theirs);
  pair.theirs = -1;

  auto c = startConnection(loop, pair.release(), closed, &frames);
  REQUIRE(f.waitFor(2s));
  CHECK(f.get().code() == StatusCode::Disconnected);
  CHECK(frames.load() <= 3);  // a reset may discard what the kernel had not handed over
  loop.call([&] { c->close(Status::disconnected("done")); });
}

TEST_CASE("a connection whose peer closes cleanly reports the end of stream") {
  UvLoop loop("test-conn");
  TcpPair pair;
  Promise<Status> closed;
  Future<Status> f = closed.getFuture();
  auto c = startConnection(loop, pair.release(), closed);
  ::close(pair.theirs);
  pair.theirs = -1;
  REQUIRE(f.waitFor(2s));
  Status why = f.get();
  CHECK(why.code() == StatusCode::Disconnected);
  CHECK(contains(why.message(), "closed by the peer"));
}

TEST_CASE("a peer that reads from a full socket is heard, though it sends nothing") {
  UvLoop loop("test-conn");
  TcpPair pair;
  int small = 4096;
  ::setsockopt(pair.theirs, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  ::setsockopt(pair.ours, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  Promise<Status> closed;
  auto c = startConnection(loop, pair.release(), closed);
  auto heard = [&] { return loop.call([&] { return c->lastHeardOnLoop(); }); };

  // Fill the socket: frames queue until the peer reads.
  for (uint64_t s = 0; s < 200000; ++s) REQUIRE(c->send(ping(s)));
  std::this_thread::sleep_for(100ms);
  auto before = heard();
  CHECK(loop.call([&] { return c->lastReceivedOnLoop(); }) <= before);

  // The peer reads (and never writes): the queue drains, and that counts as hearing from it.
  std::vector<char> buf(1 << 16);
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (heard() == before && std::chrono::steady_clock::now() < deadline) {
    if (readable(pair.theirs)) (void)!::read(pair.theirs, buf.data(), buf.size());
  }
  CHECK(heard() > before);
  loop.call([&] { c->close(Status::disconnected("done")); });
}

TEST_CASE("closeGracefully writes every queued frame, half-closes, and reads the peer's frames until its end") {
  UvLoop loop("test-conn");
  TcpPair pair;
  Promise<Status> closed;
  Future<Status> f = closed.getFuture();
  std::atomic<int> frames{0};
  auto c = startConnection(loop, pair.release(), closed, &frames);
  for (uint64_t s = 0; s < 2000; ++s) REQUIRE(c->send(ping(s)));
  c->closeGracefully();

  // This side's frames all arrive, then its end of stream; the connection stays open for the
  // peer's side meanwhile.
  auto got = pingsUntilEnd(pair.theirs);
  REQUIRE(got.has_value());
  CHECK(*got == sequence(0, 2000));
  CHECK_FALSE(c->closed());
  std::vector<std::byte> bytes;
  for (uint64_t s = 0; s < 100; ++s) ping(s).appendTo(bytes);
  REQUIRE(::write(pair.theirs, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  ::shutdown(pair.theirs, SHUT_WR);

  REQUIRE(f.waitFor(10s));
  Status why = f.get();
  CHECK(why.code() == StatusCode::Disconnected);
  CHECK(contains(why.message(), "closed by the peer"));
  CHECK(frames.load() == 100);
  CHECK(c->closed());
}

TEST_CASE("a connection closing gracefully whose peer resets it instead of ending its stream closes at once") {
  UvLoop loop("test-conn");
  TcpPair pair;
  Promise<Status> closed;
  Future<Status> f = closed.getFuture();
  auto c = startConnection(loop, pair.release(), closed);
  REQUIRE(c->send(ping(1)));
  c->closeGracefully();
  auto got = pingsUntilEnd(pair.theirs);
  REQUIRE(got.has_value());
  CHECK(*got == std::vector<uint64_t>{1});
  CHECK_FALSE(c->closed());  // waiting for the peer's end of stream

  // The peer resets instead (SO_LINGER 0: a process gone with bytes unread does the same).
  // Nothing else will come: the close must not wait for an end of stream.
  linger hard{1, 0};
  REQUIRE(::setsockopt(pair.theirs, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard)) == 0);
  ::close(pair.theirs);
  pair.theirs = -1;
  REQUIRE_MESSAGE(f.waitFor(2s), "the reset connection still waits for an end of stream");
  Status why = f.get();
  CHECK(why.code() == StatusCode::Disconnected);
  CHECK(contains(why.message(), "reset"));
  CHECK(c->closed());
}
