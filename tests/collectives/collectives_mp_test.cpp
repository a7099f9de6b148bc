// Process groups across real processes on 127.0.0.1 (tests/collectives/helpers/collectives_worker.cpp,
// one process per rank): every collective on 2, 3 and 4 ranks checked against local values, point to
// point with tags and any-source receives, sub-groups, a 64 MiB allReduce; allReduce around the
// fused limit (the data carried by the call exchange or not) with every op and dtype; a rank that
// never calls (the others time out naming it), mismatched shapes, sizes and dtypes, a rank killed
// with SIGKILL (the others name it), and back-to-back
// small allReduces (Gloo's loop thread under SCHED_BATCH), point-to-point
// transfers whose sizes differ (a typed error on both sides, the group usable after), a peer that breaks
// the protocol (ProtocolError, no abort), a peer that dies while the root's data waits to leave
// and a rank that stalls a ring then dies (DisconnectedError at once on every rank, not at the
// timeout), point-to-point between live ranks after a death. Every wait is
// bounded and every process is checked to be gone at the end.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "mp_job.h"
#include "captured_text.h"

using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::MpJob;
using weft::testing::numberAfter;
using weft::testing::rankPrefix;
using weft::testing::restOfLine;
using weft::testing::Subprocess;

namespace {

// One job of collectives_worker processes playing `scenario`, ranks 0..world-1.
MpJob workerJob(const std::string& scenario, int world) {
  return MpJob({COLLECTIVES_WORKER_PATH, scenario}, world,
               [](int) { return std::vector<std::string>{"WEFT_STORE_TIMEOUT=20"}; });
}

// Every rank's result within `timeout`, then a check that every process is gone.
std::vector<Subprocess::Result> finish(MpJob& job, std::chrono::milliseconds timeout) {
  auto results = job.finish(timeout);
  job.checkAllGone();
  return results;
}

void checkClean(const Subprocess::Result& res, int rank) {
  INFO("rank " << rank << " exit " << res.exitCode << " signal " << res.signal << "\nstdout:\n"
                << res.out << "\nstderr:\n" << res.err);
  CHECK_FALSE(res.timedOut);
  CHECK(res.exitCode == 0);
  CHECK(contains(res.out, rankPrefix(rank) + "done\n"));
}

void runAll(int world) {
  MpJob job = workerJob("all", world);
  auto results = finish(job, 60s);
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

namespace {

void runFused(int world) {
  MpJob job = workerJob("fused", world);
  auto results = finish(job, 60s);
  const long long limit = 256 * 1024 / (world - 1) / 64 * 64;
  for (int r = 0; r < world; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    CHECK(numberAfter(res.out, p + "fused_limit ") == limit);
    // 3 dtypes x 5 sizes x the reduce ops (5 for floats, 4 for int64), each checked.
    CHECK(numberAfter(res.out, p + "checked ") == 5 * (5 + 5 + 4));
    // Sizes 0, 1, limit - 1 element and the limit travel with the call header; limit + 1 does not.
    const long long fused = numberAfter(res.out, p + "fused_count ");
    CHECK(fused == 4 * (5 + 5 + 4));
    CHECK(numberAfter(res.out, p + "fused_count " + std::to_string(fused) + " expected ") == fused);
    CHECK(contains(res.out, p + "identical 12 of 12\n"));
  }
}

}  // namespace

TEST_CASE("allReduce on 2 processes: every reduce op and dtype on both sides of the fused limit and at it, "
          "bit-identical on every rank") {
  runFused(2);
}

TEST_CASE("allReduce on 3 processes: every reduce op and dtype on both sides of the fused limit and at it, "
          "bit-identical on every rank") {
  runFused(3);
}

TEST_CASE("allReduce on 4 processes: every reduce op and dtype on both sides of the fused limit and at it, "
          "bit-identical on every rank") {
  runFused(4);
}

TEST_CASE("when one rank never calls allReduce the others fail in bounded time naming the op and that rank") {
  MpJob job = workerJob("timeout", 3);
  auto results = finish(job, 30s);
  for (int r = 0; r < 2; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    long long ms = numberAfter(res.out, p + "failed in_ms ");
    CHECK(ms >= 1400);   // the 1.5 s group timeout
    CHECK(ms < 1500 + 2500);  // plus at most the bounded diagnosis
    std::string line = restOfLine(res.out, p + "failed in_ms ");
    CHECK(contains(line, "TimeoutError: allReduce #0 on group 'default'"));
    CHECK(contains(line, "ranks [2] had not started it when last heard"));
    // The group is unusable afterwards, and says why.
    std::string later = restOfLine(res.out, p + "later ");
    CHECK(contains(later, "StateError: barrier #1 on group 'default': the group is unusable"));
    CHECK(contains(later, "allReduce #0"));
  }
  checkClean(results[2], 2);
}

TEST_CASE("ranks calling allReduce with different shapes, sizes across the fused limit or dtypes of the same bytes "
          "fail that collective on every rank, saying what each called, and the group stays usable") {
  MpJob job = workerJob("mismatch", 3);
  auto results = finish(job, 30s);
  for (int r = 0; r < 3; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    std::string line = restOfLine(res.out, p + "mismatch ");
    CHECK(contains(line, "InvalidArgumentError: allReduce #0 on group 'default': the ranks' calls do not match"));
    CHECK(contains(line, "rank 1 called allReduce #0(float32, 5 elements, op sum)"));
    CHECK(contains(line, "rank 0 called allReduce #0(float32, 4 elements, op sum)"));
    CHECK(contains(res.out, p + "after mismatch ok\n"));
    // Ranks 0 and 2 sent their data with the header (exactly the limit), rank 1 only its header,
    // which names the algorithm its larger allReduce runs (auto: bcube).
    const long long limit = 256 * 1024 / 2 / 4;  // float32 elements at the fused limit of 3 ranks
    line = restOfLine(res.out, p + "mismatch_limit ");
    CHECK(contains(line, "InvalidArgumentError: allReduce #2 on group 'default': the ranks' calls do not match"));
    CHECK(contains(line, "rank 0 called allReduce #2(float32, " + std::to_string(limit) + " elements, op sum)"));
    CHECK(contains(line, "rank 1 called allReduce #2(float32, " + std::to_string(limit + 1) +
                             " elements, op sum, algorithm bcube)"));
    CHECK(contains(line, "rank 2 called allReduce #2(float32, " + std::to_string(limit) + " elements, op sum)"));
    CHECK(contains(res.out, p + "after mismatch_limit ok\n"));
    line = restOfLine(res.out, p + "mismatch_dtype ");
    CHECK(contains(line, "InvalidArgumentError: allReduce #4 on group 'default': the ranks' calls do not match"));
    CHECK(contains(line, "rank 0 called allReduce #4(float32, 8 elements, op sum)"));
    CHECK(contains(line, "rank 1 called allReduce #4(float64, 4 elements, op sum)"));
    CHECK(contains(res.out, p + "after mismatch_dtype ok\n"));
  }
}

TEST_CASE("a rank killed with SIGKILL makes the others' next collective fail promptly with DisconnectedError "
          "naming the dead rank") {
  MpJob job = workerJob("kill", 3);
  auto results = finish(job, 30s);
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
    INFO(line);
    CHECK(contains(line, "DisconnectedError: allReduce #1 on group 'default'"));
    CHECK(contains(line, "the connection to rank 2 was lost"));
  }
}

TEST_CASE("a peer that dies while the root's broadcast data waits in Gloo's send queue fails the broadcast "
          "promptly with DisconnectedError naming it, well within the group timeout") {
  MpJob job = workerJob("stalled", 2);
  auto results = finish(job, 60s);
  CHECK(results[1].signal == SIGKILL);
  CHECK(contains(results[1].out, "rank 1 stopping"));
  const auto& res = results[0];
  checkClean(res, 0);
  const std::string p = rankPrefix(0);
  const long long ms = numberAfter(res.out, p + "failed in_ms ");
  CHECK(ms >= 0);
  CHECK(ms < 10000);  // the group timeout is 20 s
  const std::string line = restOfLine(res.out, p + "failed in_ms ");
  INFO(line);
  CHECK(contains(line, "DisconnectedError: broadcast #0 on group 'default'"));
  CHECK(contains(line, "the connection to rank 1 was lost"));
}

TEST_CASE("a rank stalled inside a ring allReduce, then killed, fails the collective promptly on every other rank, "
          "its neighbours in the ring and the rank next to neither alike") {
  MpJob job = workerJob("ring_stall", 4);
  auto results = finish(job, 60s);
  CHECK(results[3].signal == SIGKILL);
  const long long killedAt = numberAfter(results[0].out, rankPrefix(0) + "killed at_ns ");
  REQUIRE(killedAt > 0);
  for (int r = 0; r < 3; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    const long long failedAt = numberAfter(res.out, p + "failed at_ns ");
    const std::string line = restOfLine(res.out, p + "failed at_ns ");
    INFO(line);
    CHECK(failedAt > 0);
    CHECK((failedAt - killedAt) / 1000000 < 10000);  // the group timeout is 20 s
    CHECK(contains(line, "DisconnectedError: allReduce #1 on group 'default'"));
    CHECK(contains(line, "the connection to rank 3 was lost"));
  }
}

TEST_CASE("point-to-point transfers between live ranks go on after another rank of the group died; its next "
          "collective fails naming the dead rank") {
  MpJob job = workerJob("p2p_after_death", 3);
  auto results = finish(job, 60s);
  CHECK(results[2].signal == SIGKILL);
  for (int r = 0; r < 2; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    CHECK(contains(res.out, p + "p2p ok\n"));
    const std::string line = restOfLine(res.out, p + "later ");
    INFO(line);
    CHECK(contains(line, "DisconnectedError: allReduce #1 on group 'default'"));
    CHECK(contains(line, "rank 2"));
  }
}

TEST_CASE("20 back-to-back small allReduces on 2 processes all complete with the right values, and Gloo's "
          "loop thread runs SCHED_BATCH") {
  MpJob job = workerJob("b2b", 2);
  auto results = finish(job, 30s);
  for (int r = 0; r < 2; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    // Without the policy, a busy machine stalls each op about one scheduler tick (4 ms);
    // bench/collectives_bench --sizes 40 --back-to-back 20 measures what it saves.
    CHECK(numberAfter(res.out, p + "b2b_checked ") == 5 * 20);
    CHECK(numberAfter(res.out, p + "batch_threads ") >= 1);
    CHECK(numberAfter(res.out, p + "main_policy ") == 0);  // the creating thread's policy is restored
  }
}

TEST_CASE("point-to-point transfers of different sizes fail on both sides with ProtocolError saying both sizes, "
          "never abort, and leave the group usable (empty any-source receives work)") {
  MpJob job = workerJob("p2p_size", 3);
  auto results = finish(job, 60s);
  for (int r = 0; r < 3; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    CHECK(contains(res.out, p + "matching ok\n"));
    CHECK(contains(res.out, p + "empty_any ok\n"));
    CHECK(contains(res.out, p + "after p2p ok\n"));
  }
  const std::string p0 = rankPrefix(0), p1 = rankPrefix(1), p2 = rankPrefix(2);
  const auto& out0 = results[0].out;
  const auto& out1 = results[1].out;
  const auto& out2 = results[2].out;
  // Sender and receiver each name the other's size.
  std::string line = restOfLine(out0, p0 + "longer ");
  CHECK(contains(line, "ProtocolError: send to rank 1 (tag 3) on group 'default'"));
  CHECK(contains(line, "12 elements of float32 (48 bytes)"));
  CHECK(contains(line, "4 elements of float32 (16 bytes)"));
  line = restOfLine(out1, p1 + "longer ");
  CHECK(contains(line, "ProtocolError: recv from rank 0 (tag 3) on group 'default'"));
  CHECK(contains(line, "12 elements of float32 (48 bytes)"));
  CHECK(contains(line, "4 elements of float32 (16 bytes)"));
  CHECK(contains(out2, p2 + "longer ok\n"));
  line = restOfLine(out0, p0 + "shorter ");
  CHECK(contains(line, "ProtocolError: send to rank 1 (tag 3)"));
  CHECK(contains(line, "12 elements of float32 (48 bytes)"));
  line = restOfLine(out1, p1 + "shorter ");
  CHECK(contains(line, "ProtocolError: recv from rank 0 (tag 3)"));
  CHECK(contains(line, "4 elements of float32 (16 bytes)"));
  line = restOfLine(out0, p0 + "big_shorter ");
  CHECK(contains(line, "ProtocolError: send to rank 1 (tag 4)"));
  CHECK(contains(line, "400000 elements of float32 (1600000 bytes)"));
  line = restOfLine(out1, p1 + "big_shorter ");
  CHECK(contains(line, "ProtocolError: recv from rank 0 (tag 4)"));
  CHECK(contains(line, "rank 0 sent 300000 elements of float32 (1200000 bytes)"));
  line = restOfLine(out1, p1 + "big_longer ");
  CHECK(contains(line, "ProtocolError: recv from rank 0 (tag 4)"));
  CHECK(contains(line, "this receive's tensor holds 4096 elements of float32 (16384 bytes)"));
  CHECK(contains(restOfLine(out0, p0 + "big_longer "), "ProtocolError: send to rank 1 (tag 4)"));
  for (int r = 0; r < 3; ++r) CHECK(contains(results[static_cast<size_t>(r)].out, rankPrefix(r) + "big_matching ok\n"));
  line = restOfLine(out0, p0 + "any_longer ");
  CHECK(contains(line, "ProtocolError: recv from any of ranks [1, 2] (tag 9)"));
  CHECK(contains(line, "rank 2 sent 3 elements of float32 (12 bytes)"));
  line = restOfLine(out2, p2 + "any_longer ");
  CHECK(contains(line, "ProtocolError: send to rank 0 (tag 9)"));
  CHECK(contains(line, "2 elements of float32 (8 bytes)"));
  CHECK(contains(results[1].out, p1 + "any_longer ok\n"));
}

TEST_CASE("a peer whose data does not fit its call header, or that sends no weft size header, makes the op fail "
          "with ProtocolError, never an abort") {
  MpJob job = workerJob("hostile", 2);
  auto results = finish(job, 60s);
  checkClean(results[0], 0);
  checkClean(results[1], 1);
  CHECK(contains(results[1].out, "rank 1 sent\n"));
  const std::string& out = results[0].out;
  std::string line = restOfLine(out, "rank 0 short_data ");
  CHECK(contains(line, "ProtocolError: allReduce #0 on group 'default': rank 1 sent 8 bytes of data with a header "
                       "for 4 elements of float32 (16 bytes)"));
  line = restOfLine(out, "rank 0 garbage_header ");
  CHECK(contains(line, "ProtocolError: recv from rank 1 (tag 5) on group 'default': rank 1 sent bytes that are no "
                       "weft size header"));
}
