#include "common/future.h"

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <functional>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace weft;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Runs fn in a forked child and checks that it dies by SIGABRT (a WEFT_CHECK);
// returns what the child wrote to stderr.
std::string abortMessage(const std::function<void()>& fn) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::fflush(nullptr);  // or the child could write the parent's buffered output again
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGABRT, SIG_DFL);  // bypass the test framework's crash reporter
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    fn();
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string err;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) err.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK_MESSAGE(WIFSIGNALED(status), "the child exited normally; stderr: " << err);
  if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGABRT);
  return err;
}

// A value that counts its copies and live instances.
struct Tracked {
  static inline std::atomic<int> copies{0};
  static inline std::atomic<int> live{0};
  int v = 0;
  explicit Tracked(int x) : v(x) { ++live; }
  Tracked(const Tracked& o) : v(o.v) {
    ++copies;
    ++live;
  }
  Tracked(Tracked&& o) noexcept : v(o.v) { ++live; }
  Tracked& operator=(const Tracked&) = delete;
  ~Tracked() { --live; }
};

struct CustomError : std::runtime_error {
  explicit CustomError(int c) : std::runtime_error("custom " + std::to_string(c)), code(c) {}
  int code;
};

}  // namespace

// ---- completion and get() ----------------------------------------------------

TEST_CASE("a value set before get() is returned by get()") {
  Promise<int> p;
  Future<int> f = p.getFuture();
  CHECK(f.valid());
  CHECK_FALSE(f.isReady());
  p.setValue(42);
  CHECK(f.isReady());
  CHECK_FALSE(f.hasError());
  CHECK(f.get() == 42);
  CHECK(f.get() == 42);  // get() does not consume through an lvalue handle
  CHECK(p.getFuture().get() == 42);
}

TEST_CASE("get() blocks until another thread sets the value") {
  Promise<std::string> p;
  Future<std::string> f = p.getFuture();
  std::thread t([p]() mutable {
    std::this_thread::sleep_for(30ms);
    p.setValue("late");
  });
  auto start = Clock::now();
  CHECK(f.get() == "late");
  CHECK(Clock::now() - start >= 25ms);
  t.join();
}

TEST_CASE("a Future<void> completes and get() returns") {
  Promise<void> p;
  Future<void> f = p.getFuture();
  CHECK_FALSE(f.isReady());
  p.setValue();
  CHECK(f.isReady());
  f.get();
  CHECK(f.status().ok());
  CHECK(f.exception() == nullptr);
}

TEST_CASE("get() on a future failed with a Status throws that status's typed exception") {
  CHECK_THROWS_AS(makeErrorFuture<int>(Status::timeout("late")).get(), TimeoutError);
  CHECK_THROWS_AS(makeErrorFuture<int>(Status::disconnected("gone")).get(), DisconnectedError);
  CHECK_THROWS_AS(makeErrorFuture<int>(Status::notFound("none")).get(), NotFoundError);
  CHECK_THROWS_AS(makeErrorFuture<void>(Status::protocol("bad")).get(), ProtocolError);
  CHECK_THROWS_AS(makeErrorFuture<void>(Status::cancelled("stop")).get(), CancelledError);
  Future<int> f = makeErrorFuture<int>(Status::failed("boom").withOrigin("worker2", "mul"));
  try {
    f.get();
    FAIL("get() returned");
  } catch (const RemoteError& e) {
    CHECK(e.worker() == "worker2");
    CHECK(e.function() == "mul");
    CHECK(e.remoteMessage() == "boom");
  }
}

TEST_CASE("get() rethrows the exact exception given to setError") {
  Promise<int> p;
  p.setError(std::make_exception_ptr(CustomError(7)));
  Future<int> f = p.getFuture();
  CHECK(f.hasError());
  try {
    f.get();
    FAIL("get() returned");
  } catch (const CustomError& e) {
    CHECK(e.code == 7);
  }
  CHECK(f.status() == Status::failed("(anonymous namespace)::CustomError: custom 7"));
}

TEST_CASE("status() and exception() describe the outcome") {
  Future<int> ok = makeReadyFuture(1);
  CHECK(ok.status().ok());
  CHECK(ok.exception() == nullptr);
  Future<int> bad = makeErrorFuture<int>(Status::invalidArgument("shape [2] vs [3]"));
  CHECK(bad.status() == Status::invalidArgument("shape [2] vs [3]"));
  REQUIRE(bad.exception() != nullptr);
  CHECK_THROWS_WITH_AS(std::rethrow_exception(bad.exception()), "shape [2] vs [3]", InvalidArgumentError);
}

TEST_CASE("get() on a temporary moves the value out when it holds the only handle") {
  Tracked::copies = 0;
  {
    Tracked t = makeReadyFuture(Tracked(5)).get();
    CHECK(t.v == 5);
    CHECK(Tracked::copies == 0);
  }
  {
    Future<Tracked> shared = makeReadyFuture(Tracked(6));
    Tracked t = Future<Tracked>(shared).get();  // another handle remains: copy
    CHECK(t.v == 6);
    CHECK(Tracked::copies == 1);
    CHECK(shared.get().v == 6);
  }
  CHECK(Tracked::live == 0);
}

TEST_CASE("a move-only value is taken out by get() on a temporary") {
  Promise<std::unique_ptr<int>> p;
  p.setValue(std::make_unique<int>(11));
  std::unique_ptr<int> v = p.getFuture().get();
  REQUIRE(v != nullptr);
  CHECK(*v == 11);
  Future<int> viaThen = makeReadyFuture(std::make_unique<int>(12)).then([](const std::unique_ptr<int>& q) { return *q; });
  CHECK(viaThen.get() == 12);
}

TEST_CASE("makeReadyFuture and makeErrorFuture are complete at once") {
  CHECK(makeReadyFuture(std::string("x")).get() == "x");
  CHECK(makeReadyFuture().isReady());
  Future<double> e = makeErrorFuture<double>(std::make_exception_ptr(std::logic_error("nope")));
  CHECK(e.isReady());
  CHECK(e.hasError());
  CHECK_THROWS_AS(e.get(), std::logic_error);
}

// ---- exactly once --------------------------------------------------------------

TEST_CASE("completing a promise twice is a bug that aborts") {
  std::string err = abortMessage([] {
    Promise<int> p;
    p.setValue(1);
    p.setValue(2);
  });
  CHECK(err.find("already complete") != std::string::npos);
  err = abortMessage([] {
    Promise<void> p;
    p.setValue();
    p.setError(Status::failed("late"));
  });
  CHECK(err.find("already complete") != std::string::npos);
}

TEST_CASE("using an empty Future or failing with an ok status are bugs that abort") {
  CHECK(abortMessage([] { Future<int>().isReady(); }).find("empty Future") != std::string::npos);
  CHECK(abortMessage([] { Promise<int>().setError(Status()); }).find("ok status") != std::string::npos);
}

TEST_CASE("trySetValue and trySetError report false after completion and keep the first result") {
  Promise<int> p;
  CHECK(p.trySetValue(1));
  CHECK_FALSE(p.trySetValue(2));
  CHECK_FALSE(p.trySetError(Status::timeout("late")));
  CHECK_FALSE(p.trySetError(std::make_exception_ptr(std::runtime_error("late"))));
  CHECK(p.isReady());
  CHECK(p.getFuture().get() == 1);
}

TEST_CASE("exactly one of many threads racing to complete a promise wins") {
  constexpr int kThreads = 8;
  for (int round = 0; round < 200; ++round) {
    Promise<int> p;
    std::latch start(kThreads);
    std::atomic<int> wins{0};
    std::atomic<int> winner{-1};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        start.arrive_and_wait();
        bool won = (t % 2) ? p.trySetValue(t) : p.trySetError(Status::failed("thread " + std::to_string(t)));
        if (won) {
          ++wins;
          winner = t;
        }
      });
    }
    for (auto& th : threads) th.join();
    REQUIRE(wins == 1);
    Future<int> f = p.getFuture();
    if (winner % 2) {
      CHECK(f.get() == winner);
    } else {
      CHECK(f.status() == Status::failed("thread " + std::to_string(winner.load())));
    }
  }
}

TEST_CASE("a broken promise fails its future instead of leaving it pending forever") {
  Future<int> f;
  {
    Promise<int> p;
    f = p.getFuture();
    Promise<int> copy = p;
  }
  REQUIRE(f.isReady());
  CHECK_THROWS_WITH_AS(f.get(), doctest::Contains("broken promise"), Error);
  CHECK(f.status().code() == StatusCode::Failed);
}

TEST_CASE("a future stays pending while any copy of its promise lives") {
  Future<int> f;
  Promise<int> survivor;
  {
    Promise<int> p;
    f = p.getFuture();
    survivor = p;
  }
  CHECK_FALSE(f.isReady());
  Promise<int> moved = std::move(survivor);
  CHECK_FALSE(f.isReady());
  moved.setValue(3);
  CHECK(f.get() == 3);
}

// ---- waiting -------------------------------------------------------------------

TEST_CASE("waitFor returns false after at least the timeout when nothing completes") {
  Promise<int> p;
  Future<int> f = p.getFuture();
  auto start = Clock::now();
  CHECK_FALSE(f.waitFor(50ms));
  auto waited = Clock::now() - start;
  CHECK(waited >= 50ms);
  CHECK(waited < 5s);
  CHECK_FALSE(f.waitFor(0ms));
  CHECK_FALSE(f.waitFor(-1s));
  CHECK_FALSE(f.waitUntil(std::chrono::system_clock::now() + 10ms));
  p.setValue(1);
  CHECK(f.waitFor(0ms));
  CHECK(f.waitFor(std::chrono::hours::max()));
}

TEST_CASE("waitFor returns as soon as another thread completes the future") {
  Promise<void> p;
  Future<void> f = p.getFuture();
  std::thread t([p]() mutable {
    std::this_thread::sleep_for(20ms);
    p.setValue();
  });
  auto start = Clock::now();
  CHECK(f.waitFor(30s));
  CHECK(Clock::now() - start < 10s);
  t.join();
}

TEST_CASE("many threads waiting on one future all wake when it completes") {
  constexpr int kWaiters = 16;
  Promise<int> p;
  Future<int> f = p.getFuture();
  std::atomic<int> sum{0};
  std::latch started(kWaiters);
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      started.count_down();
      if (i % 2) {
        sum += f.get();
      } else if (f.waitFor(60s)) {
        sum += f.get();
      }
    });
  }
  started.wait();
  std::this_thread::sleep_for(10ms);
  p.setValue(2);
  for (auto& w : waiters) w.join();
  CHECK(sum == 2 * kWaiters);
}

// ---- continuations -------------------------------------------------------------

TEST_CASE("then transforms values through a chain of different types") {
  Promise<int> p;
  Future<std::string> s = p.getFuture()
                              .then([](int v) { return v * 2; })
                              .then([](const int& v) { return std::to_string(v); })
                              .then([](std::string v) { return v + "!"; });
  CHECK_FALSE(s.isReady());
  p.setValue(21);
  CHECK(s.get() == "42!");
}

TEST_CASE("then works from and to Future<void>") {
  Promise<void> p;
  int seen = 0;
  Future<int> n = p.getFuture().then([] { return 5; });
  Future<void> done = n.then([&](int v) { seen = v; });
  p.setValue();
  done.get();
  CHECK(seen == 5);
  CHECK(n.get() == 5);

  Promise<void> inner;
  Future<void> flattened = makeReadyFuture(1).then([inner](int) { return inner.getFuture(); });
  CHECK_FALSE(flattened.isReady());
  inner.setValue();
  CHECK(flattened.isReady());
  CHECK_FALSE(flattened.hasError());
}

TEST_CASE("an error skips every then() continuation and reaches the end of the chain") {
  Promise<int> p;
  int calls = 0;
  Future<int> end = p.getFuture()
                        .then([&](int v) { return ++calls, v + 1; })
                        .then([&](int v) { return ++calls, std::to_string(v); })
                        .then([&](const std::string& v) { return ++calls, static_cast<int>(v.size()); });
  Status err = Status::timeout("call to 'ps' timed out after 2.0 s").withOrigin("ps", "pull");
  p.setError(err);
  CHECK(calls == 0);
  CHECK(end.status() == err);
  CHECK_THROWS_AS(end.get(), TimeoutError);
}

TEST_CASE("an exception thrown by a continuation fails the downstream future with that exception") {
  Future<int> f = makeReadyFuture(1)
                      .then([](int) -> int { throw CustomError(9); })
                      .then([](int v) { return v + 1; });
  try {
    f.get();
    FAIL("get() returned");
  } catch (const CustomError& e) {
    CHECK(e.code == 9);
  }
  Future<void> typed = makeReadyFuture().then([] { throw NotFoundError("no worker 'x'"); });
  CHECK(typed.status() == Status::notFound("no worker 'x'"));
}

TEST_CASE("a continuation returning a Future completes when that inner future does") {
  Promise<int> outer;
  Promise<std::string> inner;
  Future<std::string> f = outer.getFuture().then([inner](int v) {
    CHECK(v == 1);
    return inner.getFuture();
  });
  outer.setValue(1);
  CHECK_FALSE(f.isReady());
  std::thread t([inner]() mutable { inner.setValue("nested"); });
  CHECK(f.get() == "nested");
  t.join();
}

TEST_CASE("an inner future's error propagates through a flattening then") {
  Future<int> f = makeReadyFuture(1).then([](int) { return makeErrorFuture<int>(Status::disconnected("peer died")); });
  CHECK(f.status() == Status::disconnected("peer died"));
  Future<int> empty = makeReadyFuture(1).then([](int) { return Future<int>(); });
  CHECK(empty.status().code() == StatusCode::InvalidArgument);
}

TEST_CASE("then accepts a move-only continuation") {
  auto box = std::make_unique<int>(40);
  Future<int> f = makeReadyFuture(2).then([box = std::move(box)](int v) { return *box + v; });
  CHECK(f.get() == 42);
}

TEST_CASE("a continuation registered before completion runs on the completing thread") {
  Promise<int> p;
  std::thread::id ranOn;
  Future<void> f = p.getFuture().then([&](int) { ranOn = std::this_thread::get_id(); });
  std::thread::id completer;
  std::thread t([&, p]() mutable {
    completer = std::this_thread::get_id();
    p.setValue(1);
    CHECK(f.isReady());  // ran inside setValue, before it returned
  });
  t.join();
  CHECK(ranOn == completer);
}

TEST_CASE("a continuation registered after completion runs inline before then() returns") {
  Future<int> ready = makeReadyFuture(3);
  std::thread::id ranOn;
  Future<int> f = ready.then([&](int v) {
    ranOn = std::this_thread::get_id();
    return v;
  });
  CHECK(f.isReady());
  CHECK(ranOn == std::this_thread::get_id());
}

TEST_CASE("continuations run in registration order") {
  Promise<void> p;
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) p.getFuture().onComplete([&order, i](const Future<void>&) { order.push_back(i); });
  p.setValue();
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("a continuation may call into its own future and promise without deadlocking") {
  Promise<int> p;
  Future<int> f = p.getFuture();
  int inner = 0;
  bool secondCompletion = true;
  f.onComplete([&, p](const Future<int>& self) mutable {
    CHECK(self.isReady());
    CHECK(self.get() == 8);
    secondCompletion = p.trySetValue(9);
    self.then([&](int v) { inner = v; });  // registered after completion: inline
    f.onComplete([&](const Future<int>&) { ++inner; });
  });
  p.setValue(8);
  CHECK_FALSE(secondCompletion);
  CHECK(inner == 9);
}

TEST_CASE("onComplete sees errors as well as values") {
  Promise<int> p;
  Status seen;
  p.getFuture().onComplete([&](const Future<int>& f) { seen = f.status(); });
  p.setError(Status::cancelled("shutdown"));
  CHECK(seen == Status::cancelled("shutdown"));
}

TEST_CASE("an onComplete callback that throws aborts with its message") {
  std::string err = abortMessage([] {
    makeReadyFuture(1).onComplete([](const Future<int>&) { throw std::runtime_error("callback bug"); });
  });
  CHECK(err.find("callback bug") != std::string::npos);
}

TEST_CASE("a long chain built before completion runs to its end") {
  Promise<int> p;
  Future<int> f = p.getFuture();
  for (int i = 0; i < 2000; ++i) f = f.then([](int v) { return v + 1; });
  p.setValue(0);
  CHECK(f.get() == 2000);
}

TEST_CASE("continuations and their captures are released once they ran") {
  Tracked::live = 0;
  auto token = std::make_shared<int>(0);
  std::weak_ptr<int> watch = token;
  {
    Promise<Tracked> p;
    Future<int> f = p.getFuture().then([token](const Tracked& t) { return t.v; });
    token.reset();
    CHECK_FALSE(watch.expired());
    p.setValue(Tracked(4));
    CHECK(watch.expired());
    CHECK(f.get() == 4);
  }
  CHECK(Tracked::live == 0);
}

TEST_CASE("continuations added while other threads complete promises each run exactly once") {
  constexpr int kRounds = 300;
  constexpr int kAdders = 4;
  constexpr int kPerAdder = 8;
  for (int round = 0; round < kRounds; ++round) {
    Promise<int> p;
    Future<int> f = p.getFuture();
    std::atomic<int> runs{0};
    std::atomic<int> sum{0};
    std::latch start(kAdders + 1);
    std::vector<std::thread> threads;
    std::vector<std::vector<Future<int>>> derived(kAdders);
    for (int a = 0; a < kAdders; ++a) {
      threads.emplace_back([&, a] {
        start.arrive_and_wait();
        for (int i = 0; i < kPerAdder; ++i) {
          if (i % 2) {
            f.onComplete([&](const Future<int>& self) {
              ++runs;
              sum += self.get();
            });
          } else {
            derived[a].push_back(f.then([&](int v) {
              ++runs;
              sum += v;
              return v;
            }));
          }
        }
      });
    }
    threads.emplace_back([&] {
      start.arrive_and_wait();
      p.setValue(1);
    });
    for (auto& t : threads) t.join();
    REQUIRE(runs == kAdders * kPerAdder);
    CHECK(sum == kAdders * kPerAdder);
    for (auto& list : derived)
      for (auto& d : list) CHECK(d.isReady());
  }
}

// ---- whenAll / whenAny -----------------------------------------------------------

TEST_CASE("whenAll gathers values in input order whatever the completion order") {
  std::vector<Promise<int>> promises(5);
  std::vector<Future<int>> futures;
  for (auto& p : promises) futures.push_back(p.getFuture());
  Future<std::vector<int>> all = whenAll(futures);
  for (int i = 4; i >= 0; --i) {
    CHECK_FALSE(all.isReady());
    promises[static_cast<size_t>(i)].setValue(i * 10);
  }
  CHECK(all.get() == std::vector<int>{0, 10, 20, 30, 40});
}

TEST_CASE("whenAll fails with the first error even while other inputs are pending") {
  std::vector<Promise<int>> promises(3);
  std::vector<Future<int>> futures;
  for (auto& p : promises) futures.push_back(p.getFuture());
  Future<std::vector<int>> all = whenAll(futures);
  promises[0].setValue(1);
  promises[2].setError(Status::disconnected("worker2 died"));
  REQUIRE(all.isReady());
  CHECK_THROWS_AS(all.get(), DisconnectedError);
  promises[1].setError(Status::timeout("later error"));  // ignored by the finished whenAll
  CHECK(all.status() == Status::disconnected("worker2 died"));
}

TEST_CASE("whenAll of no futures is ready with an empty vector") {
  CHECK(whenAll(std::vector<Future<int>>{}).get().empty());
  CHECK(whenAll(std::vector<Future<void>>{}).isReady());
}

TEST_CASE("whenAll of void futures completes after the last and fails on an error") {
  std::vector<Promise<void>> promises(3);
  std::vector<Future<void>> futures;
  for (auto& p : promises) futures.push_back(p.getFuture());
  Future<void> all = whenAll(futures);
  promises[1].setValue();
  promises[0].setValue();
  CHECK_FALSE(all.isReady());
  promises[2].setValue();
  CHECK(all.isReady());
  CHECK_FALSE(all.hasError());

  Promise<void> bad;
  Future<void> failed = whenAll(std::vector<Future<void>>{makeReadyFuture(), bad.getFuture()});
  bad.setError(Status::protocol("bad frame"));
  CHECK_THROWS_AS(failed.get(), ProtocolError);
}

TEST_CASE("whenAll collects values completed concurrently by many threads") {
  constexpr int kInputs = 256;
  constexpr int kThreads = 8;
  for (int round = 0; round < 20; ++round) {
    std::vector<Promise<int>> promises(kInputs);
    std::vector<Future<int>> futures;
    for (auto& p : promises) futures.push_back(p.getFuture());
    Future<std::vector<int>> all = whenAll(futures);
    std::latch start(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        start.arrive_and_wait();
        for (int i = t; i < kInputs; i += kThreads) promises[static_cast<size_t>(i)].setValue(i);
      });
    }
    for (auto& th : threads) th.join();
    std::vector<int> values = all.get();
    REQUIRE(values.size() == kInputs);
    for (int i = 0; i < kInputs; ++i) CHECK(values[static_cast<size_t>(i)] == i);
  }
}

TEST_CASE("whenAny completes with the index and value of the first input to complete") {
  std::vector<Promise<std::string>> promises(3);
  std::vector<Future<std::string>> futures;
  for (auto& p : promises) futures.push_back(p.getFuture());
  Future<WhenAnyResult<std::string>> any = whenAny(futures);
  CHECK_FALSE(any.isReady());
  promises[2].setValue("third");
  promises[0].setValue("first");
  promises[1].setError(Status::timeout("ignored"));
  WhenAnyResult<std::string> r = any.get();
  CHECK(r.index == 2);
  CHECK(r.value == "third");
}

TEST_CASE("whenAny fails with the error of the first input when that input failed") {
  std::vector<Promise<int>> promises(2);
  Future<WhenAnyResult<int>> any = whenAny(std::vector<Future<int>>{promises[0].getFuture(), promises[1].getFuture()});
  promises[1].setError(Status::failed("boom").withOrigin("w1", "f"));
  promises[0].setValue(5);
  CHECK_THROWS_AS(any.get(), RemoteError);
}

TEST_CASE("whenAny of no futures fails with invalid argument") {
  CHECK_THROWS_AS(whenAny(std::vector<Future<int>>{}).get(), InvalidArgumentError);
  CHECK_THROWS_AS(whenAny(std::vector<Future<void>>{}).get(), InvalidArgumentError);
}

TEST_CASE("whenAny of void futures gives the index of the first") {
  std::vector<Promise<void>> promises(4);
  std::vector<Future<void>> futures;
  for (auto& p : promises) futures.push_back(p.getFuture());
  Future<size_t> any = whenAny(futures);
  promises[3].setValue();
  promises[1].setValue();
  CHECK(any.get() == 3);
}

TEST_CASE("exactly one of many threads racing through whenAny decides it") {
  constexpr int kThreads = 8;
  for (int round = 0; round < 100; ++round) {
    std::vector<Promise<int>> promises(kThreads);
    std::vector<Future<int>> futures;
    for (auto& p : promises) futures.push_back(p.getFuture());
    Future<WhenAnyResult<int>> any = whenAny(futures);
    std::latch start(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        start.arrive_and_wait();
        promises[static_cast<size_t>(t)].setValue(t * 100);
      });
    }
    for (auto& th : threads) th.join();
    WhenAnyResult<int> r = any.get();
    CHECK(r.value == static_cast<int>(r.index) * 100);
  }
}
