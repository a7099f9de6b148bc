// Remote references across real processes on 127.0.0.1 (tests/rref/helpers/rref_worker.cpp, one
// process per rank): an owner killed with SIGKILL while its references are in use, a reference
// forked through four workers, 10,000 references created and dropped, a 64 MiB tensor fetched,
// references nested in a struct, and the errors a user sees. Every scenario that ends normally
// checks that every worker's RRef tables are empty before and after a graceful shutdown. Every
// wait is bounded and every process is checked to be gone at the end.
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include "mp_job.h"
#include "captured_text.h"

using namespace std::chrono_literals;
using weft::testing::rankPrefix;
using weft::testing::steadyNowNs;
using weft::testing::Subprocess;

using weft::testing::contains;
using weft::testing::numberAfter;
using weft::testing::numbersAfter;
using weft::testing::restOfLine;

namespace {

const std::string kEmptyCounts = "owned 0 forks 0 users 0 pendingUsers 0 pendingChildren 0";

// One job of rref_worker processes playing `scenario`, ranks 0..world-1. Short bounds and fast
// failure detection; enough handler threads for the owner of the kill scenario to block in three
// calls at once and still serve the bookkeeping.
struct Job : weft::testing::MpJob {
  Job(const std::string& scenario, int world)
      : MpJob({RREF_WORKER_PATH, scenario}, world, [](int) { return weft::testing::fastFailureSettings(6); }) {}
};

// What every rank of a scenario that ends normally prints: exit 0, empty tables before and after
// a clean graceful shutdown, no warning about state left at close.
void checkSettled(const std::vector<Subprocess::Result>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    const auto& res = results[r];
    const std::string p = rankPrefix(static_cast<int>(r));
    CAPTURE(r);
    INFO("stdout:\n" << res.out << "\nstderr:\n" << res.err);
    CHECK_FALSE(res.timedOut);
    CHECK(res.exitCode == 0);
    CHECK(contains(res.out, p + "counts before " + kEmptyCounts + " settle_ms "));
    CHECK(contains(res.out, p + "shutdown graceful 1 missing - seconds "));
    CHECK(contains(res.out, p + "counts after " + kEmptyCounts + "\n"));
    CHECK_FALSE(contains(res.err, "RRef state left"));
  }
}

}  // namespace

TEST_CASE("rref multiprocess: an owner killed with SIGKILL fails every handle of its references promptly with "
          "DisconnectedError and the others shut down cleanly") {
  Job job("kill", 3);
  Subprocess& victim = job.proc(1);
  // Ranks 0 and 2 each have a nap pending on the owner, and rank 0 a toHere of a value still
  // being built there.
  bool ready =
      victim.readUntil(
          [](const std::string& out, const std::string&) {
            size_t naps = 0;
            for (size_t pos = out.find("rank 1 nap started\n"); pos != std::string::npos;
                 pos = out.find("rank 1 nap started\n", pos + 1)) {
              ++naps;
            }
            return naps == 2 && contains(out, "rank 1 building slow value\n");
          },
          30s) &&
      job.proc(0).readUntil([](const std::string& out, const std::string&) { return contains(out, "rank 0 pending\n"); },
                            10s) &&
      job.proc(2).readUntil([](const std::string& out, const std::string&) { return contains(out, "rank 2 pending\n"); },
                            10s);
  if (!ready) {
    weft::testing::dumpResults(job.finish(1s));
    FAIL("the owner never served both pending naps and the slow value");
  }

  long long lostAtNs = steadyNowNs();
  REQUIRE(::kill(victim.pid(), SIGKILL) == 0);

  struct Survivor {
    int rank;
    std::vector<std::string> pending;
    std::vector<std::string> later;
  };
  const std::vector<Survivor> survivors = {
      {0, {"toHere", "nap"}, {"rpcSync", "rpcAsync", "remote", "toHere", "toHereSlow", "create"}},
      {2, {"nap"}, {"rpcSync", "rpcAsync", "remote", "create"}},
  };
  for (const Survivor& s : survivors) {
    CAPTURE(s.rank);
    const std::string p = rankPrefix(s.rank);
    auto res = job.proc(s.rank).wait(20s);
    INFO("stdout:\n" << res.out << "\nstderr:\n" << res.err);
    CHECK_FALSE(res.timedOut);
    CHECK(res.exitCode == 0);

    // Operations pending when the owner died fail within 2 s of the kill (both clocks are
    // CLOCK_MONOTONIC), with DisconnectedError naming the owner.
    for (const std::string& what : s.pending) {
      CAPTURE(what);
      const std::string label = p + "pending " + what + " at_ns ";
      long long at = numberAfter(res.out, label);
      REQUIRE(at > 0);
      double after = static_cast<double>(at - lostAtNs) / 1e9;
      MESSAGE("rank " << s.rank << ": pending " << what << " failed " << after * 1000 << " ms after SIGKILL");
      CHECK(after >= 0);
      CHECK(after < 2.0);
      std::string line = restOfLine(res.out, label);
      CHECK(contains(line, " DisconnectedError: "));
      CHECK(contains(line, "worker1"));
    }
    // Later uses of the handles fail at once, the same way.
    for (const std::string& what : s.later) {
      CAPTURE(what);
      const std::string label = p + "later " + what + " in_us ";
      long long us = numberAfter(res.out, label);
      REQUIRE(us >= 0);
      CHECK(us < 100000);
      std::string line = restOfLine(res.out, label);
      CHECK(contains(line, " DisconnectedError: "));
      CHECK(contains(line, "worker1"));
    }
    CHECK(contains(res.out, p + "alive 0\n"));

    // Graceful shutdown names the dead owner, finishes within its 5 s timeout, and leaves no
    // RRef state behind.
    std::string shutdown = restOfLine(res.out, p + "shutdown graceful ");
    CHECK(contains(shutdown, "1 missing worker1 seconds "));
    std::string seconds = restOfLine(shutdown, " seconds ");
    REQUIRE_FALSE(seconds.empty());
    MESSAGE("rank " << s.rank << ": graceful shutdown took " << seconds << " s");
    CHECK(std::stod(seconds) < 5.5);
    CHECK(contains(res.out, p + "counts after " + kEmptyCounts + "\n"));
  }
  CHECK(victim.wait(10s).signal == SIGKILL);
  job.checkAllGone();
}

TEST_CASE("rref multiprocess: a reference forked 0 to 2 to 3 and back to 0 is confirmed and readable at every holder "
          "and every table empties") {
  Job job("chain", 4);
  auto results = job.finish(40s);
  checkSettled(results);
  const std::string v = " confirmed 1 value 4225 id ";
  CHECK(contains(results[0].out, "rank 0 holder creator" + v));
  CHECK(contains(results[2].out, "rank 2 holder hop2" + v));
  CHECK(contains(results[3].out, "rank 3 holder hop3" + v));
  CHECK(contains(results[0].out, "rank 0 holder hop0" + v));
  CHECK(contains(results[0].out, "rank 0 holder returned" + v));
  // Every holder saw the same reference.
  std::vector<long long> ids;
  for (const auto& r : results) {
    for (long long id : numbersAfter(r.out, v)) ids.push_back(id);
  }
  CHECK(ids.size() == 5);
  for (long long id : ids) CHECK(id == ids.front());
  job.checkAllGone();
}

TEST_CASE("rref multiprocess: 10,000 references created, fetched, bounced and dropped leave every table empty") {
  Job job("bulk", 3);
  auto results = job.finish(60s);
  checkSettled(results);
  const std::string& out0 = results[0].out;
  INFO("rank 0 stdout:\n" << out0 << "\nrank 0 stderr:\n" << results[0].err);
  CHECK(contains(out0, "rank 0 bulk created 10100 fetched 1000 bounced 600 create_seconds "));
  MESSAGE("rank 0: created 10,100 references in " << restOfLine(out0, " create_seconds ").substr(0, 8)
                                                  << " s; all confirmed, fetched and bounced after "
                                                  << restOfLine(out0, " seconds ") << " s");
  MESSAGE("rank 0: dropped them in " << restOfLine(out0, "rank 0 bulk dropped seconds ") << " s");
  // While rank 0 held them, the owner had every one of them, each with rank 0's forks (one per handle, 600 of them bounced).
  const std::string& out1 = results[1].out;
  CHECK(numberAfter(out1, "rank 1 counts loaded owned ") == 10100);
  CHECK(numberAfter(out1, "rank 1 counts loaded owned 10100 forks ") >= 10700);
  MESSAGE("rank 1: tables empty " << numberAfter(out1, " settle_ms ") << " ms after every rank dropped");
  job.checkAllGone();
}

TEST_CASE("rref multiprocess: toHere of a 64 MiB float tensor owned by another process") {
  Job job("tensor", 2);
  auto results = job.finish(60s);
  checkSettled(results);
  const std::string& out0 = results[0].out;
  CHECK(contains(out0, "rank 0 tensor bytes 67108864 elements_ok 1 first_ms "));
  MESSAGE("64 MiB toHere: first (building it included) " << restOfLine(out0, " first_ms ") << " ms");
  job.checkAllGone();
}

TEST_CASE("rref multiprocess: references in a vector in a struct travel user to third worker and owner to user") {
  Job job("parcel", 3);
  auto results = job.finish(40s);
  checkSettled(results);
  const std::string& out0 = results[0].out;
  const std::string& out2 = results[2].out;
  CHECK(contains(out0, "rank 0 parcel user-to-third sum 31.000000\n"));
  CHECK(contains(out2, "rank 2 used parcel user-to-third refs 3 confirmed 1 sum 31.000000 localValue "
                       "InvalidArgumentError: "));
  CHECK(contains(out0, "rank 0 parcel owner-to-user refs 3 confirmed_at_once 1 sum 12.000000\n"));
  CHECK(contains(out2, "rank 2 used parcel owner-to-user-to-third refs 3 confirmed 1 sum 12.000000 localValue "
                       "InvalidArgumentError: "));
  CHECK(contains(out0, "rank 0 parcel owner-to-user-to-third sum 12.000000\n"));
  job.checkAllGone();
}

TEST_CASE("rref multiprocess: localValue on a user and a throwing remote constructor or function, seen by the user") {
  Job job("errors", 2);
  auto results = job.finish(40s);
  checkSettled(results);
  const std::string& out0 = results[0].out;
  std::string localValue = restOfLine(out0, "rank 0 localValue ");
  CHECK(contains(localValue, "InvalidArgumentError: "));
  CHECK(contains(localValue, "not the owner"));
  CHECK(contains(localValue, "worker1"));
  for (const char* use : {"first", "second"}) {
    CAPTURE(use);
    std::string line = restOfLine(out0, std::string("rank 0 constructor ") + use + " ");
    CHECK(contains(line, "RemoteError: "));
    CHECK(contains(line, "worker1"));
    CHECK(contains(line, "Exploding constructor"));
    CHECK(contains(line, "the constructor exploded on purpose"));
  }
  std::string function = restOfLine(out0, "rank 0 function ");
  CHECK(contains(function, "RemoteError: "));
  CHECK(contains(function, "worker1"));
  CHECK(contains(function, "rref_worker.explode"));
  CHECK(contains(function, "the function exploded on purpose"));
  CHECK(contains(results[1].out, "rank 1 localValue owner sum 12.000000\n"));
  job.checkAllGone();
}
