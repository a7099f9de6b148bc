// What weft's two-process benchmarks (rpc_bench, rref_bench) share: the bench
// re-executes itself as its server (`/proc/self/exe --serve PORT CPU`, rank 0)
// and measures from the client (this process, rank 1), both pinned to CPUs by
// a placement, plus their size lists and output helpers (flags: bench/flags.h).
//
//   int main(int argc, char** argv) {
//     return bench::twoProcessMain(argc, argv, "my_bench", kUsage, serve, [](int n, char** arguments) {
//       Args a = parseArgs(n, arguments);               // throws: usage, exit status 2
//       return std::function<int()>([a] { return runClient(a); });
//     });
//   }
//   // in runClient:
//   bench::CpuPlan plan = bench::planCpus(args.placement);
//   bench::pinTo(plan.clientCpu);                        // before any thread exists
//   uint16_t port = bench::freePort();
//   bench::ServerProcess server("my_bench", port, plan.serverCpu);
//   rpc::Agent agent(bench::agentOptions(1, port, 30s));
//   ...
//   server.waitForExit(20s);
//
// Errors are std::runtime_error (fail()); twoProcessMain prints them and exits 1.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/flags.h"
#include "rpc/options.h"
#include "tools/weftrun/free_port.h"

namespace weft::bench {

[[noreturn]] inline void fail(const std::string& what) { throw std::runtime_error(what); }

inline std::string errnoText(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

inline std::string loadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return in ? a + " " + b + " " + c : "unknown";
}

inline std::string formatBytes(uint64_t n) {
  if (n >= (uint64_t{1} << 20) && n % (uint64_t{1} << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

// ---- arguments ---------------------------------------------------------------------

constexpr uint64_t kMaxPayload = uint64_t{1} << 30;

// "64K" -> 65536: bytes with an optional K, M or G suffix (KiB, MiB, GiB), a positive multiple of
// 4 (a float32 tensor) and at most 1 GiB.
inline uint64_t parseSize(const std::string& s) {
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &used);
  } catch (const std::exception&) {
    fail("--sizes: '" + s + "' is not a size");
  }
  std::string suffix = s.substr(used);
  uint64_t scale = suffix.empty() ? 1 : suffix == "K" ? 1024 : suffix == "M" ? (1 << 20) : suffix == "G" ? (1 << 30) : 0;
  if (scale == 0) fail("--sizes: '" + s + "' has an unknown suffix (K, M or G)");
  uint64_t bytes = v * scale;
  if (v > kMaxPayload || bytes == 0 || bytes > kMaxPayload || bytes % 4 != 0) {
    fail("--sizes: " + s + " must be a positive multiple of 4 bytes, at most 1 GiB");
  }
  return bytes;
}

// "8,64K,1M" -> {8, 65536, 1048576}.
inline std::vector<uint64_t> parseSizeList(const std::string& list) {
  std::vector<uint64_t> sizes;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    sizes.push_back(parseSize(list.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return sizes;
}

// ---- process placement -------------------------------------------------------------

// split: the server pinned to the first allowed CPU, the client to the second (with one CPU it
// degrades to same); same: both on the first allowed CPU; none: not pinned.
enum class Placement { Split, Same, None };

inline Placement parsePlacement(const std::string& p) {
  if (p == "split") return Placement::Split;
  if (p == "same") return Placement::Same;
  if (p == "none") return Placement::None;
  fail("--placement: '" + p + "' is not split, same or none");
}

struct CpuPlan {
  int serverCpu = -1;  // -1: not pinned
  int clientCpu = -1;
  size_t allowed = 0;  // CPUs this process could run on before pinning
  std::string description;
};

inline std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) fail(errnoText("sched_getaffinity"));
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

inline CpuPlan planCpus(Placement placement) {
  std::vector<int> cpus = allowedCpus();
  if (cpus.empty()) fail("no CPU in this process's affinity mask");
  CpuPlan plan;
  plan.allowed = cpus.size();
  switch (placement) {
    case Placement::None:
      plan.description = "none (unpinned)";
      break;
    case Placement::Same:
      plan.serverCpu = plan.clientCpu = cpus[0];
      plan.description = "same: server and client both on CPU " + std::to_string(cpus[0]);
      break;
    case Placement::Split:
      if (cpus.size() < 2) {
        plan.serverCpu = plan.clientCpu = cpus[0];
        plan.description = "split asked, but only CPU " + std::to_string(cpus[0]) + " is allowed: both on it";
      } else {
        plan.serverCpu = cpus[0];
        plan.clientCpu = cpus[1];
        plan.description = "split: server on CPU " + std::to_string(cpus[0]) + ", client on CPU " +
                           std::to_string(cpus[1]);
      }
      break;
  }
  return plan;
}

// Pins the calling thread; called before any other thread exists, so the whole
// process follows.
inline void pinTo(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0) fail(errnoText("sched_setaffinity"));
}

// ---- the two processes -----------------------------------------------------------------

// A port for the store, which the server binds later: drawn below the ephemeral range and
// reserved against other benchmarks, tests and weftrun (tools/weftrun/free_port.h); the
// reservation is held until 16 later ports have been drawn.
inline uint16_t freePort() {
  static std::deque<weftrun::PortReservation> held;
  held.push_back(weftrun::reserveFreePort());  // std::runtime_error, as fail() throws
  if (held.size() > 16) held.pop_front();
  return held.back().port();
}

// Rank `rank` of the two, the store on 127.0.0.1:storePort.
inline rpc::Options agentOptions(int rank, uint16_t storePort, std::chrono::milliseconds setupTimeout) {
  rpc::Options o;
  o.rank = rank;
  o.worldSize = 2;
  o.masterAddr = "127.0.0.1";
  o.masterPort = storePort;
  o.rpcTimeout = std::chrono::seconds(60);
  o.storeTimeout = setupTimeout;
  o.shutdownTimeout = std::chrono::seconds(15);
  o.validate();
  return o;
}

// The server: this program re-executed as `program --serve storePort cpu` (or with any argument
// list). It dies with this process (PR_SET_PDEATHSIG), and is killed and reaped unless it was
// waited for.
class ServerProcess {
 public:
  ServerProcess(const std::string& program, uint16_t storePort, int cpu)
      : ServerProcess({program, "--serve", std::to_string(storePort), std::to_string(cpu)}) {}
  // This program re-executed with `args` as its argv (args[0]: the name it runs under).
  explicit ServerProcess(std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t parent = ::getpid();
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) fail(errnoText("fork"));
    if (pid_ == 0) {
      // Dies with the client, whatever way the client ends.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::execv("/proc/self/exe", argv.data());
      ::_exit(127);
    }
  }
  ~ServerProcess() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Waits up to timeout for the server to exit; throws unless it exited with 0 (killing it
  // first when it did not exit in time). `meanings` words the server's own exit statuses.
  void waitForExit(std::chrono::milliseconds timeout, const std::map<int, std::string>& meanings = {}) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    for (;;) {
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (r < 0 && errno != EINTR) fail(errnoText("waitpid"));
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        reaped_ = true;
        fail("server process did not exit within " + std::to_string(timeout.count()) + " ms; killed");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    reaped_ = true;
    if (WIFSIGNALED(status)) fail("server process killed by signal " + std::to_string(WTERMSIG(status)));
    int code = WEXITSTATUS(status);
    if (auto it = meanings.find(code); it != meanings.end()) fail("server: " + it->second);
    if (code != 0) fail("server process exited with status " + std::to_string(code));
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// main() of a two-process bench: `name --serve PORT CPU` runs serve(port, cpu); otherwise
// parse(argc, argv) reads the arguments (an error prints it with the usage, exit status 2) and
// returns the client to run. Any other error is printed, exit status 1.
inline int twoProcessMain(int argc, char** argv, const char* name, const char* usage,
                          const std::function<int(uint16_t, int)>& serve,
                          const std::function<std::function<int()>(int, char**)>& parse) {
  const bool serving = argc >= 2 && std::strcmp(argv[1], "--serve") == 0;
  try {
    if (serving) {
      if (argc != 4) fail("--serve takes the store port and the CPU");
      return serve(static_cast<uint16_t>(std::stoul(argv[2])), std::stoi(argv[3]));
    }
    std::function<int()> client;
    try {
      client = parse(argc, argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n%s", name, e.what(), usage);
      return 2;
    }
    return client();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s%s: error: %s\n", name, serving ? " (server)" : "", e.what());
    return 1;
  }
}

}  // namespace weft::bench
