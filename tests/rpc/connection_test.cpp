// transport::Connection over a real TCP connection on 127.0.0.1 whose other end
// this test holds as a plain socket: how the connection ends when that end
// resets, closes, or takes bytes only once the socket is full.
#include "rpc/transport/connection.h"

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/future.h"
#include "rpc/uv_loop.h"
#include "text_util.h"

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
  loop.call([&] { c->start(); });
  return c;
}

// Waits (bounded) until `fd` has bytes to read.
bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 5000) == 1;
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
  auto heard = [&] { return loop.call([&] { return c->lastHeard(); }); };

  // Fill the socket: frames queue until the peer reads.
  for (uint64_t s = 0; s < 200000; ++s) REQUIRE(c->send(ping(s)));
  std::this_thread::sleep_for(100ms);
  auto before = heard();
  CHECK(loop.call([&] { return c->lastReceived(); }) <= before);

  // The peer reads (and never writes): the queue drains, and that counts as hearing from it.
  std::vector<char> buf(1 << 16);
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (heard() == before && std::chrono::steady_clock::now() < deadline) {
    if (readable(pair.theirs)) (void)!::read(pair.theirs, buf.data(), buf.size());
  }
  CHECK(heard() > before);
  loop.call([&] { c->close(Status::disconnected("done")); });
}
