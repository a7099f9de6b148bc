// The distributed optimizer across real processes on 127.0.0.1 (tests/dist_optim/helpers/
// dist_optim_worker.cpp, one process per rank): two trainers stepping the parameters of one server
// at the same time lose no update, and a server killed with SIGKILL fails the next step promptly
// with DisconnectedError naming it. Every wait is bounded and every process is checked to be gone
// at the end.
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
using weft::testing::restOfLine;
using weft::testing::resultsText;

namespace {

// The WEFT_* settings of rank `rank`: short bounds, fast failure detection, and a name: rank 0 is
// the parameter server "ps", the others "trainer<rank>".
std::vector<std::string> rankSettings(int rank) {
  std::vector<std::string> settings = weft::testing::fastFailureSettings(4);
  settings.push_back("WEFT_WORKER_NAME=" + (rank == 0 ? std::string("ps") : "trainer" + std::to_string(rank)));
  return settings;
}

// The real number after `label` on the line that follows `line` (NaN when either is absent).
double realOnLine(const std::string& text, const std::string& line, const std::string& label) {
  return weft::testing::realAfter(restOfLine(text, line), label);
}

// One job of dist_optim_worker processes playing `scenario`, ranks 0..world-1.
struct Job : weft::testing::MpJob {
  Job(const std::string& scenario, int world) : MpJob({DIST_OPTIM_WORKER_PATH, scenario}, world, rankSettings) {}
};

}  // namespace

TEST_CASE("dist_optim multiprocess: two trainers stepping one server's parameters at once lose no update") {
  Job job("concurrent", 3);
  auto results = job.finish(40s);
  INFO(resultsText(results));
  for (size_t r = 0; r < results.size(); ++r) {
    CAPTURE(r);
    const std::string p = "rank " + std::to_string(r) + " ";
    CHECK_FALSE(results[r].timedOut);
    CHECK(results[r].exitCode == 0);
    // Nothing left on any worker: references, contexts, optimizers, parameter locks.
    CHECK(contains(results[r].out, p + "state_empty 1 counts "));
    CHECK(contains(results[r].out, p + "shutdown graceful 1 missing - seconds "));
  }
  for (int r = 1; r <= 2; ++r) CHECK(contains(results[static_cast<size_t>(r)].out, "rank " + std::to_string(r) + " trained steps 100 "));
  // 1024 x 1024 weights and 1024 biases, each exactly 0.5 - 100 * (1 + 1) / 64 and 0.5 - 100 * (1 + 2) / 64.
  CHECK(contains(results[0].out, "rank 0 weight_wrong 0 bias_wrong 0 weight -2.625000 bias -4.187500\n"));
  job.checkAllGone();
}

TEST_CASE("dist_optim multiprocess: a server killed with SIGKILL fails the next step promptly with "
          "DisconnectedError naming it") {
  Job job("kill", 2);
  bool ready = job.proc(1).readUntil(
      [](const std::string& out, const std::string&) { return contains(out, "rank 1 ready to step\n"); }, 30s);
  if (!ready) {
    auto results = job.finish(1s);
    FAIL("the trainer never got ready\n" << resultsText(results));
  }
  REQUIRE(::kill(job.proc(0).pid(), SIGKILL) == 0);
  auto results = job.finish(30s);
  INFO(resultsText(results));
  CHECK(results[0].signal == SIGKILL);
  CHECK_FALSE(results[1].timedOut);
  CHECK(results[1].exitCode == 0);
  std::string failed = restOfLine(results[1].out, "rank 1 step failed in_ms ");
  CHECK(contains(failed, "DisconnectedError: "));
  CHECK(contains(failed, "ps"));
  long long ms = numberAfter(results[1].out, "rank 1 step failed in_ms ");
  CHECK(ms >= 0);
  CHECK(ms < 2000);
  CHECK(contains(results[1].out, "rank 1 shutdown missing ps\n"));
  job.checkAllGone();
}

TEST_CASE("dist_optim multiprocess: a worker that only hosts objects and shuts down at once serves a RemoteModule "
          "and its DistributedOptimizer until the job ends, past the shutdown timeout") {
  // Named worker0..2; a shutdown timeout of 1 s, well under the 3 s the trainers take.
  auto settings = [](int) {
    std::vector<std::string> s = weft::testing::fastFailureSettings(4);
    for (std::string& v : s) {
      if (v.rfind("WEFT_SHUTDOWN_TIMEOUT=", 0) == 0) v = "WEFT_SHUTDOWN_TIMEOUT=1";
    }
    return s;
  };
  weft::testing::MpJob job({DIST_OPTIM_WORKER_PATH, "idle_host"}, 3, settings);
  auto results = job.finish(60s);
  INFO(resultsText(results));
  for (size_t r = 0; r < results.size(); ++r) {
    CAPTURE(r);
    const std::string p = "rank " + std::to_string(r) + " ";
    CHECK_FALSE(results[r].timedOut);
    CHECK(results[r].exitCode == 0);
    CHECK(contains(results[r].out, p + "shutdown graceful 1 missing - seconds "));
    CHECK(contains(results[r].out, p + "state_empty_at_close 1 "));
  }
  for (int r : {0, 2}) {
    CAPTURE(r);
    const std::string p = "rank " + std::to_string(r) + " ";
    CHECK(contains(results[static_cast<size_t>(r)].out, p + "trained steps 6 "));
    // The same losses and parameters as the same steps on one process.
    CHECK(realOnLine(results[static_cast<size_t>(r)].out, p + "trained steps 6 ", "max_loss_diff ") < 1e-5);
    CHECK(realOnLine(results[static_cast<size_t>(r)].out, p + "trained steps 6 ", "max_param_diff ") < 1e-5);
    CHECK(realOnLine(results[static_cast<size_t>(r)].out, p + "trained steps 6 ", "loss_last ") <
          realOnLine(results[static_cast<size_t>(r)].out, p + "trained steps 6 ", "loss_first "));
  }
  // The idle worker waited in its shutdown for the whole training, well past its 1 s timeout.
  CHECK(realOnLine(results[1].out, "rank 1 shutdown graceful 1 missing - ", "seconds ") > 2.5);
  job.checkAllGone();
}
