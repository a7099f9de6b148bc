// Process groups across real processes on 127.0.0.1 (tests/collectives/helpers/collectives_worker.cpp,
// one process per rank): every collective on 2, 3 and 4 ranks checked against local values, point to
// point with tags and any-source receives, sub-groups, a 64 MiB allReduce; a rank that never calls
// (the others time out naming it), mismatched shapes, a rank killed with SIGKILL, and back-to-back
// small allReduces (no scheduler-tick stall per op; Gloo's loop thread under SCHED_BATCH). Every wait is
// bounded and every process is checked to be gone at the end.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "rpc/agent_util.h"
#include "text_util.h"
#include "tools/subprocess.h"

using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::freePort;
using weft::testing::numberAfter;
using weft::testing::processGone;
using weft::testing::restOfLine;
using weft::testing::Subprocess;

namespace {

using Clock = std::chrono::steady_clock;

std::string rankPrefix(int rank) { return "rank " + std::to_string(rank) + " "; }

// One job of collectives_worker processes playing `scenario`, ranks 0..world-1.
class Job {
 public:
  Job(const std::string& scenario, int world) {
    const uint16_t port = freePort();
    for (int r = 0; r < world; ++r) {
      procs_.push_back(std::make_unique<Subprocess>(
          std::vector<std::string>{COLLECTIVES_WORKER_PATH, scenario},
          std::vector<std::string>{"WEFT_RANK=" + std::to_string(r), "WEFT_WORLD_SIZE=" + std::to_string(world),
                                   "WEFT_LOCAL_RANK=" + std::to_string(r), "WEFT_MASTER_ADDR=127.0.0.1",
                                   "WEFT_MASTER_PORT=" + std::to_string(port), "WEFT_STORE_TIMEOUT=20"}));
    }
  }

  // Waits for every process (one shared deadline) and returns their results by rank.
  std::vector<Subprocess::Result> finish(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    std::vector<Subprocess::Result> out;
    for (auto& p : procs_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      out.push_back(p->wait(std::max(left, std::chrono::milliseconds(1))));
    }
    for (auto& p : procs_) CHECK(processGone(p->pid(), 5s));
    return out;
  }

 private:
  std::vector<std::unique_ptr<Subprocess>> procs_;
};

void checkClean(const Subprocess::Result& res, int rank) {
  INFO("rank " << rank << " exit " << res.exitCode << " signal " << res.signal << "\nstdout:\n"
                << res.out << "\nstderr:\n" << res.err);
  CHECK_FALSE(res.timedOut);
  CHECK(res.exitCode == 0);
  CHECK(contains(res.out, rankPrefix(rank) + "done\n"));
}

void runAll(int world) {
  Job job("all", world);
  auto results = job.finish(60s);
  for (int r = 0; r < world; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    // 3 dtypes x 4 sizes x at least 13 checks, plus point to point and the 64 MiB case.
    CHECK(numberAfter(res.out, rankPrefix(r) + "checked ") >= 3 * 4 * 13 + 6);
    MESSAGE("world " << world << " rank " << r << ": 64 MiB allReduce took "
                     << numberAfter(res.out, rankPrefix(r) + "big_ms ") << " ms");
  }
}

}  // namespace

TEST_CASE("every collective, point to point and a sub-group give the expected values on 2 processes") { runAll(2); }

TEST_CASE("every collective, point to point and a sub-group give the expected values on 3 processes") { runAll(3); }

TEST_CASE("every collective, point to point and a sub-group give the expected values on 4 processes") { runAll(4); }

TEST_CASE("when one rank never calls allReduce the others fail in bounded time naming the op and that rank") {
  Job job("timeout", 3);
  auto results = job.finish(30s);
  for (int r = 0; r < 2; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    long long ms = numberAfter(res.out, p + "failed in_ms ");
    CHECK(ms >= 1400);   // the 1.5 s group timeout
    CHECK(ms < 1500 + 2500);  // plus at most the bounded diagnosis
    std::string line = restOfLine(res.out, p + "failed in_ms ");
    CHECK(contains(line, "TimeoutError: allReduce #0 on group 'default'"));
    CHECK(contains(line, "ranks [2] have not started it"));
    // The group is unusable afterwards, and says why.
    std::string later = restOfLine(res.out, p + "later ");
    CHECK(contains(later, "StateError: barrier #1 on group 'default': the group is unusable"));
    CHECK(contains(later, "allReduce #0"));
  }
  checkClean(results[2], 2);
}

TEST_CASE("a rank calling allReduce with a different shape fails that collective on every rank and the group "
          "stays usable") {
  Job job("mismatch", 3);
  auto results = job.finish(30s);
  for (int r = 0; r < 3; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    std::string line = restOfLine(res.out, rankPrefix(r) + "mismatch ");
    CHECK(contains(line, "InvalidArgumentError: allReduce #0 on group 'default': the ranks' calls do not match"));
    CHECK(contains(line, "rank 1 called allReduce #0(float32, 5 elements, op sum)"));
    CHECK(contains(line, "rank 0 called allReduce #0(float32, 4 elements, op sum)"));
    CHECK(contains(res.out, rankPrefix(r) + "after mismatch ok\n"));
  }
}

TEST_CASE("a rank killed with SIGKILL makes the others' next collective fail promptly with DisconnectedError") {
  Job job("kill", 3);
  auto results = job.finish(30s);
  CHECK(results[2].signal == 9);
  CHECK(contains(results[2].out, "rank 2 dying"));
  for (int r = 0; r < 2; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    long long ms = numberAfter(res.out, p + "failed in_ms ");
    CHECK(ms >= 0);
    CHECK(ms < 5000);  // well within the 10 s group timeout
    std::string line = restOfLine(res.out, p + "failed in_ms ");
    CHECK(contains(line, "DisconnectedError: allReduce #1 on group 'default'"));
    CHECK(contains(line, "connection to a peer was lost"));
  }
}

TEST_CASE("20 back-to-back small allReduces on 2 processes take well under 20 ms and Gloo's loop thread runs "
          "SCHED_BATCH") {
  Job job("b2b", 2);
  auto results = job.finish(30s);
  for (int r = 0; r < 2; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    // Without the policy, a busy machine stalls each op about one scheduler tick (4 ms): 20 ops,
    // 80 ms or more. The fastest of 5 rounds is bounded generously against noise.
    long long best = numberAfter(res.out, p + "b2b_best_us ");
    MESSAGE("rank " << r << ": 20 back-to-back allReduces, rounds (us):" << restOfLine(res.out, p + "b2b_rounds_us"));
    CHECK(best > 0);
    CHECK(best < 20000);
    CHECK(numberAfter(res.out, p + "batch_threads ") >= 1);
    CHECK(numberAfter(res.out, p + "main_policy ") == 0);  // the creating thread's policy is restored
  }
}
