// Ranks as threads of one process: a store and one ProcessGroupGloo per rank (real TCP on
// 127.0.0.1), for unit tests of collective wrappers (ZeRO, sharded data parallel).
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "collectives/gloo/detail/group.h"
#include "rpc/store.h"

namespace weft::testing {

// A store and `world` groups, one per rank, built concurrently (the constructor is collective).
class Ranks {
 public:
  explicit Ranks(int world, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    server_ = std::make_unique<rpc::StoreServer>(rpc::StoreServer::Config{});
    for (int r = 0; r < world; ++r) {
      rpc::StoreClient::Config cc;
      cc.port = server_->port();
      cc.timeout = std::chrono::seconds(10);
      clients_.push_back(std::make_unique<rpc::StoreClient>(cc));
    }
    std::vector<std::future<std::unique_ptr<collectives::ProcessGroupGloo>>> made;
    for (int r = 0; r < world; ++r) {
      made.push_back(std::async(std::launch::async, [this, r, world, timeout] {
        return collectives::ProcessGroupGloo::create(*clients_[static_cast<size_t>(r)], r, world, {.timeout = timeout});
      }));
    }
    for (auto& f : made) groups_.push_back(f.get());
  }
  collectives::ProcessGroupGloo& operator[](int r) { return *groups_.at(static_cast<size_t>(r)); }
  int size() const { return static_cast<int>(groups_.size()); }

  // Runs fn(rank) on one thread per rank and waits for all; rethrows the first failure.
  void onEachRank(const std::function<void(int)>& fn) {
    std::vector<std::future<void>> running;
    for (int r = 0; r < size(); ++r) running.push_back(std::async(std::launch::async, [&fn, r] { fn(r); }));
    for (auto& f : running) f.get();
  }

 private:
  std::unique_ptr<rpc::StoreServer> server_;
  std::vector<std::unique_ptr<rpc::StoreClient>> clients_;  // outlive the groups
  std::vector<std::unique_ptr<collectives::ProcessGroupGloo>> groups_;
};

}  // namespace weft::testing
