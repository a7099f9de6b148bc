// Many concurrent calls from several threads and agents, chains of nested calls on small
// pools, and errors raised by the callee (exceptions, failed futures, unknown functions or
// workers, calls before start or after shutdown). Every wait is bounded.
#include "rpc/agent_functions.h"

// ---- many calls ----------------------------------------------------------------------------------

TEST_CASE("10,000 concurrent async calls all complete with the right results") {
  AgentGroup g(2);
  g.agent(1).registry().impl(squareOf, [](int64_t v) { return v * v; });
  g.start();
  Agent& a = g.agent(0);

  constexpr int kCalls = 10000;
  std::vector<Future<int64_t>> futures;
  futures.reserve(kCalls);
  auto t0 = Clock::now();
  for (int i = 0; i < kCalls; ++i) futures.push_back(a.callAsync(1, squareOf, int64_t{i} - 5000));
  Future<std::vector<int64_t>> all = whenAll(futures);
  REQUIRE(all.waitFor(30s));
  double seconds = secondsSince(t0);
  MESSAGE("10,000 async calls in " << seconds << " s");
  const std::vector<int64_t>& results = all.get();
  REQUIRE(results.size() == static_cast<size_t>(kCalls));
  int wrong = 0;
  for (int i = 0; i < kCalls; ++i) wrong += results[static_cast<size_t>(i)] != (int64_t{i} - 5000) * (int64_t{i} - 5000);
  CHECK(wrong == 0);
  CHECK(eventually([&] { return quiet(g); }, 2s));
  CHECK(stats(g, 0).callsSent >= static_cast<uint64_t>(kCalls));
  CHECK(stats(g, 1).callsServed >= static_cast<uint64_t>(kCalls));
  CHECK(stats(g, 0).timeouts == 0);
}

TEST_CASE("callers on several threads of several agents get their own results") {
  AgentGroup g(3);
  for (int r = 0; r < 3; ++r) {
    g.agent(r).registry().impl(squareOf, [r](int64_t v) { return v * v + r; });  // + r: who answered
  }
  g.start();

  constexpr int kThreads = 6;
  constexpr int kCallsPerThread = 600;
  std::atomic<int> wrong{0};
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      int from = t % 3;
      Agent& a = g.agent(from);
      std::vector<std::pair<int, Future<int64_t>>> batch;
      for (int i = 0; i < kCallsPerThread; ++i) {
        int to = (from + 1 + i % 2) % 3;
        int64_t v = t * 100000 + i;
        if (i % 5 == 0) {
          try {
            if (a.call(to, squareOf, v) != v * v + to) ++wrong;
          } catch (...) {
            ++wrong;
          }
        } else {
          batch.emplace_back(to, a.callAsync(to, squareOf, v));
        }
      }
      for (size_t k = 0; k < batch.size(); ++k) {
        auto& [to, f] = batch[k];
        if (!f.waitFor(20s) || f.hasError()) {
          ++wrong;
          continue;
        }
        // The calls of a batch were made with i = every index not divisible by 5, in order.
        size_t i = k + k / 4 + 1;
        int64_t v = t * 100000 + static_cast<int64_t>(i);
        if (f.get() != v * v + to) ++wrong;
      }
      ++done;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(done == kThreads);
  CHECK(wrong == 0);
  CHECK(eventually([&] { return quiet(g); }, 2s));
}

// ---- nested calls --------------------------------------------------------------------------------

TEST_CASE("chains of nested calls 8 levels deep across 3 workers finish on pools of 2 threads") {
  constexpr int kWorkers = 3;
  constexpr int kDepth = 8;
  AgentGroup g(kWorkers, [](int, Options& o) { o.numWorkerThreads = 2; });
  for (int r = 0; r < kWorkers; ++r) {
    Agent* self = &g.agent(r);
    // relay(depth, acc): records this worker in acc, then either answers or asks
    // the next worker (round robin) and adds 1000 to what comes back; the pool
    // thread returns at once with a future, so no thread waits on a nested call.
    g.agent(r).registry().impl(relay, [self, r](int32_t depth, int64_t acc) -> Future<int64_t> {
      int64_t here = acc * 4 + r + 1;
      if (depth == 0) return makeReadyFuture(here);
      return self->callAsync((r + 1) % kWorkers, relay, depth - 1, here).then([](int64_t v) { return v + 1000; });
    });
  }
  g.start();

  // What a chain started at worker `first` with acc = seed returns.
  auto expected = [](int first, int64_t seed) {
    int64_t acc = seed;
    int r = first;
    for (int d = kDepth; d >= 0; --d) {
      acc = acc * 4 + r + 1;
      r = (r + 1) % kWorkers;
    }
    return acc + 1000 * kDepth;
  };

  constexpr int kChainsPerWorker = 4;
  std::vector<Future<int64_t>> chains;
  std::vector<int64_t> want;
  auto t0 = Clock::now();
  for (int origin = 0; origin < kWorkers; ++origin) {
    for (int c = 0; c < kChainsPerWorker; ++c) {
      int first = (origin + 1 + c) % kWorkers;  // some chains start at the caller itself
      int64_t seed = origin * 10 + c;
      chains.push_back(g.agent(origin).callAsync(first, relay, kDepth, seed));
      want.push_back(expected(first, seed));
    }
  }
  Future<std::vector<int64_t>> all = whenAll(chains);
  REQUIRE(all.waitFor(10s));
  MESSAGE(chains.size() << " chains of " << kDepth + 1 << " calls in " << secondsSince(t0) << " s");
  CHECK(all.get() == want);
  CHECK(eventually([&] { return quiet(g); }, 2s));
}

// ---- errors from the callee ----------------------------------------------------------------------

TEST_CASE("a handler's exception arrives as RemoteError naming the worker, the function and the message") {
  AgentGroup g(2);
  Registry& reg = g.agent(1).registry();
  reg.impl(throwsRuntime, [](int32_t v) -> int32_t { throw std::runtime_error("boom " + std::to_string(v)); });
  reg.impl(throwsInvalid, [](int32_t v) -> int32_t {
    throw InvalidArgumentError("throws.invalid: value " + std::to_string(v) + " is not acceptable");
  });
  reg.impl(failedFuture, [](int32_t v) {
    return makeErrorFuture<int32_t>(std::make_exception_ptr(std::runtime_error("failed future " + std::to_string(v))));
  });
  std::vector<std::thread> completers;
  std::mutex completersMu;
  reg.impl(failedFutureLater, [&](int32_t v) {
    Promise<int32_t> p;
    Future<int32_t> f = p.getFuture();
    std::lock_guard<std::mutex> lock(completersMu);
    completers.emplace_back([p, v]() mutable {
      std::this_thread::sleep_for(50ms);
      p.setError(std::make_exception_ptr(std::runtime_error("later " + std::to_string(v))));
    });
    return f;
  });
  reg.impl(failedStatus, [](int32_t) { return makeErrorFuture<int32_t>(Status::notFound("no such record")); });
  bindEcho(reg, echoI32);
  g.start();
  Agent& a = g.agent(0);

  try {
    a.call(1, throwsRuntime, 7);
    FAIL_CHECK("no exception");
  } catch (const RemoteError& e) {
    CHECK(e.worker() == "worker1");
    CHECK(e.function() == "throws.runtime");
    CHECK(contains(e.remoteMessage(), "boom 7"));
    CHECK(contains(e.what(), "worker1"));
    CHECK(contains(e.what(), "throws.runtime"));
    CHECK(contains(e.what(), "boom 7"));
  } catch (const std::exception& e) {
    FAIL_CHECK("expected RemoteError, got " << describeError(e));
  }

  std::string invalid = messageOf<InvalidArgumentError>([&] { a.call(1, throwsInvalid, 3); });
  CHECK(contains(invalid, "value 3 is not acceptable"));

  try {
    a.call(1, failedFuture, 4);
    FAIL_CHECK("no exception");
  } catch (const RemoteError& e) {
    CHECK(e.worker() == "worker1");
    CHECK(e.function() == "future.failed");
    CHECK(contains(e.remoteMessage(), "failed future 4"));
  } catch (const std::exception& e) {
    FAIL_CHECK("expected RemoteError, got " << describeError(e));
  }

  Future<int32_t> later = a.callAsync(1, failedFutureLater, 5);
  REQUIRE(later.waitFor(5s));
  CHECK(contains(messageOf<RemoteError>([&] { later.get(); }), "later 5"));

  CHECK(contains(messageOf<NotFoundError>([&] { a.call(1, failedStatus, 1); }), "no such record"));

  // None of it broke the connection.
  CHECK(a.call(1, echoI32, 9) == 9);
  CHECK(a.isAlive(1));
  {
    std::lock_guard<std::mutex> lock(completersMu);
    for (auto& t : completers) t.join();
  }
}

TEST_CASE("an unknown function or worker is a NotFoundError, and a call before start or after shutdown a StateError") {
  const Function<int32_t(int32_t)> nobodyServes{"nobody.serves.this"};
  AgentGroup g(2);
  bindEcho(g.agent(1).registry(), echoI32);

  // Before start.
  CHECK(contains(messageOf<StateError>([&] { g.agent(0).call(1, echoI32, 1); }), "echo.i32"));
  Future<int32_t> early = g.agent(0).callAsync(1, echoI32, 1);
  REQUIRE(early.waitFor(1s));
  CHECK_THROWS_AS(early.get(), StateError);

  g.start();
  Agent& a = g.agent(0);

  std::string unknownFn = messageOf<NotFoundError>([&] { a.call(1, nobodyServes, 1); });
  CHECK(contains(unknownFn, "nobody.serves.this"));
  CHECK(contains(unknownFn, "worker1"));

  auto t0 = Clock::now();
  CHECK(contains(messageOf<NotFoundError>([&] { a.call("nobody", echoI32, 1); }), "nobody"));
  CHECK_THROWS_AS(a.call(2, echoI32, 1), NotFoundError);
  CHECK_THROWS_AS(a.call(100, echoI32, 1), NotFoundError);
  CHECK_THROWS_AS(a.worker("nobody"), NotFoundError);
  CHECK_THROWS_AS(a.worker(5), NotFoundError);
  Future<int32_t> toNobody = a.callAsync("nobody", echoI32, 1);
  REQUIRE(toNobody.waitFor(1s));
  CHECK_THROWS_AS(toNobody.get(), NotFoundError);
  CHECK(secondsSince(t0) < 1.0);  // none of it waits for anything

  CHECK(a.call(1, echoI32, 2) == 2);
  auto reports = g.shutdownAll();
  for (auto& r : reports) CHECK(r.clean());

  // After shutdown.
  CHECK(contains(messageOf<StateError>([&] { a.call(1, echoI32, 1); }), "echo.i32"));
  Future<int32_t> late = g.agent(1).callAsync(0, echoI32, 1);
  REQUIRE(late.waitFor(1s));
  CHECK_THROWS_AS(late.get(), StateError);
}
