// A program for the launcher tests to start through weftrun: each mode plays
// one behaviour of a rank (report the environment, write interleaving-prone
// output, fail, ignore SIGTERM or every stop signal, wait for a signal, fail
// until a restart).
//
//   weftrun -n 3 --tag-output weftrun_probe env
//   weftrun -n 3 weftrun_probe fail 1 3          # rank 1 exits 3, the others wait
//
// Every mode first prints "start rank=R pid=P restart=C" so tests can find the
// processes afterwards. Ranks that wait never wait longer than kMaxWait, so a
// broken launcher cannot leave them running for long.
//
// Synchronisation: when PROBE_SYNC_DIR is set, a waiting rank creates
// "<dir>/<rank>.ready" once it is set up (e.g. ignores SIGTERM), and a failing
// rank first waits (bounded) until every other rank of its attempt is ready,
// so the tests do not depend on timing.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

constexpr int kMaxWaitSeconds = 60;

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

int rank() { return envInt("WEFT_RANK", -1); }
int worldSize() { return envInt("WEFT_WORLD_SIZE", 1); }
int restartCount() { return envInt("WEFT_RESTART_COUNT", 0); }

void say(const std::string& line) {
  std::string text = line + "\n";
  ssize_t unused = ::write(STDOUT_FILENO, text.data(), text.size());
  (void)unused;
}

std::string readyPath(int r) {
  const char* dir = std::getenv("PROBE_SYNC_DIR");
  if (!dir) return {};
  return std::string(dir) + "/" + std::to_string(restartCount()) + "-" + std::to_string(r) + ".ready";
}

void markReady() {
  std::string path = readyPath(rank());
  if (path.empty()) return;
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd >= 0) ::close(fd);
}

void waitForOthers() {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int r = 0; r < worldSize(); ++r) {
    std::string path = readyPath(r);
    if (path.empty() || r == rank()) continue;
    struct stat st;
    while (::stat(path.c_str(), &st) != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

[[noreturn]] void waitThenExit() {
  markReady();
  std::this_thread::sleep_for(std::chrono::seconds(kMaxWaitSeconds));
  say("waited the maximum time");
  std::exit(0);
}

volatile sig_atomic_t gSignal = 0;
extern "C" void recordSignal(int sig) { gSignal = sig; }

void printEnv() {
  const char* names[] = {"WEFT_RANK",        "WEFT_WORLD_SIZE",    "WEFT_LOCAL_RANK", "WEFT_LOCAL_WORLD_SIZE",
                         "WEFT_NNODES",      "WEFT_NODE_RANK",     "WEFT_MASTER_ADDR", "WEFT_MASTER_PORT",
                         "WEFT_RESTART_COUNT", "RANK",             "WORLD_SIZE",      "LOCAL_RANK",
                         "LOCAL_WORLD_SIZE", "MASTER_ADDR",        "MASTER_PORT",     "WEFT_SOCKET_IFNAME",
                         "WEFT_HEARTBEAT_INTERVAL", "WEFT_HEARTBEAT_MISSES", "WEFT_NUM_THREADS"};
  for (const char* n : names) {
    const char* v = std::getenv(n);
    say(std::string(n) + "=" + (v ? v : "<unset>"));
  }
  // The CPUs this process may run on (weftrun --bind-cpus), comma-separated.
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::string cpus;
  if (::sched_getaffinity(0, sizeof mask, &mask) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (!CPU_ISSET(c, &mask)) continue;
      if (!cpus.empty()) cpus += ',';
      cpus += std::to_string(c);
    }
  }
  say("CPUS=" + cpus);
  // stdin must be /dev/null: reading gives EOF at once.
  char c;
  say(std::string("STDIN=") + (::read(STDIN_FILENO, &c, 1) == 0 ? "eof" : "data"));
}

// Lines written in small pieces, to catch a launcher that interleaves them.
void writeLines(int count) {
  for (int i = 0; i < count; ++i) {
    std::string line = "rank " + std::to_string(rank()) + " line " + std::to_string(i) + " " +
                       std::string(static_cast<size_t>(i % 40), 'x') + " end\n";
    int fd = (i % 10 == 9) ? STDERR_FILENO : STDOUT_FILENO;
    for (size_t pos = 0; pos < line.size(); pos += 7) {
      size_t n = std::min<size_t>(7, line.size() - pos);
      ssize_t unused = ::write(fd, line.data() + pos, n);
      (void)unused;
      if (pos % 21 == 0) sched_yield();
    }
  }
}

int usage() {
  std::fprintf(stderr,
               "usage: weftrun_probe env | lines N | partial | exit CODE | sleep | fail R CODE | "
               "selfsignal R SIG | stubborn R CODE | deaf | wait-signal | restart FAILS CODE\n");
  return 64;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string mode = argv[1];
  auto arg = [&](int i) { return i < argc ? std::atoi(argv[i]) : -1; };
  say("start rank=" + std::to_string(rank()) + " pid=" + std::to_string(::getpid()) +
      " restart=" + std::to_string(restartCount()));

  if (mode == "env") {
    printEnv();
  } else if (mode == "lines") {
    writeLines(arg(2));
  } else if (mode == "partial") {
    const char text[] = "no newline at the end";
    ssize_t unused = ::write(STDOUT_FILENO, text, sizeof text - 1);
    (void)unused;
  } else if (mode == "exit") {
    return arg(2);
  } else if (mode == "sleep") {
    waitThenExit();
  } else if (mode == "fail" || mode == "selfsignal") {
    if (rank() != arg(2)) waitThenExit();
    waitForOthers();
    if (mode == "fail") return arg(3);
    ::signal(arg(3), SIG_DFL);
    ::raise(arg(3));
    return 0;
  } else if (mode == "stubborn") {
    if (rank() != arg(2)) {
      ::signal(SIGTERM, SIG_IGN);
      waitThenExit();
    }
    waitForOthers();
    return arg(3);
  } else if (mode == "deaf") {
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGTERM, SIG_IGN);
    ::signal(SIGHUP, SIG_IGN);
    say("ready");
    waitThenExit();
  } else if (mode == "wait-signal") {
    struct sigaction sa {};
    sa.sa_handler = recordSignal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    say("ready");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kMaxWaitSeconds);
    while (gSignal == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    say("got signal " + std::to_string(static_cast<int>(gSignal)));
    return 0;
  } else if (mode == "restart") {
    if (restartCount() >= arg(2)) return 0;
    if (rank() != 0) waitThenExit();
    waitForOthers();
    return arg(3);
  } else {
    return usage();
  }
  return 0;
}
