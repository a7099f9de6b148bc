// Helpers for tests that run several Agents: a free port for the store, options
// with short timeouts, and a group of agents living in this one process (each
// agent has its own loop thread, pool and sockets, so a group exercises the same
// code paths as separate processes, over real TCP on 127.0.0.1).
//
//   weft::testing::AgentGroup g(3);                       // three agents, ranks 0..2
//   g.agent(1).registry().impl(add, ...);                 // before start
//   g.start();                                            // starts all of them concurrently
//   CHECK(g.agent(0).call(1, add, a, b) ...);
//   // the destructor shuts every agent down (gracefully when possible)
#pragma once

#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rpc/agent.h"
#include "rpc/options.h"
#include "tools/weftrun/free_port.h"

namespace weft::testing {

// A TCP port for a store that rank 0 binds later, drawn below Linux's
// ephemeral range (the local ends of the connections other tests open cannot
// take it) and reserved against every other test and weftrun on this machine
// (tools/weftrun/free_port.h). The reservation is held by this process until
// 64 later ports have been drawn, well past the moment any job binds it.
inline uint16_t freePort() {
  static std::mutex mutex;
  static std::deque<weftrun::PortReservation> held;
  weftrun::PortReservation r = weftrun::reserveFreePort();
  const uint16_t port = r.port();
  std::lock_guard<std::mutex> lock(mutex);
  held.push_back(std::move(r));
  if (held.size() > 64) held.pop_front();
  return port;
}

// Options for rank `rank` of `world` with the store on 127.0.0.1:port and
// timeouts short enough for tests.
inline rpc::Options agentOptions(int rank, int world, uint16_t port) {
  rpc::Options o;
  o.rank = rank;
  o.worldSize = world;
  o.masterAddr = "127.0.0.1";
  o.masterPort = port;
  o.numWorkerThreads = 2;
  o.rpcTimeout = std::chrono::seconds(20);
  o.storeTimeout = std::chrono::seconds(20);
  o.shutdownTimeout = std::chrono::seconds(10);
  o.heartbeatInterval = std::chrono::milliseconds(500);
  return o;
}

class AgentGroup {
 public:
  // configure(rank, options) may adjust each agent's options before construction.
  explicit AgentGroup(int world, std::function<void(int, rpc::Options&)> configure = {}) : port_(freePort()) {
    for (int r = 0; r < world; ++r) {
      rpc::Options o = agentOptions(r, world, port_);
      if (configure) configure(r, o);
      agents_.push_back(std::make_unique<rpc::Agent>(o));
    }
  }
  ~AgentGroup() {
    std::vector<std::thread> threads;
    for (auto& a : agents_) {
      if (a && a->started()) threads.emplace_back([&a] {
          try {
            a->shutdown();
          } catch (...) {
          }
        });
    }
    for (auto& t : threads) t.join();
  }

  rpc::Agent& agent(int rank) { return *agents_.at(rank); }
  int size() const { return static_cast<int>(agents_.size()); }
  uint16_t storePort() const { return port_; }

  // Starts every agent on its own thread and waits; rethrows the first failure.
  void start() {
    for (auto& e : startEach())
      if (e) std::rethrow_exception(e);
  }

  // Starts every agent on its own thread and waits; returns each agent's
  // failure (null where start() succeeded), for tests of start errors.
  std::vector<std::exception_ptr> startEach() {
    std::vector<std::exception_ptr> errors(agents_.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < agents_.size(); ++r) {
      threads.emplace_back([&, r] {
        try {
          agents_[r]->start();
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    return errors;
  }

  // Shuts every agent down concurrently (a graceful shutdown is a barrier, so
  // the agents of one group must enter it together); returns their reports.
  std::vector<rpc::ShutdownReport> shutdownAll(rpc::ShutdownOptions opts = {}) {
    std::vector<rpc::ShutdownReport> reports(agents_.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < agents_.size(); ++r) {
      threads.emplace_back([&, r] { reports[r] = agents_[r]->shutdown(opts); });
    }
    for (auto& t : threads) t.join();
    return reports;
  }

 private:
  uint16_t port_;
  std::vector<std::unique_ptr<rpc::Agent>> agents_;
};

// Polls pred every millisecond until it holds (true) or the timeout passes
// (false, after one last look).
template <class Pred>
bool eventually(Pred&& pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace weft::testing
