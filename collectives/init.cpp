#include "collectives/init.h"

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/gloo/detail/group.h"
#include "common/error.h"
#include "common/future.h"
#include "common/logging.h"
#include "rpc/agent.h"
#include "rpc/store.h"

namespace weft::collectives {

namespace {

// The key a rank sets in the store when its group ends (see "The store" in the header).
std::string leftKey(int rank) { return "weft/init/left/" + std::to_string(rank); }

std::string rankList(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

// The store init(opt) builds: rank 0's server and every rank's client. See
// "The store" in the header for how the ranks leave.
class OwnedStore {
 public:
  explicit OwnedStore(const rpc::Options& opt) : rank_(opt.rank), world_(opt.worldSize), linger_(opt.shutdownTimeout) {
    if (opt.rank == 0) server_ = std::make_unique<rpc::StoreServer>(rpc::StoreServer::configFor(opt));
    rpc::StoreClient::Config cc = rpc::StoreClient::configFor(opt);
    if (server_ && opt.masterPort == 0) cc.port = server_->port();
    client_ = std::make_unique<rpc::StoreClient>(cc);
  }
  ~OwnedStore() {
    if (server_) {
      serveUntilLeft();
    } else {
      leave();
    }
    client_.reset();
  }
  OwnedStore(const OwnedStore&) = delete;
  OwnedStore& operator=(const OwnedStore&) = delete;

  rpc::StoreClient& client() { return *client_; }

 private:
  // A rank other than 0 says it leaves, for at most linger_ (rank 0 may be stalled or gone).
  void leave() {
    try {
      Future<void> done = client_->setAsync(leftKey(rank_), "1");
      if (!done.waitFor(linger_)) {
        WEFT_LOG(Warn) << "collectives::init: rank " << rank_ << " could not tell rank 0 it leaves within "
                       << linger_.count() << " ms (rpc::Options::shutdownTimeout); closing anyway";
        return;
      }
      done.get();
    } catch (const std::exception& e) {
      WEFT_LOG(Info) << "collectives::init: rank " << rank_ << " leaves without telling rank 0: " << e.what();
    }
  }

  // Rank 0 serves until no other process is connected, or linger_ has passed, then names the ranks
  // that did not leave: those whose connection is gone died (or lost the store), the others are
  // still there.
  void serveUntilLeft() {
    if (world_ == 1) return;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + linger_;
    size_t others = 0;
    for (;;) {
      try {
        const size_t all = server_->stats().connections;
        const size_t own = client_->connected() ? 1 : 0;
        others = all > own ? all - own : 0;
      } catch (const std::exception&) {
        others = 0;
      }
      if (others == 0 || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::vector<int> notLeft;
    for (int r = 1; r < world_; ++r) {
      try {
        if (!client_->check({leftKey(r)})) notLeft.push_back(r);
      } catch (const std::exception&) {
        notLeft.push_back(r);
      }
    }
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    if (others > 0) {
      const std::string who = notLeft.empty() ? std::string("every rank had left")
                                              : "ranks " + rankList(notLeft) +
                                                    " have not left the group (stalled, still working, or gone "
                                                    "without leaving)";
      WEFT_LOG(Warn) << "collectives::init: rank 0 closes the store after waiting " << waited << " ms with " << others
                     << " other process(es) still connected (rpc::Options::shutdownTimeout, WEFT_SHUTDOWN_TIMEOUT); "
                     << who;
    } else if (!notLeft.empty()) {
      WEFT_LOG(Warn) << "collectives::init: ranks " << rankList(notLeft)
                     << " ended without leaving the group (the process died or lost its connection to the store); "
                        "rank 0 closes the store after "
                     << waited << " ms";
    }
  }

  int rank_;
  int world_;
  std::chrono::milliseconds linger_;
  std::unique_ptr<rpc::StoreServer> server_;
  std::unique_ptr<rpc::StoreClient> client_;
};

}  // namespace

std::unique_ptr<ProcessGroup> init() { return init(rpc::Options::fromEnv()); }

std::unique_ptr<ProcessGroup> init(const rpc::Options& opt, GlooOptions options) {
  opt.validate();
  if (options.hostname.empty()) options.hostname = opt.localAddress();
  auto store = std::make_shared<OwnedStore>(opt);
  auto group = ProcessGroupGloo::create(store->client(), opt.rank, opt.worldSize, std::move(options));
  group->keepAlive(std::move(store));
  return group;
}

std::unique_ptr<ProcessGroup> init(rpc::Agent& agent, GlooOptions options) {
  WEFT_ENFORCE(agent.started(), StateError, "collectives::init: the agent of worker '", agent.name(),
               "' is not started; call agent.start() first (the group joins through the agent's store)");
  if (options.hostname.empty()) options.hostname = agent.options().localAddress();
  return createGlooGroup(agent.store(), agent.rank(), agent.worldSize(), std::move(options));
}

}  // namespace weft::collectives
