// A job of real worker processes on 127.0.0.1 for the multiprocess tests: one process per rank
// of a worker program, each started (tests/tools/subprocess.h) with the WEFT_* environment that
// places it in the job (rank, world size, a store on a free port) plus the settings the test
// chooses; waits on the whole job under one deadline, and the checks that no process is left.
//
//   weft::testing::MpJob job({RREF_WORKER_PATH, "chain"}, 4,
//                            [](int) { return weft::testing::fastFailureSettings(6); });
//   job.proc(1).readUntil(...);                        // one rank's output while it runs
//   auto results = job.finish(std::chrono::seconds(40));  // every rank's Result, by rank
//   if (failed) weft::testing::dumpResults(results);   // exit, signal, stdout, stderr of each
//   job.checkAllGone();                                // CHECKs that every process is gone
//
// A process still running when the MpJob is destroyed is killed with its process group.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "captured_text.h"
#include "rpc/agent_group.h"
#include "tools/subprocess.h"

namespace weft::testing {

// The settings every multiprocess test job gives its workers besides their place: short bounds
// and fast failure detection (a silent peer is declared dead after 5 heartbeats of 0.5 s), and
// `workerThreads` handler threads.
inline std::vector<std::string> fastFailureSettings(int workerThreads) {
  return {"WEFT_HEARTBEAT_INTERVAL=0.5",
          "WEFT_HEARTBEAT_MISSES=5",
          "WEFT_SHUTDOWN_TIMEOUT=5",
          "WEFT_STORE_TIMEOUT=20",
          "WEFT_RPC_TIMEOUT=30",
          "WEFT_NUM_WORKER_THREADS=" + std::to_string(workerThreads)};
}

// The environment of rank `rank` of `world` whose store is at 127.0.0.1:port: `settings`
// followed by the place (WEFT_RANK, WEFT_WORLD_SIZE, WEFT_LOCAL_RANK = rank, WEFT_MASTER_*).
inline std::vector<std::string> rankEnv(int rank, int world, uint16_t port, std::vector<std::string> settings) {
  settings.push_back("WEFT_RANK=" + std::to_string(rank));
  settings.push_back("WEFT_WORLD_SIZE=" + std::to_string(world));
  settings.push_back("WEFT_LOCAL_RANK=" + std::to_string(rank));
  settings.push_back("WEFT_MASTER_ADDR=127.0.0.1");
  settings.push_back("WEFT_MASTER_PORT=" + std::to_string(port));
  return settings;
}

// "rank R ", how a worker program starts each line it prints.
inline std::string rankPrefix(int rank) { return std::string("rank ").append(std::to_string(rank)).append(" "); }

// Now on the steady clock (CLOCK_MONOTONIC), in nanoseconds: comparable with the times a worker
// process on the same machine prints.
inline long long steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class MpJob {
 public:
  // The WEFT_* settings of one rank besides its place (see rankEnv).
  using Settings = std::function<std::vector<std::string>(int rank)>;

  // Starts `argv` once for each rank 0..world-1, all with a store on one free port.
  MpJob(const std::vector<std::string>& argv, int world, const Settings& settings) {
    const uint16_t port = freePort();
    for (int r = 0; r < world; ++r) {
      procs_.push_back(std::make_unique<Subprocess>(argv, rankEnv(r, world, port, settings(r))));
    }
  }

  Subprocess& proc(int rank) { return *procs_.at(static_cast<size_t>(rank)); }
  int size() const { return static_cast<int>(procs_.size()); }

  // Waits for every process (one shared deadline) and returns their results by rank.
  std::vector<Subprocess::Result> finish(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<Subprocess::Result> out;
    for (auto& p : procs_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      out.push_back(p->wait(std::max(left, std::chrono::milliseconds(1))));
    }
    return out;
  }

  // True when every process is gone within 5 s (each is waited for, whatever the others did).
  bool allGone() {
    bool gone = true;
    for (auto& p : procs_) gone = processGone(p->pid(), std::chrono::seconds(5)) && gone;
    return gone;
  }

  // One CHECK per process that it is gone within 5 s.
  void checkAllGone() {
    for (auto& p : procs_) CHECK(processGone(p->pid(), std::chrono::seconds(5)));
  }

 private:
  std::vector<std::unique_ptr<Subprocess>> procs_;
};

// "rank R exit E signal S\nstdout:\n...\nstderr:\n..." for one process's result.
inline std::string resultText(size_t rank, const Subprocess::Result& result) {
  return "rank " + std::to_string(rank) + " exit " + std::to_string(result.exitCode) + " signal " +
         std::to_string(result.signal) + "\nstdout:\n" + result.out + "\nstderr:\n" + result.err;
}

// Every rank's resultText, each followed by a newline: for an INFO or a FAIL.
inline std::string resultsText(const std::vector<Subprocess::Result>& results) {
  std::string s;
  for (size_t r = 0; r < results.size(); ++r) s += resultText(r, results[r]) + "\n";
  return s;
}

// One MESSAGE per rank with its resultText.
inline void dumpResults(const std::vector<Subprocess::Result>& results) {
  for (size_t r = 0; r < results.size(); ++r) MESSAGE(resultText(r, results[r]));
}

// True when every rank ended in time with exit 0 after printing "rank R done"; otherwise dumps
// every rank's result (dumpResults) and returns false: REQUIRE(allClean(results)).
inline bool allClean(const std::vector<Subprocess::Result>& results) {
  bool ok = true;
  for (size_t r = 0; r < results.size(); ++r) {
    ok = ok && !results[r].timedOut && results[r].exitCode == 0 &&
         contains(results[r].out, rankPrefix(static_cast<int>(r)) + "done\n");
  }
  if (!ok) dumpResults(results);
  return ok;
}

// The number after `key` on rank `rank`'s line that starts with `first` ("rank R <first> ... key v").
inline long long rankField(const std::string& out, int rank, const std::string& first, const std::string& key) {
  const std::string line = " " + first + " " + restOfLine(out, rankPrefix(rank) + first + " ");
  return numberAfter(line, " " + key + " ");
}

}  // namespace weft::testing
