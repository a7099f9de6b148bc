// The RRef layer's protocol: RRefExtension (rref/rref_extension.h) creating, using, forking and
// deleting references, the owner's and the users' bookkeeping, frames that carry references,
// peer failures and the end of the job (rpc/protocol.capnp, "Remote references"). The
// remote-class table is in remote_class.cpp, the entry points of the RRef<T> templates and the
// reference codec in rref_codec.cpp.
//
// Threads: the weft.rref.* handlers, incoming frames, peer failures and shutdown run on the
// agent's loop thread; values are built and methods run on its handler pool; a handle is
// created, sent and released on whichever thread does so. The tables are under mutex_.
#include <atomic>
#include <functional>
#include <mutex>
#include <sstream>

#include "common/logging.h"
#include "rref/rref_extension.h"

namespace weft::rref {

namespace {

// Bookkeeping messages go out even while the shutdown barrier runs, and never time out: only
// the peer's death ends them.
const rpc::CallOptions kControl{.timeout = std::chrono::milliseconds(0), .duringShutdown = true};

std::atomic<bool> gHasReleaseHook{false};
std::mutex gHookMutex;
std::function<void(uint64_t)> gReleaseHook;  // under gHookMutex

void runReleaseHook(uint64_t id) {
  if (!gHasReleaseHook.load(std::memory_order_acquire)) return;
  std::function<void(uint64_t)> hook;
  {
    std::lock_guard<std::mutex> lock(gHookMutex);
    hook = gReleaseHook;
  }
  if (hook) hook(id);
}

}  // namespace

namespace detail {

void setReleaseHook(std::function<void(uint64_t id)> hook) {
  std::lock_guard<std::mutex> lock(gHookMutex);
  gHasReleaseHook.store(static_cast<bool>(hook), std::memory_order_release);
  gReleaseHook = std::move(hook);
}

}  // namespace detail

// ---- handles ------------------------------------------------------------------------------

RRefCore::~RRefCore() {
  if (ctx) ctx->release(*this);
}

std::shared_ptr<RRefCore> RRefExtension::makeCore(uint64_t id, uint64_t fork, int owner, std::string typeName) {
  auto core = std::make_shared<RRefCore>();
  core->ctx = shared_from_this();
  core->id = id;
  core->fork = fork;
  core->owner = owner;
  core->isOwner = owner == self();
  core->typeName = std::move(typeName);
  return core;
}

void RRefExtension::release(RRefCore& core) {
  std::shared_ptr<OwnerRecord> erased;
  bool sendIt = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    if (core.isOwner) {
      if (core.record && !core.released) {
        auto& local = core.record->local;
        local.erase(std::remove(local.begin(), local.end(), &core), local.end());
        erased = core.record;
        maybeErase(core.record);
      }
    } else {
      auto it = users_.find(core.fork);
      if (it != users_.end() && it->second == &core) users_.erase(it);
      sendIt = !core.released && core.failure.ok() && core.fork != 0;
      if (sendIt) ++unsettledDeletes_;
    }
  }
  if (!sendIt) return;
  runReleaseHook(core.id);
  sendDelete(core.id, core.fork, core.owner);
}

void RRefExtension::sendDelete(uint64_t id, uint64_t fork, int owner) {
  auto done = agent_.callWith<void>(owner, kDelete, rpc::nameId(kDelete), kControl,
                                    [&](rpc::EncodeContext& enc, rpc::wire::Call::Builder call) {
                                      rpc::encodeArguments(enc, call.initArgs(1), std::make_tuple(id, fork));
                                    });
  done.onComplete([self = shared_from_this()](const Future<void>&) {
    std::lock_guard<std::mutex> lock(self->mutex_);
    --self->unsettledDeletes_;
  });
}

void RRefExtension::check(const RRefCore& core) {
  WEFT_ENFORCE(!closed_, StateError, "RRef ", idString(core.id), ": the agent that holds it has shut down");
  if (!core.unusable.load()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!core.failure.ok()) throwStatus(core.failure);
  WEFT_ENFORCE(!core.released, StateError, "RRef ", idString(core.id), ": worker '", agent_.name(),
               "' released it when the job ended (every worker called Agent::shutdown())");
}

std::shared_ptr<OwnerRecord> RRefExtension::recordFor(uint64_t id) {
  auto it = owned_.find(id);
  if (it != owned_.end()) return it->second;
  if (creatorOf(id) == self() || deadPeers_.count(creatorOf(id))) return nullptr;
  auto rec = std::make_shared<OwnerRecord>();
  rec->id = id;
  owned_.emplace(id, rec);
  return rec;
}

void RRefExtension::maybeErase(const std::shared_ptr<OwnerRecord>& rec) {
  if (!rec->created || !rec->forks.empty() || !rec->local.empty()) return;
  auto it = owned_.find(rec->id);
  if (it != owned_.end() && it->second == rec) owned_.erase(it);
}

DebugCounts RRefExtension::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (atClose_) return *atClose_;
  DebugCounts c;
  c.owned = owned_.size();
  for (auto& [id, rec] : owned_) c.forks += rec->forks.size();
  c.users = users_.size();
  c.pendingUsers = pendingUsers_.size();
  c.pendingChildren = pendingChildren_.size();
  return c;
}

Status RRefExtension::originError(const std::exception_ptr& e, const std::string& label) const {
  Status s = statusFromException(e);
  return s.hasOrigin() ? s : s.withOrigin(agent_.name(), label);
}

// ---- creating ------------------------------------------------------------------------------

std::shared_ptr<RRefCore> RRefExtension::create(
    const rpc::WorkerRef& to, const std::string& typeName, detail::CreateKind kind, const std::string& name,
    uint64_t index, unsigned n,
    const std::function<void(rpc::EncodeContext&, capnp::List<rpc::wire::Value>::Builder)>& fill) {
  int owner = agent_.rankOf(to);
  uint64_t id = newId();
  bool local = owner == self();
  uint64_t fork = local ? 0 : id;
  auto core = makeCore(id, fork, owner, typeName);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    WEFT_ENFORCE(!shuttingDown_ && !closed_, StateError, "Agent::remote: the job has ended on worker '",
                 agent_.name(), "' (every worker called Agent::shutdown())");
    if (local) {
      auto rec = std::make_shared<OwnerRecord>();
      rec->id = id;
      rec->created = true;
      rec->local.push_back(core.get());
      core->record = rec;
      core->confirmed = true;
      owned_.emplace(id, rec);
    } else {
      if (deadPeers_.count(owner)) {
        core->failure = Status::disconnected("Agent::remote: the owner '" + agent_.worker(owner).name + "' (rank " +
                                             std::to_string(owner) + ") is gone");
        core->unusable = true;
        return core;
      }
      users_[fork] = core.get();
      pendingUsers_[fork] = core;
    }
  }
  auto done = agent_.callWith<void>(
      owner, kCreate, rpc::nameId(kCreate), kControl,
      [&](rpc::EncodeContext& enc, rpc::wire::Call::Builder call) {
        auto args = call.initArgs(2);
        rpc::encodeValue(std::make_tuple(id, fork, static_cast<uint8_t>(kind), name, index), args[0], enc);
        fill(enc, args[1].initList(n));
      });
  done.onComplete([self = shared_from_this(), core, local](const Future<void>& f) {
    Status error = f.hasError() ? f.status() : Status();
    if (local) {
      if (!error.ok()) core->record->promise.trySetError(error);
      return;
    }
    self->confirm(core, error);
  });
  return core;
}

std::shared_ptr<RRefCore> RRefExtension::makeOwned(rpc::HeldValue value) {
  uint64_t id = newId();
  auto core = makeCore(id, 0, self(), value.typeName);
  auto rec = std::make_shared<OwnerRecord>();
  rec->id = id;
  rec->created = true;
  rec->promise.setValue(std::move(value));
  std::lock_guard<std::mutex> lock(mutex_);
  WEFT_ENFORCE(!shuttingDown_ && !closed_, StateError, "makeRRef: the job has ended on worker '", agent_.name(),
               "' (every worker called Agent::shutdown())");
  rec->local.push_back(core.get());
  core->record = rec;
  core->confirmed = true;
  owned_.emplace(id, rec);
  return core;
}

// The owner registered this worker's fork (error: it could not). Loop thread or caller.
void RRefExtension::confirm(const std::shared_ptr<RRefCore>& core, const Status& error) {
  std::shared_ptr<RRefCore> held;
  bool deleteNow = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pendingUsers_.find(core->fork);
    if (it != pendingUsers_.end() && it->second == core) {
      held = std::move(it->second);
      pendingUsers_.erase(it);
    }
    if (!error.ok()) {
      if (core->failure.ok() && !core->released) core->failure = error;
      core->unusable = true;
    } else {
      core->confirmed = true;
      // A handle confirmed after the job ended is deleted now; nothing will use it.
      if (shuttingDown_ && !core->released && core->failure.ok()) {
        core->released = true;
        core->unusable = true;
        deleteNow = true;
        ++unsettledDeletes_;
      }
    }
  }
  if (deleteNow) sendDelete(core->id, core->fork, core->owner);
}

void RRefExtension::build(const std::shared_ptr<OwnerRecord>& rec, Future<rpc::HeldValue> value,
                        const std::string& label) {
  value.onComplete([self = shared_from_this(), rec, label](const Future<rpc::HeldValue>& f) {
    if (f.hasError()) {
      rec->promise.trySetError(self->originError(f.exception(), label));
    } else {
      rec->promise.trySetValue(f.get());
    }
  });
}

Future<rpc::HeldValue> RRefExtension::onCreate(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame) {
  auto args = frame->message().getCall().getArgs();
  rpc::DecodeContext dec(*frame);
  if (args.size() != 2) throw ProtocolError(kCreate + ": expected 2 arguments, got " + std::to_string(args.size()));
  auto [id, fork, kind, name, index] =
      rpc::decodeValue<std::tuple<uint64_t, uint64_t, uint8_t, std::string, uint64_t>>(args[0], dec);
  if (args[1].which() != rpc::wire::Value::LIST) throw ProtocolError(kCreate + ": the arguments are not a list");
  bool fromSelf = ctx.callerRank == self();
  if (id == 0 || creatorOf(id) != ctx.callerRank || fork != (fromSelf ? 0 : id) || kind > 2) {
    throw ProtocolError(kCreate + ": a malformed header from '" + ctx.callerName + "'");
  }
  std::shared_ptr<OwnerRecord> rec;
  std::shared_ptr<OwnerRecord> target;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fromSelf) {
      auto it = owned_.find(id);
      if (it != owned_.end()) rec = it->second;
    } else {
      rec = recordFor(id);
      if (rec && rec->created) throw ProtocolError(kCreate + ": RRef " + idString(id) + " created twice");
      if (rec) {
        rec->created = true;
        rec->forks[fork] = ctx.callerRank;
      }
    }
    if (kind == static_cast<uint8_t>(detail::CreateKind::Method)) target = recordFor(index);
  }
  if (!rec) return makeReadyFuture(rpc::HeldValue::none());  // its creator dropped it already
  // Building runs on the handler pool; the frame stays alive until then.
  auto listOf = [frame] { return frame->message().getCall().getArgs()[1].getList(); };
  switch (static_cast<detail::CreateKind>(kind)) {
    case detail::CreateKind::Constructor: {
      const ClassInfo* cls = findClass(name);
      std::string label = (cls ? cls->name : name) + " constructor";
      if (cls == nullptr || index >= cls->constructors.size()) {
        rec->promise.trySetError(
            Status::notFound(cls == nullptr ? "worker '" + agent_.name() + "' has no remote class '" + name + "'"
                                            : "remote class '" + name + "' has no constructor " + std::to_string(index))
                .withOrigin(agent_.name(), label));
        break;
      }
      Promise<rpc::HeldValue> built;
      build(rec, built.getFuture(), label);
      bool posted = agent_.post([frame, listOf, cls, index, built, rec]() mutable {
        try {
          auto scope = rpc::enterFrameScope(*frame);
          rpc::DecodeContext d(*frame);
          rec->cls = cls;
          built.setValue(cls->constructors[index].construct(listOf(), d));
        } catch (...) {
          built.trySetError(std::current_exception());
        }
      });
      if (!posted) built.trySetError(Status::cancelled("the agent shut down"));
      break;
    }
    case detail::CreateKind::Function: {
      const rpc::detail::Handler* h = agent_.registry().find(rpc::nameId(name));
      if (h == nullptr || h->name != name || !h->run) {
        rec->promise.trySetError(
            Status::notFound("worker '" + agent_.name() + "' has no function '" + name + "'").withOrigin(agent_.name(), name));
        break;
      }
      Promise<rpc::HeldValue> built;
      build(rec, built.getFuture(), h->name);
      rpc::CallContext c = ctx;
      c.function = &h->name;
      bool posted = agent_.post([frame, listOf, h, built, c]() mutable {
        try {
          auto scope = rpc::enterFrameScope(*frame);
          rpc::DecodeContext d(*frame);
          built.setFrom(h->run(c, listOf(), d));
        } catch (...) {
          built.trySetError(std::current_exception());
        }
      });
      if (!posted) built.trySetError(Status::cancelled("the agent shut down"));
      break;
    }
    case detail::CreateKind::Method: {
      if (!target) {
        rec->promise.trySetError(Status::notFound("RRef " + idString(index) + " does not exist on worker '" +
                                                  agent_.name() + "'"));
        break;
      }
      std::string method = name;
      build(rec, whenBuilt(target, name, [frame, listOf, method](const rpc::HeldValue& object, const OwnerRecord& t) {
              const MethodInfo* m = t.cls ? t.cls->findMethod(method) : nullptr;
              WEFT_ENFORCE(m != nullptr, NotFoundError, "'", object.typeName, "' has no remote method '", method, "'");
              auto scope = rpc::enterFrameScope(*frame);
              rpc::DecodeContext d(*frame);
              return m->invoke(object.object, listOf(), d);
            }),
            name);
      break;
    }
  }
  return makeReadyFuture(rpc::HeldValue::none());
}

Future<rpc::HeldValue> RRefExtension::whenBuilt(
    const std::shared_ptr<OwnerRecord>& rec, const std::string& label,
    std::function<Future<rpc::HeldValue>(const rpc::HeldValue& value, const OwnerRecord& rec)> body) {
  Promise<rpc::HeldValue> out;
  rec->value.onComplete([self = shared_from_this(), rec, out, label, body = std::move(body)](
                            const Future<rpc::HeldValue>& f) mutable {
    if (f.hasError()) {
      out.trySetError(f.status());
      return;
    }
    bool posted = self->agent_.post([self, rec, out, label, body, value = f.get()]() mutable {
      try {
        Future<rpc::HeldValue> r = body(value, *rec);
        r.onComplete([self, out, label](const Future<rpc::HeldValue>& g) mutable {
          if (g.hasError()) {
            out.trySetError(self->originError(g.exception(), label));
          } else {
            out.trySetValue(g.get());
          }
        });
      } catch (...) {
        out.trySetError(self->originError(std::current_exception(), label));
      }
    });
    if (!posted) out.trySetError(Status::cancelled("the agent shut down"));
  });
  return out.getFuture();
}

// ---- using ---------------------------------------------------------------------------------

Future<rpc::HeldValue> RRefExtension::onCall(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame) {
  auto args = frame->message().getCall().getArgs();
  rpc::DecodeContext dec(*frame);
  if (args.size() != 2) throw ProtocolError(kCall + ": expected 2 arguments, got " + std::to_string(args.size()));
  auto [id, method] = rpc::decodeValue<std::tuple<uint64_t, std::string>>(args[0], dec);
  if (args[1].which() != rpc::wire::Value::LIST) throw ProtocolError(kCall + ": the arguments are not a list");
  std::shared_ptr<OwnerRecord> rec;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rec = requireRecord(id);
  }
  return whenBuilt(rec, method, [frame, method](const rpc::HeldValue& object, const OwnerRecord& r) {
    const MethodInfo* m = r.cls ? r.cls->findMethod(method) : nullptr;
    WEFT_ENFORCE(m != nullptr, NotFoundError, "'", object.typeName, "' has no remote method '", method, "'");
    auto scope = rpc::enterFrameScope(*frame);
    rpc::DecodeContext d(*frame);
    return m->invoke(object.object, frame->message().getCall().getArgs()[1].getList(), d);
  });
}

Future<rpc::HeldValue> RRefExtension::onFetch(const rpc::CallContext&, std::shared_ptr<rpc::IncomingFrame> frame) {
  auto args = frame->message().getCall().getArgs();
  rpc::DecodeContext dec(*frame);
  if (args.size() != 1) throw ProtocolError(kFetch + ": expected 1 argument, got " + std::to_string(args.size()));
  auto [id, unused] = rpc::decodeValue<std::tuple<uint64_t, std::string>>(args[0], dec);
  std::shared_ptr<OwnerRecord> rec;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rec = requireRecord(id);
  }
  // The reply encodes the value; a tensor's bytes are written from its own storage.
  return rec->value;
}

// ---- forks ---------------------------------------------------------------------------------

Future<rpc::HeldValue> RRefExtension::onFork(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame) {
  auto args = frame->message().getCall().getArgs();
  rpc::DecodeContext dec(*frame);
  auto [forkArgs] = rpc::decodeArguments<std::tuple<uint64_t, uint64_t>>(kFork, args, dec);
  auto [id, fork] = forkArgs;
  std::lock_guard<std::mutex> lock(mutex_);
  auto rec = requireRecord(id);
  if (fork == 0 || !rec->forks.emplace(fork, ctx.callerRank).second) {
    throw ProtocolError(kFork + ": fork " + idString(fork) + " of RRef " + idString(id) + " registered twice");
  }
  return makeReadyFuture(rpc::HeldValue::none());
}

Future<rpc::HeldValue> RRefExtension::onAccept(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame) {
  auto args = frame->message().getCall().getArgs();
  rpc::DecodeContext dec(*frame);
  auto [fork] = rpc::decodeArguments<uint64_t>(kAccept, args, dec);
  std::shared_ptr<RRefCore> parent;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pendingChildren_.find(fork);
    if (it != pendingChildren_.end() && it->second.dest == ctx.callerRank) {
      parent = std::move(it->second.parent);
      pendingChildren_.erase(it);
    }
  }
  return makeReadyFuture(rpc::HeldValue::none());  // `parent` is dropped outside the lock
}

Future<rpc::HeldValue> RRefExtension::onDelete(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame) {
  auto args = frame->message().getCall().getArgs();
  rpc::DecodeContext dec(*frame);
  auto [pair] = rpc::decodeArguments<std::tuple<uint64_t, uint64_t>>(kDelete, args, dec);
  auto [id, fork] = pair;
  std::shared_ptr<OwnerRecord> rec;  // the value is freed outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = owned_.find(id);
    if (it == owned_.end()) return makeReadyFuture(rpc::HeldValue::none());
    rec = it->second;
    auto f = rec->forks.find(fork);
    if (f == rec->forks.end() || f->second != ctx.callerRank) {
      WEFT_LOG(Debug) << "rref: '" << ctx.callerName << "' deleted fork " << idString(fork) << " of RRef "
                      << idString(id) << ", which it does not hold";
      return makeReadyFuture(rpc::HeldValue::none());
    }
    rec->forks.erase(f);
    maybeErase(rec);
  }
  return makeReadyFuture(rpc::HeldValue::none());
}

void RRefExtension::encodeRef(const std::shared_ptr<RRefCore>& core, rpc::wire::Value::Builder out,
                            rpc::EncodeContext& enc) {
  WEFT_ENFORCE(core != nullptr, InvalidArgumentError, "RRef: an empty handle cannot be sent");
  WEFT_ENFORCE(enc.agent() == &agent_, InvalidArgumentError, "RRef ", idString(core->id),
               ": sent outside a call of the agent that holds it");
  check(*core);
  int dest = enc.peerRank();
  uint64_t fork = 0;
  if (dest != core->owner) {
    fork = newId();
    std::lock_guard<std::mutex> lock(mutex_);
    if (core->isOwner) {
      core->record->forks[fork] = dest;
      enc.onDiscard([self = shared_from_this(), rec = core->record, fork] {
        std::lock_guard<std::mutex> l(self->mutex_);
        rec->forks.erase(fork);
        self->maybeErase(rec);
      });
    } else {
      pendingChildren_[fork] = Child{core, dest};
      enc.onDiscard([self = shared_from_this(), fork] {
        std::shared_ptr<RRefCore> parent;
        std::lock_guard<std::mutex> l(self->mutex_);
        auto it = self->pendingChildren_.find(fork);
        if (it == self->pendingChildren_.end()) return;
        parent = std::move(it->second.parent);
        self->pendingChildren_.erase(it);
        // `parent` outlives the lock: it is declared before it.
      });
    }
  }
  auto d = out.initRref();
  d.setRrefId(core->id);
  d.setForkId(fork);
  d.setOwner(static_cast<uint32_t>(core->owner));
  d.setParent(static_cast<uint32_t>(self()));
  d.setTypeName(core->typeName);
  enc.markHasRRefs();
}

// ---- frames that carry references -----------------------------------------------------------

void RRefExtension::onIncomingFrame(int peer, rpc::IncomingFrame& frame) {
  auto inbox = std::make_shared<RRefInbox>();
  auto msg = frame.message();
  uint32_t maxDepth = frame.maxNesting() + 2;
  if (msg.which() == rpc::wire::Message::CALL) {
    for (auto v : msg.getCall().getArgs()) scan(peer, v, *inbox, 1, maxDepth);
  } else if (msg.which() == rpc::wire::Message::RESPONSE && msg.getResponse().which() == rpc::wire::Response::VALUE) {
    scan(peer, msg.getResponse().getValue(), *inbox, 1, maxDepth);
  }
  frame.attach(std::move(inbox));
}

void RRefExtension::scan(int peer, rpc::wire::Value::Reader v, RRefInbox& inbox, uint32_t depth, uint32_t maxDepth) {
  if (depth > maxDepth) throw ProtocolError("rref: values nested deeper than " + std::to_string(maxDepth));
  switch (v.which()) {
    case rpc::wire::Value::RREF:
      adopt(peer, v.getRref(), inbox);
      return;
    case rpc::wire::Value::LIST:
      for (auto e : v.getList()) scan(peer, e, inbox, depth + 1, maxDepth);
      return;
    case rpc::wire::Value::TUPLE:
      for (auto e : v.getTuple()) scan(peer, e, inbox, depth + 1, maxDepth);
      return;
    case rpc::wire::Value::MAP:
      for (auto e : v.getMap()) {
        scan(peer, e.getKey(), inbox, depth + 1, maxDepth);
        scan(peer, e.getValue(), inbox, depth + 1, maxDepth);
      }
      return;
    case rpc::wire::Value::RECORD:
      for (auto e : v.getRecord().getFields()) scan(peer, e, inbox, depth + 1, maxDepth);
      return;
    default:
      return;
  }
}

void RRefExtension::adopt(int peer, rpc::wire::RRefDesc::Reader d, RRefInbox& inbox) {
  uint64_t id = d.getRrefId();
  uint64_t fork = d.getForkId();
  int owner = static_cast<int>(d.getOwner());
  int parent = static_cast<int>(d.getParent());
  int world = agent_.worldSize();
  if (id == 0 || owner >= world || creatorOf(id) >= world || parent != peer || (owner == self()) != (fork == 0) ||
      (fork != 0 && creatorOf(fork) != peer)) {
    throw ProtocolError("rref: a malformed reference " + idString(id) + " from rank " + std::to_string(peer));
  }
  auto key = std::make_pair(id, fork);
  if (inbox.cores.count(key)) {
    if (fork != 0) throw ProtocolError("rref: fork " + idString(fork) + " sent twice in one frame");
    return;
  }
  auto core = makeCore(id, fork, owner, d.getTypeName().cStr());
  bool askOwner = false;
  bool deleteNow = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shuttingDown_) {
      // Nothing may use a handle once the job has ended: give it back at once (an unconfirmed one
      // is given back when the owner confirms it, below).
      core->released = true;
      core->unusable = true;
    }
    if (owner == self()) {
      auto rec = recordFor(id);
      if (rec) {
        if (!core->released) rec->local.push_back(core.get());
        core->record = rec;
        core->confirmed = true;
      } else {
        core->failure = Status::notFound("RRef " + idString(id) + " no longer exists on its owner '" + agent_.name() + "'");
        core->unusable = true;
      }
    } else if (deadPeers_.count(owner)) {
      core->failure = Status::disconnected("RRef " + idString(id) + ": its owner (rank " + std::to_string(owner) +
                                           ") is gone");
      core->unusable = true;
    } else {
      if (users_.count(fork)) throw ProtocolError("rref: fork " + idString(fork) + " received twice");
      users_[fork] = core.get();
      if (parent == owner) {
        core->confirmed = true;
        deleteNow = core->released;
        if (deleteNow) ++unsettledDeletes_;
      } else {
        // Given back when the owner confirms it (confirm()), never before (G1).
        core->released = false;
        core->unusable = false;
        pendingUsers_[fork] = core;
        askOwner = true;
      }
    }
  }
  inbox.cores.emplace(key, core);
  if (deleteNow) sendDelete(id, fork, owner);
  if (!askOwner) return;
  // Register the fork at the owner, then tell the parent it may drop the handle it kept for us.
  auto f = agent_.callWith<void>(owner, kFork, rpc::nameId(kFork), kControl,
                                 [&](rpc::EncodeContext& enc, rpc::wire::Call::Builder call) {
                                   rpc::encodeArguments(enc, call.initArgs(1), std::make_tuple(id, fork));
                                 });
  f.onComplete([self = shared_from_this(), core, parent](const Future<void>& r) {
    self->confirm(core, r.hasError() ? r.status() : Status());
    if (parent == self->self()) {
      std::shared_ptr<RRefCore> kept;
      std::lock_guard<std::mutex> lock(self->mutex_);
      auto it = self->pendingChildren_.find(core->fork);
      if (it != self->pendingChildren_.end()) {
        kept = std::move(it->second.parent);
        self->pendingChildren_.erase(it);
      }
      return;
    }
    uint64_t child = core->fork;
    self->agent_.callWith<void>(parent, kAccept, rpc::nameId(kAccept), kControl,
                                [&](rpc::EncodeContext& enc, rpc::wire::Call::Builder call) {
                                  rpc::encodeArguments(enc, call.initArgs(1), child);
                                });
  });
}

// ---- failures and shutdown ----------------------------------------------------------------

void RRefExtension::onPeerFailed(int rank, const Status& why) {
  std::vector<std::shared_ptr<RRefCore>> dropped;
  std::vector<std::shared_ptr<OwnerRecord>> records;
  std::vector<std::shared_ptr<OwnerRecord>> orphans;
  std::string name = agent_.worker(rank).name;
  Status gone = Status::disconnected("RRef owner '" + name + "' (rank " + std::to_string(rank) + ") is gone: " +
                                     why.message());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    deadPeers_.insert(rank);
    for (auto& [id, rec] : owned_) {
      for (auto it = rec->forks.begin(); it != rec->forks.end();) {
        it = it->second == rank ? rec->forks.erase(it) : std::next(it);
      }
      if (!rec->created && creatorOf(id) == rank) {
        rec->created = true;
        orphans.push_back(rec);
      }
      records.push_back(rec);
    }
    for (auto& rec : records) maybeErase(rec);
    for (auto it = users_.begin(); it != users_.end();) {
      RRefCore* core = it->second;
      if (core->owner == rank) {
        if (core->failure.ok()) core->failure = gone;
        core->unusable = true;
        it = users_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = pendingUsers_.begin(); it != pendingUsers_.end();) {
      if (it->second->owner == rank) {
        dropped.push_back(std::move(it->second));
        it = pendingUsers_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = pendingChildren_.begin(); it != pendingChildren_.end();) {
      if (it->second.dest == rank || it->second.parent->owner == rank) {
        dropped.push_back(std::move(it->second.parent));
        it = pendingChildren_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& rec : orphans) {
    rec->promise.trySetError(Status::disconnected("RRef " + idString(rec->id) + ": its creator '" + name + "' (rank " +
                                                  std::to_string(rank) + ") died before creating it"));
  }
}

void RRefExtension::onShutdownBegin() {
  std::vector<std::tuple<uint64_t, uint64_t, int>> deletes;
  std::vector<std::shared_ptr<OwnerRecord>> records;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shuttingDown_ = true;
    for (auto& [fork, core] : users_) {
      if (core->released || !core->failure.ok() || !core->confirmed) continue;
      core->released = true;
      core->unusable = true;
      deletes.emplace_back(core->id, core->fork, core->owner);
      ++unsettledDeletes_;
    }
    for (auto& [id, rec] : owned_) {
      for (RRefCore* core : rec->local) {
        core->released = true;
        core->unusable = true;
      }
      rec->local.clear();
      records.push_back(rec);
    }
    for (auto& rec : records) maybeErase(rec);
  }
  for (auto& [id, fork, owner] : deletes) sendDelete(id, fork, owner);
}

void RRefExtension::onClosed() {
  std::unordered_map<uint64_t, std::shared_ptr<OwnerRecord>> owned;
  std::unordered_map<uint64_t, std::shared_ptr<RRefCore>> pendingUsers;
  std::unordered_map<uint64_t, Child> pendingChildren;
  DebugCounts left = counts();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_.exchange(true)) return;
    atClose_ = left;
    for (auto& [fork, core] : users_) core->unusable = true;
    for (auto& [id, rec] : owned_) {
      for (RRefCore* core : rec->local) core->unusable = true;
    }
    owned.swap(owned_);
    users_.clear();
    pendingUsers.swap(pendingUsers_);
    pendingChildren.swap(pendingChildren_);
  }
  if (!left.empty() && shuttingDown_) {
    WEFT_LOG(Warn) << "rref: worker '" << agent_.name() << "' closed with RRef state left: " << left.toString();
  }
}

// ---- registration ---------------------------------------------------------------------------

void RRefExtension::registerFunctions() {
  auto& reg = agent_.registry();
  auto bind = [&](const std::string& name, auto method) {
    reg.implOnLoop(name, [this, method](const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame) {
      return (this->*method)(ctx, std::move(frame));
    });
  };
  bind(kCreate, &RRefExtension::onCreate);
  bind(kCall, &RRefExtension::onCall);
  bind(kFetch, &RRefExtension::onFetch);
  bind(kFork, &RRefExtension::onFork);
  bind(kAccept, &RRefExtension::onAccept);
  bind(kDelete, &RRefExtension::onDelete);
}

std::string DebugCounts::toString() const {
  std::ostringstream os;
  os << "owned " << owned << ", forks " << forks << ", users " << users << ", pending users " << pendingUsers
     << ", pending children " << pendingChildren;
  return os.str();
}

DebugCounts debugCounts(rpc::Agent& agent) { return agent.extension<RRefExtension>().counts(); }

namespace detail {

bool installLayer() {
  return rpc::Agent::installExtension(typeTag<RRefExtension>(), [](rpc::Agent& agent) -> std::shared_ptr<rpc::AgentExtension> {
    auto ctx = std::make_shared<RRefExtension>(agent);
    ctx->registerFunctions();
    return ctx;
  });
}

}  // namespace detail
}  // namespace weft::rref
