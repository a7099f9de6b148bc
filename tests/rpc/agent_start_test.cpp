// Jobs that cannot form: duplicate names or ranks, a rank outside the world, disagreeing
// world sizes, a peer that never comes; each worker learns why without waiting out the
// store timeout, and shutdown releases one waiting in start. Every wait is bounded.
#include "rpc/agent_functions.h"

// ---- start errors ------------------------------------------------------------------------------

namespace {

// Short rendezvous and shutdown bounds for jobs that cannot form.
void shortStart(int, Options& o) {
  o.storeTimeout = 1500ms;
  o.shutdownTimeout = 1s;
}

std::string whatOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
}

// The messages of the starts that failed (startEach's non-null entries).
std::vector<std::string> startFailures(const std::vector<std::exception_ptr>& errors) {
  std::vector<std::string> out;
  for (auto& e : errors) {
    if (e) out.push_back(whatOf(e));
  }
  return out;
}

}  // namespace

TEST_CASE("two workers with the same name are a clear error at start") {
  AgentGroup g(2, [](int r, Options& o) {
    shortStart(r, o);
    o.name = std::string(1, 'a');  // not = "a": GCC 12 warns falsely (-Wrestrict) on that
  });
  auto t0 = Clock::now();
  std::vector<std::exception_ptr> errors = g.startEach();
  CHECK(secondsSince(t0) < 3.0);
  std::vector<std::string> failures = startFailures(errors);
  INFO("failures: " << joined(failures));
  CHECK(failures.size() == 2);  // the other hears of it through the store
  CHECK(std::any_of(failures.begin(), failures.end(),
                    [](const std::string& m) { return contains(m, "duplicate") && contains(m, "'a'"); }));
}

TEST_CASE("workers that disagree on the world size are a clear error at start") {
  AgentGroup g(2, [](int r, Options& o) {
    shortStart(r, o);
    if (r == 1) o.worldSize = 3;
  });
  auto t0 = Clock::now();
  std::vector<std::exception_ptr> errors = g.startEach();
  CHECK(secondsSince(t0) < 3.0);
  std::vector<std::string> failures = startFailures(errors);
  INFO("failures: " << joined(failures));
  CHECK(failures.size() == 2);  // neither can form a job
  CHECK(std::any_of(failures.begin(), failures.end(),
                    [](const std::string& m) {
                      return contains(m, "world size") && contains(m, "2") && contains(m, "3");
                    }));
}

TEST_CASE("a rank outside the world is rejected before anything starts") {
  Options o = weft::testing::agentOptions(3, 3, weft::testing::freePort());
  std::string m = messageOf<InvalidArgumentError>([&] { o.validate(); });
  CHECK(contains(m, "rank 3"));
  CHECK(contains(m, "worldSize 3"));
  CHECK_THROWS_AS(Agent{o}, InvalidArgumentError);
  o.rank = -1;
  CHECK_THROWS_AS(Agent{o}, InvalidArgumentError);
}

TEST_CASE("two workers claiming one rank are a clear error at start, and nobody waits past the store timeout") {
  AgentGroup g(3, [](int r, Options& o) {
    shortStart(r, o);
    if (r == 2) o.rank = 1;
  });
  auto t0 = Clock::now();
  std::vector<std::exception_ptr> errors = g.startEach();
  CHECK(secondsSince(t0) < 3.0);
  std::vector<std::string> failures = startFailures(errors);
  INFO("failures: " << joined(failures));
  CHECK(failures.size() == 3);  // rank 2 never arrives, so no one can form the job
  CHECK(std::any_of(failures.begin(), failures.end(),
                    [](const std::string& m) { return contains(m, "rank 1") || contains(m, "worker2"); }));
}

TEST_CASE("a start that times out names the ranks that never joined, as the collectives name ranks") {
  AgentGroup g(3, shortStart);
  std::string e;
  try {
    g.agent(0).start();  // ranks 1 and 2 never start
  } catch (const TimeoutError& ex) {
    e = ex.what();
  }
  INFO(e);
  CHECK(e.find("for ranks [1, 2] to join") != std::string::npos);
}

TEST_CASE("an agent waiting in start for a peer that never comes is released at once by its shutdown") {
  AgentGroup g(2, [](int, Options& o) {
    o.storeTimeout = 10s;
    o.shutdownTimeout = 1s;
  });
  // Only rank 0 starts: it waits for rank 1.
  std::exception_ptr error;
  std::atomic<bool> done{false};
  std::thread starter([&] {
    try {
      g.agent(0).start();
    } catch (...) {
      error = std::current_exception();
    }
    done = true;
  });
  std::this_thread::sleep_for(200ms);
  if (done) {
    starter.join();
    FAIL("start() returned before it was shut down: " << (error ? whatOf(error) : std::string("no error")));
  }
  auto t0 = Clock::now();
  ShutdownReport report = g.agent(0).shutdown({.graceful = false});
  bool released = eventually([&] { return done.load(); }, 2s);
  double took = secondsSince(t0);
  starter.join();
  CHECK(released);
  CHECK(took < 2.0);
  CHECK_FALSE(report.graceful);
  REQUIRE(error);
  // The interrupted start fails as cancelled (or as a start on an agent shut down).
  bool cancelled = false;
  try {
    std::rethrow_exception(error);
  } catch (const CancelledError&) {
    cancelled = true;
  } catch (const StateError&) {
    cancelled = true;
  } catch (const std::exception& e) {
    FAIL_CHECK("start() failed with " << describeError(e));
  }
  CHECK(cancelled);
  CHECK_FALSE(g.agent(0).started());
}

TEST_CASE("every worker of a job that cannot form learns why, without waiting out the store timeout") {
  // The worker that detects the problem is not the only one to hear of it: the
  // others would otherwise wait the whole store timeout (300 s by default) and
  // then blame a worker that did arrive.
  struct Case {
    std::string what;
    std::function<void(int, Options&)> configure;
    std::vector<std::string> words;  // each error names the problem with all of these
  };
  std::vector<Case> cases = {
      {"duplicate names", [](int, Options& o) { o.name = std::string(1, 'a'); }, {"duplicate", "'a'"}},
      {"world size mismatch", [](int r, Options& o) { o.worldSize = r == 1 ? 3 : 2; }, {"world size"}},
      {"one rank twice", [](int r, Options& o) { o.rank = r == 2 ? 1 : r; }, {"rank 1"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    int world = c.what == "one rank twice" ? 3 : 2;
    AgentGroup g(world, [&](int r, Options& o) {
      o.storeTimeout = 3s;
      o.shutdownTimeout = 1s;
      c.configure(r, o);
    });
    auto t0 = Clock::now();
    std::vector<std::exception_ptr> errors = g.startEach();
    CHECK(secondsSince(t0) < 1.5);
    for (size_t r = 0; r < errors.size(); ++r) {
      CAPTURE(r);
      REQUIRE(errors[r]);
      std::string m = whatOf(errors[r]);
      INFO(m);
      for (const std::string& w : c.words) CHECK(contains(m, w));
    }
  }
}
