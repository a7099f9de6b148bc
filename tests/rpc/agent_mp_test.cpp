// The Agent across real processes on 127.0.0.1 (tests/rpc/helpers/agent_worker.cpp):
// a worker killed with SIGKILL, or stopped with SIGSTOP, in the middle of calls
// made to it or while the others wait for it in the shutdown barrier, or killed
// with bytes unread in its socket (a reset); a whole job stopped for longer than
// its heartbeat window, and a busy worker among spinning processes, neither of
// which may be declared dead; and jobs started through the built weftrun, one of
// whose ranks fails. Every wait is bounded and every process is checked to be
// gone at the end.
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "rpc/agent_group.h"
#include "tools/subprocess.h"
#include "captured_text.h"

using namespace std::chrono_literals;
using weft::testing::freePort;
using weft::testing::processGone;
using weft::testing::Subprocess;

using weft::testing::contains;
using weft::testing::numbersAfter;
using weft::testing::restOfLine;

namespace {

using Clock = std::chrono::steady_clock;

// Settings every worker of these tests gets: short bounds, fast failure
// detection (a silent peer is declared dead after 5 heartbeat intervals).
std::vector<std::string> commonEnv(const std::string& heartbeatSeconds = "0.5") {
  return {"WEFT_HEARTBEAT_INTERVAL=" + heartbeatSeconds, "WEFT_HEARTBEAT_MISSES=5", "WEFT_SHUTDOWN_TIMEOUT=5",
          "WEFT_STORE_TIMEOUT=20", "WEFT_RPC_TIMEOUT=30", "WEFT_NUM_WORKER_THREADS=2"};
}

// The environment of rank `rank` of `world` whose store is at 127.0.0.1:port.
std::vector<std::string> rankEnv(int rank, int world, uint16_t port, const std::string& heartbeatSeconds) {
  std::vector<std::string> env = commonEnv(heartbeatSeconds);
  for (std::string v : {"WEFT_RANK=" + std::to_string(rank), "WEFT_WORLD_SIZE=" + std::to_string(world),
                        "WEFT_LOCAL_RANK=" + std::to_string(rank), std::string("WEFT_MASTER_ADDR=127.0.0.1"),
                        "WEFT_MASTER_PORT=" + std::to_string(port)}) {
    env.push_back(v);
  }
  return env;
}

// "[r] rank r ", how weftrun --tag-output shows rank r's lines of agent_worker.
// (Built with append: GCC 12 warns falsely, -Wrestrict, on "[" + std::string.)
std::string tagged(int rank) {
  std::string r = std::to_string(rank);
  return std::string("[").append(r).append("] rank ").append(r).append(" ");
}

// "ring ok next worker<n>", the line rank r of a ring prints about its successor.
std::string ringLine(int rank, int world) {
  return std::string("ring ok next worker").append(std::to_string((rank + 1) % world));
}

long long steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Runs the `kill` scenario of agent_worker with 3 workers: once the victim
// (rank 2) is serving both survivors' calls, sends it `sig`, and checks that
// the survivors' pending calls failed with DisconnectedError within `bound` of it,
// that later calls failed at once, that they served each other and shut down
// gracefully, reporting the victim missing.
void loseVictimMidCall(int sig, const std::string& heartbeatSeconds, std::chrono::milliseconds bound) {
  constexpr int kWorld = 3;
  const uint16_t port = freePort();
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (int r = 0; r < kWorld; ++r) {
    procs.push_back(std::make_unique<Subprocess>(std::vector<std::string>{AGENT_WORKER_PATH, "kill"},
                                                 rankEnv(r, kWorld, port, heartbeatSeconds)));
  }
  Subprocess& victim = *procs[kWorld - 1];

  // Both survivors' calls are being served by the victim when it is lost.
  bool serving = victim.readUntil(
      [](const std::string& out, const std::string&) {
        return contains(out, "rank 2 victim ready\n") && contains(out, "serving hang from worker0\n") &&
               contains(out, "serving hang from worker1\n");
      },
      30s);
  if (!serving) {
    for (auto& p : procs) {
      auto r = p->wait(1s);
      INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
      CHECK(false);
    }
  }
  REQUIRE(serving);

  long long lostAtNs = steadyNowNs();
  REQUIRE(::kill(victim.pid(), sig) == 0);

  for (int r = 0; r < kWorld - 1; ++r) {
    CAPTURE(r);
    Subprocess& p = *procs[static_cast<size_t>(r)];
    auto res = p.wait(20s);
    INFO("stdout:\n" << res.out << "\nstderr:\n" << res.err);
    CHECK_FALSE(res.timedOut);
    CHECK(res.exitCode == 0);
    CHECK(contains(res.out, "rank " + std::to_string(r) + " pid "));
    CHECK(contains(res.out, "calling"));

    // The pending call failed within the bound (both clocks are CLOCK_MONOTONIC), plus the time the
    // survivor itself could not run: its heartbeat silence leaves out its own stalls (a loaded
    // machine not scheduling it), and the bound is about the detector, not the scheduler.
    std::vector<long long> at = numbersAfter(res.out, "disconnected at_ns ");
    REQUIRE(at.size() == 1);
    std::vector<long long> stallMs = numbersAfter(res.out, "stall_ms ");
    REQUIRE(stallMs.size() == 1);
    double after = static_cast<double>(at[0] - lostAtNs) / 1e9;
    MESSAGE("rank " << r << ": pending call failed " << after * 1000 << " ms after the signal; longest stall "
                    << stallMs[0] << " ms");
    CHECK(after >= 0);
    CHECK(after * 1000 < static_cast<double>(bound.count() + stallMs[0]));
    CHECK(contains(restOfLine(res.out, "disconnected at_ns "), "worker2"));

    // Later calls fail at once, and the victim no longer counts as alive.
    std::vector<long long> laterUs = numbersAfter(res.out, "later DisconnectedError in_us ");
    REQUIRE(laterUs.size() == 1);
    CHECK(laterUs[0] < 100000);
    CHECK(contains(res.out, "alive 0\n"));

    // The survivors served each other: 0 + 1 + ... + 99.
    CHECK(numbersAfter(res.out, "peer sum ") == std::vector<long long>{4950});

    // Graceful shutdown names the lost worker and ends promptly: the barrier fails at once, with
    // no wait for the 5 s shutdown timeout.
    std::string shutdown = restOfLine(res.out, "shutdown graceful ");
    CHECK(contains(shutdown, "1 missing worker2 seconds "));
    std::string seconds = restOfLine(res.out, " seconds ");
    REQUIRE_FALSE(seconds.empty());
    CHECK(std::stod(seconds) < 3.0);
  }
  if (sig != SIGKILL) ::kill(victim.pid(), SIGKILL);  // a stopped process still dies of SIGKILL
  CHECK(victim.wait(10s).signal == SIGKILL);
  for (auto& p : procs) CHECK(processGone(p->pid(), 5s));
}

// Runs the `barrier_loss` scenario of agent_worker with 4 workers: once ranks 0 and 1 have waited
// in their graceful shutdown for half a second while rank 3 keeps calling them, sends the victim
// (rank 2) `sig`, and checks that both left the barrier within `bound` seconds of it, naming the
// victim, and that rank 3, whose calls then fail, names the victim alone too.
void loseVictimInBarrier(int sig, const std::string& heartbeatSeconds, double bound) {
  constexpr int kWorld = 4;
  const uint16_t port = freePort();
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (int r = 0; r < kWorld; ++r) {
    procs.push_back(std::make_unique<Subprocess>(std::vector<std::string>{AGENT_WORKER_PATH, "barrier_loss"},
                                                 rankEnv(r, kWorld, port, heartbeatSeconds)));
  }
  Subprocess& victim = *procs[2];
  const std::vector<std::string> readyLines = {"rank 0 in shutdown\n", "rank 1 in shutdown\n",
                                               "rank 2 victim ready\n", "rank 3 working\n"};
  bool ready = true;
  for (int r = 0; r < kWorld && ready; ++r) {
    const std::string& line = readyLines[static_cast<size_t>(r)];
    ready = procs[static_cast<size_t>(r)]->readUntil(
        [&line](const std::string& out, const std::string&) { return contains(out, line); }, 30s);
  }
  if (!ready) {
    for (auto& p : procs) {
      auto res = p->wait(1s);
      INFO("stdout:\n" << res.out << "\nstderr:\n" << res.err);
      CHECK(false);
    }
  }
  REQUIRE(ready);
  std::this_thread::sleep_for(500ms);  // they wait in the barrier, for as long as the job runs

  long long lostAtNs = steadyNowNs();
  REQUIRE(::kill(victim.pid(), sig) == 0);
  for (int r : {0, 1, 3}) {
    CAPTURE(r);
    auto res = procs[static_cast<size_t>(r)]->wait(20s);
    INFO("stdout:\n" << res.out << "\nstderr:\n" << res.err);
    CHECK_FALSE(res.timedOut);
    CHECK(res.exitCode == 0);
    std::vector<long long> at = numbersAfter(res.out, " left at_ns ");
    REQUIRE(at.size() == 1);
    double after = static_cast<double>(at[0] - lostAtNs) / 1e9;
    MESSAGE("rank " << r << " left " << after * 1000 << " ms after the signal");
    CHECK(after >= 0);  // it was still in the job
    CHECK(after < bound);
    CHECK(contains(restOfLine(res.out, " left at_ns "), " graceful 1 missing worker2"));
    CHECK(restOfLine(res.out, " missing ") == "worker2");
    if (r == 3) {
      // It was served by both while they waited in their shutdown (25 calls in the half second).
      std::vector<long long> calls = numbersAfter(res.out, "calls ended after ");
      REQUIRE(calls.size() == 1);
      CHECK(calls[0] >= 10);
    }
  }
  if (sig != SIGKILL) ::kill(victim.pid(), SIGKILL);
  CHECK(victim.wait(10s).signal == SIGKILL);
  for (auto& p : procs) CHECK(processGone(p->pid(), 5s));
}

}  // namespace

TEST_CASE("workers waiting in the shutdown barrier for a worker that is killed (SIGKILL) leave it within 1 s, "
          "naming it") {
  loseVictimInBarrier(SIGKILL, "0.5", 1.0);
}

TEST_CASE("workers waiting in the shutdown barrier for a worker that stops answering (SIGSTOP) leave it once "
          "the heartbeat declares it dead, naming it") {
  // 5 heartbeat intervals of 0.2 s of silence, then at once.
  loseVictimInBarrier(SIGSTOP, "0.2", 2.5);
}

TEST_CASE("a worker killed with SIGKILL mid-call: the others get DisconnectedError within 100 ms, keep serving "
          "each other and shut down cleanly") {
  // Its sockets close with the process: noticed at once, whatever the heartbeat.
  loseVictimMidCall(SIGKILL, "0.5", 100ms);
}

TEST_CASE("a worker that stops answering (SIGSTOP) is declared dead by heartbeat: the others get DisconnectedError "
          "within 2 s and shut down cleanly") {
  // Its sockets stay open, so only the heartbeat notices: 5 intervals of 0.2 s of silence.
  loseVictimMidCall(SIGSTOP, "0.2", 2s);
}

TEST_CASE("a worker killed with bytes unread in its socket (a reset): the pending call fails within 100 ms") {
  // Stopped first, so that the call's bytes stay unread: its death then resets the connection
  // instead of closing it. Heartbeats of 1 s keep them out of the picture: the survivor writes
  // nothing after the kill for 1 s, so only the reset itself can end the call in time.
  const uint16_t port = freePort();
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (int r = 0; r < 2; ++r) {
    procs.push_back(std::make_unique<Subprocess>(std::vector<std::string>{AGENT_WORKER_PATH, "reset"},
                                                 rankEnv(r, 2, port, "1")));
  }
  Subprocess& survivor = *procs[0];
  Subprocess& victim = *procs[1];
  auto dump = [&] {
    for (auto& p : procs) {
      auto res = p->wait(1s);
      MESSAGE("stdout:\n" << res.out << "\nstderr:\n" << res.err);
    }
  };
  bool ready = victim.readUntil([](const std::string& out, const std::string&) {
    return contains(out, "rank 1 victim ready\n");
  }, 30s) && survivor.readUntil([](const std::string& out, const std::string&) {
    return contains(out, "rank 0 waiting for SIGUSR1\n");
  }, 30s);
  if (!ready) dump();
  REQUIRE(ready);

  REQUIRE(::kill(victim.pid(), SIGSTOP) == 0);
  REQUIRE(::kill(survivor.pid(), SIGUSR1) == 0);
  bool calling = survivor.readUntil(
      [](const std::string& out, const std::string&) { return contains(out, "rank 0 calling\n"); }, 10s);
  if (!calling) dump();
  REQUIRE(calling);
  long long killedAtNs = steadyNowNs();
  REQUIRE(::kill(victim.pid(), SIGKILL) == 0);

  auto res = survivor.wait(20s);
  INFO("stdout:\n" << res.out << "\nstderr:\n" << res.err);
  CHECK_FALSE(res.timedOut);
  CHECK(res.exitCode == 0);
  // Within 100 ms, plus the time the survivor's loop itself could not run (a loaded machine
  // not scheduling it; see the SIGSTOP test).
  std::vector<long long> at = numbersAfter(res.out, "disconnected at_ns ");
  REQUIRE(at.size() == 1);
  std::vector<long long> stallMs = numbersAfter(res.out, "stall_ms ");
  REQUIRE(stallMs.size() == 1);
  double afterMs = static_cast<double>(at[0] - killedAtNs) / 1e6;
  MESSAGE("the pending call failed " << afterMs << " ms after the kill; longest stall " << stallMs[0] << " ms");
  CHECK(afterMs >= 0);
  CHECK(afterMs < 100 + static_cast<double>(stallMs[0]));
  CHECK(contains(restOfLine(res.out, "disconnected at_ns "), "worker1"));
  CHECK(victim.wait(10s).signal == SIGKILL);
  for (auto& p : procs) CHECK(processGone(p->pid(), 5s));
}

TEST_CASE("workers stalled together for longer than the heartbeat window do not declare each other dead") {
  // A loaded machine can leave every process of a job unscheduled for a while; SIGSTOP on all
  // of them at once is that stall, made exact. Each counts only the silence it was awake to
  // observe, so none of them blames the others for time nobody was watching.
  constexpr int kWorld = 3;
  const uint16_t port = freePort();
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (int r = 0; r < kWorld; ++r) {
    procs.push_back(std::make_unique<Subprocess>(std::vector<std::string>{AGENT_WORKER_PATH, "freeze"},
                                                 rankEnv(r, kWorld, port, "0.2")));
  }
  bool ready = true;
  for (int r = 0; r < kWorld; ++r) {
    std::string line = std::string("rank ").append(std::to_string(r)).append(" ready\n");
    ready = procs[static_cast<size_t>(r)]->readUntil(
                [&](const std::string& out, const std::string&) { return contains(out, line); }, 30s) &&
            ready;
  }
  if (!ready) {
    for (auto& p : procs) {
      auto res = p->wait(1s);
      MESSAGE("stdout:\n" << res.out << "\nstderr:\n" << res.err);
    }
  }
  REQUIRE(ready);
  for (auto& p : procs) REQUIRE(::kill(p->pid(), SIGSTOP) == 0);
  std::this_thread::sleep_for(2s);  // twice the window of 5 x 0.2 s
  for (auto& p : procs) REQUIRE(::kill(p->pid(), SIGCONT) == 0);
  std::this_thread::sleep_for(500ms);  // a few heartbeat checks
  for (auto& p : procs) REQUIRE(::kill(p->pid(), SIGUSR1) == 0);

  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    auto res = procs[static_cast<size_t>(r)]->wait(30s);
    INFO("stdout:\n" << res.out << "\nstderr:\n" << res.err);
    CHECK_FALSE(res.timedOut);
    CHECK(res.exitCode == 0);
    std::string prefix = std::string("rank ").append(std::to_string(r)).append(" ");
    CHECK(contains(res.out, prefix + "alive 1 calls ok"));
    std::vector<long long> stallMs = numbersAfter(res.out, "stall_ms ");
    REQUIRE(stallMs.size() == 1);
    CHECK(stallMs[0] >= 1500);  // the stop was seen as a stall of its own
    CHECK(contains(res.out, prefix + "shutdown clean 1\n"));
    CHECK_FALSE(contains(res.err, "lost worker"));
  }
  for (auto& p : procs) CHECK(processGone(p->pid(), 5s));
}

TEST_CASE("a busy worker, every thread spinning and spinning processes alongside, is never declared dead") {
  // Four spinning processes (each in its own process group, killed with it; `timeout` bounds
  // them should this test die first), and both handler threads and the main thread of rank 1
  // spinning too: its loop thread must still answer heartbeats, with a window of 5 x 0.2 s. (On
  // two shared cores its loop thread has waited up to 0.2 s for the CPU here.)
  std::vector<std::unique_ptr<Subprocess>> spinners;
  for (int i = 0; i < 4; ++i) {
    spinners.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{"/usr/bin/timeout", "30", "/bin/sh", "-c", "while :; do :; done"}));
  }
  const uint16_t port = freePort();
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (int r = 0; r < 2; ++r) {
    procs.push_back(std::make_unique<Subprocess>(std::vector<std::string>{AGENT_WORKER_PATH, "busy"},
                                                 rankEnv(r, 2, port, "0.2")));
  }
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    auto res = procs[static_cast<size_t>(r)]->wait(60s);
    INFO("stdout:\n" << res.out << "\nstderr:\n" << res.err);
    CHECK_FALSE(res.timedOut);
    CHECK(res.exitCode == 0);
    std::string prefix = std::string("rank ").append(std::to_string(r)).append(" ");
    CHECK(contains(res.out, prefix + "busy ok alive 1"));
    std::vector<long long> stallMs = numbersAfter(res.out, "stall_ms ");
    if (!stallMs.empty()) MESSAGE("rank " << r << ": longest stall " << stallMs[0] << " ms");
    CHECK(contains(res.out, prefix + "shutdown clean 1\n"));
    CHECK_FALSE(contains(res.err, "lost worker"));
  }
  for (auto& s : spinners) ::kill(-s->pid(), SIGKILL);
  for (auto& s : spinners) CHECK(s->wait(5s).signal == SIGKILL);
  for (auto& p : procs) CHECK(processGone(p->pid(), 5s));
}

TEST_CASE("a job of three agents started by weftrun calls around the ring and shuts down cleanly") {
  Subprocess run({WEFTRUN_PATH, "-n", "3", "--tag-output", AGENT_WORKER_PATH, "ring"}, commonEnv());
  auto r = run.wait(60s);
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK_FALSE(r.timedOut);
  CHECK(r.exitCode == 0);
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(contains(r.out, tagged(rank) + ringLine(rank, 3) + "\n"));
    CHECK(contains(r.out, tagged(rank) + "shutdown clean 1\n"));
  }
  std::vector<long long> pids = numbersAfter(r.out, " pid ");
  CHECK(pids.size() == 3);
  for (long long pid : pids) CHECK(processGone(static_cast<pid_t>(pid), 5s));
}

TEST_CASE("when one agent of a weftrun job fails, weftrun stops the others and exits with that rank's status") {
  Subprocess run({WEFTRUN_PATH, "-n", "3", "--tag-output", "--grace-period", "5", AGENT_WORKER_PATH, "fail", "1", "7"},
                 commonEnv());
  auto r = run.wait(60s);
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK_FALSE(r.timedOut);
  CHECK(r.exitCode == 7);
  CHECK(r.seconds < 15);  // the waiting ranks were stopped, not waited for
  CHECK(contains(r.out, "[1] rank 1 failing with code 7\n"));
  CHECK(contains(r.out, "[0] rank 0 waiting\n"));
  CHECK(contains(r.out, "[2] rank 2 waiting\n"));
  CHECK_FALSE(contains(r.out, "was not stopped"));
  CHECK(contains(r.err, "rank 1"));
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(contains(r.out, tagged(rank) + ringLine(rank, 3)));
  }
  std::vector<long long> pids = numbersAfter(r.out, " pid ");
  CHECK(pids.size() == 3);
  for (long long pid : pids) CHECK(processGone(static_cast<pid_t>(pid), 5s));
}
