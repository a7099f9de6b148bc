// rpc_bench: the RPC agent's round-trip time and call throughput between two
// processes on 127.0.0.1, with its own baseline measured in the same run: a
// plain blocking TCP ping-pong (TCP_NODELAY) between the same two processes.
//
//   rpc_bench                          # the full run, placement split
//   rpc_bench --placement same         # both processes on one CPU
//   rpc_bench --quick                  # a smoke run (a few seconds)
//   rpc_bench --sizes 8,1K,64M         # payload sizes (bytes, K/M/G = KiB/MiB/GiB, multiples of 4)
//   rpc_bench --only sync              # only the round trips (or: async), e.g. under perf
//
// Processes. This program re-executes itself (/proc/self/exe --serve) as the
// server: the child is rank 0 (it serves the rendezvous store and the bench's
// functions), this process is rank 1, the client. Both the baseline and weft
// run between these same two processes. The child also opens a listening
// socket for the baseline and publishes its port through the store. It dies
// with this process (PR_SET_PDEATHSIG), ends when the baseline connection
// closes, and is killed and reaped on any error; every wait is bounded.
//
// Placement (--placement). On a machine with few cores, a small message's
// round trip is dominated by waking threads on the other CPU (or switching
// between them on one), not by the bytes: on an idle 2-core machine a raw
// ping-pong takes ~15 us with both processes on one CPU and ~32 us across
// CPUs. So the baseline runs under exactly the placement weft runs under, and
// only the ratio between them counts:
//   split  the server (child) pinned to the first allowed CPU, the client (this
//          process) to the second (default; with one CPU it degrades to same)
//   same   both processes pinned to the first allowed CPU
//   none   no pinning; the scheduler decides
// Pinning (sched_setaffinity) happens first thing in main, before the agent
// exists, so every thread the bench and the agent start (the loop thread, the
// handler pool, the baseline's echo loop) inherits its process's CPU.
//
// What is measured.
//  1. sync round trip, for payloads 8 B, 1 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB.
//     weft: agent.call(0, echo, t) where t is a float32 tensor of bytes/4
//     elements and echo's handler returns the tensor it received (so the reply
//     is written straight from the received storage). Baseline: the client
//     writes an 8-byte length and the payload in one writev, the server reads
//     all of it and writes the payload back, the client reads it all. Both are
//     warmed up, then timed one round trip at a time in alternating blocks
//     (baseline block, weft block, ...) so drift in the machine's load hits
//     both; the table shows the medians, their ratio, and for payloads of
//     64 KiB and more the bandwidth 2 * bytes / round trip (each direction in
//     turn: the one-way rate) and the bandwidth ratio raw time / weft time.
//     The baseline reuses its two buffers; weft receives every message into
//     new Storage (the request on the server, the reply on the client), as a
//     real caller does, so large payloads pay for first-touch page faults
//     there and not in the baseline.
//  2. async throughput: increment(int64) with 128 and 1,024 calls in flight.
//     The window is primed from the main thread; after that each call's
//     continuation (which runs on the agent's loop thread as the reply is
//     read) checks the result and issues the next call. This keeps exactly W
//     calls outstanding without a thread hop per call, and lets the agent
//     coalesce the calls issued while handling one batch of replies into one
//     writev. Each run lasts about a second; the figure is the median of 3
//     runs. Frames per writev syscall (AgentStats) is shown for both sides.
// Goals (the issue's): 8 B round trip <= 1.5x the baseline; 64 MiB round trip
// >= 0.9x the baseline's bandwidth; >= 150,000 calls/s with 1,024 in flight.
// A missed goal is reported, not an error: the exit status is non-zero only
// when something failed (a wrong result, a failed call, a broken process).
//
// The load average is printed at the start and the end: read the figures of a
// loaded machine with care.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "rpc/agent.h"
#include "rpc/options.h"
#include "rpc/store.h"
#include "tensor/tensor.h"
#include "two_process.h"

namespace {

using namespace weft;
using namespace std::chrono_literals;
using namespace weft::bench;
using Clock = std::chrono::steady_clock;

// The bench's functions, served by rank 0.
inline const weft::Function<Tensor(Tensor)> echo{"rpc_bench.echo"};
inline const weft::Function<int64_t(int64_t)> increment{"rpc_bench.increment"};
// {framesWritten, writeSyscalls} of the serving agent.
inline const weft::Function<std::vector<uint64_t>()> writeCounters{"rpc_bench.writeCounters"};

constexpr const char* kRawPortKey = "rpc_bench/raw_port";
constexpr auto kSetupTimeout = 30s;

// ---- sockets -------------------------------------------------------------------------

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  return a;
}

// A socket bound to 127.0.0.1 on a free port; listening when `listen`.
Fd boundSocket(bool listen, uint16_t* port) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) fail(errnoText("socket"));
  sockaddr_in a = loopback(0);
  socklen_t len = sizeof a;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fail(errnoText("bind"));
  if (listen && ::listen(fd.get(), 1) != 0) fail(errnoText("listen"));
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) fail(errnoText("getsockname"));
  *port = ntohs(a.sin_port);
  return fd;
}

void setNoDelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) fail(errnoText("TCP_NODELAY"));
}

// Reads exactly n bytes; false on end of stream before the first byte.
bool readExact(int fd, char* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = ::recv(fd, buf + got, n - got, 0);
    if (k == 0 && got == 0) return false;
    if (k == 0) fail("baseline: connection closed mid-message");
    if (k < 0) {
      if (errno == EINTR) continue;
      fail(errnoText("baseline: recv"));
    }
    got += static_cast<size_t>(k);
  }
  return true;
}

void writeAll(int fd, iovec* iov, int count) {
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    ssize_t k = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      fail(errnoText("baseline: sendmsg"));
    }
    auto left = static_cast<size_t>(k);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
}

// The baseline's server side: each message is an 8-byte length n and n bytes;
// the reply is the n bytes. The header and whatever of the payload has arrived
// are taken in one recv, as a careful blocking server would. Returns at end of
// stream.
void serveRawEcho(int fd) {
  std::vector<char> buf(64 * 1024 + 8);
  for (;;) {
    size_t got = 0;
    while (got < 8) {
      ssize_t k = ::recv(fd, buf.data() + got, buf.size() - got, 0);
      if (k == 0 && got == 0) return;
      if (k == 0) fail("baseline server: connection closed mid-header");
      if (k < 0) {
        if (errno == EINTR) continue;
        fail(errnoText("baseline server: recv"));
      }
      got += static_cast<size_t>(k);
    }
    uint64_t n = 0;
    std::memcpy(&n, buf.data(), 8);
    if (n > kMaxPayload) fail("baseline server: message of " + std::to_string(n) + " bytes");
    if (got > 8 + n) fail("baseline server: bytes past the end of a message");
    if (buf.size() < 8 + n) buf.resize(8 + n);
    if (got < 8 + n) readExact(fd, buf.data() + got, 8 + n - got);
    iovec iov{buf.data() + 8, n};
    writeAll(fd, &iov, 1);
  }
}

// Accepts one connection within timeout.
Fd acceptWithin(int listener, std::chrono::milliseconds timeout) {
  pollfd p{listener, POLLIN, 0};
  int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (r < 0) fail(errnoText("poll"));
  if (r == 0) fail("baseline server: no client connected within " + std::to_string(timeout.count()) + " ms");
  Fd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (fd.get() < 0) fail(errnoText("accept"));
  setNoDelay(fd.get());
  return fd;
}

Fd connectTo(uint16_t port) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) fail(errnoText("socket"));
  sockaddr_in a = loopback(port);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fail(errnoText("connect"));
  setNoDelay(fd.get());
  return fd;
}

// ---- the server process ------------------------------------------------------------

int serve(uint16_t storePort, int cpu) {
  pinTo(cpu);
  uint16_t rawPort = 0;
  Fd listener = boundSocket(true, &rawPort);
  rpc::Agent agent(agentOptions(0, storePort, kSetupTimeout));
  agent.registry().impl(echo, [](Tensor t) { return t; });
  agent.registry().impl(increment, [](int64_t v) { return v + 1; });
  agent.registry().impl(writeCounters, [&agent]() {
    rpc::AgentStats s = agent.stats();
    return std::vector<uint64_t>{s.framesWritten, s.writeSyscalls};
  });
  agent.start();
  agent.store().set(kRawPortKey, std::to_string(rawPort));
  Fd raw = acceptWithin(listener.get(), kSetupTimeout);
  listener.reset();
  serveRawEcho(raw.get());  // until the client closes the baseline connection: the bench is over
  raw.reset();
  rpc::ShutdownReport report = agent.shutdown();
  if (!report.clean()) fail("server: shutdown did not hear from the client");
  return 0;
}

// ---- sync round trips ----------------------------------------------------------------

struct RunConfig {
  bool quick = false;
  double secondsPerSize = 1.0;  // both sides together, after warm-up
  int minReps = 10;
  int maxReps = 10000;
  int blocks = 10;
  double asyncSeconds = 1.0;
  int asyncRuns = 3;
};

struct LatencyRow {
  uint64_t bytes = 0;
  int reps = 0;
  double weftUs = 0;
  double rawUs = 0;
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

class RoundTrips {
 public:
  RoundTrips(rpc::Agent& agent, int rawFd, uint64_t bytes) : agent_(agent), rawFd_(rawFd), bytes_(bytes) {
    payload_ = empty({static_cast<int64_t>(bytes / 4)});
    auto* p = reinterpret_cast<unsigned char*>(payload_.data<float>());
    for (uint64_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 131 + 7);
    rawOut_.resize(8 + bytes);
    std::memcpy(rawOut_.data(), &bytes_, 8);
    std::memcpy(rawOut_.data() + 8, p, bytes);
    rawIn_.resize(bytes);
  }

  void raw(bool check) {
    iovec iov{rawOut_.data(), rawOut_.size()};
    writeAll(rawFd_, &iov, 1);
    if (!readExact(rawFd_, rawIn_.data(), bytes_)) fail("baseline: server closed the connection");
    if (check && std::memcmp(rawIn_.data(), rawOut_.data() + 8, bytes_) != 0) {
      fail("baseline: the echo of " + formatBytes(bytes_) + " differs from what was sent");
    }
  }

  void weft(bool check) {
    Tensor r = agent_.call(0, echo, payload_);
    if (r.nbytes() != bytes_ || r.dtype() != DType::Float32) {
      fail("weft: echo of " + formatBytes(bytes_) + " returned " + std::to_string(r.nbytes()) + " bytes");
    }
    if (check) {
      Tensor c = r.contiguous();
      if (bytes_ > 0 && std::memcmp(c.data<float>(), payload_.data<float>(), bytes_) != 0) {
        fail("weft: the echo of " + formatBytes(bytes_) + " differs from what was sent");
      }
    }
  }

  template <class F>
  static double timeOne(F&& f) {
    auto t = Clock::now();
    f();
    return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
  }

 private:
  rpc::Agent& agent_;
  int rawFd_;
  uint64_t bytes_;
  Tensor payload_;
  std::vector<char> rawOut_;
  std::vector<char> rawIn_;
};

LatencyRow measureRoundTrips(rpc::Agent& agent, int rawFd, uint64_t bytes, const RunConfig& cfg) {
  RoundTrips rt(agent, rawFd, bytes);
  // Warm-up, checking every echo; its timing sizes the measurement.
  int warmup = bytes >= (uint64_t{16} << 20) ? 2 : bytes >= (uint64_t{1} << 20) ? 5 : (cfg.quick ? 50 : 200);
  double rawEst = 0, weftEst = 0;
  for (int i = 0; i < warmup; ++i) {
    rawEst += RoundTrips::timeOne([&] { rt.raw(true); });
    weftEst += RoundTrips::timeOne([&] { rt.weft(true); });
  }
  double pairUs = (rawEst + weftEst) / warmup;
  int reps = static_cast<int>(cfg.secondsPerSize * 1e6 / std::max(pairUs, 1.0));
  reps = std::clamp(reps, cfg.minReps, cfg.maxReps);
  int blocks = std::min(cfg.blocks, reps);
  int perBlock = (reps + blocks - 1) / blocks;

  std::vector<double> rawUs, weftUs;
  rawUs.reserve(static_cast<size_t>(perBlock * blocks));
  weftUs.reserve(static_cast<size_t>(perBlock * blocks));
  for (int b = 0; b < blocks; ++b) {
    for (int i = 0; i < perBlock; ++i) rawUs.push_back(RoundTrips::timeOne([&] { rt.raw(false); }));
    for (int i = 0; i < perBlock; ++i) weftUs.push_back(RoundTrips::timeOne([&] { rt.weft(false); }));
  }
  return {bytes, perBlock * blocks, median(weftUs), median(rawUs)};
}

// ---- async throughput ----------------------------------------------------------------

struct ThroughputRun {
  double callsPerSecond = 0;
  uint64_t calls = 0;
  uint64_t errors = 0;
  std::string firstError;
};

// Keeps `window` increment calls in flight until the deadline: each call's
// continuation checks its result and issues the next one. Shared by the
// continuations, so it outlives the last of them.
class AsyncPump : public std::enable_shared_from_this<AsyncPump> {
 public:
  AsyncPump(rpc::Agent& agent, Clock::time_point deadline) : agent_(agent), deadline_(deadline) {}

  ThroughputRun run(int window, std::chrono::milliseconds drainTimeout) {
    start_ = Clock::now();
    lastCompletionNs_ = 0;
    for (int i = 0; i < window; ++i) issue();
    std::unique_lock<std::mutex> lock(mutex_);
    if (!drained_.wait_for(lock, drainTimeout, [&] { return inFlight_.load() == 0; })) {
      fail("async: " + std::to_string(inFlight_.load()) + " calls still in flight " +
           std::to_string(drainTimeout.count()) + " ms after the run ended");
    }
    ThroughputRun r;
    r.calls = completed_.load();
    r.errors = errors_.load();
    r.firstError = firstError_;
    double elapsed = static_cast<double>(lastCompletionNs_.load()) * 1e-9;
    r.callsPerSecond = elapsed > 0 ? static_cast<double>(r.calls) / elapsed : 0;
    return r;
  }

 private:
  void issue() {
    int64_t v = next_.fetch_add(1, std::memory_order_relaxed);
    inFlight_.fetch_add(1);
    std::shared_ptr<AsyncPump> self = shared_from_this();
    agent_.callAsync(0, increment, v).onComplete([self, v](const Future<int64_t>& f) { self->completed(f, v); });
  }

  void completed(const Future<int64_t>& f, int64_t v) {
    bool ok = false;
    if (f.hasError()) {
      noteError("call " + std::to_string(v) + " failed: " + f.status().toString());
    } else if (f.get() != v + 1) {
      noteError("increment(" + std::to_string(v) + ") returned " + std::to_string(f.get()));
    } else {
      ok = true;
    }
    completed_.fetch_add(1, std::memory_order_relaxed);
    auto now = Clock::now();
    lastCompletionNs_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(now - start_).count(),
                            std::memory_order_relaxed);
    // A failed call is not replaced: the run stops issuing (and a call that
    // failed at once cannot recurse).
    if (ok && now < deadline_) issue();
    if (inFlight_.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      drained_.notify_all();
    }
  }

  void noteError(std::string what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (errors_.fetch_add(1) == 0) firstError_ = std::move(what);
  }

  rpc::Agent& agent_;
  Clock::time_point deadline_;
  Clock::time_point start_;
  std::atomic<int64_t> next_{1};
  std::atomic<int64_t> inFlight_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<int64_t> lastCompletionNs_{0};
  std::mutex mutex_;
  std::condition_variable drained_;
  std::string firstError_;  // under mutex_
};

struct ThroughputRow {
  int window = 0;
  double callsPerSecond = 0;  // median of the runs
  uint64_t calls = 0;         // over all runs
  double clientFramesPerWrite = 0;
  double serverFramesPerWrite = 0;
};

double ratioOf(uint64_t frames, uint64_t writes) {
  return writes == 0 ? 0 : static_cast<double>(frames) / static_cast<double>(writes);
}

ThroughputRow measureThroughput(rpc::Agent& agent, int window, const RunConfig& cfg) {
  auto serverBefore = agent.call(0, writeCounters);
  rpc::AgentStats before = agent.stats();
  std::vector<double> rates;
  ThroughputRow row;
  row.window = window;
  for (int run = 0; run < cfg.asyncRuns; ++run) {
    auto duration = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg.asyncSeconds));
    auto pump = std::make_shared<AsyncPump>(agent, Clock::now() + duration);
    ThroughputRun r = pump->run(window, 60s);
    if (r.errors > 0) {
      fail("async: " + std::to_string(r.errors) + " of " + std::to_string(r.calls) +
           " calls went wrong; the first: " + r.firstError);
    }
    rates.push_back(r.callsPerSecond);
    row.calls += r.calls;
  }
  rpc::AgentStats after = agent.stats();
  auto serverAfter = agent.call(0, writeCounters);
  if (serverBefore.size() != 2 || serverAfter.size() != 2) fail("writeCounters: expected two counters");
  row.callsPerSecond = median(rates);
  row.clientFramesPerWrite =
      ratioOf(after.framesWritten - before.framesWritten, after.writeSyscalls - before.writeSyscalls);
  row.serverFramesPerWrite = ratioOf(serverAfter[0] - serverBefore[0], serverAfter[1] - serverBefore[1]);
  return row;
}

// ---- the client process ----------------------------------------------------------------

struct Args {
  Placement placement = Placement::Split;
  bool quick = false;
  bool sync = true;
  bool async = true;
  std::vector<uint64_t> sizes = {8, 1024, 64 * 1024, 1 << 20, 16 << 20, 64 << 20};
};

const char* kUsage =
    "usage: rpc_bench [--quick] [--placement split|same|none] [--sizes LIST] [--only sync|async]\n"
    "  --quick       few repetitions: a smoke run of a few seconds\n"
    "  --placement   split: server and client pinned to two different CPUs (default)\n"
    "                same: both pinned to one CPU; none: not pinned\n"
    "  --sizes       comma-separated payload sizes in bytes, multiples of 4, with an\n"
    "                optional K, M or G suffix (KiB, MiB, GiB); default 8,1K,64K,1M,16M,64M\n"
    "  --only        run only the round trips (sync) or only the throughput (async),\n"
    "                e.g. under a profiler\n";

Args parseArgs(int argc, char** argv) {
  Args a;
  Flags flags;
  flags.onSwitch("--quick", [&] { a.quick = true; });
  flags.onValue("--placement", [&](const std::string& v) { a.placement = parsePlacement(v); });
  flags.onValue("--only", [&](const std::string& part) {
    if (part != "sync" && part != "async") throw FlagError("--only: '" + part + "' is not sync or async");
    a.sync = part == "sync";
    a.async = part == "async";
  });
  flags.onValue("--sizes", [&](const std::string& v) { a.sizes = parseSizeList(v); });
  flags.parse(argc, argv);
  return a;
}

const LatencyRow* rowFor(const std::vector<LatencyRow>& rows, uint64_t bytes) {
  for (const auto& r : rows)
    if (r.bytes == bytes) return &r;
  return nullptr;
}

// The one-way rate of a round trip that carries `bytes` each way in turn.
double gigabytesPerSecond(uint64_t bytes, double roundTripUs) {
  return 2.0 * static_cast<double>(bytes) / 1e9 / (roundTripUs * 1e-6);
}

const char* verdict(bool met) { return met ? "goal met" : "goal missed"; }

int runClient(const Args& args) {
  CpuPlan plan = planCpus(args.placement);
  pinTo(plan.clientCpu);  // before any thread exists: every thread of this process inherits it

  RunConfig cfg;
  if (args.quick) {
    cfg.quick = true;
    cfg.secondsPerSize = 0.15;
    cfg.minReps = 3;
    cfg.maxReps = 500;
    cfg.blocks = 3;
    cfg.asyncSeconds = 0.25;
    cfg.asyncRuns = 1;
  }

  uint16_t storePort = freePort();
  ServerProcess server("rpc_bench", storePort, plan.serverCpu);
  rpc::Options options = agentOptions(1, storePort, kSetupTimeout);
  rpc::Agent agent(options);
  agent.start();
  uint16_t rawPort = static_cast<uint16_t>(std::stoul(agent.store().get(kRawPortKey, kSetupTimeout)));
  Fd raw = connectTo(rawPort);

  std::printf("rpc_bench%s: two processes on 127.0.0.1; server = child (rank 0), client = this process (rank 1)\n",
              args.quick ? " --quick" : "");
  std::printf("CPUs: %ld online, %zu allowed; placement %s\n", ::sysconf(_SC_NPROCESSORS_ONLN),
              plan.allowed, plan.description.c_str());
  std::printf("weft: %d handler threads per agent; baseline: blocking TCP ping-pong (TCP_NODELAY), same processes\n",
              options.numWorkerThreads);
  std::printf("load average at start: %s\n", loadAverage().c_str());
  std::fflush(stdout);

  std::vector<LatencyRow> rows;
  if (args.sync) {
    std::printf("\n== sync round trip: median of `reps` per side, baseline and weft timed in alternating blocks\n");
    std::printf("%9s %6s %12s %12s %9s %10s %10s %9s\n", "payload", "reps", "weft_us", "raw_us", "weft/raw",
                "weft_GB/s", "raw_GB/s", "bw_ratio");
    for (uint64_t bytes : args.sizes) {
      LatencyRow r = measureRoundTrips(agent, raw.get(), bytes, cfg);
      rows.push_back(r);
      std::printf("%9s %6d %12.1f %12.1f %8.2fx", formatBytes(bytes).c_str(), r.reps, r.weftUs, r.rawUs,
                  r.weftUs / r.rawUs);
      if (bytes >= 64 * 1024) {
        std::printf(" %10.2f %10.2f %8.2fx", gigabytesPerSecond(bytes, r.weftUs), gigabytesPerSecond(bytes, r.rawUs),
                    r.rawUs / r.weftUs);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    std::printf("(GB/s = 2 x payload / round trip: the one-way rate; bw_ratio = raw_us / weft_us)\n");
  }

  std::vector<ThroughputRow> throughput;
  if (args.async) {
    std::printf("\n== async throughput: increment(int64), %d run%s of %.2f s per window, median;\n", cfg.asyncRuns,
                cfg.asyncRuns == 1 ? "" : "s", cfg.asyncSeconds);
    std::printf("   the window is kept full by each reply's continuation issuing the next call\n");
    std::printf("%10s %14s %10s %22s %22s\n", "in_flight", "calls/s", "calls", "client frames/writev",
                "server frames/writev");
    for (int window : {128, 1024}) {
      ThroughputRow t = measureThroughput(agent, window, cfg);
      throughput.push_back(t);
      std::printf("%10d %14.0f %10llu %22.1f %22.1f\n", t.window, t.callsPerSecond,
                  static_cast<unsigned long long>(t.calls), t.clientFramesPerWrite, t.serverFramesPerWrite);
      std::fflush(stdout);
    }
  }

  std::printf("\n== goals (placement %s)\n", plan.description.c_str());
  if (const LatencyRow* r = rowFor(rows, 8)) {
    double ratio = r->weftUs / r->rawUs;
    std::printf("  8 B round trip <= 1.5x raw TCP:          %7.2fx  (%.1f vs %.1f us)  %s\n", ratio, r->weftUs,
                r->rawUs, verdict(ratio <= 1.5));
  } else {
    std::printf("  8 B round trip <= 1.5x raw TCP:          not measured\n");
  }
  if (const LatencyRow* r = rowFor(rows, uint64_t{64} << 20)) {
    double ratio = r->rawUs / r->weftUs;
    std::printf("  64 MiB bandwidth >= 0.9x raw TCP:        %7.2fx  (%.2f vs %.2f GB/s)  %s\n", ratio,
                gigabytesPerSecond(r->bytes, r->weftUs), gigabytesPerSecond(r->bytes, r->rawUs), verdict(ratio >= 0.9));
  } else {
    std::printf("  64 MiB bandwidth >= 0.9x raw TCP:        not measured\n");
  }
  if (!throughput.empty()) {
    double rate = throughput.back().callsPerSecond;
    std::printf("  >= 150,000 calls/s with 1,024 in flight: %7.0f/s  %s\n", rate, verdict(rate >= 150000));
  } else {
    std::printf("  >= 150,000 calls/s with 1,024 in flight: not measured\n");
  }
  std::printf("load average at end: %s\n", loadAverage().c_str());
  std::fflush(stdout);

  raw.reset();  // the server's baseline loop ends, and it joins the shutdown barrier
  rpc::ShutdownReport report = agent.shutdown();
  if (!report.clean()) fail("client: shutdown did not hear from the server");
  server.waitForExit(20s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::twoProcessMain(argc, argv, "rpc_bench", kUsage, serve, [](int n, char** arguments) {
    Args args = parseArgs(n, arguments);
    return std::function<int()>([args] { return runClient(args); });
  });
}
