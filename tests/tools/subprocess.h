// Starts a program for a test, with stdout and stderr captured and every wait
// bounded, and makes sure nothing it started outlives the test.
//
//   weft::testing::Subprocess p({WEFTRUN_PATH, "-n", "2", "--tag-output", probe, "env"});
//   auto r = p.wait(std::chrono::seconds(20));
//   CHECK(r.exitCode == 0);
//   CHECK(r.out.find("[1] WEFT_RANK=1") != std::string::npos);
//
// The program runs in its own process group with stdin from /dev/null. The
// destructor (and wait() on timeout) sends SIGKILL to that group and reaps the
// program. Not thread-safe; one test thread drives it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace weft::testing {

class Subprocess {
 public:
  using Clock = std::chrono::steady_clock;

  struct Result {
    bool timedOut = false;
    int exitCode = -1;  // the exit code when it exited normally, else -1
    int signal = 0;     // the signal that killed it, else 0
    std::string out;
    std::string err;
    double seconds = 0;  // from start to reaping
  };

  // argv[0] is a path; extraEnv entries ("KEY=VALUE") override the test's environment.
  explicit Subprocess(const std::vector<std::string>& argv, const std::vector<std::string>& extraEnv = {}) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string entry(*e);
      std::string key = entry.substr(0, entry.find('='));
      bool overridden = false;
      for (const std::string& x : extraEnv) overridden |= x.substr(0, x.find('=')) == key;
      if (!overridden) env.push_back(entry);
    }
    env.insert(env.end(), extraEnv.begin(), extraEnv.end());
    std::vector<std::string> args = argv;
    std::vector<char*> cargs = cStrings(args);
    std::vector<char*> cenv = cStrings(env);

    int out[2];
    int err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    start_ = Clock::now();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::setpgid(0, 0);
      int devNull = ::open("/dev/null", O_RDONLY);
      ::dup2(devNull, STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::execve(cargs[0], cargs.data(), cenv.data());
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
    ::close(out[1]);
    ::close(err[1]);
    outFd_ = out[0];
    errFd_ = err[0];
    ::fcntl(outFd_, F_SETFL, O_NONBLOCK);
    ::fcntl(errFd_, F_SETFL, O_NONBLOCK);
  }

  ~Subprocess() {
    if (!reaped_) {
      ::kill(-pid_, SIGKILL);
      int status;
      ::waitpid(pid_, &status, 0);
    }
    closeFd(outFd_);
    closeFd(errFd_);
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

  // Reads output until pred(out, err) holds (true) or the timeout passes (false).
  bool readUntil(const std::function<bool(const std::string&, const std::string&)>& pred,
                 std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (!pred(out_, err_)) {
      if (Clock::now() >= deadline || (outFd_ < 0 && errFd_ < 0)) return pred(out_, err_);
      readSome(std::chrono::milliseconds(20));
    }
    return true;
  }

  // One round of reading output for up to `timeout`; true when bytes arrived. With tryReap, lets
  // one test thread drive several programs at once.
  bool pump(std::chrono::milliseconds timeout) { return readSome(timeout); }

  // Reaps the program if it has ended (without waiting) and fills `r` as wait() does.
  bool tryReap(Result& r) {
    if (reaped_) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
    finishResult(r, status);
    return true;
  }

  // Waits for the program to end, reading its output. On timeout kills its
  // process group and reports timedOut.
  Result wait(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    Result r;
    int status = 0;
    while (true) {
      pid_t got = ::waitpid(pid_, &status, WNOHANG);
      if (got == pid_) break;
      if (Clock::now() >= deadline) {
        r.timedOut = true;
        ::kill(-pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      readSome(std::chrono::milliseconds(20));
    }
    finishResult(r, status);
    return r;
  }

 private:
  void finishResult(Result& r, int status) {
    reaped_ = true;
    r.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    // What the program wrote is in the pipes now; do not wait for writers that
    // outlived it (that would be a leak the test reports by other means).
    for (int i = 0; i < 64 && (outFd_ >= 0 || errFd_ >= 0); ++i) {
      if (!readSome(std::chrono::milliseconds(0))) break;
    }
    if (WIFEXITED(status)) r.exitCode = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    r.out = out_;
    r.err = err_;
  }

  static std::vector<char*> cStrings(std::vector<std::string>& strings) {
    std::vector<char*> out;
    for (std::string& s : strings) out.push_back(s.data());
    out.push_back(nullptr);
    return out;
  }
  static void closeFd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  // One poll round; returns whether any bytes arrived.
  bool readSome(std::chrono::milliseconds timeout) {
    pollfd fds[2];
    int n = 0;
    if (outFd_ >= 0) fds[n++] = {outFd_, POLLIN, 0};
    if (errFd_ >= 0) fds[n++] = {errFd_, POLLIN, 0};
    if (n == 0) {
      std::this_thread::sleep_for(timeout);
      return false;
    }
    if (::poll(fds, static_cast<nfds_t>(n), static_cast<int>(timeout.count())) <= 0) return false;
    bool got = false;
    for (int i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      int& fd = fds[i].fd == outFd_ ? outFd_ : errFd_;
      std::string& sink = fds[i].fd == outFd_ ? out_ : err_;
      char buf[65536];
      ssize_t k = ::read(fd, buf, sizeof buf);
      if (k > 0) {
        sink.append(buf, static_cast<size_t>(k));
        got = true;
      } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
        closeFd(fd);
      }
    }
    return got;
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  int outFd_ = -1;
  int errFd_ = -1;
  std::string out_;
  std::string err_;
  Clock::time_point start_;
};

// True once pid no longer runs (gone, or a zombie awaiting its reaper) within
// the time given.
inline bool processGone(pid_t pid, std::chrono::milliseconds within) {
  auto deadline = std::chrono::steady_clock::now() + within;
  while (true) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    size_t paren = content.rfind(')');
    if (paren != std::string::npos && paren + 2 < content.size() && content[paren + 2] == 'Z') return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace weft::testing
