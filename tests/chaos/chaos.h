// The fault-injection runs of the chaos suite (tests/chaos/chaos_test.cpp): start a job of real
// processes, hit one rank at a random moment with a fault, and judge how every process ended.
//
//   weft::testing::chaos::Scenario s{.label = "parameter_server", .argv = {...}, .world = 3, ...};
//   weft::testing::chaos::runMany(s);   // WEFT_CHAOS_RUNS runs, seeded by WEFT_CHAOS_SEED
//
// Faults:
//   kill  SIGKILL: the process is gone and its sockets close (the kernel resets those with
//         unread bytes)
//   stop  SIGSTOP, held past the job's heartbeat window, then SIGCONT: a live process that falls
//         silent, then comes back to a job that has declared it dead
//   cut   every established TCP connection of the process shut down from outside (pidfd_getfd and
//         shutdown(2)): the processes live on, the network between them is gone
//
// What every run must show:
//   - no process ends by a signal other than the one the fault sent (no crash, no abort);
//   - every process ends within the bound of the fault's kind (no hang);
//   - a process that goes on after the fault either finished the job (its "shut down cleanly"
//     line) or exits non-zero with an error naming a peer it lost (for kill and stop, the
//     faulted rank, or a peer whose own error leads back to it, as when the loss spreads through
//     a job whose ranks depend on each other; for cut, any other rank);
//   - every process, and every process it started, is gone afterwards; the run's scratch folder
//     holds nothing but what the programs were asked to write, and it is removed.
// A failing run prints the seed, the run's index, the fault and every process's output, so
// `WEFT_CHAOS_SEED=S WEFT_CHAOS_RUNS=N` replays it.
#pragma once

#include <doctest/doctest.h>
#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mp_job.h"
#include "tools/subprocess.h"

namespace weft::testing::chaos {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

enum class FaultKind { Kill, Stop, Cut };

inline const char* kindName(FaultKind k) {
  switch (k) {
    case FaultKind::Kill: return "kill";
    case FaultKind::Stop: return "stop";
    case FaultKind::Cut: return "cut";
  }
  return "?";
}

// The job settings of every chaos run: a silent peer is declared dead after 5 heartbeats of
// 0.5 s (the window is 2.5 s), and the store and shutdown bounds are short.
inline constexpr double kHeartbeatWindow = 2.5;
inline constexpr double kStoreTimeout = 5.0;
inline std::vector<std::string> chaosSettings() {
  return {"WEFT_HEARTBEAT_INTERVAL=0.5", "WEFT_HEARTBEAT_MISSES=5", "WEFT_SHUTDOWN_TIMEOUT=5",
          "WEFT_STORE_TIMEOUT=5",       "WEFT_RPC_TIMEOUT=20",     "WEFT_NUM_THREADS=1"};
}

// "rank R", or R in a list "ranks [A, B, ...]", as weft names ranks (the collectives, the
// agent's start-up, the store's server).
inline bool namesRank(const std::string& text, int r) {
  static const std::regex one("rank ([0-9]+)");
  static const std::regex list("ranks \\[([0-9, ]+)\\]");
  for (const std::regex* re : {&one, &list}) {
    for (std::sregex_iterator it(text.begin(), text.end(), *re), end; it != end; ++it) {
      std::istringstream items((*it)[1].str());
      std::string item;
      while (std::getline(items, item, ',')) {
        if (std::atoi(item.c_str()) == r) return true;
      }
    }
  }
  return false;
}

struct Scenario {
  std::string label;
  std::vector<std::string> argv;   // the program and its arguments, started once per rank
  int world = 2;
  std::function<std::string(int rank)> nameOf;  // how the job names a rank in its errors
  // Whether an error text names `rank`; unset: it contains nameOf(rank).
  std::function<bool(const std::string& text, int rank)> names;
  double faultWindow = 2.0;        // faults fall uniformly in [0.05 s, faultWindow] after the start
  std::vector<FaultKind> kinds = {FaultKind::Kill, FaultKind::Stop, FaultKind::Cut};
  // Seconds from the fault within which every process must have ended, per kind (the detection
  // bound of the kind plus the job's own way out).
  double killBound = 10.0;
  double stopBound = 14.0;
  double cutBound = 10.0;
  std::vector<std::string> extraEnv;  // besides chaosSettings()
};

// The runs each test makes (WEFT_CHAOS_RUNS, default 3) and the seed (WEFT_CHAOS_SEED, default
// drawn from the clock and printed).
inline int runCount() {
  const char* v = std::getenv("WEFT_CHAOS_RUNS");
  return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 3;
}
inline uint64_t seedFromEnv() {
  const char* v = std::getenv("WEFT_CHAOS_SEED");
  if (v != nullptr && *v != '\0') return std::strtoull(v, nullptr, 10);
  return static_cast<uint64_t>(Clock::now().time_since_epoch().count()) % 1000000007ull;
}

// The inode numbers of the established TCP connections (IPv4 and IPv6) in pid's namespace.
inline std::set<std::string> establishedInodes(pid_t pid) {
  std::set<std::string> out;
  for (const char* table : {"tcp", "tcp6"}) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/net/" + table);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      in >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state == "01") out.insert(inode);  // TCP_ESTABLISHED
    }
  }
  return out;
}

// Shuts down every established TCP connection of pid from outside; returns how many.
inline int cutConnections(pid_t pid) {
  const std::set<std::string> inodes = establishedInodes(pid);
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return -1;
  int cut = 0;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char target[128];
      const ssize_t n = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      const std::string t(target);
      if (t.rfind("socket:[", 0) != 0) continue;
      if (inodes.count(t.substr(8, t.size() - 9)) == 0) continue;
      const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, std::atoi(e->d_name), 0));
      if (fd < 0) continue;
      if (::shutdown(fd, SHUT_RDWR) == 0) ++cut;
      ::close(fd);
    }
    ::closedir(d);
  }
  ::close(pidfd);
  return cut;
}

struct Fault {
  FaultKind kind = FaultKind::Kill;
  int rank = 0;
  double at = 0;  // seconds after the start
  std::string text() const {
    std::ostringstream s;
    s << kindName(kind) << " rank " << rank << " at " << at << " s";
    return s.str();
  }
};

// The most seconds between a kill and the reaping of a target that was already exiting on its own
// (the pump's 5 ms sleeps and its rounds over the other processes).
inline constexpr double kExitRace = 0.05;

// One run: starts the job in a scratch folder, injects `fault`, waits for every process, and
// returns an empty string when the run held, else what went wrong followed by every output.
inline std::string runOnce(const Scenario& s, const Fault& fault) {
  namespace fs = std::filesystem;
  const fs::path scratch = fs::temp_directory_path() / ("weft-chaos-" + std::to_string(::getpid()) + "-" +
                                                       std::to_string(Clock::now().time_since_epoch().count()));
  fs::create_directories(scratch);
  const fs::path cwd = fs::current_path();
  fs::current_path(scratch);

  const uint16_t port = freePort();
  std::vector<std::unique_ptr<Subprocess>> procs;
  std::vector<std::string> settings = chaosSettings();
  settings.insert(settings.end(), s.extraEnv.begin(), s.extraEnv.end());
  for (int r = 0; r < s.world; ++r) procs.push_back(std::make_unique<Subprocess>(s.argv, rankEnv(r, s.world, port, settings)));
  fs::current_path(cwd);

  const auto start = Clock::now();
  std::vector<Subprocess::Result> results(static_cast<size_t>(s.world));
  std::vector<bool> done(static_cast<size_t>(s.world), false);
  std::vector<double> endedAt(static_cast<size_t>(s.world), 0);
  auto pumpAll = [&] {
    for (int r = 0; r < s.world; ++r) {
      if (done[static_cast<size_t>(r)]) continue;
      procs[static_cast<size_t>(r)]->pump(std::chrono::milliseconds(0));
      if (procs[static_cast<size_t>(r)]->tryReap(results[static_cast<size_t>(r)])) {
        done[static_cast<size_t>(r)] = true;
        endedAt[static_cast<size_t>(r)] = Seconds(Clock::now() - start).count();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  auto allDone = [&] { return std::all_of(done.begin(), done.end(), [](bool d) { return d; }); };

  while (Seconds(Clock::now() - start).count() < fault.at && !allDone()) pumpAll();
  const pid_t target = procs[static_cast<size_t>(fault.rank)]->pid();
  // Alive: not reaped at the last pump, and not exited since (a zombie is not reaped here:
  // WNOWAIT leaves it to the pump).
  siginfo_t exited{};
  const bool targetAlive = !done[static_cast<size_t>(fault.rank)] &&
                           !(::waitid(P_PID, static_cast<id_t>(target), &exited, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                             exited.si_pid == target);
  const double faultAt = Seconds(Clock::now() - start).count();
  int connectionsCut = 0;
  if (targetAlive) {
    switch (fault.kind) {
      case FaultKind::Kill: ::kill(target, SIGKILL); break;
      case FaultKind::Stop: ::kill(target, SIGSTOP); break;
      case FaultKind::Cut: connectionsCut = cutConnections(target); break;
    }
  }
  const double bound = fault.kind == FaultKind::Kill ? s.killBound : fault.kind == FaultKind::Stop ? s.stopBound : s.cutBound;
  bool resumed = fault.kind != FaultKind::Stop || !targetAlive;
  // Every process gets the bound from the fault, and a hard limit beyond it ends a hang.
  const double hardLimit = faultAt + bound + 20.0;
  while (!allDone() && Seconds(Clock::now() - start).count() < hardLimit) {
    pumpAll();
    if (!resumed && Seconds(Clock::now() - start).count() >= faultAt + kHeartbeatWindow * 2) {
      ::kill(target, SIGCONT);
      resumed = true;
    }
  }
  if (!resumed) ::kill(target, SIGCONT);

  std::ostringstream problems;
  for (int r = 0; r < s.world; ++r) {
    const auto i = static_cast<size_t>(r);
    if (!done[i]) {
      problems << "rank " << r << " still running " << (hardLimit - faultAt) << " s after the fault (hang)\n";
      ::kill(-procs[i]->pid(), SIGKILL);
      results[i] = procs[i]->wait(std::chrono::seconds(5));
      results[i].timedOut = true;
      endedAt[i] = hardLimit;
    }
  }
  // A fault during start-up comes before the workers know each other's names: a survivor can
  // name the peer only by its rank then (the store's server, a rank that never joined).
  auto mentions = [&](const std::string& text, int p) {
    return (s.names ? s.names(text, p) : text.find(s.nameOf(p)) != std::string::npos) || namesRank(text, p);
  };
  // The ranks a survivor may blame: the faulted one, and every rank whose own output names one
  // already blamed (the loss spreading: a rank that left because of the fault, and the rank that
  // lost it in turn).
  std::vector<bool> blamed(static_cast<size_t>(s.world), false);
  blamed[static_cast<size_t>(fault.rank)] = true;
  for (bool grew = true; grew;) {
    grew = false;
    for (int p = 0; p < s.world; ++p) {
      if (blamed[static_cast<size_t>(p)]) continue;
      const std::string& text = results[static_cast<size_t>(p)].err;
      for (int q = 0; q < s.world && !blamed[static_cast<size_t>(p)]; ++q) {
        if (q != p && blamed[static_cast<size_t>(q)] && mentions(text, q)) blamed[static_cast<size_t>(p)] = grew = true;
      }
    }
  }
  for (int r = 0; r < s.world; ++r) {
    const auto i = static_cast<size_t>(r);
    const Subprocess::Result& res = results[i];
    if (res.timedOut) continue;
    const bool isTarget = r == fault.rank && targetAlive;
    if (isTarget && fault.kind == FaultKind::Kill) {
      // A process already in its own exit when the kill comes keeps its exit status: a target that
      // finished the job (exit 0, shut down cleanly, reaped within kExitRace of the kill) in that
      // instant ended before the fault.
      const bool finishedFirst = res.signal == 0 && res.exitCode == 0 && endedAt[i] - faultAt < kExitRace &&
                                 (res.out + res.err).find("shut down cleanly") != std::string::npos;
      if (res.signal != SIGKILL && !finishedFirst) {
        problems << "rank " << r << " (killed) ended with exit " << res.exitCode << " signal " << res.signal << "\n";
      }
      continue;
    }
    if (res.signal != 0) {
      problems << "rank " << r << " ended by signal " << res.signal << " (" << ::strsignal(res.signal) << ")\n";
      continue;
    }
    const bool endedBeforeFault = endedAt[i] <= faultAt;
    if (endedBeforeFault) {
      if (res.exitCode != 0) problems << "rank " << r << " failed before any fault: exit " << res.exitCode << "\n";
      continue;
    }
    if (endedAt[i] > faultAt + bound) {
      problems << "rank " << r << " ended " << (endedAt[i] - faultAt) << " s after the fault, past the bound of " << bound << " s\n";
    }
    const std::string text = res.out + res.err;
    if (res.exitCode == 0) {
      if (text.find("shut down cleanly") == std::string::npos) {
        problems << "rank " << r << " exited 0 without finishing the job after the fault\n";
      }
      continue;
    }
    // A typed error naming the peer it lost: the faulted rank, or (a cascade) a peer whose own
    // output leads back to the fault (see `blamed` below). For a cut, any other rank. The stopped
    // process itself came back to a job that went on without it: an error of its own is enough
    // (it exited, it did not crash).
    bool named = isTarget && fault.kind == FaultKind::Stop;
    for (int p = 0; p < s.world; ++p) {
      if (p == r || !mentions(results[i].err, p)) continue;
      named = named || fault.kind == FaultKind::Cut || blamed[static_cast<size_t>(p)];
    }
    if (!named) problems << "rank " << r << " exited " << res.exitCode << " without naming the peer it lost\n";
  }
  // Nothing left: the processes, the processes they started, the scratch folder's contents are
  // the programs' own outputs (removed with the folder).
  for (auto& p : procs) {
    if (!processGone(p->pid(), std::chrono::seconds(5))) problems << "process " << p->pid() << " is still there\n";
    if (::kill(-p->pid(), 0) == 0) problems << "process group " << p->pid() << " still has members\n";
  }
  std::error_code ec;
  fs::remove_all(scratch, ec);

  const std::string found = problems.str();
  if (found.empty()) return "";
  std::ostringstream report;
  report << found << "fault: " << fault.text() << (targetAlive ? "" : " (target had already ended)")
         << (fault.kind == FaultKind::Cut ? ", " + std::to_string(connectionsCut) + " connections cut" : "") << "\n";
  for (int r = 0; r < s.world; ++r) {
    report << "rank " << r << " ended at " << endedAt[static_cast<size_t>(r)] << " s: "
           << resultText(static_cast<size_t>(r), results[static_cast<size_t>(r)]) << "\n";
  }
  return report.str();
}

// WEFT_CHAOS_RUNS runs of the scenario, each with a fault drawn from the seed; one CHECK per run.
inline void runMany(const Scenario& s) {
  const uint64_t seed = seedFromEnv();
  const int runs = runCount();
  std::mt19937_64 rng(seed ^ std::hash<std::string>{}(s.label));
  int counts[3] = {0, 0, 0};
  int failed = 0;
  for (int i = 0; i < runs; ++i) {
    Fault f;
    f.kind = s.kinds[std::uniform_int_distribution<size_t>(0, s.kinds.size() - 1)(rng)];
    f.rank = std::uniform_int_distribution<int>(0, s.world - 1)(rng);
    f.at = std::uniform_real_distribution<double>(0.05, s.faultWindow)(rng);
    const std::string problems = runOnce(s, f);
    ++counts[static_cast<int>(f.kind)];
    if (!problems.empty()) {
      ++failed;
      FAIL_CHECK(s.label << " run " << i << " of " << runs << " (WEFT_CHAOS_SEED=" << seed
                         << " WEFT_CHAOS_RUNS=" << runs << "): " << f.text() << "\n" << problems);
    }
  }
  MESSAGE(s.label << ": " << runs << " runs (kill " << counts[0] << ", stop " << counts[1] << ", cut " << counts[2]
                  << "), " << failed << " failed, WEFT_CHAOS_SEED=" << seed);
}

}  // namespace weft::testing::chaos
