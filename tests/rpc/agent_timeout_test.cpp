// Calls past their timeout: each fails once with TimeoutError, the callee is told, a late
// reply leaks nothing, cancelled queued calls never run, and the default comes from
// Options::rpcTimeout. Every wait is bounded.
#include "rpc/agent_functions.h"

// ---- timeouts --------------------------------------------------------------------------------------

TEST_CASE("a call past its timeout fails with TimeoutError, the callee is told, and the late reply leaks nothing") {
  AgentGroup g(2);
  bindSlow(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  auto t0 = Clock::now();
  Future<int32_t> f = a.callAsync(1, slow, {.timeout = 100ms}, 500, 1);
  REQUIRE(f.waitFor(3s));
  double waited = secondsSince(t0);
  CHECK(waited >= 0.095);
  CHECK(waited < 0.45);
  std::string message = messageOf<TimeoutError>([&] { f.get(); });
  CHECK(contains(message, "worker1"));
  CHECK(contains(message, "slow"));
  CHECK(contains(message, "after 0.1"));  // the time waited, in seconds
  CHECK(a.stats().timeouts == 1);
  CHECK(a.stats().pendingOutgoing == 0);

  // The callee hears of the cancel while its body still sleeps.
  CHECK(eventually([&] { return stats(g, 1).cancelsReceived >= 1; }, 1s));
  // A call made meanwhile gets its own reply, not the late one.
  CHECK(a.call(1, slow, 0, 2) == 2);

  // Once the first body has finished, nothing of that call is left on either side.
  CHECK(eventually([&] { return stats(g, 1).activeIncoming == 0; }, 2s));
  // Either the callee dropped the cancelled call's reply, or it sent it and the
  // caller dropped it as late: every reply sent is accounted for (slow(0, 2) is
  // the one other call answered so far).
  CHECK(eventually([&] { return stats(g, 1).callsServed == 1 + stats(g, 0).lateResponses; }, 2s));
  AgentStats caller = stats(g, 0);
  AgentStats callee = stats(g, 1);
  CHECK(caller.pendingOutgoing == 0);
  CHECK(callee.activeIncoming == 0);
  CHECK(caller.lateResponses <= 1);
  CHECK(caller.timeouts == 1);
  CHECK(a.isAlive(1));
  CHECK(a.call(1, slow, 0, 3) == 3);
  // The callee counts a reply once its write returns, which may be after the caller has it.
  CHECK(eventually([&] { return stats(g, 1).callsServed == 2 + stats(g, 0).lateResponses; }, 2s));
}

TEST_CASE("hundreds of calls timing out together each fail once and leave nothing behind") {
  AgentGroup g(2);
  Gate gate;
  std::atomic<int> bodies{0};
  g.agent(1).registry().impl(hold, [&](int32_t v) {
    ++bodies;
    gate.wait();
    return v;
  });
  g.start();
  Agent& a = g.agent(0);

  constexpr int kCalls = 500;
  std::vector<Future<int32_t>> futures;
  for (int i = 0; i < kCalls; ++i) futures.push_back(a.callAsync(1, hold, {.timeout = 50ms}, i));
  int timedOut = 0;
  for (auto& f : futures) {
    REQUIRE(f.waitFor(5s));
    try {
      f.get();
    } catch (const TimeoutError&) {
      ++timedOut;
    } catch (...) {
    }
  }
  CHECK(timedOut == kCalls);
  CHECK(a.stats().timeouts == static_cast<uint64_t>(kCalls));
  CHECK(a.stats().pendingOutgoing == 0);
  CHECK(eventually([&] { return stats(g, 1).cancelsReceived == static_cast<uint64_t>(kCalls); }, 2s));
  // Only calls already running when their cancel came have started their bodies:
  // at most one per pool thread (agentOptions: numWorkerThreads = 2).
  const int started = bodies.load();
  CHECK(started <= 2);

  gate.open();
  CHECK(eventually([&] { return stats(g, 1).activeIncoming == 0; }, 5s));
  CHECK(eventually([&] { return stats(g, 1).callsServed == stats(g, 0).lateResponses; }, 2s));
  // The calls still queued when cancelled were dropped without running.
  CHECK(bodies.load() == started);
  // The connection is as good as new.
  CHECK(a.call(1, hold, {.timeout = 2s}, 7) == 7);
  CHECK(eventually([&] { return quiet(g); }, 2s));
}

TEST_CASE("the default timeout comes from Options::rpcTimeout, and a timeout of 0 means none") {
  AgentGroup g(2, [](int rank, Options& o) {
    if (rank == 0) o.rpcTimeout = 150ms;
  });
  bindSlow(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  auto t0 = Clock::now();
  CHECK_THROWS_AS(a.call(1, slow, 400, 1), TimeoutError);
  double waited = secondsSince(t0);
  CHECK(waited >= 0.14);
  CHECK(waited < 0.38);

  t0 = Clock::now();
  CHECK(a.call(1, slow, {.timeout = 0ms}, 400, 2) == 2);
  CHECK(secondsSince(t0) >= 0.39);
  CHECK(a.call(1, slow, {.timeout = 2s}, 300, 3) == 3);
  CHECK(eventually([&] { return quiet(g); }, 2s));
  CHECK(a.stats().timeouts == 1);
}
