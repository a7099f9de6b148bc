// The common part of the worker programs that the multiprocess tests start, one process per rank
// (tests/mp_job.h): main's frame (scenario from argv[1], usage, a failure as one line on stderr),
// the lines a worker prints for the test to parse ("rank R <phrase> key value ..."), bounded
// waits, and a timed graceful shutdown reported in the form the tests read.
//
//   int main(int argc, char** argv) {
//     return weft::testing::workerMain("my_worker", {"chain", "kill"}, argc, argv, [](const std::string& s) {
//       weft::rpc::Agent agent(weft::rpc::Options::fromEnv());
//       agent.start();
//       weft::testing::sayStarted(agent);  // "rank R pid P started"
//       weft::testing::require(weft::testing::waitUntil([&] { return ready(); }, 10s), "never ready");
//       weft::testing::sayShutdown(agent);  // "rank R shutdown graceful 1 missing - seconds 0.01"
//       return 0;
//     });
//   }
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <string>
#include <thread>

#include "common/error.h"
#include "rpc/agent.h"

namespace weft::testing {

// Writes `line` and a newline to stdout in one write(2), unbuffered: a test reads it at once, and
// lines of several threads never interleave.
inline void say(const std::string& line) {
  std::string text = line + "\n";
  ssize_t unused = ::write(STDOUT_FILENO, text.data(), text.size());
  (void)unused;
}

// "rank R ", the start of every line a worker prints.
inline std::string prefix(int rank) { return "rank " + std::to_string(rank) + " "; }
inline std::string prefix(const rpc::Agent& agent) { return prefix(agent.options().rank); }

// Says "rank R pid P started", the first line of every worker.
inline void sayStarted(const rpc::Agent& agent) {
  say(prefix(agent) + "pid " + std::to_string(::getpid()) + " started");
}

// `t` on the steady clock (CLOCK_MONOTONIC) in nanoseconds, comparable across the processes of
// one machine.
inline long long steadyNs(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// "<ErrorType>: <message>" for an exception, on one line (newlines become spaces): weft's error
// types by name, anything else derived from std::exception as "std::exception".
inline std::string describe(std::exception_ptr e) {
  std::string text;
  try {
    std::rethrow_exception(e);
  } catch (const DisconnectedError& x) {
    text = std::string("DisconnectedError: ") + x.what();
  } catch (const RemoteError& x) {
    text = std::string("RemoteError: ") + x.what();
  } catch (const TimeoutError& x) {
    text = std::string("TimeoutError: ") + x.what();
  } catch (const StateError& x) {
    text = std::string("StateError: ") + x.what();
  } catch (const InvalidArgumentError& x) {
    text = std::string("InvalidArgumentError: ") + x.what();
  } catch (const NotFoundError& x) {
    text = std::string("NotFoundError: ") + x.what();
  } catch (const IndexError& x) {
    text = std::string("IndexError: ") + x.what();
  } catch (const CancelledError& x) {
    text = std::string("CancelledError: ") + x.what();
  } catch (const ProtocolError& x) {
    text = std::string("ProtocolError: ") + x.what();
  } catch (const std::exception& x) {
    text = std::string("std::exception: ") + x.what();
  }
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

// Polls `pred` every `poll` until it holds or `timeout` has passed; returns its last value.
template <class Pred>
bool waitUntil(Pred&& pred, std::chrono::milliseconds timeout,
               std::chrono::milliseconds poll = std::chrono::milliseconds(1)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(poll);
  }
  return true;
}

// A wrong result in a worker: throws weft::Error "check failed: <what>" (workerMain prints it and
// exits 1).
inline void require(bool ok, const std::string& what) {
  if (!ok) throw Error("check failed: " + what);
}

// The workers a shutdown did not hear from, comma-separated; "-" when none.
inline std::string missingNames(const rpc::ShutdownReport& report) {
  std::string missing;
  for (const std::string& m : report.missing) missing += (missing.empty() ? "" : ",") + m;
  return missing.empty() ? "-" : missing;
}

// Shuts `agent` down gracefully, says "rank R shutdown graceful <0|1> missing <names|-> seconds
// <s>" (how long the shutdown took), and returns its report.
inline rpc::ShutdownReport sayShutdown(rpc::Agent& agent) {
  auto began = std::chrono::steady_clock::now();
  rpc::ShutdownReport report = agent.shutdown();
  say(prefix(agent) + "shutdown graceful " + std::to_string(report.graceful ? 1 : 0) + " missing " +
      missingNames(report) + " seconds " +
      std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count()));
  return report;
}

// main's frame for a worker program: the scenario is argv[1] and must be one of `scenarios`
// (otherwise "usage: <program> <a|b|...>" on stderr, exit status 2); returns what
// `run(scenario)` returns, or, when it throws, prints "<program> <scenario>: <what>" on stderr
// and returns 1.
template <class Run>
int workerMain(const char* program, std::initializer_list<const char*> scenarios, int argc, char** argv, Run&& run) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (std::find(scenarios.begin(), scenarios.end(), scenario) == scenarios.end()) {
    std::string names;
    for (const char* s : scenarios) names.append(names.empty() ? "" : "|").append(s);
    std::fprintf(stderr, "usage: %s %s\n", program, names.c_str());
    return 2;
  }
  try {
    return run(scenario);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s %s: %s\n", program, scenario.c_str(), e.what());
    return 1;
  }
}

}  // namespace weft::testing
