// collectives::init and the object collectives across real processes on 127.0.0.1
// (tests/collectives/helpers/init_worker.cpp): a lone process with an empty environment (a world
// of 1, every collective as on one rank), jobs of 2 and 3 processes that use nothing but init()
// (allGatherObject / broadcastObject of strings, vectors, structs, maps and tensors against the
// values each rank computes; ranks passing different types fail alike with ProtocolError), an
// agent whose group shares the agent's store, and the job's end: rank 0 keeps the store until the
// other ranks have left, ends at once when a rank died instead, naming it, and names a stalled
// rank after WEFT_SHUTDOWN_TIMEOUT. Every wait is bounded and every process is checked
// to be gone at the end.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include "mp_job.h"
#include "captured_text.h"

using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::MpJob;
using weft::testing::rankPrefix;
using weft::testing::restOfLine;
using weft::testing::Subprocess;

namespace {

void checkClean(const Subprocess::Result& res, int rank) {
  INFO("rank " << rank << " exit " << res.exitCode << " signal " << res.signal << "\nstdout:\n"
                << res.out << "\nstderr:\n" << res.err);
  CHECK_FALSE(res.timedOut);
  CHECK(res.exitCode == 0);
  CHECK(contains(res.out, rankPrefix(rank) + "done\n"));
}

void runJob(int world) {
  MpJob job({INIT_WORKER_PATH, "job"}, world, [](int) { return std::vector<std::string>{"WEFT_STORE_TIMEOUT=20"}; });
  auto results = job.finish(60s);
  job.checkAllGone();
  for (int r = 0; r < world; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    CHECK(contains(res.out, p + "world " + std::to_string(world) + "\n"));
    CHECK(contains(res.out, p + "allGatherObject ok\n"));
    CHECK(contains(res.out, p + "broadcastObject ok\n"));
    const std::string line = restOfLine(res.out, p + "mismatch ");
    INFO(line);
    CHECK(contains(line, "ProtocolError: allGatherObject: rank "));
    if (r == 1) {
      CHECK(contains(line, "rank 0's value: expected int64, got string"));
    } else {
      CHECK(contains(line, "rank 1's value: expected string, got int"));
    }
    CHECK(contains(res.out, p + "after mismatch ok\n"));
    // Every rank left: rank 0 names nobody.
    CHECK_FALSE(contains(res.err, "collectives::init"));
  }
}

// Milliseconds rank `rank`'s group took to end ("rank R end took N ms"); -1 when it did not say.
long long endMs(const Subprocess::Result& res, int rank) {
  const std::string line = restOfLine(res.out, rankPrefix(rank) + "end took ");
  return line.empty() ? -1 : std::stoll(line);
}

}  // namespace

TEST_CASE("a lone process with an empty environment gets a world of 1 from collectives::init, where every "
          "collective and object collective works as on one rank") {
  Subprocess p({"/usr/bin/env", "-i", INIT_WORKER_PATH, "lone"});
  auto res = p.wait(30s);
  checkClean(res, 0);
  CHECK(contains(res.out, "rank 0 world 1\n"));
  CHECK(contains(res.out, "rank 0 lone ok\n"));
}

TEST_CASE("a job of 2 processes set up with collectives::init alone: object collectives match on every rank") {
  runJob(2);
}

TEST_CASE("a job of 3 processes set up with collectives::init alone: object collectives match on every rank") {
  runJob(3);
}

TEST_CASE("collectives::init(agent) joins through the agent's store, next to its RPC, and before start() is a "
          "StateError") {
  MpJob job({INIT_WORKER_PATH, "agent"}, 3, [](int) { return weft::testing::fastFailureSettings(2); });
  auto results = job.finish(60s);
  job.checkAllGone();
  for (int r = 0; r < 3; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    CHECK(contains(restOfLine(res.out, p + "before_start "), "StateError: collectives::init: the agent of worker"));
    CHECK(contains(res.out, p + "store shared\n"));
    CHECK(contains(res.out, p + "agent ok\n"));
  }
}

TEST_CASE("a lone process with an empty environment runs an agent and its group") {
  Subprocess p({"/usr/bin/env", "-i", INIT_WORKER_PATH, "agent"});
  auto res = p.wait(30s);
  checkClean(res, 0);
  CHECK(contains(res.out, "rank 0 store shared\n"));
  CHECK(contains(res.out, "rank 0 agent ok\n"));
}

TEST_CASE("the end of a collectives::init job: a rank that died instead of leaving is named by rank 0, which "
          "closes the store at once rather than after WEFT_SHUTDOWN_TIMEOUT") {
  // Rank 2 kills itself after the last collective, its group never destroyed.
  MpJob job({INIT_WORKER_PATH, "end", "die"}, 3, [](int) {
    return std::vector<std::string>{"WEFT_STORE_TIMEOUT=20", "WEFT_SHUTDOWN_TIMEOUT=60"};
  });
  auto results = job.finish(60s);
  job.checkAllGone();
  CHECK(results[2].signal == SIGKILL);
  for (int r = 0; r < 2; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const long long ms = endMs(res, r);
    INFO("rank " << r << " end took " << ms << " ms");
    CHECK(ms >= 0);
    CHECK(ms < 15000);  // the 60 s bound is for ranks still connected; a dead one is gone at once
  }
  INFO("rank 0 stderr:\n" << results[0].err);
  CHECK(contains(results[0].err, "collectives::init: ranks [2] ended without leaving the group"));
  CHECK_FALSE(contains(results[1].err, "collectives::init"));
}

TEST_CASE("the end of a collectives::init job: rank 0 names a rank still connected after WEFT_SHUTDOWN_TIMEOUT, "
          "and closes the store") {
  // Rank 2 stalls for 8 s before destroying its group; rank 0 waits 2 s for it.
  MpJob job({INIT_WORKER_PATH, "end", "stall"}, 3, [](int) {
    return std::vector<std::string>{"WEFT_STORE_TIMEOUT=20", "WEFT_SHUTDOWN_TIMEOUT=2"};
  });
  auto results = job.finish(60s);
  job.checkAllGone();
  for (int r = 0; r < 3; ++r) checkClean(results[static_cast<size_t>(r)], r);
  const long long ms = endMs(results[0], 0);
  INFO("rank 0 end took " << ms << " ms; stderr:\n" << results[0].err);
  CHECK(ms >= 1900);
  CHECK(ms < 7000);  // rank 0 does not wait for the stalled rank past its bound
  CHECK(contains(results[0].err, "with 1 other process(es) still connected"));
  CHECK(contains(results[0].err, "ranks [2] have not left the group"));
  // The stalled rank finds the store closed when it leaves, and still ends cleanly.
  CHECK(endMs(results[2], 2) >= 0);
}
