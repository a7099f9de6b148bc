#include "tools/weftrun/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "tools/weftrun/cpu_binding.h"
#include "tools/weftrun/free_port.h"
#include "tools/weftrun/line_tagger.h"

extern char** environ;

namespace weft::weftrun {
namespace {

using Clock = std::chrono::steady_clock;

// Signals weftrun handles; the handler only records them in the self-pipe.
constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

// Write end of the self-pipe. A signal handler can reach nothing else, so this
// one global exists for the lifetime of a SignalPipe.
int gSignalWriteFd = -1;

extern "C" void recordSignal(int signo) {
  int savedErrno = errno;
  unsigned char byte = static_cast<unsigned char>(signo);
  // A full pipe drops the byte: fine, the loop is already due to wake, and
  // SIGCHLD handling reaps every exited child whichever byte woke it.
  ssize_t unused = ::write(gSignalWriteFd, &byte, 1);
  (void)unused;
  errno = savedErrno;
}

[[noreturn]] void throwErrno(const std::string& what) { throw std::system_error(errno, std::generic_category(), what); }

// Installs weftrun's signal handling for its lifetime and restores the
// previous dispositions afterwards.
class SignalPipe {
 public:
  SignalPipe() {
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) throwErrno("weftrun: pipe");
    gSignalWriteFd = fds_[1];
    struct sigaction sa {};
    sa.sa_handler = recordSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      struct sigaction act = sa;
      if (kHandledSignals[i] == SIGCHLD) act.sa_flags |= SA_NOCLDSTOP;
      ::sigaction(kHandledSignals[i], &act, &previous_[i]);
    }
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, &previousPipe_);
  }
  ~SignalPipe() {
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) ::sigaction(kHandledSignals[i], &previous_[i], nullptr);
    ::sigaction(SIGPIPE, &previousPipe_, nullptr);
    gSignalWriteFd = -1;
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int readFd() const { return fds_[0]; }
  // The signals recorded since the last call, oldest first.
  std::vector<int> take() {
    std::vector<int> signals;
    unsigned char buf[256];
    ssize_t n;
    while ((n = ::read(fds_[0], buf, sizeof buf)) > 0) signals.insert(signals.end(), buf, buf + n);
    return signals;
  }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction previous_[std::size(kHandledSignals)] {};
  struct sigaction previousPipe_ {};
};

std::string signalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// "exited with code 3", "was killed by signal 9 (SIGKILL)".
std::string describeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + signalName(sig) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// Exit code, or 128 + signal: what a shell reports for the same ending.
int exitStatusOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Writes all of data; false once the reader has gone (the rest is dropped).
bool writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// weftrun's own messages: one line, one write, on stderr.
void say(const std::string& message) { writeAll(STDERR_FILENO, "weftrun: " + message + "\n"); }

// weftrun's environment with every variable it manages replaced.
// threads > 0: WEFT_NUM_THREADS for the rank (--bind-cpus), unless weftrun's
// own environment sets it.
std::vector<std::string> rankEnvironment(const Options& o, int localRank, int port, int restartCount,
                                         int threads) {
  std::vector<std::pair<const char*, std::string>> managed = {
      {"WEFT_RANK", std::to_string(o.globalRank(localRank))},
      {"WEFT_WORLD_SIZE", std::to_string(o.worldSize())},
      {"WEFT_LOCAL_RANK", std::to_string(localRank)},
      {"WEFT_LOCAL_WORLD_SIZE", std::to_string(o.procsPerNode)},
      {"WEFT_NNODES", std::to_string(o.nnodes)},
      {"WEFT_NODE_RANK", std::to_string(o.nodeRank)},
      {"WEFT_MASTER_ADDR", o.masterAddr},
      {"WEFT_MASTER_PORT", std::to_string(port)},
      {"WEFT_RESTART_COUNT", std::to_string(restartCount)},
      {"RANK", std::to_string(o.globalRank(localRank))},
      {"WORLD_SIZE", std::to_string(o.worldSize())},
      {"LOCAL_RANK", std::to_string(localRank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.procsPerNode)},
      {"MASTER_ADDR", o.masterAddr},
      {"MASTER_PORT", std::to_string(port)},
  };
  if (!o.heartbeatInterval.empty()) managed.emplace_back("WEFT_HEARTBEAT_INTERVAL", o.heartbeatInterval);
  if (!o.heartbeatMisses.empty()) managed.emplace_back("WEFT_HEARTBEAT_MISSES", o.heartbeatMisses);
  if (threads > 0 && std::getenv("WEFT_NUM_THREADS") == nullptr) {
    managed.emplace_back("WEFT_NUM_THREADS", std::to_string(threads));
  }
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string_view entry(*e);
    std::string_view key = entry.substr(0, entry.find('='));
    bool replaced = std::any_of(managed.begin(), managed.end(), [&](const auto& kv) { return key == kv.first; });
    if (!o.socketIfname.empty() && key == "WEFT_SOCKET_IFNAME") replaced = true;
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [key, value] : managed) env.push_back(std::string(key) + "=" + value);
  if (!o.socketIfname.empty()) env.push_back("WEFT_SOCKET_IFNAME=" + o.socketIfname);
  return env;
}

std::vector<char*> cStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// One of a rank's output streams, relayed through a pipe when tagging.
struct Stream {
  int fd = -1;     // read end; -1 once closed
  int target = -1;  // weftrun's STDOUT_FILENO or STDERR_FILENO
  LineTagger tagger;
};

struct Rank {
  int localRank = 0;
  int globalRank = 0;
  pid_t pid = -1;  // also its process group id
  bool running = false;
  int waitStatus = 0;
  Stream out;
  Stream err;
};

enum class Outcome { Success, Failed, CannotExecute };

struct AttemptResult {
  Outcome outcome = Outcome::Success;
  int exitStatus = 0;
  bool interrupted = false;  // a stop signal arrived: never restart
};

// One run of the whole group, from starting every rank to reaping the last.
class Attempt {
 public:
  Attempt(const Options& options, SignalPipe& signals, int restartCount,
          const std::vector<std::vector<int>>& cpuShares)
      : options_(options), signals_(signals), restartCount_(restartCount), cpuShares_(cpuShares) {}
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;
  // Reached with ranks still running only when an exception escapes run().
  ~Attempt() {
    for (Rank& r : ranks_) {
      if (!r.running) continue;
      ::kill(-r.pid, SIGKILL);
      ::kill(r.pid, SIGKILL);
      int status = 0;
      ::waitpid(r.pid, &status, 0);
    }
    for (Rank& r : ranks_) {
      closeStream(r.out);
      closeStream(r.err);
    }
  }

  AttemptResult run() {
    // Held until the attempt ends: no other weftrun or test takes the port
    // before rank 0 binds it (free_port.h).
    if (options_.masterPort == 0) {
      try {
        masterPort_ = reserveFreePort();
      } catch (const std::runtime_error& e) {
        throw std::runtime_error(std::string("weftrun: choosing a free master port: ") + e.what());
      }
    }
    int port = options_.masterPort ? options_.masterPort : masterPort_.port();
    ranks_.resize(static_cast<size_t>(options_.procsPerNode));
    for (int local = 0; local < options_.procsPerNode; ++local) {
      Rank& r = ranks_[static_cast<size_t>(local)];
      r.localRank = local;
      r.globalRank = options_.globalRank(local);
      int execErrno = spawn(r, port);
      if (execErrno != 0) {
        say("cannot execute '" + options_.command[0] + "': " + std::strerror(execErrno));
        cannotExecuteStatus_ = execErrno == ENOENT ? 127 : 126;
        stop(SIGTERM);
        break;
      }
    }
    loop();
    drainStreams();

    AttemptResult result;
    result.interrupted = interruptSignal_ != 0;
    if (cannotExecuteStatus_ != 0) {
      result.outcome = Outcome::CannotExecute;
      result.exitStatus = cannotExecuteStatus_;
    } else if (failedRank_ != nullptr) {
      result.outcome = Outcome::Failed;
      result.exitStatus = exitStatusOf(failedRank_->waitStatus);
    } else if (interruptSignal_ != 0) {
      result.outcome = Outcome::Failed;
      result.exitStatus = 128 + interruptSignal_;
    }
    return result;
  }

 private:
  // Starts r. Returns 0, or the errno of a failed exec (the child is reaped).
  int spawn(Rank& r, int port) {
    std::vector<std::string> argStrings = options_.command;
    const std::vector<int>* cpus =
        cpuShares_.empty() ? nullptr : &cpuShares_[static_cast<size_t>(r.localRank)];
    std::vector<std::string> envStrings =
        rankEnvironment(options_, r.localRank, port, restartCount_, cpus ? static_cast<int>(cpus->size()) : 0);
    std::vector<char*> argv = cStrings(argStrings);
    std::vector<char*> envp = cStrings(envStrings);

    int outPipe[2] = {-1, -1};
    int errPipe[2] = {-1, -1};
    if (options_.tagOutput) {
      if (::pipe2(outPipe, O_CLOEXEC) != 0) throwErrno("weftrun: pipe");
      if (::pipe2(errPipe, O_CLOEXEC) != 0) {
        int e = errno;
        ::close(outPipe[0]);
        ::close(outPipe[1]);
        errno = e;
        throwErrno("weftrun: pipe");
      }
    }
    int execPipe[2];
    if (::pipe2(execPipe, O_CLOEXEC) != 0) throwErrno("weftrun: pipe");

    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) throwErrno("weftrun: fork");
    if (pid == 0) {
      // The child: weftrun is single-threaded, so everything here is safe.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // weftrun died before prctl took effect
      for (int sig : kHandledSignals) ::signal(sig, SIG_DFL);
      ::signal(SIGPIPE, SIG_DFL);
      int devNull = ::open("/dev/null", O_RDONLY);
      if (devNull >= 0) {
        ::dup2(devNull, STDIN_FILENO);
        ::close(devNull);
      }
      if (options_.tagOutput) {
        ::dup2(outPipe[1], STDOUT_FILENO);
        ::dup2(errPipe[1], STDERR_FILENO);
      }
      int err = cpus ? bindToCpus(*cpus) : 0;
      if (err == 0) {
        ::execvpe(argv[0], argv.data(), envp.data());
        err = errno;
      }
      ssize_t unused = ::write(execPipe[1], &err, sizeof err);
      (void)unused;
      ::_exit(127);
    }

    ::setpgid(pid, pid);  // also done by the child; whichever runs first wins the race harmlessly
    ::close(execPipe[1]);
    if (options_.tagOutput) {
      ::close(outPipe[1]);
      ::close(errPipe[1]);
      ::fcntl(outPipe[0], F_SETFL, O_NONBLOCK);
      ::fcntl(errPipe[0], F_SETFL, O_NONBLOCK);
      std::string tag = "[";
      tag += std::to_string(r.globalRank);
      tag += "] ";
      r.out = Stream{outPipe[0], STDOUT_FILENO, LineTagger(tag)};
      r.err = Stream{errPipe[0], STDERR_FILENO, LineTagger(tag)};
    }
    r.pid = pid;
    r.running = true;
    ++running_;

    // EOF: exec succeeded (the pipe closed on exec). An int: exec failed.
    int execErrno = 0;
    ssize_t n;
    do {
      n = ::read(execPipe[0], &execErrno, sizeof execErrno);
    } while (n < 0 && errno == EINTR);
    ::close(execPipe[0]);
    if (n != static_cast<ssize_t>(sizeof execErrno)) return 0;
    int status = 0;
    ::waitpid(pid, &status, 0);
    r.running = false;
    r.waitStatus = status;
    --running_;
    return execErrno;
  }

  void loop() {
    while (running_ > 0) {
      std::vector<pollfd> fds;
      std::vector<Stream*> polled;
      fds.push_back({signals_.readFd(), POLLIN, 0});
      for (Rank& r : ranks_) {
        for (Stream* s : {&r.out, &r.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          polled.push_back(s);
        }
      }
      int timeoutMs = -1;
      if (stopping_ && !killed_) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(killDeadline_ - Clock::now()).count();
        timeoutMs = static_cast<int>(std::max<long long>(0, left));
      }
      int n = ::poll(fds.data(), fds.size(), timeoutMs);
      if (n < 0 && errno != EINTR) throwErrno("weftrun: poll");
      if (n > 0) {
        if (fds[0].revents != 0) {
          for (int sig : signals_.take()) onSignal(sig);
        }
        for (size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents != 0) pump(*polled[i - 1]);
        }
      }
      if (stopping_ && !killed_ && running_ > 0 && Clock::now() >= killDeadline_) {
        std::string still;
        for (const Rank& r : ranks_) {
          if (r.running) still += (still.empty() ? "" : ", ") + std::to_string(r.globalRank);
        }
        say("rank(s) " + still + " still running " + formatSeconds(options_.graceSeconds) +
            " after being told to stop; sending SIGKILL");
        signalRunning(SIGKILL);
        killed_ = true;
      }
    }
  }

  void onSignal(int sig) {
    if (sig == SIGCHLD) {
      reap();
      return;
    }
    if (interruptSignal_ == 0) {
      interruptSignal_ = sig;
      if (running_ > 0) say("got " + signalName(sig) + "; forwarding it to " + countRanks(running_));
      signalRunning(sig);
      beginStopping();
    } else if (!killed_) {
      say("got " + signalName(sig) + " again; sending SIGKILL to " + countRanks(running_));
      signalRunning(SIGKILL);
      killed_ = true;
    }
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      auto it = std::find_if(ranks_.begin(), ranks_.end(), [&](const Rank& r) { return r.running && r.pid == pid; });
      if (it == ranks_.end()) continue;
      it->running = false;
      it->waitStatus = status;
      --running_;
      if (!succeeded(status) && !stopping_) {
        failedRank_ = &*it;
        std::string message = "rank " + std::to_string(it->globalRank) + " (pid " + std::to_string(pid) + ") " +
                              describeWaitStatus(status);
        if (running_ > 0) message += "; stopping " + countRanks(running_);
        say(message);
        stop(SIGTERM);
      }
    }
  }

  // Sends sig to every running rank and starts the grace period.
  void stop(int sig) {
    signalRunning(sig);
    beginStopping();
  }
  void beginStopping() {
    if (stopping_) return;
    stopping_ = true;
    killDeadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(options_.graceSeconds));
  }
  // Signals each running rank's process group, reaching what it started too.
  void signalRunning(int sig) {
    for (const Rank& r : ranks_) {
      if (!r.running) continue;
      if (::kill(-r.pid, sig) != 0) ::kill(r.pid, sig);
    }
  }

  // Relays what one read returns; closes the stream at EOF.
  void pump(Stream& s) {
    char buf[65536];
    ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      emit(s, s.tagger.feed(std::string_view(buf, static_cast<size_t>(n))));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      emit(s, s.tagger.finish());
      closeStream(s);
    }
  }

  // After every rank has been reaped: relay what is left in the pipes without
  // waiting for writers that outlived their rank (a background grandchild),
  // bounded so such a writer cannot keep weftrun here.
  void drainStreams() {
    constexpr int kMaxReads = 64;
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        for (int i = 0; i < kMaxReads && s->fd >= 0; ++i) {
          char buf[65536];
          ssize_t n = ::read(s->fd, buf, sizeof buf);
          if (n <= 0) break;
          emit(*s, s->tagger.feed(std::string_view(buf, static_cast<size_t>(n))));
        }
        if (s->fd >= 0) {
          emit(*s, s->tagger.finish());
          closeStream(*s);
        }
      }
    }
  }

  void emit(const Stream& s, const std::string& text) {
    if (text.empty() || outputClosed_[s.target == STDOUT_FILENO ? 0 : 1]) return;
    if (!writeAll(s.target, text)) outputClosed_[s.target == STDOUT_FILENO ? 0 : 1] = true;
  }

  static void closeStream(Stream& s) {
    if (s.fd >= 0) ::close(s.fd);
    s.fd = -1;
  }

  static std::string countRanks(int n) { return std::to_string(n) + (n == 1 ? " running rank" : " running ranks"); }
  static std::string formatSeconds(double s) {
    std::string text = std::to_string(s);
    text.erase(text.find_last_not_of('0') + 1);
    if (text.back() == '.') text.pop_back();
    return text + " s";
  }

  const Options& options_;
  SignalPipe& signals_;
  const int restartCount_;
  const std::vector<std::vector<int>>& cpuShares_;  // --bind-cpus: rank r's CPUs; empty: no binding
  PortReservation masterPort_;  // the port chosen when none was given
  std::vector<Rank> ranks_;  // sized once, so Rank pointers stay valid
  int running_ = 0;
  bool stopping_ = false;  // ranks were told to stop (failure, signal or exec error)
  bool killed_ = false;    // SIGKILL sent
  Clock::time_point killDeadline_{};
  int interruptSignal_ = 0;
  const Rank* failedRank_ = nullptr;  // first rank that failed on its own
  int cannotExecuteStatus_ = 0;
  bool outputClosed_[2] = {false, false};  // weftrun's stdout / stderr reader went away
};

}  // namespace

int launch(const Options& options) {
  // --bind-cpus: every attempt binds rank r to the same slice.
  const std::vector<std::vector<int>> shares =
      options.bindCpus ? cpuShares(options.procsPerNode) : std::vector<std::vector<int>>{};
  SignalPipe signals;
  for (int restart = 0;; ++restart) {
    AttemptResult result = Attempt(options, signals, restart, shares).run();
    if (result.outcome == Outcome::Success) return 0;
    if (result.outcome == Outcome::CannotExecute || result.interrupted) return result.exitStatus;
    if (restart >= options.maxRestarts) {
      if (options.maxRestarts > 0) {
        say("giving up after " + std::to_string(options.maxRestarts) +
            (options.maxRestarts == 1 ? " restart" : " restarts"));
      }
      return result.exitStatus;
    }
    say("restarting all " + std::to_string(options.procsPerNode) + " local ranks (restart " +
        std::to_string(restart + 1) + " of " + std::to_string(options.maxRestarts) + ")");
  }
}

}  // namespace weft::weftrun
