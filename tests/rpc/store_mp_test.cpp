// The rendezvous store across real processes on 127.0.0.1: started through the
// built weftrun, or one by one with a spawn helper, always with bounded waits,
// and checked to leave no process behind.
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "rpc/store.h"
#include "tools/subprocess.h"
#include "captured_text.h"

using namespace weft;
using namespace weft::rpc;
using namespace std::chrono_literals;
using weft::testing::processGone;
using weft::testing::Subprocess;

using weft::testing::contains;

namespace {

// The number following each occurrence of `label` in text ("pid 4711" ->
// 4711 for label "pid "), in order.
std::vector<long> numbersAfter(const std::string& text, const std::string& label) {
  std::vector<long> out;
  for (size_t pos = text.find(label); pos != std::string::npos; pos = text.find(label, pos + 1)) {
    size_t start = pos + label.size();
    size_t end = start;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end > start) out.push_back(std::stol(text.substr(start, end - start)));
  }
  return out;
}

// The environment of rank `rank` of `world` whose store is at 127.0.0.1:port.
std::vector<std::string> rankEnv(int rank, int world, uint16_t port) {
  return {"WEFT_RANK=" + std::to_string(rank), "WEFT_WORLD_SIZE=" + std::to_string(world),
          "WEFT_LOCAL_RANK=" + std::to_string(rank), "WEFT_MASTER_ADDR=127.0.0.1",
          "WEFT_MASTER_PORT=" + std::to_string(port)};
}

StoreClient::Config clientConfig(uint16_t port) {
  StoreClient::Config c;
  c.port = port;
  c.connectTimeout = 10s;
  c.timeout = 30s;
  return c;
}

void checkCount(const Subprocess::Result& r, int world, int adds) {
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK_FALSE(r.timedOut);
  CHECK(r.exitCode == 0);
  for (int rank = 0; rank < world; ++rank) {
    std::string tag = std::to_string(rank);
    CHECK(contains(r.out, std::string("[").append(tag).append("] rank ").append(tag).append(" pid ")));
  }
  std::vector<long> totals = numbersAfter(r.out, " counter ");
  CHECK(totals.size() == static_cast<size_t>(world));
  for (long total : totals) CHECK(total == world * adds);
  std::vector<long> pids = numbersAfter(r.out, " pid ");
  CHECK(pids.size() == static_cast<size_t>(world));
  for (long pid : pids) CHECK(processGone(static_cast<pid_t>(pid), 5s));
}

}  // namespace

TEST_CASE("four processes started by weftrun count to the exact total through rank 0's store") {
  Subprocess run({WEFTRUN_PATH, "-n", "4", "--tag-output", STORE_WORKER_PATH, "count", "200"});
  checkCount(run.wait(90s), 4, 200);
}

TEST_CASE("ranks that start before rank 0's store connect once it listens") {
  Subprocess run({WEFTRUN_PATH, "-n", "4", "--tag-output", STORE_WORKER_PATH, "count", "20", "800"});
  auto r = run.wait(90s);
  checkCount(r, 4, 20);
  CHECK(r.seconds >= 0.8);
}

TEST_CASE("a client killed with SIGKILL mid-wait does not disturb the others") {
  StoreServer::Config sc;
  sc.port = 0;
  StoreServer server(sc);
  StoreClient observer(clientConfig(server.port()));

  constexpr int kSurvivors = 3;
  std::vector<std::unique_ptr<Subprocess>> survivors;
  for (int r = 0; r < kSurvivors; ++r) {
    survivors.push_back(
        std::make_unique<Subprocess>(std::vector<std::string>{STORE_WORKER_PATH, "survivor", std::to_string(kSurvivors)},
                                     rankEnv(r, kSurvivors + 1, server.port())));
  }
  Subprocess victim({STORE_WORKER_PATH, "victim"}, rankEnv(kSurvivors, kSurvivors + 1, server.port()));

  // Everyone is waiting: the survivors for "go", the victim for "never".
  std::string victimPid = observer.get("victim/pid", 30s);
  CHECK(victimPid == std::to_string(victim.pid()));
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (server.stats().waiters < kSurvivors + 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(server.stats().waiters == kSurvivors + 1);
  REQUIRE(server.stats().connections == kSurvivors + 2);  // with the observer

  ::kill(victim.pid(), SIGKILL);
  auto v = victim.wait(10s);
  CHECK(v.signal == SIGKILL);
  // The server notices the dead connection and forgets its waiter.
  deadline = std::chrono::steady_clock::now() + 10s;
  while (server.stats().connections != kSurvivors + 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK(server.stats().connections == kSurvivors + 1);
  CHECK(server.stats().waiters == kSurvivors);

  observer.set("go", "1");
  for (int r = 0; r < kSurvivors; ++r) {
    auto res = survivors[static_cast<size_t>(r)]->wait(30s);
    INFO("survivor " << r << " stdout:\n" << res.out << "\nstderr:\n" << res.err);
    CHECK_FALSE(res.timedOut);
    CHECK(res.exitCode == 0);
    CHECK(contains(res.out, "survivor rank " + std::to_string(r) + " done"));
    CHECK(processGone(survivors[static_cast<size_t>(r)]->pid(), 5s));
  }
  CHECK(observer.get("finished") == std::to_string(kSurvivors));
  CHECK(observer.get("survivors") == std::to_string(kSurvivors));
  CHECK(server.stats().waiters == 0);
  CHECK(server.stats().connections == 1);

  // The port is free again once the server is gone.
  uint16_t port = server.port();
  server.close();
  sc.port = port;
  CHECK_NOTHROW(StoreServer{sc});
}

TEST_CASE("clients of a store whose process is killed fail with DisconnectedError promptly") {
  Subprocess serverProcess({STORE_WORKER_PATH, "serve"}, {"WEFT_RANK=0", "WEFT_WORLD_SIZE=1"});
  REQUIRE(serverProcess.readUntil(
      [](const std::string& out, const std::string&) {
        size_t at = out.find("listening ");
        return at != std::string::npos && out.find('\n', at) != std::string::npos;  // the whole line
      },
      20s));
  std::vector<long> ports = numbersAfter(serverProcess.out(), "listening ");
  REQUIRE(ports.size() == 1);
  std::string port = std::to_string(ports[0]);

  std::vector<std::string> env = {"WEFT_RANK=0", "WEFT_WORLD_SIZE=1", "WEFT_MASTER_ADDR=127.0.0.1",
                                  "WEFT_MASTER_PORT=" + port};
  Subprocess a({STORE_WORKER_PATH, "wait-disconnect"}, env);
  Subprocess b({STORE_WORKER_PATH, "wait-disconnect"}, env);
  // Both are connected and about to wait (or waiting) when they say so.
  for (Subprocess* client : {&a, &b}) {
    REQUIRE(client->readUntil([](const std::string& out, const std::string&) { return contains(out, "waiting"); },
                              20s));
  }
  auto killedAt = std::chrono::steady_clock::now();
  ::kill(serverProcess.pid(), SIGKILL);
  for (Subprocess* client : {&a, &b}) {
    auto r = client->wait(10s);
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(r.exitCode == 0);
    CHECK(contains(r.out, "disconnected after"));
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - killedAt).count() < 2.0);
    CHECK(processGone(client->pid(), 5s));
  }
  CHECK(serverProcess.wait(10s).signal == SIGKILL);
}
