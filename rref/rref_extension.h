// The RRef layer's state on one agent, internal to rref/ (rref.cpp runs its protocol,
// rref_codec.cpp reaches it from the RRef<T> templates of rref/rref.h); not part of the public API.
//
// RRefExtension is the agent extension behind every RRef of one agent: the values this worker owns
// (OwnerRecord, with the forks other workers hold), its user handles, the handles waiting for the
// owner's confirmation and the children waiting to be accepted (the owner/user protocol of
// rpc/protocol.capnp, "Remote references"). Every table is guarded by mutex_; its functions run
// on the loop thread (incoming frames, the weft.rref.* handlers, peer failures, shutdown), on the
// handler pool (building values) and on any thread that creates, sends or drops a handle.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "rref/rref.h"

namespace weft::rref {

// The functions of the protocol (rpc/protocol.capnp, "Remote references").
inline const std::string kCreate = "weft.rref.create";
inline const std::string kCall = "weft.rref.call";
inline const std::string kFetch = "weft.rref.fetch";
inline const std::string kFork = "weft.rref.fork";
inline const std::string kAccept = "weft.rref.accept";
inline const std::string kDelete = "weft.rref.delete";
inline const std::string kToHere = "RRef::toHere";

// An RRef or fork id: the creating rank above kRankBits, a per-agent counter below.
inline constexpr int kRankBits = 48;

inline int creatorOf(uint64_t id) { return static_cast<int>(id >> kRankBits); }

inline std::string idString(uint64_t id) {
  return std::to_string(creatorOf(id)) + ":" + std::to_string(id & ((uint64_t{1} << kRankBits) - 1));
}

// ---- the owner's side of one reference ---------------------------------------------------

struct OwnerRecord {
  uint64_t id = 0;
  Promise<rpc::HeldValue> promise;
  Future<rpc::HeldValue> value = promise.getFuture();
  bool created = false;  // the create arrived (or this worker is building it); false: a placeholder
  const ClassInfo* cls = nullptr;                // set when a remote object is built
  std::unordered_map<uint64_t, int> forks;      // fork id -> the rank holding it
  std::vector<RRefCore*> local;                 // handles on this worker
};

// ---- the layer's per-agent state ---------------------------------------------------------

// The handles one frame carries, taken over when it arrives; decoding picks them up.
struct RRefInbox {
  std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<RRefCore>> cores;
};

class RRefExtension final : public rpc::AgentExtension, public std::enable_shared_from_this<RRefExtension> {
 public:
  explicit RRefExtension(rpc::Agent& agent) : agent_(agent) {}

  void registerFunctions();

  void onIncomingFrame(int peer, rpc::IncomingFrame& frame) override;
  void onPeerFailed(int rank, const Status& why) override;
  void onShutdownBegin() override;
  // A fork request, accept or delete is outstanding: the shutdown barrier waits.
  bool busy() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return !pendingUsers_.empty() || !pendingChildren_.empty() || unsettledDeletes_ != 0;
  }
  void onClosed() override;

  rpc::Agent& agent() { return agent_; }
  rpc::Agent& agentWhileOpen(const RRefCore& core) {
    WEFT_ENFORCE(!closed_, StateError, "RRef ", idString(core.id), ": the agent that holds it has shut down");
    return agent_;
  }
  int self() const { return agent_.rank(); }
  uint64_t newId() {
    return (static_cast<uint64_t>(agent_.rank()) << kRankBits) | counter_.fetch_add(1, std::memory_order_relaxed);
  }

  std::shared_ptr<RRefCore> create(const rpc::WorkerRef& to, const std::string& typeName, detail::CreateKind kind,
                                   const std::string& name, uint64_t index, unsigned n,
                                   const std::function<void(rpc::EncodeContext&, capnp::List<rpc::wire::Value>::Builder)>& fill);
  std::shared_ptr<RRefCore> makeOwned(rpc::HeldValue value);
  void release(RRefCore& core);
  void check(const RRefCore& core);
  void encodeRef(const std::shared_ptr<RRefCore>& core, rpc::wire::Value::Builder out, rpc::EncodeContext& enc);
  DebugCounts counts() const;

  mutable std::mutex mutex_;

 private:
  std::shared_ptr<RRefCore> makeCore(uint64_t id, uint64_t fork, int owner, std::string typeName);
  // The record of an id this worker owns; a placeholder when another worker created it and its
  // create has not arrived yet; null when this worker created it and it is gone. Under mutex_.
  std::shared_ptr<OwnerRecord> recordFor(uint64_t id);
  // recordFor for a use sent by a holder (a call, a fetch, a fork): NotFoundError, which the
  // caller receives, when the value is gone. Under mutex_.
  std::shared_ptr<OwnerRecord> requireRecord(uint64_t id) {
    auto rec = recordFor(id);
    WEFT_ENFORCE(rec != nullptr, NotFoundError, "RRef ", idString(id), " does not exist on worker '", agent_.name(), "'");
    return rec;
  }
  // Drops the record from the table when nothing holds it any more. Under mutex_.
  void maybeErase(const std::shared_ptr<OwnerRecord>& rec);
  void confirm(const std::shared_ptr<RRefCore>& core, const Status& error);
  // Sends the delete of a fork whose handle left the tables; the caller counted it in
  // unsettledDeletes_ under mutex_, in the same step that decided the delete, and the count
  // drops when the owner has answered (or the call failed).
  void sendDelete(uint64_t id, uint64_t fork, int owner);

  Future<rpc::HeldValue> onCreate(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame);
  Future<rpc::HeldValue> onCall(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame);
  Future<rpc::HeldValue> onFetch(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame);
  Future<rpc::HeldValue> onFork(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame);
  Future<rpc::HeldValue> onAccept(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame);
  Future<rpc::HeldValue> onDelete(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame);
  // Runs `body` on the handler pool once rec's value exists; its errors carry the owner and label.
  Future<rpc::HeldValue> whenBuilt(
      const std::shared_ptr<OwnerRecord>& rec, const std::string& label,
      std::function<Future<rpc::HeldValue>(const rpc::HeldValue& value, const OwnerRecord& rec)> body);
  void build(const std::shared_ptr<OwnerRecord>& rec, Future<rpc::HeldValue> value, const std::string& label);
  void scan(int peer, rpc::wire::Value::Reader v, RRefInbox& inbox, uint32_t depth, uint32_t maxDepth);
  void adopt(int peer, rpc::wire::RRefDesc::Reader d, RRefInbox& inbox);
  Status originError(const std::exception_ptr& e, const std::string& label) const;

  rpc::Agent& agent_;
  std::atomic<uint64_t> counter_{1};
  std::atomic<bool> closed_{false};
  bool shuttingDown_ = false;                                               // under mutex_
  // Deletes decided (their handle gone from users_) and not yet answered by the owner, including
  // those not yet handed to the agent: the layer is busy until they settle.
  size_t unsettledDeletes_ = 0;                                             // under mutex_
  std::unordered_map<uint64_t, std::shared_ptr<OwnerRecord>> owned_;        // under mutex_
  std::unordered_map<uint64_t, RRefCore*> users_;                           // fork -> live handle
  std::unordered_map<uint64_t, std::shared_ptr<RRefCore>> pendingUsers_;   // not yet confirmed
  struct Child {
    std::shared_ptr<RRefCore> parent;  // kept alive until the child is accepted (G2)
    int dest = -1;
  };
  std::unordered_map<uint64_t, Child> pendingChildren_;  // child fork -> its parent handle
  std::set<int> deadPeers_;
  std::optional<DebugCounts> atClose_;
};

}  // namespace weft::rref
