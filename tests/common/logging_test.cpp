// logging::RateLimiter on a clock the test moves by hand, its summaries caught by a sink.
#include "common/logging.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

using namespace weft::logging;
using namespace std::chrono_literals;
using Clock = RateLimiter::Clock;

namespace {

struct Harness {
  Clock::time_point t = Clock::time_point{} + 1000s;
  std::vector<std::pair<Level, std::string>> summaries;
  RateLimiter::Config config;

  RateLimiter make(const std::string& prefix = "rpc") {
    return RateLimiter(prefix, config, [this] { return t; },
                       [this](Level l, const std::string& s) { summaries.emplace_back(l, s); });
  }
};

int admitted(RateLimiter& limiter, Level level, const std::string& key, int n) {
  int shown = 0;
  for (int i = 0; i < n; ++i) shown += limiter.admit(level, key) ? 1 : 0;
  return shown;
}

}  // namespace

TEST_CASE("a rate limiter shows the first lines of a key, holds back the rest, and sums them up when the window ends") {
  Harness h;
  {
    RateLimiter limiter = h.make();
    CHECK(admitted(limiter, Level::Warn, "127.0.0.1", 3000) == 3);
    CHECK(limiter.nextDue() == h.t + 10s);
    h.t += 9s;
    limiter.flush();
    CHECK(h.summaries.empty());  // the window is still open
    h.t += 1s;
    limiter.flush();
    REQUIRE(h.summaries.size() == 1);
    CHECK(h.summaries[0].first == Level::Warn);
    CHECK(h.summaries[0].second == "rpc: ... and 2,997 more from 127.0.0.1 in the last 10 s");
    CHECK(limiter.nextDue() == Clock::time_point::max());
    limiter.flush();
    CHECK(h.summaries.size() == 1);  // said once
  }
  CHECK(h.summaries.size() == 1);  // nothing left for the destructor
}

TEST_CASE("a rate limiter counts each key on its own") {
  Harness h;
  RateLimiter limiter = h.make("store");
  CHECK(admitted(limiter, Level::Warn, "10.0.0.1", 5) == 3);
  CHECK(admitted(limiter, Level::Warn, "10.0.0.2", 2) == 2);
  CHECK(admitted(limiter, Level::Warn, "10.0.0.2", 1) == 1);
  CHECK(admitted(limiter, Level::Warn, "10.0.0.2", 1) == 0);
  h.t += 10s;
  limiter.flush();
  REQUIRE(h.summaries.size() == 2);
  CHECK(h.summaries[0].second == "store: ... and 2 more from 10.0.0.1 in the last 10 s");
  CHECK(h.summaries[1].second == "store: ... and 1 more from 10.0.0.2 in the last 10 s");
}

TEST_CASE("a rate limiter opens a new window with the next line after one ends, summing up the old one first") {
  Harness h;
  RateLimiter limiter = h.make();
  CHECK(admitted(limiter, Level::Warn, "a", 4) == 3);
  h.t += 12s;
  // No flush: the next line writes the summary that is due, then is shown in a fresh window.
  CHECK(limiter.admit(Level::Warn, "b"));
  REQUIRE(h.summaries.size() == 1);
  CHECK(h.summaries[0].second == "rpc: ... and 1 more from a in the last 10 s");
  CHECK(admitted(limiter, Level::Warn, "a", 3) == 3);
}

TEST_CASE("a key whose lines were all shown needs no summary") {
  Harness h;
  RateLimiter limiter = h.make();
  CHECK(admitted(limiter, Level::Warn, "a", 3) == 3);
  CHECK(limiter.nextDue() == Clock::time_point::max());
  h.t += 10s;
  limiter.flush();
  CHECK(h.summaries.empty());
}

TEST_CASE("a summary is written at the highest level held back") {
  Harness h;
  RateLimiter limiter = h.make();
  CHECK(admitted(limiter, Level::Info, "a", 3) == 3);
  CHECK(admitted(limiter, Level::Info, "a", 5) == 0);
  CHECK(admitted(limiter, Level::Error, "a", 1) == 0);
  h.t += 10s;
  limiter.flush();
  REQUIRE(h.summaries.size() == 1);
  CHECK(h.summaries[0].first == Level::Error);
  CHECK(h.summaries[0].second == "rpc: ... and 6 more from a in the last 10 s");
}

TEST_CASE("the destructor sums up the windows still open, over the time they were open") {
  Harness h;
  {
    RateLimiter limiter = h.make();
    CHECK(admitted(limiter, Level::Warn, "a", 10) == 3);
    h.t += 3200ms;
  }
  REQUIRE(h.summaries.size() == 1);
  CHECK(h.summaries[0].second == "rpc: ... and 7 more from a in the last 3.2 s");
}

TEST_CASE("keys beyond the limit share one key, so memory stays bounded") {
  Harness h;
  h.config.maxKeys = 4;
  RateLimiter limiter = h.make();
  int shown = 0;
  for (int i = 0; i < 1000; ++i) shown += limiter.admit(Level::Warn, "10.0.0." + std::to_string(i)) ? 1 : 0;
  CHECK(shown == 4 + 3);  // one line for each of the first 4 keys, 3 for all the others together
  h.t += 10s;
  limiter.flush();
  REQUIRE(h.summaries.size() == 1);
  CHECK(h.summaries[0].second == "rpc: ... and 993 more from other addresses in the last 10 s");
}

TEST_CASE("a rate limiter with its own configuration: burst and window") {
  Harness h;
  h.config.burst = 1;
  h.config.window = 500ms;
  RateLimiter limiter = h.make();
  CHECK(admitted(limiter, Level::Warn, "a", 1234567) == 1);
  h.t += 500ms;
  limiter.flush();
  REQUIRE(h.summaries.size() == 1);
  CHECK(h.summaries[0].second == "rpc: ... and 1,234,566 more from a in the last 0.5 s");
}

TEST_CASE("a rate limiter may be used from several threads at once") {
  Harness h;
  RateLimiter limiter = h.make();
  std::atomic<int> shown{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] { shown += admitted(limiter, Level::Warn, "a", 1000); });
  }
  for (auto& th : threads) th.join();
  CHECK(shown.load() == 3);
  h.t += 10s;
  limiter.flush();
  REQUIRE(h.summaries.size() == 1);
  CHECK(h.summaries[0].second == "rpc: ... and 3,997 more from a in the last 10 s");
}

TEST_CASE("hostOf drops the port of an address") {
  CHECK(RateLimiter::hostOf("127.0.0.1:54321") == "127.0.0.1");
  CHECK(RateLimiter::hostOf("[::1]:54321") == "::1");
  CHECK(RateLimiter::hostOf("node3") == "node3");
  CHECK(RateLimiter::hostOf("fe80::1") == "fe80::1");
}
