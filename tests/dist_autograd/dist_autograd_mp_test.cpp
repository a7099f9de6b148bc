// Distributed autograd across real processes on 127.0.0.1 (tests/dist_autograd/helpers/dist_autograd_worker.cpp,
// one process per rank). One job of three workers runs every graph shape in sequence, each in
// its own context: for each, rank 0 compares the gradients every worker holds in the context
// with the same computation run locally in one process (float64, 1e-6 relative), and checks
// that every worker's distributed autograd state drains once the context ends. The same job
// runs the error paths (a second backward, a throwing backward rule on another worker) and
// must still shut down gracefully within a few seconds. A second job kills a worker that took
// part in two contexts, one of them in the middle of a backward pass. A third kills a worker
// just after it answered every request of a pass, before the initiator resumes it. Every wait is
// bounded and every process is checked to be gone at the end.
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include "mp_job.h"
#include "captured_text.h"

using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::numberAfter;
using weft::testing::rankPrefix;
using weft::testing::restOfLine;
using weft::testing::Subprocess;

namespace {

using Clock = std::chrono::steady_clock;

const std::string kEmptyCounts = "counts contexts 0 sendNodes 0 pendingReleases 0\n";

// One job of dist_autograd_worker processes, ranks 0..world-1, with short bounds and fast failure detection.
struct Job : weft::testing::MpJob {
  Job(const std::string& job, int world)
      : MpJob({DIST_AUTOGRAD_WORKER_PATH, job}, world, [](int) { return weft::testing::fastFailureSettings(6); }) {}
};

// The graphs job runs once, for every test case that reads it.
struct GraphsRun {
  std::vector<Subprocess::Result> results;
  bool gone = false;
  double seconds = 0;
};

const GraphsRun& graphsRun() {
  static const GraphsRun run = [] {
    auto began = Clock::now();
    Job job("graphs", 3);
    GraphsRun r;
    r.results = job.finish(40s);
    r.gone = job.allGone();
    r.seconds = std::chrono::duration<double>(Clock::now() - began).count();
    return r;
  }();
  return run;
}

double doubleAfter(const std::string& text, const std::string& label) {
  std::string rest = restOfLine(text, label);
  REQUIRE_FALSE(rest.empty());
  return std::stod(rest.substr(0, rest.find(' ')));
}

// The line rank 0 printed for `scenario` (after "rank 0 scenario <name> "), checked to report
// success with `grads` gradients compared and every one within 1e-6 relative of the local
// reference, and the contexts drained on every worker.
std::string checkScenario(const std::string& scenario, long long grads) {
  const GraphsRun& run = graphsRun();
  REQUIRE(run.results.size() == 3);
  const std::string& out0 = run.results[0].out;
  INFO("rank 0 stdout:\n" << out0 << "\nrank 0 stderr:\n" << run.results[0].err);
  std::string line = restOfLine(out0, "rank 0 scenario " + scenario + " ");
  CAPTURE(line);
  REQUIRE(line.rfind("ok ", 0) == 0);
  if (grads > 0) {
    CHECK(numberAfter(line, "grads ") == grads);
    double maxRel = doubleAfter(line, " maxrel ");
    CHECK(maxRel <= 1e-6);
    MESSAGE(scenario << ": " << grads << " gradients, largest relative difference " << maxRel);
  }
  long long drainedMs = numberAfter(line, " drained_ms ");
  if (scenario != "chain") {
    CHECK(drainedMs >= 0);
    CHECK(drainedMs < 5000);
  }
  return line;
}

}  // namespace

TEST_CASE("dist_autograd multiprocess: the graphs job ends cleanly, every worker's state empty, graceful shutdown "
          "within seconds") {
  const GraphsRun& run = graphsRun();
  REQUIRE(run.results.size() == 3);
  MESSAGE("graphs job: 3 processes, " << run.seconds << " s from start to the last exit; scenarios took "
                                      << restOfLine(run.results[0].out, " seconds ") << " s on rank 0");
  for (size_t r = 0; r < run.results.size(); ++r) {
    const auto& res = run.results[r];
    const std::string p = rankPrefix(static_cast<int>(r));
    CAPTURE(r);
    INFO("stdout:\n" << res.out << "\nstderr:\n" << res.err);
    CHECK_FALSE(res.timedOut);
    CHECK(res.exitCode == 0);
    CHECK(contains(res.out, p + kEmptyCounts));
    std::string shutdown = restOfLine(res.out, p + "shutdown graceful ");
    CHECK(contains(shutdown, "1 missing - seconds "));
    std::string seconds = restOfLine(shutdown, " seconds ");
    REQUIRE_FALSE(seconds.empty());
    CHECK(std::stod(seconds) < 3.0);
  }
  CHECK(contains(run.results[0].out, "rank 0 scenarios failed 0 seconds "));
  CHECK(run.gone);
}

TEST_CASE("dist_autograd multiprocess: a chain 0 to 1 to 2 and back to 0 gives every worker its parameter's "
          "gradient and release empties every worker at once") {
  std::string line = checkScenario("chain", 5);
  CHECK(contains(line, " released_empty 1"));
}

TEST_CASE("dist_autograd multiprocess: a diamond, one tensor sent to two workers and the results combined") {
  checkScenario("diamond", 3);
}

TEST_CASE("dist_autograd multiprocess: several roots on three workers in one backward pass") {
  checkScenario("roots", 4);
}

TEST_CASE("dist_autograd multiprocess: a tensor crossing the same boundary twice, and as both arguments of a call") {
  checkScenario("twice", 2);
}

TEST_CASE("dist_autograd multiprocess: a remote result fetched twice with RRef toHere inside the graph") {
  checkScenario("toHere", 2);
}

TEST_CASE("dist_autograd multiprocess: remote results kept on the owner and used later by a remote object's method") {
  checkScenario("later", 3);
}

TEST_CASE("dist_autograd multiprocess: a parameter passed as an argument gets its gradient in its owner's context") {
  checkScenario("param", 3);
}

TEST_CASE("dist_autograd multiprocess: retainGraph passes accumulate and a backward after the last one fails "
          "naming a node") {
  std::string line = checkScenario("retain", 4);
  std::string error = restOfLine(line, " second_error ");
  CHECK((error.rfind("StateError: ", 0) == 0 || error.rfind("RemoteError: ", 0) == 0));
  CHECK(contains(error, "node"));
  MESSAGE("second backward failed after " << numberAfter(line, " second_ms ") << " ms: " << error);
}

TEST_CASE("dist_autograd multiprocess: a second backward from a root that another worker computed fails promptly "
          "naming a node") {
  std::string line = checkScenario("second-remote", 2);
  std::string error = restOfLine(line, " second_error ");
  CHECK((error.rfind("StateError: ", 0) == 0 || error.rfind("RemoteError: ", 0) == 0));
  CHECK(contains(error, "node"));
  CHECK(numberAfter(line, " second_ms ") < 5000);
  MESSAGE("second backward from a remote root failed after " << numberAfter(line, " second_ms ") << " ms: " << error);
}

TEST_CASE("dist_autograd multiprocess: a backward rule throwing on another worker fails backward naming that "
          "worker and the message, and leaves no worker stuck") {
  std::string line = checkScenario("remote-error", 0);
  std::string error = restOfLine(line, " error ");
  CHECK(error.rfind("RemoteError: ", 0) == 0);
  CHECK(contains(error, "worker1"));
  CHECK(contains(error, "the backward of ExplodingOp exploded on purpose"));
  long long ms = numberAfter(line, "failed_ms ");
  CHECK(ms >= 0);
  CHECK(ms < 5000);
  MESSAGE("backward failed " << ms << " ms after it began: " << error);
  // The same workers then run a diamond correctly.
  checkScenario("after-errors", 3);
}

TEST_CASE("dist_autograd multiprocess: a worker killed with SIGKILL fails backward and gradients on the initiator "
          "promptly with DisconnectedError and the survivors shut down") {
  Job job("kill", 3);
  Subprocess& victim = job.proc(1);
  bool stalled = victim.readUntil(
      [](const std::string& out, const std::string&) { return contains(out, "rank 1 backward stalled\n"); }, 30s);
  if (!stalled) {
    weft::testing::dumpResults(job.finish(1s));
    FAIL("rank 1 never ran the stalling backward rule");
  }
  long long lostAtNs = weft::testing::steadyNowNs();
  REQUIRE(::kill(victim.pid(), SIGKILL) == 0);

  auto res0 = job.proc(0).wait(20s);
  auto res2 = job.proc(2).wait(10s);
  {
    INFO("rank 0 stdout:\n" << res0.out << "\nrank 0 stderr:\n" << res0.err);
    CHECK_FALSE(res0.timedOut);
    CHECK(res0.exitCode == 0);
    // The pass pending when worker1 died fails within 2 s of the kill (both clocks are
    // CLOCK_MONOTONIC).
    const std::string pending = "rank 0 pending backward at_ns ";
    long long at = numberAfter(res0.out, pending);
    REQUIRE(at > 0);
    double after = static_cast<double>(at - lostAtNs) / 1e9;
    MESSAGE("pending backward failed " << after * 1000 << " ms after SIGKILL");
    CHECK(after >= 0);
    CHECK(after < 2.0);
    std::string line = restOfLine(res0.out, pending);
    CHECK(contains(line, " DisconnectedError: "));
    CHECK(contains(line, "worker1"));
    // Later uses of either context fail at once, the same way.
    for (const char* what : {"gradientsOfPending", "backward", "gradients", "gradientsById"}) {
      CAPTURE(what);
      const std::string label = std::string("rank 0 later ") + what + " in_us ";
      long long us = numberAfter(res0.out, label);
      REQUIRE(us >= 0);
      CHECK(us < 500000);
      std::string use = restOfLine(res0.out, label);
      CHECK(contains(use, " DisconnectedError: "));
      CHECK(contains(use, "worker1"));
    }
    CHECK(contains(res0.out, "rank 0 survivors empty 1 drained_ms "));
    CHECK(contains(res0.out, "rank 0 alive 0\n"));
  }
  for (const auto* res : {&res0, &res2}) {
    const int rank = res == &res0 ? 0 : 2;
    CAPTURE(rank);
    INFO("stdout:\n" << res->out << "\nstderr:\n" << res->err);
    const std::string p = rankPrefix(rank);
    CHECK_FALSE(res->timedOut);
    CHECK(res->exitCode == 0);
    CHECK(contains(res->out, p + kEmptyCounts));
    std::string shutdown = restOfLine(res->out, p + "shutdown graceful ");
    CHECK(contains(shutdown, "1 missing worker1 seconds "));
    std::string seconds = restOfLine(shutdown, " seconds ");
    REQUIRE_FALSE(seconds.empty());
    MESSAGE("rank " << rank << ": graceful shutdown without worker1 took " << seconds << " s");
    CHECK(std::stod(seconds) < 5.5);
  }
  CHECK(victim.wait(10s).signal == SIGKILL);
  CHECK(job.allGone());
}

TEST_CASE("dist_autograd multiprocess: a worker killed after answering every request of a pass, before the "
          "initiator resumes it, fails backward with DisconnectedError naming it, no crash") {
  for (int run = 0; run < 3; ++run) {
    CAPTURE(run);
    Job job("settled-kill", 2);
    Subprocess& victim = job.proc(1);
    bool settled = job.proc(0).readUntil(
        [](const std::string& out, const std::string&) { return contains(out, "rank 0 settled\n"); }, 30s);
    if (!settled) {
      weft::testing::dumpResults(job.finish(1s));
      FAIL("rank 0 never reached the settled point of its backward pass");
    }
    REQUIRE(::kill(victim.pid(), SIGKILL) == 0);
    auto res0 = job.proc(0).wait(20s);
    INFO("rank 0 stdout:\n" << res0.out << "\nrank 0 stderr:\n" << res0.err);
    CHECK_FALSE(res0.timedOut);
    CHECK(res0.signal == 0);
    CHECK(res0.exitCode == 0);
    CHECK(contains(res0.out, "rank 0 dropped 1\n"));
    std::string outcome = restOfLine(res0.out, "rank 0 backward ");
    CHECK(outcome.rfind("DisconnectedError: ", 0) == 0);
    CHECK(contains(outcome, "worker1"));
    std::string later = restOfLine(res0.out, "rank 0 later gradients in_us ");
    CHECK(contains(later, " DisconnectedError: "));
    CHECK(contains(later, "worker1"));
    CHECK(contains(res0.out, "rank 0 " + kEmptyCounts));
    CHECK(victim.wait(10s).signal == SIGKILL);
    CHECK(job.allGone());
  }
}
