#include "collectives/init.h"

#include <chrono>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/logging.h"
#include "rpc/agent.h"
#include "rpc/store.h"

namespace weft::collectives {

namespace {

// The store init(opt) builds: rank 0's server and every rank's client. See
// "The store" in the header for how rank 0 leaves.
class OwnedStore {
 public:
  explicit OwnedStore(const rpc::Options& opt) : linger_(opt.shutdownTimeout) {
    if (opt.rank == 0) server_ = std::make_unique<rpc::StoreServer>(rpc::StoreServer::configFor(opt));
    rpc::StoreClient::Config cc = rpc::StoreClient::configFor(opt);
    if (server_ && opt.masterPort == 0) cc.port = server_->port();
    client_ = std::make_unique<rpc::StoreClient>(cc);
  }
  ~OwnedStore() {
    client_.reset();
    if (!server_) return;
    const auto deadline = std::chrono::steady_clock::now() + linger_;
    size_t left = 0;
    for (;;) {
      try {
        left = server_->stats().connections;
      } catch (const std::exception&) {
        left = 0;
      }
      if (left == 0 || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (left > 0) {
      WEFT_LOG(Warn) << "collectives::init: rank 0 closes the store with " << left
                     << " other process(es) still connected after waiting " << linger_.count()
                     << " ms (rpc::Options::shutdownTimeout)";
    }
  }
  OwnedStore(const OwnedStore&) = delete;
  OwnedStore& operator=(const OwnedStore&) = delete;

  rpc::StoreClient& client() { return *client_; }

 private:
  std::chrono::milliseconds linger_;
  std::unique_ptr<rpc::StoreServer> server_;
  std::unique_ptr<rpc::StoreClient> client_;
};

}  // namespace

std::unique_ptr<ProcessGroupGloo> init() { return init(rpc::Options::fromEnv()); }

std::unique_ptr<ProcessGroupGloo> init(const rpc::Options& opt, ProcessGroupGloo::Options options) {
  opt.validate();
  if (options.hostname.empty()) options.hostname = opt.localAddress();
  auto store = std::make_shared<OwnedStore>(opt);
  auto group = ProcessGroupGloo::create(store->client(), opt.rank, opt.worldSize, std::move(options));
  group->keepAlive(std::move(store));
  return group;
}

std::unique_ptr<ProcessGroupGloo> init(rpc::Agent& agent, ProcessGroupGloo::Options options) {
  WEFT_ENFORCE(agent.started(), StateError, "collectives::init: the agent of worker '", agent.name(),
               "' is not started; call agent.start() first (the group joins through the agent's store)");
  if (options.hostname.empty()) options.hostname = agent.options().localAddress();
  return ProcessGroupGloo::create(agent.store(), agent.rank(), agent.worldSize(), std::move(options));
}

}  // namespace weft::collectives
