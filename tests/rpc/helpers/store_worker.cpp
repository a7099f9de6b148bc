// A program for the store's multiprocess tests: each mode plays one part a
// process takes in a rendezvous. It finds the store (and its rank) through
// rpc::Options::fromEnv, as a real weft program does.
//
//   weftrun -n 4 store_worker count 100          # every rank adds 100, then all check the total
//   store_worker serve                           # serves on a free port, prints "listening <port>"
//
// Modes:
//   count <adds> [serverDelayMs]  rank 0 serves the store (after the delay, so
//                                 the others must retry connecting); every rank
//                                 adds 1 to "counter" <adds> times, meets the
//                                 others in a barrier, checks the total is
//                                 worldSize * adds, meets them again, exits 0
//   survivor <n>                  adds to "survivors", barrier of n, waits for
//                                 the key "go", barrier of n again, exits 0
//   victim                        sets "victim/pid" and waits for a key nobody
//                                 sets (a test kills it with SIGKILL meanwhile)
//   serve                         serves the store on a free port and prints
//                                 "listening <port>" until killed
//   wait-disconnect               prints "waiting", then waits for a key nobody
//                                 sets; exits 0 when the wait fails with
//                                 DisconnectedError
// Every wait is bounded (kTimeout), so a broken store cannot leave a process
// running for long. Errors print one line to stderr and exit non-zero.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "rpc/options.h"
#include "rpc/store.h"

namespace {

using namespace weft;
using namespace weft::rpc;
using namespace std::chrono_literals;

constexpr std::chrono::seconds kTimeout{30};

void say(const std::string& line) {
  std::string text = line + "\n";
  ssize_t unused = ::write(STDOUT_FILENO, text.data(), text.size());
  (void)unused;
}

std::unique_ptr<StoreClient> connect(const Options& opt) {
  StoreClient::Config c = StoreClient::configFor(opt);
  c.connectTimeout = kTimeout;
  c.timeout = kTimeout;
  return std::make_unique<StoreClient>(c);
}

int count(const Options& opt, int adds, int serverDelayMs) {
  std::unique_ptr<StoreServer> server;
  if (opt.rank == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(serverDelayMs));
    server = std::make_unique<StoreServer>(StoreServer::configFor(opt));
  }
  auto store = connect(opt);
  for (int i = 0; i < adds; ++i) store->add("counter", 1);
  store->barrier("counted", opt.worldSize, kTimeout);
  std::string total = store->get("counter", kTimeout);
  say("rank " + std::to_string(opt.rank) + " pid " + std::to_string(::getpid()) + " counter " + total);
  if (total != std::to_string(static_cast<int64_t>(opt.worldSize) * adds)) return 3;
  // Nobody leaves before everyone has read the total, and rank 0 does not close the server before
  // every other rank has said it is leaving (after the barrier, one may still await its release).
  store->barrier("done", opt.worldSize, kTimeout);
  if (opt.rank == 0) {
    std::vector<std::string> left;
    for (int r = 1; r < opt.worldSize; ++r) left.push_back("left/" + std::to_string(r));
    if (!left.empty()) store->wait(left, kTimeout);
  } else {
    store->set("left/" + std::to_string(opt.rank), "1");
  }
  return 0;
}

int survivor(const Options& opt, int n) {
  auto store = connect(opt);
  store->add("survivors", 1);
  store->barrier("survivors-ready", n, kTimeout);
  store->wait({"go"}, kTimeout);
  store->add("finished", 1);
  store->barrier("survivors-done", n, kTimeout);
  say("survivor rank " + std::to_string(opt.rank) + " done");
  return 0;
}

int victim(const Options& opt) {
  auto store = connect(opt);
  store->set("victim/pid", std::to_string(::getpid()));
  store->wait({"never"}, std::chrono::seconds(60));
  return 4;  // never reached: nobody sets "never"
}

int serve(const Options& opt) {
  StoreServer::Config c = StoreServer::configFor(opt);
  c.port = 0;
  StoreServer server(c);
  say("listening " + std::to_string(server.port()));
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

int waitDisconnect(const Options& opt) {
  auto store = connect(opt);
  store->set("waiting/" + std::to_string(::getpid()), "1");
  say("waiting");
  auto start = std::chrono::steady_clock::now();
  try {
    store->wait({"never"}, std::chrono::seconds(60));
  } catch (const DisconnectedError& e) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    say("disconnected after " + std::to_string(ms.count()) + " ms: " + e.what());
    return 0;
  }
  return 6;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  try {
    Options opt = Options::fromEnv();
    if (mode == "count" && argc >= 3) return count(opt, std::atoi(argv[2]), argc >= 4 ? std::atoi(argv[3]) : 0);
    if (mode == "survivor" && argc >= 3) return survivor(opt, std::atoi(argv[2]));
    if (mode == "victim") return victim(opt);
    if (mode == "serve") return serve(opt);
    if (mode == "wait-disconnect") return waitDisconnect(opt);
    std::fprintf(stderr, "usage: store_worker count|survivor|victim|serve|wait-disconnect [args]\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_worker %s: %s\n", mode.c_str(), e.what());
    return 1;
  }
}
