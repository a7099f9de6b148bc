#include "rpc/uv_loop.h"

#include <doctest/doctest.h>
#include <unistd.h>
#include <uv.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace weft;
using namespace weft::rpc;
using namespace std::chrono_literals;

TEST_CASE("tasks posted from several threads run on the loop thread, each thread's in order") {
  UvLoop loop("test-loop");
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  std::vector<std::vector<int>> seen(kThreads);  // touched only on the loop thread
  std::atomic<bool> offLoop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        REQUIRE(loop.post([&, t, i] {
          if (!loop.inLoopThread()) offLoop = true;
          seen[t].push_back(i);
        }));
      }
    });
  }
  for (auto& th : threads) th.join();
  loop.call([] {});  // every earlier task has run
  CHECK_FALSE(offLoop.load());
  for (int t = 0; t < kThreads; ++t) {
    REQUIRE(seen[t].size() == static_cast<size_t>(kPerThread));
    for (int i = 0; i < kPerThread; ++i) CHECK(seen[t][static_cast<size_t>(i)] == i);
  }
  CHECK_FALSE(loop.inLoopThread());
}

TEST_CASE("call returns the task's value, rethrows its exception, and runs inline on the loop thread") {
  UvLoop loop;
  CHECK(loop.call([] { return 42; }) == 42);
  CHECK(loop.call([] { return std::string("text"); }) == "text");
  CHECK_THROWS_WITH_AS(loop.call([]() -> int { throw std::runtime_error("boom"); }), "boom", std::runtime_error);
  // From a task: inline, no deadlock.
  int nested = loop.call([&] { return loop.call([] { return 7; }) + 1; });
  CHECK(nested == 8);
  // Move-only results and tasks.
  auto p = loop.call([] { return std::make_unique<int>(5); });
  CHECK(*p == 5);
  auto owned = std::make_unique<int>(3);
  std::promise<int> got;
  REQUIRE(loop.post([o = std::move(owned), &got] { got.set_value(*o); }));
  CHECK(got.get_future().get() == 3);
}

TEST_CASE("stop runs every task accepted before it, then post refuses and destroys the task unrun") {
  auto loop = std::make_unique<UvLoop>();
  std::atomic<int> ran{0};
  std::latch blocked(1);
  std::latch release(1);
  REQUIRE(loop->post([&] {
    blocked.count_down();
    release.wait();
    ++ran;
  }));
  blocked.wait();
  for (int i = 0; i < 100; ++i) REQUIRE(loop->post([&] { ++ran; }));
  std::thread stopper([&] { loop->stop(); });
  // stop() has begun once post refuses.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!loop->stopping() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  REQUIRE(loop->stopping());
  auto token = std::make_shared<int>(0);
  std::weak_ptr<int> watch = token;
  CHECK_FALSE(loop->post([&, token] { ran += 1000; }));
  token.reset();
  CHECK(watch.expired());  // the refused task was destroyed on this thread
  release.count_down();
  stopper.join();
  CHECK(ran.load() == 101);
  CHECK_THROWS_AS(loop->call([] { return 1; }), StateError);
  loop->stop();  // idempotent
}

TEST_CASE("handles left open at stop are closed so the loop is released") {
  UvLoop loop;
  auto timer = std::make_unique<uv_timer_t>();
  loop.call([&] {
    uv_timer_init(loop.raw(), timer.get());
    uv_timer_start(timer.get(), [](uv_timer_t*) {}, 100000, 0);
  });
  loop.stop();  // warns once and returns instead of hanging on the active timer
  CHECK(loop.stopping());
}

TEST_CASE("the loop thread blocks SIGPIPE, so writing to a closed pipe fails with EPIPE instead of killing") {
  UvLoop loop;
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  ::close(fds[0]);
  int err = loop.call([&] {
    ssize_t n = ::write(fds[1], "x", 1);
    return n < 0 ? errno : 0;
  });
  ::close(fds[1]);
  CHECK(err == EPIPE);
}
