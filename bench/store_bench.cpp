// store_bench: the rendezvous store's round-trip latency and counter
// throughput, with a raw TCP ping-pong measured in the same run as baseline.
//
// Everything runs in this one process on 127.0.0.1: the server on its own
// loop thread, the client on another, the calling threads on top. A store
// round trip therefore crosses four threads (caller -> client loop -> server
// loop -> client loop -> caller); the baseline's ping-pong crosses two (a
// blocking client thread and a blocking echo thread, TCP_NODELAY, 8 bytes).
// On a machine with few cores the wake-ups dominate both; read the ratio.
//
//   1. set / get round trip, 8-byte value, one thread, blocking: median, p90, p99
//   2. add throughput: 4 threads sharing one client (blocking), 4 threads with
//      a client each (blocking), and one thread keeping 256 adds in flight
//
// Usage: store_bench [--quick]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/flags.h"
#include "rpc/store.h"

using namespace weft;
using namespace weft::rpc;
using Clock = std::chrono::steady_clock;

namespace {

struct Percentiles {
  double median = 0, p90 = 0, p99 = 0;
};

Percentiles percentiles(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  auto at = [&](double q) { return us[std::min(us.size() - 1, static_cast<size_t>(q * static_cast<double>(us.size())))]; };
  return {at(0.5), at(0.9), at(0.99)};
}

double microsSince(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

// Blocking echo of 8-byte messages between two threads of this process.
Percentiles rawPingPong(int rounds) {
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::listen(listener, 1);
  socklen_t len = sizeof a;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  int one = 1;
  auto readFull = [](int fd, char* buf, size_t n) {
    size_t got = 0;
    while (got < n) {
      ssize_t k = ::recv(fd, buf + got, n - got, 0);
      if (k <= 0) return false;
      got += static_cast<size_t>(k);
    }
    return true;
  };
  std::thread echo([&] {
    int fd = ::accept(listener, nullptr, nullptr);
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char buf[8];
    while (readFull(fd, buf, sizeof buf)) ::send(fd, buf, sizeof buf, MSG_NOSIGNAL);
    ::close(fd);
  });
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char buf[8] = "pingpon";
  std::vector<double> us;
  for (int i = 0; i < rounds + rounds / 10; ++i) {
    auto t = Clock::now();
    ::send(fd, buf, sizeof buf, MSG_NOSIGNAL);
    readFull(fd, buf, sizeof buf);
    if (i >= rounds / 10) us.push_back(microsSince(t));
  }
  ::close(fd);
  echo.join();
  ::close(listener);
  return percentiles(us);
}

template <class F>
Percentiles roundTrips(int rounds, F op) {
  std::vector<double> us;
  for (int i = 0; i < rounds + rounds / 10; ++i) {
    auto t = Clock::now();
    op(i);
    if (i >= rounds / 10) us.push_back(microsSince(t));
  }
  return percentiles(us);
}

StoreClient::Config clientConfig(uint16_t port) {
  StoreClient::Config c;
  c.port = port;
  c.connectTimeout = std::chrono::seconds(10);
  c.timeout = std::chrono::seconds(60);
  return c;
}

// Adds per second from `threads` threads doing `perThread` blocking adds each,
// on one shared client or on a client per thread.
double blockingAdds(uint16_t port, int threads, int perThread, bool shared) {
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int t = 0; t < (shared ? 1 : threads); ++t) clients.push_back(std::make_unique<StoreClient>(clientConfig(port)));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      StoreClient& c = *clients[shared ? 0 : static_cast<size_t>(t)];
      ++ready;
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < perThread; ++i) c.add("bench/adds", 1);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  auto start = Clock::now();
  go = true;
  for (auto& th : pool) th.join();
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return threads * static_cast<double>(perThread) / seconds;
}

// Adds per second from one thread keeping `inFlight` adds outstanding.
double pipelinedAdds(StoreClient& c, int total, int inFlight) {
  std::deque<Future<int64_t>> window;
  auto start = Clock::now();
  for (int i = 0; i < total; ++i) {
    if (static_cast<int>(window.size()) == inFlight) {
      window.front().get();
      window.pop_front();
    }
    window.push_back(c.addAsync("bench/pipelined", 1));
  }
  while (!window.empty()) {
    window.front().get();
    window.pop_front();
  }
  return total / std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  weft::bench::Flags flags;
  flags.onSwitch("--quick", [&] { quick = true; });
  if (!weft::bench::parseFlagsOrUsage(flags, argc, argv, "store_bench", "usage: store_bench [--quick]\n")) return 2;
  int rounds = quick ? 2000 : 20000;
  int adds = quick ? 2000 : 20000;
  std::printf("store_bench: in-process server and client on 127.0.0.1, %u hardware threads\n",
              std::thread::hardware_concurrency());

  StoreServer::Config sc;
  sc.port = 0;
  StoreServer server(sc);
  StoreClient client(clientConfig(server.port()));
  client.set("bench/key", "01234567");

  Percentiles raw = rawPingPong(rounds);
  Percentiles set = roundTrips(rounds, [&](int) { client.set("bench/key", "01234567"); });
  Percentiles get = roundTrips(rounds, [&](int) { (void)client.get("bench/key"); });

  std::printf("\n== round trip, 8-byte value, one thread (us)\n");
  std::printf("%-28s %9s %9s %9s %14s\n", "", "median", "p90", "p99", "median / raw");
  auto row = [&](const char* name, const Percentiles& p) {
    std::printf("%-28s %9.1f %9.1f %9.1f %13.2fx\n", name, p.median, p.p90, p.p99, p.median / raw.median);
  };
  row("raw TCP ping-pong (2 threads)", raw);
  row("store set", set);
  row("store get", get);

  std::printf("\n== add throughput (adds/s)\n");
  double shared = blockingAdds(server.port(), 4, adds / 4, true);
  double separate = blockingAdds(server.port(), 4, adds / 4, false);
  double pipelined = pipelinedAdds(client, adds * 5, 256);
  std::printf("%-44s %12.0f\n", "4 threads, one shared client, blocking", shared);
  std::printf("%-44s %12.0f\n", "4 threads, a client each, blocking", separate);
  std::printf("%-44s %12.0f\n", "1 thread, 256 adds in flight", pipelined);
  std::printf("%-44s %12.0f\n", "(raw ping-pong round trips/s, 1 thread)", 1e6 / raw.median);
  return 0;
}
