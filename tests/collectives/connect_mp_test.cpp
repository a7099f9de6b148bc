// The end of a group's connect across real processes on 127.0.0.1 (tests/collectives/helpers/
// collectives_worker.cpp, scenarios leave and stall): a rank whose group is connected must not
// close its connections while a peer's Gloo loop thread has yet to accept them. Gloo's loop thread
// asks for the peer's name of each connection it accepts and throws (an abort of the process)
// when the connection was reset in the meantime; a rank that leaves right after its group is
// built resets its connections. The test makes the peer late deterministically: it serves the
// store itself, stops rank 1 (SIGSTOP) once rank 1 listens and has given its addresses, lets rank
// 0 connect (the kernel completes the connection without rank 1's loop thread), and resumes rank 1
// only once rank 0 has either left or is waiting for rank 1. Rank 1 binds 127.0.0.1 and rank 0
// 127.0.0.2, so that rank 1 is the side that accepts (Gloo's rule: the greater address dials).
// Every wait is bounded and every process is checked to be gone at the end.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "captured_text.h"
#include "mp_job.h"
#include "rpc/store.h"

using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::rankEnv;
using weft::testing::rankPrefix;
using weft::testing::restOfLine;
using weft::testing::Subprocess;

namespace {

struct LateAcceptRun {
  Subprocess::Result rank0;
  Subprocess::Result rank1;
  bool rank1Stopped = false;  // rank 1 was stopped before rank 0 started
  bool rank0Waited = false;   // rank 0 said it waits for rank 1 instead of leaving
};

// Rank 1 listens and is stopped; rank 0 connects and goes on (scenario `scenario` of
// collectives_worker); rank 1 is resumed once rank 0 has ended, or (with `resumeOnWait`) says in
// the store that it waits for rank 1's connections, or after `resumeAfter` at the latest.
LateAcceptRun runLateAccept(const std::string& scenario, bool resumeOnWait, std::chrono::milliseconds resumeAfter) {
  weft::rpc::StoreServer::Config sc;
  sc.port = 0;
  weft::rpc::StoreServer server(sc);
  weft::rpc::StoreClient::Config cc;
  cc.port = server.port();
  cc.timeout = 20s;
  weft::rpc::StoreClient store(cc);
  const std::vector<std::string> settings{"WEFT_STORE_TIMEOUT=20"};
  LateAcceptRun run;

  Subprocess rank1({COLLECTIVES_WORKER_PATH, scenario, "127.0.0.1"}, rankEnv(1, 2, server.port(), settings));
  try {
    store.wait({"weft/pg/default/mesh/1"}, 20s);
    run.rank1Stopped = ::kill(rank1.pid(), SIGSTOP) == 0;
  } catch (const weft::TimeoutError&) {
  }
  Subprocess rank0({COLLECTIVES_WORKER_PATH, scenario, "127.0.0.2"}, rankEnv(0, 2, server.port(), settings));
  bool ended = false;
  const auto until = std::chrono::steady_clock::now() + resumeAfter;
  while (!ended && std::chrono::steady_clock::now() < until) {
    ended = rank0.tryReap(run.rank0);
    if (!ended && !run.rank0Waited) run.rank0Waited = store.check({"weft/pg/default/mesh/up/0"});
    if (run.rank0Waited && resumeOnWait) break;
    rank0.pump(20ms);
  }
  ::kill(rank1.pid(), SIGCONT);
  if (!ended) run.rank0 = rank0.wait(40s);
  run.rank1 = rank1.wait(40s);
  CHECK(weft::testing::processGone(rank0.pid(), 5s));
  CHECK(weft::testing::processGone(rank1.pid(), 5s));
  return run;
}

std::string text(const Subprocess::Result& r, int rank) {
  return "rank " + std::to_string(rank) + " exit " + std::to_string(r.exitCode) + " signal " +
         std::to_string(r.signal) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

}  // namespace

TEST_CASE("a rank that leaves right after its group is built does not abort a peer whose loop thread has not yet "
          "accepted its connection: the peer's collective fails with DisconnectedError") {
  LateAcceptRun run = runLateAccept("leave", true, 15s);
  INFO(text(run.rank0, 0));
  INFO(text(run.rank1, 1));
  REQUIRE(run.rank1Stopped);
  // Rank 0 may not return before rank 1 has taken up the connection it dialled.
  CHECK(run.rank0Waited);
  CHECK(run.rank1.signal == 0);
  CHECK(run.rank1.exitCode == 0);
  CHECK(contains(run.rank1.out, rankPrefix(1) + "joined\n"));
  const std::string failed = restOfLine(run.rank1.out, rankPrefix(1) + "allReduce ");
  CHECK(contains(failed, "DisconnectedError: "));
  CHECK(contains(failed, "rank 0"));
  CHECK(run.rank0.exitCode == 0);
  CHECK(contains(run.rank0.out, rankPrefix(0) + "joined\n"));
}

TEST_CASE("a peer stalled past the group's timeout while connecting is named by the rank waiting for it, and "
          "fails with a weft error once it resumes, without an abort") {
  // Rank 1 stays stopped past rank 0's 3 s timeout.
  LateAcceptRun run = runLateAccept("stall", false, 8s);
  INFO(text(run.rank0, 0));
  INFO(text(run.rank1, 1));
  REQUIRE(run.rank1Stopped);
  CHECK(run.rank0.exitCode == 0);
  const std::string rank0 = restOfLine(run.rank0.out, rankPrefix(0) + "create ");
  CHECK(contains(rank0, "TimeoutError: ProcessGroupGloo: group 'default' (rank 0 of 2): rank 0 connected to every "
                        "peer, but rank [1] has not finished connecting after "));
  CHECK(run.rank1.signal == 0);
  CHECK(run.rank1.exitCode == 0);
  // Rank 1 learns of rank 0's failure from the store (or from the connection rank 0 closed).
  const std::string rank1 = restOfLine(run.rank1.out, rankPrefix(1) + "create ");
  CHECK(contains(rank1, "DisconnectedError: ProcessGroupGloo: group 'default' (rank 1 of 2): "));
  CHECK(contains(rank1, "rank 0"));
}
