// The distributed optimizer across real processes on 127.0.0.1 (tests/dist_optim/helpers/
// dist_optim_worker.cpp, one process per rank): two trainers stepping the parameters of one server
// at the same time lose no update, and a server killed with SIGKILL fails the next step promptly
// with DisconnectedError naming it. Every wait is bounded and every process is checked to be gone
// at the end.
#include <doctest/doctest.h>
#include <signal.h>

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

std::vector<std::string> rankEnv(int rank, int world, uint16_t port) {
  return {"WEFT_HEARTBEAT_INTERVAL=0.5",
          "WEFT_HEARTBEAT_MISSES=5",
          "WEFT_SHUTDOWN_TIMEOUT=5",
          "WEFT_STORE_TIMEOUT=20",
          "WEFT_RPC_TIMEOUT=30",
          "WEFT_NUM_WORKER_THREADS=4",
          "WEFT_WORKER_NAME=" + (rank == 0 ? std::string("ps") : "trainer" + std::to_string(rank)),
          "WEFT_RANK=" + std::to_string(rank),
          "WEFT_WORLD_SIZE=" + std::to_string(world),
          "WEFT_LOCAL_RANK=" + std::to_string(rank),
          "WEFT_MASTER_ADDR=127.0.0.1",
          "WEFT_MASTER_PORT=" + std::to_string(port)};
}

// One job of dist_optim_worker processes playing `scenario`, ranks 0..world-1.
class Job {
 public:
  Job(const std::string& scenario, int world) {
    const uint16_t port = freePort();
    for (int r = 0; r < world; ++r) {
      procs_.push_back(std::make_unique<Subprocess>(std::vector<std::string>{DIST_OPTIM_WORKER_PATH, scenario},
                                                    rankEnv(r, world, port)));
    }
  }

  Subprocess& proc(int rank) { return *procs_.at(static_cast<size_t>(rank)); }

  // Waits for every process (one shared deadline) and returns their results by rank.
  std::vector<Subprocess::Result> finish(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    std::vector<Subprocess::Result> out;
    for (auto& p : procs_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      out.push_back(p->wait(std::max(left, std::chrono::milliseconds(1))));
    }
    return out;
  }

  void checkAllGone() {
    for (auto& p : procs_) CHECK(processGone(p->pid(), 5s));
  }

 private:
  std::vector<std::unique_ptr<Subprocess>> procs_;
};

std::string dump(const std::vector<Subprocess::Result>& results) {
  std::string s;
  for (size_t r = 0; r < results.size(); ++r) {
    s += "rank " + std::to_string(r) + " exit " + std::to_string(results[r].exitCode) + " signal " +
         std::to_string(results[r].signal) + "\nstdout:\n" + results[r].out + "\nstderr:\n" + results[r].err + "\n";
  }
  return s;
}

}  // namespace

TEST_CASE("dist_optim multiprocess: two trainers stepping one server's parameters at once lose no update") {
  Job job("concurrent", 3);
  auto results = job.finish(40s);
  INFO(dump(results));
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
    FAIL("the trainer never got ready\n" << dump(results));
  }
  REQUIRE(::kill(job.proc(0).pid(), SIGKILL) == 0);
  auto results = job.finish(30s);
  INFO(dump(results));
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
