// GlooStore: Gloo's rendezvous store interface (gloo::rendezvous::Store) over
// weft's store client, internal to the gloo backend, so that Gloo contexts find each other through the same
// store as the RPC agents. Every key is put under a prefix, one per process
// group, so that groups (and Gloo's own keys, which are just rank numbers)
// never collide.
//
//   rpc::StoreClient& store = agent.store();
//   collectives::GlooStore gs(store, "weft/pg/default/gloo/", std::chrono::seconds(60));
//   auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
//   ctx->connectFullMesh(gs, device);           // Gloo sets/waits/gets "<prefix><rank>"
//
// Errors are weft's (rpc/store.h): TimeoutError naming the keys still missing,
// DisconnectedError when the store is gone; they pass through Gloo unchanged.
// Threads: as StoreClient (any thread but the store's loop thread).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "rpc/store.h"

namespace weft::collectives {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // `store` must outlive this object. `timeout` bounds get() and the wait()
  // Gloo calls without a timeout; zero waits forever.
  GlooStore(rpc::StoreClient& store, std::string prefix, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  const std::string& prefix() const { return prefix_; }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const;

  rpc::StoreClient& store_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace weft::collectives
