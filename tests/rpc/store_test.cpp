#include "rpc/store.h"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <latch>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "rate_limited_log.h"
#include "captured_text.h"

using namespace weft;
using namespace weft::rpc;
using namespace std::chrono_literals;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

using weft::testing::contains;

namespace {

StoreServer::Config serverConfig(store::Limits limits = {}) {
  StoreServer::Config c;
  c.host = "127.0.0.1";
  c.port = 0;
  c.limits = limits;
  return c;
}

StoreClient::Config clientConfig(uint16_t port, milliseconds timeout = 30s) {
  StoreClient::Config c;
  c.host = "127.0.0.1";
  c.port = port;
  c.connectTimeout = 10s;
  c.timeout = timeout;
  return c;
}

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Polls cond until it holds or the time is up; the store's own behaviour is
// event driven, but what a test observes from outside (another socket, the
// server's counters) has to be sampled.
template <class F>
bool eventually(F cond, milliseconds within = 10s) {
  auto deadline = Clock::now() + within;
  while (!cond()) {
    if (Clock::now() >= deadline) return cond();
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// The message of the exception of type E that fn throws.
template <class E, class F>
std::string errorOf(F fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("threw another exception: ", e.what());
    return "";
  }
  FAIL("threw nothing");
  return "";
}

// A port nobody listens on (bound once by the kernel's choice, then released).
uint16_t unusedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

uint32_t loadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string helloFrame(const std::string& token = "", uint16_t version = store::kVersion,
                       uint32_t magic = store::kMagic, uint64_t clientId = 1) {
  return store::FrameWriter(0, static_cast<uint8_t>(store::Op::Hello))
      .u32(magic)
      .u16(version)
      .str(token)
      .u64(clientId)
      .finish();
}

struct Reply {
  uint64_t id = 0;
  int status = -1;
  std::string payload;
};

Reply parseReply(const std::string& body) {
  REQUIRE(body.size() >= store::kBodyHeaderBytes);
  store::BodyReader r(body.data(), body.size());
  Reply out;
  out.id = r.u64("id");
  out.status = r.u8("status");
  out.payload = body.substr(store::kBodyHeaderBytes);
  return out;
}

// A plain TCP connection for writing bytes of the test's choosing.
class RawSocket {
 public:
  explicit RawSocket(uint16_t port, int receiveBuffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    if (receiveBuffer > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receiveBuffer, sizeof receiveBuffer);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~RawSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  // Writes what the socket takes; the server may close it midway.
  void send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }

  // True when the peer closed (end of stream or reset) within the time.
  // Whatever it sent first is read and discarded.
  bool closedWithin(milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    char buf[4096];
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      int left = static_cast<int>(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count());
      if (::poll(&p, 1, std::max(left, 1)) <= 0) continue;
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    }
    return false;
  }

  // The body of the next frame, or nullopt when the peer closes first or the
  // time runs out.
  std::optional<std::string> readFrame(milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (true) {
      if (buffer_.size() >= 4) {
        uint32_t len = loadU32(buffer_.data());
        if (buffer_.size() >= 4 + static_cast<size_t>(len)) {
          std::string body = buffer_.substr(4, len);
          buffer_.erase(0, 4 + static_cast<size_t>(len));
          return body;
        }
      }
      int left = static_cast<int>(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count());
      if (left <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, left) <= 0) continue;
      char buf[65536];
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return std::nullopt;
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }

  // Sends a Hello and checks that it is accepted. Each socket is a client of
  // its own unless told which.
  void handshake(const std::string& token = "", std::optional<uint64_t> clientId = std::nullopt) {
    static std::atomic<uint64_t> nextClientId{1000};
    send(helloFrame(token, store::kVersion, store::kMagic, clientId ? *clientId : nextClientId++));
    std::optional<std::string> reply = readFrame(5s);
    REQUIRE(reply.has_value());
    REQUIRE(parseReply(*reply).status == 0);
  }

 private:
  int fd_ = -1;
  std::string buffer_;
};

// What the process writes to stderr (the logger's lines) while it lives.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    file_ = std::tmpfile();
    REQUIRE(file_ != nullptr);
    ::dup2(::fileno(file_), STDERR_FILENO);
  }
  ~StderrCapture() { restore(); }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  // Stops capturing and returns what was written.
  std::string text() {
    restore();
    std::string out;
    std::rewind(file_);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, file_)) > 0) out.append(buf, n);
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  int saved_ = -1;
  std::FILE* file_ = nullptr;
};

size_t countLines(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++count;
  return count;
}

}  // namespace

// ---- operations -------------------------------------------------------------------

TEST_CASE("a client sets and gets values, and values are arbitrary bytes") {
  StoreServer server(serverConfig());
  CHECK(server.port() != 0);
  StoreClient client(clientConfig(server.port()));
  CHECK(client.connected());
  CHECK(client.endpoint() == "127.0.0.1:" + std::to_string(server.port()));

  client.set("addr/worker0", "10.0.0.1:4000");
  CHECK(client.get("addr/worker0") == "10.0.0.1:4000");
  client.set("addr/worker0", "10.0.0.2:4001");  // replaces
  CHECK(client.get("addr/worker0", 1s) == "10.0.0.2:4001");

  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  client.set(std::string("bin\0key", 7), bytes);
  CHECK(client.get(std::string("bin\0key", 7)) == bytes);
  client.set("empty", "");
  CHECK(client.get("empty") == "");
  CHECK(client.check({"empty", "addr/worker0"}));
  CHECK_FALSE(client.check({"empty", "absent"}));
  CHECK(client.numKeys() == 3);
}

TEST_CASE("a client started through localhost reaches a server bound to 127.0.0.1") {
  StoreServer server(serverConfig());
  StoreClient::Config c = clientConfig(server.port());
  c.host = "localhost";
  StoreClient client(c);
  client.set("k", "v");
  CHECK(client.get("k") == "v");
}

TEST_CASE("get before set blocks, then wakes as soon as another client sets the key") {
  StoreServer server(serverConfig());
  StoreClient waiter(clientConfig(server.port()));
  StoreClient setter(clientConfig(server.port()));
  Future<std::string> got = waiter.getAsync("late", 20s);
  CHECK(eventually([&] { return server.stats().waiters == 1; }));
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(got.isReady());
  auto setAt = Clock::now();
  setter.set("late", "here");
  REQUIRE(got.waitFor(5s));
  CHECK(secondsSince(setAt) < 1.0);
  CHECK(got.get() == "here");
  CHECK(server.stats().waiters == 0);
}

TEST_CASE("a zero timeout waits without a deadline") {
  StoreServer server(serverConfig());
  StoreClient client(clientConfig(server.port(), 100ms));  // the default timeout does not apply
  Future<std::string> got = client.getAsync("k", 0ms);
  Future<void> waited = client.waitAsync({"k"}, 0ms);
  std::this_thread::sleep_for(400ms);
  CHECK_FALSE(got.isReady());
  CHECK_FALSE(waited.isReady());
  StoreClient other(clientConfig(server.port()));
  other.set("k", "v");
  CHECK(got.get() == "v");
  CHECK_NOTHROW(waited.get());
}

TEST_CASE("get and wait time out with a TimeoutError naming the keys still missing") {
  StoreServer server(serverConfig());
  StoreClient client(clientConfig(server.port()));
  auto start = Clock::now();
  std::string e = errorOf<TimeoutError>([&] { client.get("rank3/addr", 200ms); });
  double took = secondsSince(start);
  CHECK(contains(e, "get('rank3/addr') timed out after 0.2 s"));
  CHECK(took >= 0.19);
  CHECK(took < 2.0);

  client.set("present", "1");
  start = Clock::now();
  e = errorOf<TimeoutError>([&] { client.wait({"present", "missing/a", "missing/b"}, 300ms); });
  CHECK(contains(e, "wait timed out after 0.3 s"));
  CHECK(contains(e, "'missing/a'"));
  CHECK(contains(e, "'missing/b'"));
  CHECK_FALSE(contains(e, "'present'"));
  CHECK(secondsSince(start) >= 0.29);
  CHECK(server.stats().waiters == 0);
  // The connection is still good.
  CHECK(client.get("present") == "1");
}

TEST_CASE("wait returns once all keys exist at the same time, and is woken by set and add") {
  StoreServer server(serverConfig());
  StoreClient client(clientConfig(server.port()));
  StoreClient other(clientConfig(server.port()));
  Future<void> w = client.waitAsync({"a", "b", "counter"}, 20s);
  other.set("a", "1");
  other.deleteKey("a");
  other.set("b", "1");
  other.add("counter", 5);
  // Every key has been set, but "a" no longer exists.
  CHECK(eventually([&] { return server.stats().waiters == 1; }));
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(w.isReady());
  other.set("a", "again");
  CHECK_NOTHROW(w.get());
  CHECK_NOTHROW(client.wait({}, 1s));  // nothing to wait for
  CHECK_NOTHROW(client.wait({"a", "a"}, 1s));
}

TEST_CASE("a thousand gets waiting on distinct keys are all answered with their own value") {
  StoreServer server(serverConfig());
  StoreClient client(clientConfig(server.port()));
  StoreClient setter(clientConfig(server.port()));
  constexpr int kKeys = 1000;
  // (Appending rather than "k" + to_string(i) keeps GCC 12's -Wrestrict false positive away.)
  auto numbered = [](char prefix, int i) { return std::string(1, prefix).append(std::to_string(i)); };
  std::vector<Future<std::string>> gets;
  for (int i = 0; i < kKeys; ++i) gets.push_back(client.getAsync(numbered('k', i), 30s));
  CHECK(eventually([&] { return server.stats().waiters == kKeys; }));
  std::vector<Future<void>> sets;
  for (int i = kKeys - 1; i >= 0; --i) sets.push_back(setter.setAsync(numbered('k', i), numbered('v', i)));
  whenAll(sets).get();
  for (int i = 0; i < kKeys; ++i) CHECK(gets[static_cast<size_t>(i)].get() == numbered('v', i));
  CHECK(server.stats().waiters == 0);
}

TEST_CASE("concurrent adds from threads sharing one client, and from separate clients, give exact totals") {
  StoreServer server(serverConfig());
  constexpr int kThreads = 4;
  constexpr int kAdds = 1000;

  StoreClient shared(clientConfig(server.port()));
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) seen[static_cast<size_t>(t)].push_back(shared.add("shared", 1));
    });
  }
  for (auto& th : threads) th.join();
  CHECK(shared.get("shared") == std::to_string(kThreads * kAdds));
  std::set<int64_t> all;
  for (const auto& s : seen) {
    CHECK(std::is_sorted(s.begin(), s.end()));  // one thread's adds apply in order
    all.insert(s.begin(), s.end());
  }
  CHECK(all.size() == static_cast<size_t>(kThreads * kAdds));  // every value handed out once
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == kThreads * kAdds);

  threads.clear();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      StoreClient own(clientConfig(server.port()));
      for (int i = 0; i < kAdds; ++i) own.add("separate", t % 2 ? 3 : -1);
    });
  }
  for (auto& th : threads) th.join();
  CHECK(shared.add("separate", 0) == kAdds * 2 * 3 - kAdds * 2);
}

TEST_CASE("add counts from zero, stores decimal text, and refuses values that are not integers") {
  StoreServer server(serverConfig());
  StoreClient client(clientConfig(server.port()));
  CHECK(client.add("n", 5) == 5);
  CHECK(client.add("n", -7) == -2);
  CHECK(client.get("n") == "-2");
  client.set("text", "abc");
  std::string e = errorOf<InvalidArgumentError>([&] { client.add("text", 1); });
  CHECK(contains(e, "add('text')"));
  CHECK(contains(e, "not a decimal integer"));
  client.set("max", std::to_string(INT64_MAX));
  CHECK(contains(errorOf<InvalidArgumentError>([&] { client.add("max", 1); }), "overflows"));
  CHECK(client.get("max") == std::to_string(INT64_MAX));
  CHECK(client.add("n", 0) == -2);  // the connection is still good
}

TEST_CASE("compareSet follows torch's TCPStore compare_set") {
  StoreServer server(serverConfig());
  StoreClient client(clientConfig(server.port()));
  // Missing key, empty expected: stores desired.
  CHECK(client.compareSet("a", "", "x") == "x");
  CHECK(client.get("a") == "x");
  // Missing key, non-empty expected: stores nothing, returns expected.
  CHECK(client.compareSet("b", "zz", "y") == "zz");
  CHECK_FALSE(client.check({"b"}));
  // Present and equal: swaps.
  CHECK(client.compareSet("a", "x", "z") == "z");
  CHECK(client.get("a") == "z");
  // Present and different: returns the current value, changes nothing.
  CHECK(client.compareSet("a", "q", "w") == "z");
  CHECK(client.compareSet("a", "", "w") == "z");
  CHECK(client.get("a") == "z");
  // A successful compareSet wakes waiters.
  Future<std::string> got = client.getAsync("c", 10s);
  CHECK(client.compareSet("c", "", "first") == "first");
  CHECK(got.get() == "first");
}

TEST_CASE("deleteKey says whether the key existed, and numKeys counts what is stored") {
  StoreServer server(serverConfig());
  StoreClient client(clientConfig(server.port()));
  CHECK(client.numKeys() == 0);
  client.set("x", "1");
  client.add("y", 1);
  CHECK(client.numKeys() == 2);
  CHECK(client.deleteKey("x"));
  CHECK_FALSE(client.deleteKey("x"));
  CHECK(client.numKeys() == 1);
  CHECK(server.stats().keys == 1);
  CHECK(server.stats().storedBytes == 2);  // "y" and "1"
  CHECK_THROWS_AS(client.get("x", 100ms), TimeoutError);
}

TEST_CASE("values and keys at the size limit are stored, larger ones are refused before sending") {
  StoreServer server(serverConfig());
  StoreClient client(clientConfig(server.port()));
  uint32_t maxValue = client.maxValueBytes();
  uint32_t maxKey = client.maxKeyBytes();
  CHECK(maxValue == store::Limits().maxValueBytes);

  std::string big(maxValue, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  client.set("big", big);
  CHECK(client.get("big") == big);
  CHECK(client.compareSet("big", big, "small") == "small");

  std::string e = errorOf<InvalidArgumentError>([&] { client.set("too-big", std::string(maxValue + 1, 'v')); });
  CHECK(contains(e, "StoreClient::set: value of " + std::to_string(maxValue + 1) + " bytes exceeds the server's limit"));
  CHECK_THROWS_AS(client.compareSet("k", "", std::string(maxValue + 1, 'v')), InvalidArgumentError);

  std::string longKey(maxKey, 'k');
  client.set(longKey, "v");
  CHECK(client.get(longKey) == "v");
  CHECK_THROWS_AS(client.set(longKey + "k", "v"), InvalidArgumentError);
  CHECK(contains(errorOf<InvalidArgumentError>([&] { client.get(""); }), "StoreClient::get: empty key"));
  std::vector<std::string> manyKeys(client.maxKeysPerRequest() + 1, "k");
  CHECK_THROWS_AS(client.wait(manyKeys, 1s), InvalidArgumentError);
  CHECK_THROWS_AS(client.get("k", -1ms), InvalidArgumentError);
  CHECK(server.stats().droppedConnections == 0);  // nothing oversized reached the server
  CHECK(client.get("big") == "small");
}

TEST_CASE("a set beyond the store's total capacity fails and leaves the store as it was") {
  store::Limits limits;
  limits.maxStoredBytes = 1000;
  StoreServer server(serverConfig(limits));
  StoreClient client(clientConfig(server.port()));
  client.set("a", std::string(900, 'a'));
  std::string e = errorOf<InvalidArgumentError>([&] { client.set("b", std::string(200, 'b')); });
  CHECK(contains(e, "no room for 200 bytes under 'b'"));
  CHECK_FALSE(client.check({"b"}));
  client.set("a", std::string(990, 'a'));  // replacing counts the old value out
  CHECK(server.stats().storedBytes == 991);
}

// ---- barrier -------------------------------------------------------------------------

TEST_CASE("a barrier releases nobody before everyone arrived, and can be used again") {
  StoreServer server(serverConfig());
  constexpr int kWorkers = 4;
  constexpr int kRounds = 5;
  std::atomic<int> arrived[kRounds] = {};
  std::atomic<int> early{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      StoreClient client(clientConfig(server.port()));
      for (int r = 0; r < kRounds; ++r) {
        std::this_thread::sleep_for(milliseconds(5 * ((w + r) % kWorkers)));  // stagger arrivals
        ++arrived[r];
        client.barrier("rounds", kWorkers, 20s);
        if (arrived[r].load() != kWorkers) ++early;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(early.load() == 0);
  // Only the counter and the last round's key remain.
  StoreClient client(clientConfig(server.port()));
  CHECK(client.numKeys() == 2);
  CHECK(client.get("weft/barrier/rounds/count") == std::to_string(kWorkers * kRounds));
}

TEST_CASE("a barrier that times out says how many participants arrived") {
  StoreServer server(serverConfig());
  StoreClient client(clientConfig(server.port()));
  std::vector<std::future<std::string>> results;
  for (int i = 0; i < 3; ++i) {
    results.push_back(std::async(std::launch::async, [&] {
      return errorOf<TimeoutError>([&] { client.barrier("lonely", 4, 300ms); });
    }));
  }
  for (auto& r : results) {
    std::string e = r.get();
    CHECK(contains(e, "barrier 'lonely' timed out after 0.3 s: 3 of 4 participants arrived"));
  }
  CHECK_THROWS_AS(client.barrier("x", 0, 1s), InvalidArgumentError);
  CHECK_NOTHROW(client.barrier("alone", 1, 1s));
}

// ---- connecting ----------------------------------------------------------------------

TEST_CASE("a client started before its server connects once the server listens") {
  uint16_t port = unusedPort();
  auto start = Clock::now();
  auto connecting = std::async(std::launch::async, [&] {
    StoreClient client(clientConfig(port));
    client.set("hello", "world");
    return client.get("hello");
  });
  std::this_thread::sleep_for(300ms);
  CHECK(connecting.wait_for(0s) == std::future_status::timeout);
  StoreServer::Config c = serverConfig();
  c.port = port;
  StoreServer server(c);
  REQUIRE(connecting.wait_for(10s) == std::future_status::ready);
  CHECK(connecting.get() == "world");
  CHECK(secondsSince(start) < 5.0);
}

TEST_CASE("connecting where nobody listens times out naming the address and the last error") {
  uint16_t port = unusedPort();
  StoreClient::Config c = clientConfig(port);
  c.connectTimeout = 300ms;
  auto start = Clock::now();
  std::string e = errorOf<TimeoutError>([&] { StoreClient client(c); });
  CHECK(contains(e, "could not connect to the server at 127.0.0.1:" + std::to_string(port) + " within 0.3 s"));
  CHECK(contains(e, "connection refused"));
  CHECK(secondsSince(start) >= 0.29);
  CHECK(secondsSince(start) < 3.0);
}

TEST_CASE("a client that knows who serves the store names it beside the address") {
  uint16_t port = unusedPort();
  StoreClient::Config c = clientConfig(port);
  c.connectTimeout = 300ms;
  c.serverName = "rank 0";
  std::string e = errorOf<TimeoutError>([&] { StoreClient client(c); });
  CHECK(contains(e, "could not connect to the server at 127.0.0.1:" + std::to_string(port) + " (rank 0) within 0.3 s"));
  // The agent's clients are configured so.
  Options o;
  o.masterPort = port;
  CHECK(StoreClient::configFor(o).serverName == "rank 0");
}

TEST_CASE("a second server on a port in use fails with an error naming the address") {
  StoreServer server(serverConfig());
  StoreServer::Config c = serverConfig();
  c.port = server.port();
  std::string e = errorOf<Error>([&] { StoreServer second(c); });
  CHECK(contains(e, "cannot listen on 127.0.0.1:" + std::to_string(server.port())));
  CHECK(contains(e, "address already in use"));
  StoreClient client(clientConfig(server.port()));  // the first one still serves
  client.set("k", "v");
}

TEST_CASE("a server with a token refuses clients without it, with a clear error on both sides") {
  StoreServer::Config c = serverConfig();
  c.token = "s3cret";
  StoreServer server(c);
  StoreClient::Config cc = clientConfig(server.port());
  cc.connectTimeout = 30s;

  auto start = Clock::now();
  StderrCapture log;
  std::string none = errorOf<ProtocolError>([&] { StoreClient client(cc); });
  cc.token = "wrong";
  std::string wrong = errorOf<ProtocolError>([&] { StoreClient client(cc); });
  std::string serverLog = log.text();
  CHECK(secondsSince(start) < 5.0);  // a refusal is final: no retrying until the connect timeout
  CHECK(contains(none, "refused the connection: authentication failed: the client sent no token"));
  CHECK(contains(wrong, "authentication failed: the client's token differs"));
  CHECK_FALSE(contains(wrong, "s3cret"));
  CHECK(countLines(serverLog, "store: refusing the connection from 127.0.0.1") == 2);

  cc.token = "s3cret";
  StoreClient client(cc);
  client.set("k", "v");
  CHECK(client.get("k") == "v");
}

TEST_CASE("a hello with another protocol version is answered with a protocol error, then closed") {
  StoreServer server(serverConfig());
  RawSocket raw(server.port());
  raw.send(helloFrame("", 99));
  std::optional<std::string> body = raw.readFrame(5s);
  REQUIRE(body.has_value());
  Reply reply = parseReply(*body);
  CHECK(reply.status == static_cast<int>(StatusCode::Protocol));
  CHECK(contains(reply.payload, "version 99"));
  CHECK(raw.closedWithin(5s));
}

// ---- hostile input -------------------------------------------------------------------

TEST_CASE("malformed bytes close that connection with one log line, and the server keeps serving") {
  weft::testing::EveryLineLogged all;  // one line per case, however many cases come from this one address
  store::Limits limits;
  limits.maxValueBytes = 1024;
  StoreServer server(serverConfig(limits));
  StoreClient client(clientConfig(server.port()));
  client.set("before", "1");
  using store::FrameWriter;
  using store::Op;
  auto op = [](Op o) { return static_cast<uint8_t>(o); };

  struct Case {
    const char* name;
    bool afterHello;
    std::string bytes;
  };
  std::string runaway = FrameWriter(1, op(Op::Set)).u32(1000).finish();  // a key of 1000 bytes, none sent
  std::vector<Case> cases = {
      {"text instead of frames", false, "GET / HTTP/1.1\r\nHost: store\r\n\r\n"},
      {"a length prefix claiming 4 GiB", false, std::string("\xff\xff\xff\xff", 4) + "data"},
      {"a frame shorter than its header", false, std::string("\x03\x00\x00\x00", 4) + "abc"},
      {"a request before the hello", false, FrameWriter(1, op(Op::Set)).str("k").str("v").finish()},
      {"a hello with the wrong magic", false, helloFrame("", store::kVersion, 0xdeadbeef)},
      {"an unknown op", true, FrameWriter(1, 200).finish()},
      {"a key above the limit", true, FrameWriter(1, op(Op::Set)).str(std::string(5000, 'k')).str("v").finish()},
      {"a value above the limit", true, FrameWriter(1, op(Op::Set)).str("k").str(std::string(2000, 'v')).finish()},
      {"a string running past the end of its frame", true, runaway},
      {"bytes after the payload", true, FrameWriter(1, op(Op::NumKeys)).u8(7).finish()},
      {"a second hello", true, helloFrame()},
      {"a wait announcing a billion keys", true, FrameWriter(1, op(Op::Wait)).u32(1000000000).u64(0).finish()},
      {"a truncated add", true, FrameWriter(1, op(Op::Add)).str("k").u32(1).finish()},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    uint64_t droppedBefore = server.stats().droppedConnections;
    StderrCapture log;
    {
      RawSocket raw(server.port());
      if (c.afterHello) raw.handshake();
      raw.send(c.bytes);
      CHECK(raw.closedWithin(5s));
    }
    std::string text = log.text();
    CHECK(countLines(text, "store: closing the connection from 127.0.0.1") == 1);
    CHECK(server.stats().droppedConnections == droppedBefore + 1);
    CHECK(client.get("before") == "1");
  }
  CHECK(client.add("after", 1) == 1);
}

TEST_CASE("random bytes on many connections never stop the server, which logs a few lines and a summary") {
  auto owned = std::make_unique<StoreServer>(serverConfig());
  StoreServer& server = *owned;
  auto client = std::make_unique<StoreClient>(clientConfig(server.port()));
  StderrCapture quiet;
  std::srand(7);
  for (int i = 0; i < 200; ++i) {
    RawSocket raw(server.port());
    bool hello = i % 2 == 0;
    if (hello) raw.handshake();
    std::string junk(static_cast<size_t>(std::rand() % 64 + 1), '\0');
    for (char& ch : junk) ch = static_cast<char>(std::rand());
    // Half the time a plausible length prefix, so the junk reaches the parser.
    if (i % 4 < 2 && junk.size() >= 4) {
      uint32_t len = static_cast<uint32_t>(junk.size() - 4);
      for (int b = 0; b < 4; ++b) junk[static_cast<size_t>(b)] = static_cast<char>(len >> (8 * b));
    }
    raw.send(junk);
  }
  CHECK(eventually([&] { return server.stats().connections == 1; }));
  client->set("alive", "yes");
  CHECK(client->get("alive") == "yes");
  // Each dropped connection is one line or one count in a summary (the last written as the
  // server closes), and the lines are a few: not one per connection.
  uint64_t dropped = server.stats().droppedConnections;
  client.reset();
  owned.reset();
  std::string text = quiet.text();
  size_t shown = countLines(text, "store: closing the connection from 127.0.0.1") +
                 countLines(text, "store: refusing the connection from 127.0.0.1");
  uint64_t held = weft::testing::heldBack(text, "store", "127.0.0.1");
  INFO(text);
  CHECK(dropped > 100);
  CHECK(shown <= 3);
  CHECK(shown + held == dropped);
}

TEST_CASE("a silent connection is closed after the hello timeout, a stalled frame after the frame timeout") {
  store::Limits limits;
  limits.helloTimeout = 300ms;
  limits.frameTimeout = 300ms;
  StoreServer server(serverConfig(limits));
  StderrCapture log;
  auto start = Clock::now();
  RawSocket silent(server.port());
  RawSocket stalled(server.port());
  stalled.handshake();
  stalled.send(store::FrameWriter(1, static_cast<uint8_t>(store::Op::Set)).str("k").str("v").finish().substr(0, 10));
  RawSocket idle(server.port());  // through the hello, nothing pending: may stay
  idle.handshake();
  CHECK(silent.closedWithin(5s));
  CHECK(stalled.closedWithin(5s));
  CHECK(secondsSince(start) >= 0.29);
  CHECK_FALSE(idle.closedWithin(500ms));
  std::string text = log.text();
  CHECK(countLines(text, "no hello within 0.3 s") == 1);
  CHECK(countLines(text, "a request stayed incomplete for 0.3 s") == 1);
}

TEST_CASE("a flood of idle connections does not stop the server serving others") {
  StoreServer server(serverConfig());
  std::vector<std::unique_ptr<RawSocket>> flood;
  for (int i = 0; i < 300; ++i) flood.push_back(std::make_unique<RawSocket>(server.port()));
  auto start = Clock::now();
  StoreClient client(clientConfig(server.port()));
  for (int i = 0; i < 100; ++i) client.add("n", 1);
  CHECK(client.get("n") == "100");
  CHECK(secondsSince(start) < 5.0);
  CHECK(server.stats().connections == 301);
  flood.clear();
  CHECK(eventually([&] { return server.stats().connections == 1; }));
}

TEST_CASE("beyond the connection limit new connections are closed, and serving resumes as the flood times out") {
  weft::testing::EveryLineLogged all;  // one line per timed-out connection
  store::Limits limits;
  limits.maxConnections = 16;
  limits.helloTimeout = 500ms;
  StoreServer server(serverConfig(limits));
  StderrCapture log;
  std::vector<std::unique_ptr<RawSocket>> flood;
  for (int i = 0; i < 16; ++i) flood.push_back(std::make_unique<RawSocket>(server.port()));
  RawSocket extra(server.port());
  CHECK(extra.closedWithin(5s));
  auto start = Clock::now();
  StoreClient client(clientConfig(server.port()));  // retries until the idle ones are dropped
  client.set("k", "v");
  CHECK(secondsSince(start) < 5.0);
  std::string text = log.text();
  CHECK(countLines(text, "connections are open, the limit") >= 1);
  CHECK(countLines(text, "no hello within 0.5 s") == 16);
}

TEST_CASE("a client that does not read its replies is disconnected once its backlog passes the limit") {
  store::Limits limits;
  limits.maxWriteBacklogBytes = 1u << 20;
  StoreServer server(serverConfig(limits));
  StoreClient client(clientConfig(server.port()));
  client.set("big", std::string(256 * 1024, 'b'));
  StderrCapture log;
  RawSocket greedy(server.port(), 4096);
  greedy.handshake();
  std::string requests;
  for (uint64_t i = 1; i <= 200; ++i) {
    requests += store::FrameWriter(i, static_cast<uint8_t>(store::Op::Get)).str("big").u64(0).finish();
  }
  greedy.send(requests);
  CHECK(eventually([&] { return server.stats().droppedConnections == 1; }));
  CHECK(countLines(log.text(), "it does not read its replies") == 1);
  CHECK(client.get("big").size() == 256 * 1024);
}

// ---- reconnection ----------------------------------------------------------------------

namespace {

// A TCP relay between store clients and a server, which a test uses to break
// the path the way a network partition does: black-hole it (nothing crosses,
// new connections wait unanswered), drop what the server sends, or cut the
// clients' connections (as their kernel does once its retransmission timeout
// passes) while the server's side stays open and silent. Serves on a thread
// of its own; every method returns once the relay thread has applied it.
class TcpRelay {
 public:
  explicit TcpRelay(uint16_t upstream) : upstream_(upstream) {
    listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(listenFd_ >= 0);
    sockaddr_in a = loopback(0);
    REQUIRE(::bind(listenFd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listenFd_, 64) == 0);
    socklen_t len = sizeof a;
    ::getsockname(listenFd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~TcpRelay() {
    stop_ = true;
    thread_.join();
    for (Pair& p : pairs_) closePair(p);
    for (int fd : silent_) ::close(fd);
    ::close(listenFd_);
  }
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  uint16_t port() const { return port_; }

  void blackhole(bool on) {
    apply([&] { blackhole_ = on; });
  }
  void dropReplies(bool on) {
    apply([&] { dropReplies_ = on; });
  }
  // Where connections accepted from now on are relayed.
  void setUpstream(uint16_t port) {
    apply([&] { upstream_ = port; });
  }
  // Closes the client side of every relayed connection; the server side is
  // kept open and never read or written again.
  void cutClients() {
    apply([&] {
      for (Pair& p : pairs_) {
        ::close(p.client);
        silent_.push_back(p.server);
      }
      pairs_.clear();
    });
  }

 private:
  struct Pair {
    int client = -1;
    int server = -1;
    std::string toServer;
    std::string toClient;
  };

  static sockaddr_in loopback(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }

  // Runs change on the relay thread and waits for it.
  template <class F>
  void apply(F change) {
    std::unique_lock<std::mutex> lock(mutex_);
    command_ = change;
    done_.wait(lock, [&] { return !command_; });
  }

  static void closePair(Pair& p) {
    ::close(p.client);
    ::close(p.server);
  }

  // Sends what the socket takes now; false when the peer is gone.
  static bool flush(int fd, std::string& out) {
    while (!out.empty()) {
      ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
      out.erase(0, static_cast<size_t>(n));
    }
    return true;
  }

  void run() {
    while (!stop_) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (command_) {
          command_();
          command_ = nullptr;
          done_.notify_all();
        }
      }
      std::vector<pollfd> fds;
      if (!blackhole_) {
        fds.push_back({listenFd_, POLLIN, 0});
        for (const Pair& p : pairs_) {
          fds.push_back({p.client, static_cast<short>(POLLIN | (p.toClient.empty() ? 0 : POLLOUT)), 0});
          fds.push_back({p.server, static_cast<short>(POLLIN | (p.toServer.empty() ? 0 : POLLOUT)), 0});
        }
      }
      if (::poll(fds.data(), fds.size(), 5) <= 0) {
        if (blackhole_) std::this_thread::sleep_for(5ms);
        continue;
      }
      if (fds[0].revents & POLLIN) {
        int client = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (client >= 0) {
          int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          sockaddr_in a = loopback(upstream_);
          if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
            pairs_.push_back({client, server, "", ""});
          } else {
            ::close(server);
            ::close(client);
          }
        }
      }
      std::vector<bool> broken(pairs_.size(), false);
      char buf[65536];
      for (size_t i = 0; i < pairs_.size() && 1 + 2 * i + 1 < fds.size(); ++i) {
        Pair& p = pairs_[i];
        const pollfd& c = fds[1 + 2 * i];
        const pollfd& s = fds[2 + 2 * i];
        if (c.revents & (POLLIN | POLLHUP | POLLERR)) {
          ssize_t n = ::recv(p.client, buf, sizeof buf, MSG_DONTWAIT);
          if (n > 0) p.toServer.append(buf, static_cast<size_t>(n));
          if (n == 0 || (n < 0 && errno != EAGAIN)) broken[i] = true;
        }
        if (s.revents & (POLLIN | POLLHUP | POLLERR)) {
          ssize_t n = ::recv(p.server, buf, sizeof buf, MSG_DONTWAIT);
          if (n > 0 && !dropReplies_) p.toClient.append(buf, static_cast<size_t>(n));
          if (n == 0 || (n < 0 && errno != EAGAIN)) broken[i] = true;
        }
        if (!flush(p.server, p.toServer) || !flush(p.client, p.toClient)) broken[i] = true;
      }
      for (size_t i = pairs_.size(); i-- > 0;) {
        if (!broken[i]) continue;
        closePair(pairs_[i]);
        pairs_.erase(pairs_.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
  }

  uint16_t upstream_;
  int listenFd_ = -1;
  uint16_t port_ = 0;
  bool blackhole_ = false;    // relay thread only (set through apply)
  bool dropReplies_ = false;  // relay thread only
  std::vector<Pair> pairs_;   // relay thread only, until joined
  std::vector<int> silent_;   // server sides of cut connections
  std::mutex mutex_;
  std::condition_variable done_;
  std::function<void()> command_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

StoreClient::Config relayedConfig(const TcpRelay& relay, milliseconds timeout, milliseconds reconnectWithin) {
  StoreClient::Config c = clientConfig(relay.port(), timeout);
  c.connectTimeout = reconnectWithin;
  return c;
}

}  // namespace

TEST_CASE("calls in flight when a partition cuts the connection complete once it heals") {
  StoreServer server(serverConfig());
  TcpRelay relay(server.port());
  StoreClient client(relayedConfig(relay, 30s, 30s));
  StoreClient direct(clientConfig(server.port()));
  client.set("before", "1");

  relay.blackhole(true);
  Future<void> set = client.setAsync("k", "v");
  Future<int64_t> add = client.addAsync("n", 5);
  Future<std::string> cas = client.compareSetAsync("slot", "", "mine");
  Future<std::string> get = client.getAsync("later", 20s);
  Future<void> wait = client.waitAsync({"later", "k"}, 0ms);
  std::this_thread::sleep_for(200ms);
  relay.cutClients();  // the partition outlasts the kernel's patience: the connection is lost
  // Reconnection attempts vanish into the partition meanwhile.
  std::this_thread::sleep_for(1500ms);
  CHECK_FALSE(client.connected());
  for (bool ready : {set.isReady(), add.isReady(), cas.isReady(), get.isReady(), wait.isReady()}) CHECK_FALSE(ready);
  CHECK(direct.check({"before"}));
  CHECK_FALSE(direct.check({"k"}));

  relay.blackhole(false);
  direct.set("later", "L");
  CHECK_NOTHROW(set.get());
  CHECK(add.get() == 5);
  CHECK(cas.get() == "mine");
  CHECK(get.get() == "L");
  CHECK_NOTHROW(wait.get());
  CHECK(client.connected());
  CHECK(direct.get("k") == "v");
  CHECK(direct.get("n") == "5");
  // The server closed the connection the partition had left open on its side
  // when the client came back: only the direct client's and the new one remain.
  CHECK(eventually([&] { return server.stats().connections == 2; }));
  CHECK(client.add("n", 1) == 6);
}

TEST_CASE("updates whose replies were lost are applied exactly once when sent again") {
  StoreServer server(serverConfig());
  TcpRelay relay(server.port());
  StoreClient client(relayedConfig(relay, 30s, 30s));
  StoreClient direct(clientConfig(server.port()));
  direct.set("gone", "x");

  relay.dropReplies(true);
  Future<int64_t> add = client.addAsync("n", 1);
  Future<void> set = client.setAsync("k", "mine");
  Future<std::string> cas = client.compareSetAsync("slot", "", "A");
  Future<bool> del = client.deleteKeyAsync("gone");
  // All four reached the server; their replies did not reach the client.
  CHECK(eventually([&] {
    return direct.check({"n", "k", "slot"}) && !direct.check({"gone"});
  }));
  // Others change the same keys before the client's retries arrive: a retry
  // applied again would undo these.
  direct.set("k", "theirs");
  CHECK(direct.compareSet("slot", "A", "B") == "B");
  direct.set("gone", "back");
  for (bool ready : {add.isReady(), set.isReady(), cas.isReady(), del.isReady()}) CHECK_FALSE(ready);

  relay.dropReplies(false);
  relay.cutClients();
  CHECK(add.get() == 1);
  CHECK_NOTHROW(set.get());
  CHECK(cas.get() == "A");  // the answer the server gave the first time
  CHECK(del.get());
  CHECK(direct.get("n") == "1");
  CHECK(direct.get("k") == "theirs");
  CHECK(direct.get("slot") == "B");
  CHECK(direct.get("gone") == "back");
  CHECK(client.add("n", 1) == 2);
  // Once settled, the server forgets the replies it kept for retries.
  CHECK(client.add("n", 1) == 3);
  CHECK(server.stats().keptReplies <= 2);
}

TEST_CASE("a partition longer than a call's deadline fails it with DisconnectedError naming the server and the time") {
  StoreServer server(serverConfig());
  TcpRelay relay(server.port());
  StoreClient client(relayedConfig(relay, 1500ms, 4s));
  const std::string where = "lost the connection to the server at 127.0.0.1:" + std::to_string(relay.port());
  relay.blackhole(true);
  auto start = Clock::now();
  Future<void> set = client.setAsync("k", "v");
  Future<std::string> forever = client.getAsync("never", 0ms);  // no deadline of its own
  relay.cutClients();

  std::string e = errorOf<DisconnectedError>([&] { set.get(); });
  CHECK(secondsSince(start) >= 1.45);
  CHECK(secondsSince(start) < 10.0);
  CHECK(contains(e, where + " while waiting for set('k'): the connection was lost "));
  CHECK(contains(e, "), and reconnecting has not succeeded within the call's 1.5 s (1 attempt(s))"));

  // The reconnection itself gives up after connectTimeout: the call without
  // a deadline fails then, and later calls fail at once.
  e = errorOf<DisconnectedError>([&] { forever.get(); });
  CHECK(secondsSince(start) >= 3.9);
  CHECK(secondsSince(start) < 15.0);
  CHECK(contains(e, where + " while waiting for get('never'): the connection was lost "));
  CHECK(contains(e, "and reconnecting did not succeed within 4.0 s ("));
  CHECK(contains(e, "attempt(s); last error: no answer to the hello within 2.0 s)"));
  CHECK_FALSE(client.connected());
  auto before = Clock::now();
  e = errorOf<DisconnectedError>([&] { client.set("k", "v"); });
  CHECK(secondsSince(before) < 1.0);
  CHECK(contains(e, "not connected to the server at 127.0.0.1:" + std::to_string(relay.port())));
  relay.blackhole(false);
}

TEST_CASE("a client that reconnects to a restarted server fails its calls: what the store held is gone") {
  auto first = std::make_unique<StoreServer>(serverConfig());
  TcpRelay relay(first->port());
  StoreClient client(relayedConfig(relay, 30s, 30s));
  client.set("k", "v");
  StoreServer second(serverConfig());
  relay.setUpstream(second.port());
  Future<std::string> get = client.getAsync("never", 10s);
  CHECK(eventually([&] { return first->stats().waiters == 1; }));
  relay.cutClients();
  std::string e = errorOf<DisconnectedError>([&] { get.get(); });
  CHECK(contains(e, "the server that answered the reconnection is another one (the store was restarted"));
  CHECK_FALSE(client.connected());
}

TEST_CASE("the server answers an update repeated by a reconnected client from the reply it kept") {
  StoreServer server(serverConfig());
  using store::FrameWriter;
  using store::Op;
  auto add = [](uint64_t id, int64_t delta, uint64_t settled) {
    return FrameWriter(id, static_cast<uint8_t>(Op::Add)).str("n").i64(delta).u64(settled).finish();
  };
  auto value = [](const std::optional<std::string>& body) {
    REQUIRE(body.has_value());
    Reply r = parseReply(*body);
    REQUIRE(r.status == 0);
    store::BodyReader reader(r.payload.data(), r.payload.size());
    return reader.i64("value");
  };
  constexpr uint64_t kClient = 77;
  RawSocket first(server.port());
  first.handshake("", kClient);
  first.send(add(7, 1, 7));
  CHECK(value(first.readFrame(5s)) == 1);

  RawSocket again(server.port());
  again.handshake("", kClient);
  CHECK(first.closedWithin(5s));  // the older connection of the same client is closed
  again.send(add(7, 1, 7));       // the same request again: answered, not applied
  CHECK(value(again.readFrame(5s)) == 1);
  again.send(add(8, 1, 8));
  CHECK(value(again.readFrame(5s)) == 2);

  RawSocket other(server.port());  // another client's ids are its own
  other.handshake("", kClient + 1);
  other.send(add(7, 10, 7));
  CHECK(value(other.readFrame(5s)) == 12);
  CHECK(server.stats().knownClients == 2);
  CHECK(server.stats().keptReplies == 2);  // request 8 of one client, request 7 of the other

  // settled = 9: the reply to 8 is forgotten, so a late copy of 8 is applied.
  again.send(add(9, 1, 9));
  CHECK(value(again.readFrame(5s)) == 13);
  again.send(add(8, 1, 10));
  CHECK(value(again.readFrame(5s)) == 14);
}

// ---- shutdown and failures -------------------------------------------------------------

TEST_CASE("closing the server fails pending client calls with DisconnectedError promptly, and later calls at once") {
  auto server = std::make_unique<StoreServer>(serverConfig());
  const uint16_t port = server->port();
  StoreClient client(clientConfig(port));
  auto pending = std::async(std::launch::async, [&] {
    return errorOf<DisconnectedError>([&] { client.get("never", 60s); });
  });
  Future<void> waiting = client.waitAsync({"never", "also-never"}, 0ms);
  CHECK(eventually([&] { return server->stats().waiters == 2; }));
  auto closedAt = Clock::now();
  server->close();
  REQUIRE(pending.wait_for(5s) == std::future_status::ready);
  CHECK(secondsSince(closedAt) < 2.0);
  std::string e = pending.get();
  // The client tries to reconnect once; the refusal tells it the server is gone.
  CHECK(contains(e, "lost the connection to the server at 127.0.0.1:" + std::to_string(port) +
                        " while waiting for get('never')"));
  CHECK(contains(e, "(the server closed the connection), and reconnecting was refused"));
  CHECK_THROWS_AS(waiting.get(), DisconnectedError);
  CHECK(eventually([&] { return !client.connected(); }));
  auto start = Clock::now();
  e = errorOf<DisconnectedError>([&] { client.set("k", "v"); });
  CHECK(secondsSince(start) < 1.0);
  CHECK(contains(e, "cannot set('k'): not connected to the server at 127.0.0.1:"));
  server.reset();  // close() twice is fine
}

TEST_CASE("closing a client fails its pending calls with CancelledError and frees its waiters on the server") {
  StoreServer server(serverConfig());
  auto client = std::make_unique<StoreClient>(clientConfig(server.port()));
  Future<std::string> got = client->getAsync("never", 0ms);
  Future<void> barrier = client->barrierAsync("b", 2, 0ms);
  CHECK(eventually([&] { return server.stats().waiters == 2; }));
  client->close();
  CHECK_THROWS_AS(got.get(), CancelledError);
  CHECK_THROWS_AS(barrier.get(), CancelledError);
  CHECK_THROWS_AS(client->set("k", "v"), DisconnectedError);
  client.reset();
  CHECK(eventually([&] { return server.stats().waiters == 0 && server.stats().connections == 0; }));
}

namespace {

// A server that accepts the Hello and then never answers: the client's own
// reply deadline must fail the call.
class MuteServer {
 public:
  MuteServer() {
    listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listenFd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listenFd_, 4) == 0);
    socklen_t len = sizeof a;
    ::getsockname(listenFd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~MuteServer() {
    stop_ = true;
    thread_.join();
    ::close(listenFd_);
  }
  uint16_t port() const { return port_; }

 private:
  void serve() {
    int fd = -1;
    std::string in;
    bool answered = false;
    while (!stop_) {
      pollfd p{fd < 0 ? listenFd_ : fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      if (fd < 0) {
        fd = ::accept(listenFd_, nullptr, nullptr);
        continue;
      }
      char buf[4096];
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      in.append(buf, static_cast<size_t>(n));
      if (!answered && in.size() >= 4 && in.size() >= 4 + loadU32(in.data())) {
        answered = true;
        std::string reply = store::FrameWriter(0, 0).u32(4096).u32(1024).u32(16).u64(1).finish();
        ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
      }
    }
    if (fd >= 0) ::close(fd);
  }

  int listenFd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE("a call the server never answers fails with TimeoutError after the client's timeout") {
  MuteServer mute;
  StoreClient client(clientConfig(mute.port(), 300ms));
  CHECK(client.maxValueBytes() == 1024);  // the limits announced in the hello reply
  auto start = Clock::now();
  std::string e = errorOf<TimeoutError>([&] { client.set("k", "v"); });
  CHECK(contains(e, "did not answer set('k') within 0.3 s"));
  CHECK(secondsSince(start) >= 0.29);
  CHECK(secondsSince(start) < 3.0);
  CHECK(client.connected());  // a slow server is not a lost one
}

TEST_CASE("server and client can share one event loop, whose thread runs their continuations") {
  UvLoop loop("shared-loop");
  {
    StoreServer server(serverConfig(), &loop);
    StoreClient client(clientConfig(server.port()), &loop);
    std::atomic<bool> onLoop{false};
    Future<size_t> size = client.getAsync("k", 5s).then([&](const std::string& v) {
      onLoop = loop.inLoopThread();
      return v.size();
    });
    client.set("k", "four");
    CHECK(size.get() == 4);
    CHECK(onLoop.load());
    // A continuation may issue further requests (never block) on the loop thread.
    Future<int64_t> chained = client.addAsync("n", 1).then([&](int64_t) { return client.addAsync("n", 10); });
    CHECK(chained.get() == 11);
    CHECK(server.stats().connections == 1);
  }
  loop.stop();
}
