// A peer that goes away mid-call or under a writer, graceful shutdown with calls in flight
// and its barrier (every worker stays a member until all have joined, a worker dying in it
// fails it promptly), and abrupt shutdown. Every wait is bounded.
#include "rpc/agent_functions.h"

// ---- failures and shutdown ---------------------------------------------------------------------

TEST_CASE("a peer shut down abruptly mid-call fails that call with DisconnectedError promptly, and the rest keep "
          "working") {
  AgentGroup g(3, [](int, Options& o) { o.shutdownTimeout = 3s; });
  Gate gate;
  g.agent(2).registry().impl(hold, [&gate](int32_t v) {
    gate.wait();
    return v;
  });
  for (int r = 0; r < 3; ++r) bindEcho(g.agent(r).registry(), echoI32);
  g.start();

  Future<int32_t> pending = g.agent(0).callAsync(2, hold, 1);
  REQUIRE(eventually([&] { return stats(g, 2).activeIncoming == 1; }, 2s));

  auto t0 = Clock::now();
  ShutdownReport victimReport;
  std::thread stopper([&] { victimReport = g.agent(2).shutdown({.graceful = false}); });
  bool failedInTime = pending.waitFor(2s);
  double took = secondsSince(t0);
  gate.open();
  stopper.join();
  REQUIRE(failedInTime);
  MESSAGE("pending call failed " << took * 1000 << " ms after the peer's shutdown began");
  CHECK(took < 2.0);
  CHECK(contains(messageOf<DisconnectedError>([&] { pending.get(); }), "worker2"));
  CHECK_FALSE(victimReport.graceful);

  // Later calls to it fail at once.
  t0 = Clock::now();
  CHECK_THROWS_AS(g.agent(0).call(2, echoI32, 1), DisconnectedError);
  CHECK(secondsSince(t0) < 0.2);
  CHECK_FALSE(g.agent(0).isAlive(2));
  CHECK(eventually([&] { return !g.agent(1).isAlive(2); }, 2s));
  CHECK_THROWS_AS(g.agent(1).call("worker2", echoI32, 1), DisconnectedError);

  // The others are unaffected.
  CHECK(g.agent(0).isAlive(1));
  CHECK(g.agent(0).call(1, echoI32, 5) == 5);
  CHECK(g.agent(1).call(0, echoI32, 6) == 6);

  // Their graceful shutdown names the one that left and does not wait for it.
  t0 = Clock::now();
  std::vector<ShutdownReport> reports(2);
  std::thread s0([&] { reports[0] = g.agent(0).shutdown(); });
  std::thread s1([&] { reports[1] = g.agent(1).shutdown(); });
  s0.join();
  s1.join();
  CHECK(secondsSince(t0) < 3.5);
  for (auto& r : reports) {
    INFO("missing: " << joined(r.missing));
    CHECK(r.graceful);
    CHECK(r.missing == std::vector<std::string>{"worker2"});
  }
}

namespace {

// Shuts down the sending side of this process's established TCP connections whose local port is
// `port`, as a cable pulled under a writer would: the next write to one fails with EPIPE.
int shutDownWritesOnPort(uint16_t port) {
  int cut = 0;
  DIR* d = ::opendir("/proc/self/fd");
  REQUIRE(d != nullptr);
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    sockaddr_storage local{};
    sockaddr_storage peer{};
    socklen_t len = sizeof local;
    socklen_t peerLen = sizeof peer;
    if (e->d_name[0] == '.' || ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0 ||
        local.ss_family != AF_INET || ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLen) != 0) {
      continue;  // not a connected IPv4 socket
    }
    if (ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port) == port && ::shutdown(fd, SHUT_WR) == 0) ++cut;
  }
  ::closedir(d);
  return cut;
}

}  // namespace

TEST_CASE("a write to a connection cut under the caller fails the call with DisconnectedError, not SIGPIPE") {
  // SIGPIPE's default action ends the process: a caller's thread writing to a connection whose
  // sending side is gone must get EPIPE instead, whatever the program's signal settings.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  struct sigaction previous {};
  REQUIRE(::sigaction(SIGPIPE, &dfl, &previous) == 0);
  // The write races the loop thread noticing the cut from the other side; a few rounds make sure
  // that the caller's write meets it.
  for (int round = 0; round < 5; ++round) {
    const uint16_t port0 = weft::testing::freePort();
    AgentGroup g(2, [port0](int r, Options& o) {
      o.shutdownTimeout = 1s;
      if (r == 0) o.listenPort = port0;
    });
    for (int r = 0; r < 2; ++r) bindEcho(g.agent(r).registry(), echoI32);
    g.start();
    REQUIRE(g.agent(0).call(1, echoI32, 7) == 7);
    // worker0's end of its connection with worker1 (accepted on worker0's listening port).
    REQUIRE(shutDownWritesOnPort(port0) == 1);
    // The frame is written by this thread (nothing is queued on the connection).
    Future<int32_t> call = g.agent(0).callAsync(1, echoI32, 8);
    REQUIRE(call.waitFor(5s));
    CHECK_THROWS_AS(call.get(), DisconnectedError);
    for (int r = 0; r < 2; ++r) g.agent(r).shutdown({.graceful = false});
  }
  ::sigaction(SIGPIPE, &previous, nullptr);
}

TEST_CASE("a graceful shutdown begun with calls in flight lets them all complete") {
  AgentGroup g(3);
  for (int r = 0; r < 3; ++r) bindSlow(g.agent(r).registry());
  g.start();

  std::vector<Future<int32_t>> inFlight;
  std::vector<int32_t> want;
  for (int from = 0; from < 3; ++from) {
    for (int i = 0; i < 3; ++i) {
      int32_t tag = from * 10 + i;
      inFlight.push_back(g.agent(from).callAsync((from + 1) % 3, slow, 200, tag));
      want.push_back(tag);
    }
  }
  auto t0 = Clock::now();
  std::vector<ShutdownReport> reports = g.shutdownAll();
  double took = secondsSince(t0);
  CHECK(took < 5.0);
  for (auto& r : reports) {
    CHECK(r.graceful);
    CHECK(r.clean());
  }
  std::vector<int32_t> got;
  for (auto& f : inFlight) {
    REQUIRE(f.isReady());  // the barrier waited for them
    if (f.hasError()) {
      FAIL_CHECK("a call in flight failed: " << f.status());
      got.push_back(-1);
    } else {
      got.push_back(f.get());
    }
  }
  CHECK(got == want);
  CHECK(took >= 0.19);  // each callee's slow bodies were still running when shutdown began
  for (int r = 0; r < 3; ++r) {
    CHECK(stats(g, r).pendingOutgoing == 0);
    CHECK(stats(g, r).activeIncoming == 0);
  }
  // shutdown is idempotent.
  CHECK(g.agent(0).shutdown().clean());
}

TEST_CASE("a worker in shutdown stays a full member of the job until every worker has joined: it serves, and its "
          "threads may call out") {
  AgentGroup g(2);
  for (int r = 0; r < 2; ++r) bindEcho(g.agent(r).registry(), echoI32);
  g.start();

  ShutdownReport r1;
  std::atomic<bool> left{false};
  std::thread leaving([&] {
    r1 = g.agent(1).shutdown();
    left = true;
  });
  // worker1 is in its shutdown (it waits for worker0 there); worker0 is not. Both directions work.
  for (int32_t i = 0; i < 20; ++i) {
    CHECK(g.agent(0).call(1, echoI32, i) == i);
    CHECK(g.agent(1).call(0, echoI32, i) == i);
    std::this_thread::sleep_for(10ms);
  }
  CHECK_FALSE(left.load());
  ShutdownReport r0 = g.agent(0).shutdown();
  leaving.join();
  CHECK(r0.clean());
  CHECK(r1.clean());
  // Once the job has ended, neither makes calls.
  CHECK_THROWS_AS(g.agent(1).call(0, echoI32, 1), StateError);
}

TEST_CASE("a graceful shutdown waits, past its timeout, for a live worker that is still working: no cliff") {
  // The timeout bounds only the drain after every worker has joined.
  AgentGroup g(3, [](int, Options& o) { o.shutdownTimeout = 300ms; });
  for (int r = 0; r < 3; ++r) bindEcho(g.agent(r).registry(), echoI32);
  g.start();

  auto t0 = Clock::now();
  std::vector<ShutdownReport> reports(3);
  std::atomic<int> left{0};
  std::thread s0([&] {
    reports[0] = g.agent(0).shutdown();
    ++left;
  });
  std::thread s1([&] {
    reports[1] = g.agent(1).shutdown();
    ++left;
  });
  // worker2 keeps working with both for ten times their shutdown timeout.
  int64_t sum = 0;
  int64_t want = 0;
  for (int32_t i = 0; secondsSince(t0) < 3.0; ++i) {
    sum += g.agent(2).call(i % 2, echoI32, i);
    want += i;
    std::this_thread::sleep_for(5ms);
  }
  CHECK(sum == want);
  CHECK(left.load() == 0);
  auto t1 = Clock::now();
  reports[2] = g.agent(2).shutdown();
  s0.join();
  s1.join();
  CHECK(secondsSince(t1) < 5.0);  // once the last worker joined, nothing is waited for
  for (auto& r : reports) {
    INFO("missing: " << joined(r.missing));
    CHECK(r.graceful);
    CHECK(r.clean());
  }
}

TEST_CASE("a worker that dies while others wait in the shutdown barrier fails it promptly on each, naming it") {
  // waiting: the ranks in the barrier when rank `victim` is lost; the others are still working and
  // learn of it from those that leave (their later shutdown names the victim, not them).
  struct Case {
    std::vector<int> waiting;
    int victim;
  };
  for (const Case& c : {Case{{0, 1}, 2}, Case{{1, 2}, 3}, Case{{0, 1, 2}, 3}}) {
    CAPTURE(c.victim);
    CAPTURE(c.waiting.size());
    AgentGroup g(4, [](int, Options& o) { o.shutdownTimeout = 30s; });
    for (int r = 0; r < 4; ++r) bindEcho(g.agent(r).registry(), echoI32);
    g.start();
    const std::string victimName = "worker" + std::to_string(c.victim);

    std::vector<ShutdownReport> reports(4);
    std::array<std::atomic<double>, 4> leftAt;
    for (auto& a : leftAt) a = -1;
    auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int r : c.waiting) {
      threads.emplace_back([&, r] {
        reports[static_cast<size_t>(r)] = g.agent(r).shutdown();
        leftAt[static_cast<size_t>(r)] = secondsSince(t0);
      });
    }
    std::this_thread::sleep_for(500ms);
    for (int r : c.waiting) CHECK(leftAt[static_cast<size_t>(r)] < 0);  // still waiting
    double lostAt = secondsSince(t0);
    g.agent(c.victim).shutdown({.graceful = false});  // its connections close, as when it dies
    for (auto& t : threads) t.join();
    for (int r : c.waiting) {
      CAPTURE(r);
      MESSAGE("rank " << r << " left the barrier " << (leftAt[static_cast<size_t>(r)] - lostAt) * 1000
                      << " ms after the victim was lost");
      CHECK(leftAt[static_cast<size_t>(r)] - lostAt < 1.0);
      INFO("missing: " << joined(reports[static_cast<size_t>(r)].missing));
      CHECK(reports[static_cast<size_t>(r)].missing == std::vector<std::string>{victimName});
    }
    // A worker that was still working shuts down at once, naming the victim too.
    for (int r = 0; r < 4; ++r) {
      if (r == c.victim || std::count(c.waiting.begin(), c.waiting.end(), r)) continue;
      CAPTURE(r);
      auto t1 = Clock::now();
      ShutdownReport late = g.agent(r).shutdown();
      CHECK(secondsSince(t1) < 2.5);
      INFO("missing: " << joined(late.missing));
      CHECK(late.missing == std::vector<std::string>{victimName});
    }
  }
}

TEST_CASE("an abrupt shutdown fails this side's pending calls with CancelledError") {
  AgentGroup g(2, [](int, Options& o) { o.shutdownTimeout = 2s; });
  Gate gate;
  g.agent(1).registry().impl(hold, [&gate](int32_t v) {
    gate.wait();
    return v;
  });
  g.start();

  Future<int32_t> pending = g.agent(0).callAsync(1, hold, 1);
  REQUIRE(eventually([&] { return stats(g, 1).activeIncoming == 1; }, 2s));
  auto t0 = Clock::now();
  ShutdownReport r0 = g.agent(0).shutdown({.graceful = false});
  CHECK(secondsSince(t0) < 1.0);
  CHECK_FALSE(r0.graceful);
  REQUIRE(pending.waitFor(1s));
  CHECK_THROWS_AS(pending.get(), CancelledError);
  CHECK(g.agent(0).stats().pendingOutgoing == 0);

  // The other side learns the peer is gone, and its own shutdown reports it.
  CHECK(eventually([&] { return !g.agent(1).isAlive(0); }, 2s));
  gate.open();
  t0 = Clock::now();
  ShutdownReport r1 = g.agent(1).shutdown();
  CHECK(secondsSince(t0) < 2.5);
  INFO("missing: " << joined(r1.missing));
  CHECK(r1.missing == std::vector<std::string>{"worker0"});
}
