// A program for the Agent's multiprocess tests: one process of a weft job, which
// finds its place in the job through rpc::Options::fromEnv (as a real program
// does) and plays the part its scenario names. It prints one line per event, in
// a form the tests parse ("key value" pairs after a fixed phrase).
//
//   weftrun -n 3 agent_worker ring              # every rank calls the next, then all shut down
//   WEFT_RANK=0 WEFT_WORLD_SIZE=3 ... agent_worker kill
//
// Scenarios:
//   ring              calls echo and whoami on the next rank (round robin), prints
//                     "rank R ring ok next <name>", shuts down gracefully, prints
//                     "rank R shutdown clean <0|1>"; exits 0 when clean
//   kill              the last rank is the victim: it prints "rank R victim ready"
//                     and sleeps (a test kills it with SIGKILL while it serves).
//                     The others each call `hang` on the victim (its body prints
//                     "serving hang from <caller>" and sleeps), print "calling",
//                     and when the call fails print
//                       "disconnected at_ns <steady clock ns> after_ms <ms since the call>: <message>"
//                     then call the victim again and print
//                       "later DisconnectedError in_us <us>"
//                     and "alive <0|1>" (whether the agent still counts it alive),
//                     call each other 100 times ("peer sum <sum of the echoes>"),
//                     meet at a store barrier, shut down gracefully and print
//                       "shutdown graceful <0|1> missing <names, comma-separated> seconds <s>"
//                     After the failure it also prints "stall_ms <ms>", the longest stall of its
//                     agent's loop (AgentStats::longestStall)
//   reset             two ranks; rank 1 is the victim: it prints "rank 1 victim ready" and sleeps.
//                     Rank 0 prints "rank 0 waiting for SIGUSR1", and on SIGUSR1 (the test
//                     has stopped the victim meanwhile, so the call's bytes stay unread in its
//                     socket) calls `hang` on it, prints "calling" once the call's frame is
//                     written, and when the call fails
//                     prints "disconnected at_ns ..." as in kill, and "stall_ms <ms>"
//   freeze            every rank calls the next, prints "rank R ready", waits for SIGUSR1 (the
//                     test stops and resumes every rank meanwhile), calls the next rank 20
//                     times, prints "rank R alive <0|1> calls ok stall_ms <ms>", shuts down
//                     gracefully and prints "rank R shutdown clean <0|1>"; exits 0 when clean
//   busy              two ranks; every handler thread of rank 1 spins on the CPU: rank 0 keeps
//                     2 x WEFT_NUM_WORKER_THREADS calls of `spin` (300 ms of busy loop each) in
//                     flight for 3 s while rank 1's main thread spins too, then both print
//                     "rank R busy ok alive <0|1> stall_ms <ms>", shut down gracefully and print
//                     "rank R shutdown clean <0|1>"; exits 0 when clean
//   barrier_loss      rank 2 is the victim: it prints "rank 2 victim ready" and sleeps (a
//                     test kills or stops it). Ranks 0 and 1 print "rank R in shutdown" and
//                     shut down gracefully (they wait there while the job runs). Rank 3
//                     prints "rank 3 working" and calls ranks 0 and 1 in turn, every 20 ms,
//                     until a call fails, then prints "rank 3 calls ended after <N>: <message>"
//                     and shuts down. Each but the victim then prints
//                       "rank R left at_ns <steady clock ns> graceful <0|1> missing <names>"
//   fail <rank> <code>  like ring; the others print "rank R waiting"; after a store
//                     barrier of all ranks, rank <rank> prints "rank R failing with code C"
//                     and returns C from main (the agent's destructor closes it) while
//                     the others sleep, to be stopped by the launcher
// Every rank first prints "rank R pid P started". Every wait is bounded (60 s at
// most), so a broken agent cannot leave a process running for long. Errors print
// one line to stderr and exit non-zero.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "rpc/agent.h"
#include "rpc/options.h"
#include "rpc/store.h"

namespace {

using namespace weft;
using namespace weft::rpc;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const Function<int64_t(int64_t)> echo{"echo"};
const Function<std::string()> whoami{"whoami"};
const Function<int32_t(int32_t)> hang{"hang"};
const Function<int64_t(int32_t)> spin{"spin"};

// Keeps this thread on the CPU for `ms` (no sleeping, no system calls); returns the rounds spun.
int64_t spinFor(std::chrono::milliseconds ms) {
  auto until = Clock::now() + ms;
  volatile int64_t rounds = 0;
  while (Clock::now() < until) {
    for (int i = 0; i < 1000; ++i) rounds = rounds + 1;
  }
  return rounds;
}

std::atomic<bool> gotUsr1{false};

void onUsr1(int) { gotUsr1 = true; }

void catchUsr1() {
  struct sigaction sa {};
  sa.sa_handler = onUsr1;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
}

// Waits (60 s at most) for SIGUSR1; false when it never came.
bool waitForUsr1() {
  auto deadline = Clock::now() + 60s;
  while (!gotUsr1 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  return gotUsr1;
}

long long steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// The steady clock when `f` completes, taken by the completing thread (the agent's loop thread
// when it fails a call): what the test measures is the agent, not this process's main thread
// waking up later.
// Read it with whenCompleted: the continuation runs just after waiters wake.
template <class T>
std::shared_ptr<std::atomic<long long>> completionTime(const Future<T>& f) {
  auto at = std::make_shared<std::atomic<long long>>(0);
  f.onComplete([at](const Future<T>&) noexcept { *at = steadyNs(); });
  return at;
}

long long whenCompleted(const std::atomic<long long>& at) {
  auto deadline = Clock::now() + 5s;
  while (at.load() == 0 && Clock::now() < deadline) std::this_thread::sleep_for(100us);
  return at.load();
}

void say(const std::string& line) {
  std::string text = line + "\n";
  ssize_t unused = ::write(STDOUT_FILENO, text.data(), text.size());
  (void)unused;
}

std::string prefix(const Agent& agent) { return "rank " + std::to_string(agent.rank()) + " "; }

// Binds the functions every scenario serves.
void bindAll(Agent& agent) {
  agent.registry().impl(echo, [](int64_t v) { return v; });
  agent.registry().impl(whoami, [&agent] { return agent.name(); });
  agent.registry().impl(spin, [](int32_t ms) { return spinFor(std::chrono::milliseconds(ms)); });
  agent.registry().impl(hang, [](const CallContext& ctx, int32_t ms) {
    say("serving hang from " + ctx.callerName);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return ms;
  });
}

void startAgent(Agent& agent) {
  bindAll(agent);
  agent.start();
  say(prefix(agent) + "pid " + std::to_string(::getpid()) + " started");
}

// Calls the next rank; throws on a wrong answer.
std::string ringCall(Agent& agent) {
  int next = (agent.rank() + 1) % agent.worldSize();
  int64_t v = agent.rank() * 1000 + 7;
  int64_t got = agent.call(next, echo, v);
  if (got != v) throw Error("echo from rank " + std::to_string(next) + " returned " + std::to_string(got));
  return agent.call(next, whoami);
}

int ring(Agent& agent) {
  startAgent(agent);
  say(prefix(agent) + "ring ok next " + ringCall(agent));
  ShutdownReport report = agent.shutdown();
  say(prefix(agent) + "shutdown clean " + std::to_string(report.clean()));
  return report.clean() ? 0 : 5;
}

int kill(Agent& agent) {
  startAgent(agent);
  const int victim = agent.worldSize() - 1;
  if (agent.rank() == victim) {
    say(prefix(agent) + "victim ready");
    std::this_thread::sleep_for(60s);
    say(prefix(agent) + "victim was not killed");
    return 6;
  }

  auto calledAt = Clock::now();
  Future<int32_t> pending = agent.callAsync(victim, hang, {.timeout = 0ms}, 30000);
  auto failedAt = completionTime(pending);
  say(prefix(agent) + "calling");
  if (!pending.waitFor(40s)) {
    say(prefix(agent) + "the call to the victim never failed");
    return 3;
  }
  try {
    pending.get();
    say(prefix(agent) + "the call to the victim succeeded");
    return 3;
  } catch (const DisconnectedError& e) {
    long long at = whenCompleted(*failedAt);
    say("disconnected at_ns " + std::to_string(at) + " after_ms " +
        std::to_string((at - std::chrono::duration_cast<std::chrono::nanoseconds>(calledAt.time_since_epoch()).count()) /
                       1000000) +
        ": " + e.what());
  }
  say("stall_ms " + std::to_string(agent.stats().longestStall.count()));

  auto laterAt = Clock::now();
  try {
    agent.call(victim, echo, 1);
    say(prefix(agent) + "a later call to the victim succeeded");
    return 3;
  } catch (const DisconnectedError&) {
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - laterAt).count();
    say("later DisconnectedError in_us " + std::to_string(us));
  }
  say(std::string("alive ") + (agent.isAlive(victim) ? "1" : "0"));

  // The survivors keep serving each other.
  int64_t sum = 0;
  for (int i = 0; i < agent.worldSize() - 1; ++i) {
    if (i == agent.rank()) continue;
    for (int64_t k = 0; k < 100; ++k) sum += agent.call(i, echo, k);
  }
  say("peer sum " + std::to_string(sum));
  // A job that lost a worker ends at the first survivor's shutdown (the barrier fails at once),
  // so the survivors finish serving each other first.
  agent.store().barrier("survivors-served", agent.worldSize() - 1, std::chrono::seconds(30));

  auto shutdownAt = Clock::now();
  ShutdownReport report = agent.shutdown();
  std::string missing;
  for (const std::string& m : report.missing) missing += (missing.empty() ? "" : ",") + m;
  say("shutdown graceful " + std::to_string(report.graceful) + " missing " + (missing.empty() ? "-" : missing) +
      " seconds " + std::to_string(std::chrono::duration<double>(Clock::now() - shutdownAt).count()));
  return 0;
}

int reset(Agent& agent) {
  catchUsr1();
  startAgent(agent);
  if (agent.rank() == 1) {
    say(prefix(agent) + "victim ready");
    std::this_thread::sleep_for(60s);
    say(prefix(agent) + "victim was not killed");
    return 6;
  }
  say(prefix(agent) + "waiting for SIGUSR1");
  if (!waitForUsr1()) {
    say(prefix(agent) + "no SIGUSR1");
    return 3;
  }
  const uint64_t written = agent.stats().framesWritten;
  Future<int32_t> pending = agent.callAsync(1, hang, {.timeout = 0ms}, 30000);
  auto failedAt = completionTime(pending);
  // Once the call's frame is written, its bytes sit unread in the stopped victim's socket.
  for (auto until = Clock::now() + 10s; agent.stats().framesWritten == written && Clock::now() < until;) {
    std::this_thread::sleep_for(1ms);
  }
  say(prefix(agent) + "calling");
  if (!pending.waitFor(40s)) {
    say(prefix(agent) + "the call to the victim never failed");
    return 3;
  }
  try {
    pending.get();
    say(prefix(agent) + "the call to the victim succeeded");
    return 3;
  } catch (const DisconnectedError& e) {
    say("disconnected at_ns " + std::to_string(whenCompleted(*failedAt)) + ": " + e.what());
  }
  say("stall_ms " + std::to_string(agent.stats().longestStall.count()));
  agent.shutdown({.graceful = false});
  return 0;
}

int freeze(Agent& agent) {
  catchUsr1();
  startAgent(agent);
  ringCall(agent);
  say(prefix(agent) + "ready");
  if (!waitForUsr1()) {
    say(prefix(agent) + "no SIGUSR1");
    return 3;
  }
  int next = (agent.rank() + 1) % agent.worldSize();
  for (int64_t k = 0; k < 20; ++k) {
    if (agent.call(next, echo, k) != k) throw Error("a wrong echo");
  }
  say(prefix(agent) + "alive " + (agent.isAlive(next) ? "1" : "0") + " calls ok stall_ms " +
      std::to_string(agent.stats().longestStall.count()));
  ShutdownReport report = agent.shutdown();
  say(prefix(agent) + "shutdown clean " + std::to_string(report.clean()));
  return report.clean() ? 0 : 5;
}

int busy(Agent& agent) {
  startAgent(agent);
  const auto kFor = 3s;
  if (agent.rank() == 1) {
    spinFor(kFor);
  } else {
    const int inFlight = 2 * agent.options().numWorkerThreads;
    auto until = Clock::now() + kFor;
    std::vector<Future<int64_t>> calls;
    for (int i = 0; i < inFlight; ++i) calls.push_back(agent.callAsync(1, spin, 300));
    while (Clock::now() < until) {
      for (auto& c : calls) {
        if (c.waitFor(1ms)) {
          c.get();  // throws DisconnectedError if rank 1 was declared dead
          c = agent.callAsync(1, spin, 300);
        }
      }
    }
    for (auto& c : calls) c.get();
  }
  int other = 1 - agent.rank();
  say(prefix(agent) + "busy ok alive " + (agent.isAlive(other) ? "1" : "0") + " stall_ms " +
      std::to_string(agent.stats().longestStall.count()));
  ShutdownReport report = agent.shutdown();
  say(prefix(agent) + "shutdown clean " + std::to_string(report.clean()));
  return report.clean() ? 0 : 5;
}

int fail(Agent& agent, int failRank, int code) {
  startAgent(agent);
  say(prefix(agent) + "ring ok next " + ringCall(agent));
  if (agent.rank() != failRank) say(prefix(agent) + "waiting");
  // Nobody fails before every ring call is answered and every line above is out.
  agent.store().barrier("ring-done", agent.worldSize(), 30s);
  if (agent.rank() == failRank) {
    say(prefix(agent) + "failing with code " + std::to_string(code));
    return code;
  }
  std::this_thread::sleep_for(60s);
  say(prefix(agent) + "was not stopped");
  return 0;
}

// Rank 2 is the victim, rank 3 keeps working, ranks 0 and 1 enter their graceful shutdown at once
// and wait there.
int barrierLoss(Agent& agent) {
  startAgent(agent);
  if (agent.rank() == 2) {
    say(prefix(agent) + "victim ready");
    std::this_thread::sleep_for(60s);  // killed or stopped by the test long before
    return 3;
  }
  if (agent.rank() == 3) {
    say(prefix(agent) + "working");
    int64_t calls = 0;
    auto until = Clock::now() + 60s;
    try {
      for (int64_t k = 0; Clock::now() < until; ++k) {
        if (agent.call(k % 2, echo, k) != k) throw Error("a wrong echo");
        ++calls;
        std::this_thread::sleep_for(20ms);
      }
      return 4;
    } catch (const DisconnectedError& e) {
      say(prefix(agent) + "calls ended after " + std::to_string(calls) + ": " + e.what());
    }
  } else {
    say(prefix(agent) + "in shutdown");
  }
  ShutdownReport report = agent.shutdown();
  auto now = Clock::now();
  std::string missing;
  for (const std::string& m : report.missing) missing += (missing.empty() ? "" : ",") + m;
  say(prefix(agent) + "left at_ns " +
      std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count()) +
      " graceful " + std::to_string(report.graceful) + " missing " + (missing.empty() ? "-" : missing));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string scenario = argc > 1 ? argv[1] : "";
  try {
    Agent agent(Options::fromEnv());
    if (scenario == "ring") return ring(agent);
    if (scenario == "kill") return kill(agent);
    if (scenario == "reset") return reset(agent);
    if (scenario == "freeze") return freeze(agent);
    if (scenario == "busy") return busy(agent);
    if (scenario == "barrier_loss") return barrierLoss(agent);
    if (scenario == "fail" && argc >= 4) return fail(agent, std::atoi(argv[2]), std::atoi(argv[3]));
    std::fprintf(stderr, "usage: agent_worker ring|kill|reset|freeze|busy|barrier_loss|fail <rank> <code>\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "agent_worker %s: %s\n", scenario.c_str(), e.what());
    return 1;
  }
}
