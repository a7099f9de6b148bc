// RRef<T>: a reference to a value or object that lives on one worker of the job (its owner),
// usable from every worker.
//
//   #include "rref/rref.h"
//   WEFT_REMOTE_CLASS(ParameterServer, WEFT_CONSTRUCTORS((double)), forward, parameterRRefs);
//
//   weft::RRef<ParameterServer> ps = agent.remote<ParameterServer>("ps", 0.03);   // returns at once
//   weft::Future<Tensor> out = ps.rpcAsync(&ParameterServer::forward, batch);    // runs on "ps"
//   std::vector<weft::RRef<Tensor>> params = ps.rpcSync(&ParameterServer::parameterRRefs);
//   Tensor w = params[0].toHere();                       // a copy, fetched from the owner
//   weft::RRef<Tensor> r = agent.remote("w1", add, a, b);  // the result of a registered function
//   agent.call("w2", train, ps);                          // RRefs travel as arguments and results
//
// Creation. agent.remote<T>(to, args...) builds a remote class (rref/remote_class.h) on `to`
// with the first declared constructor the arguments convert to; agent.remote(to, fn, args...)
// runs a registered function there and keeps its result. Both return at once. Calls, toHere()
// and further remote() on the new reference may follow immediately: the owner queues them until
// the value exists (no extra round trip). If building the value fails, the first use of the
// reference fails with the owner's original error (RemoteError naming the owner and
// "T constructor" or the function).
//
// Use. rpcAsync(&T::method, args...) runs the method on the owner against the live object and
// returns Future<R> (R unwrapped when the method returns Future<R>); rpcSync waits for it;
// remote(&T::method, args...) keeps the method's result on the owner as a new RRef<R>. The
// method must be declared in WEFT_REMOTE_CLASS (InvalidArgumentError otherwise) and the
// arguments must convert to its parameters (checked at compile time). A rpc::CallOptions may come
// first: ps.rpcAsync({.timeout = 2s}, &PS::forward, x). toHere(timeout) returns a copy of the
// value (on the owner itself, the value); localValue() returns the owner's object itself and is
// an InvalidArgumentError anywhere else. Calls run on the owner's handler pool, so calls in
// flight together (an rpcAsync, then another call before it completed) run in no set order, as
// calls of one agent do; wait for a call's future before one that must follow it.
//
// Lifetime. Handles are cheap to copy (shared within a process) and may be sent to any worker
// inside any argument or result, nested in vectors, maps, optionals and WEFT_CODEC_FIELDS
// structs. The owner keeps the value exactly as long as a handle exists on some worker, and
// frees it after the last one is dropped everywhere (the owner/user protocol of
// rpc/protocol.capnp, "Remote references"). confirmedByOwner() is true once the owner has
// registered this worker's handle (at once on the owner and for a handle the owner sent).
//
// Failures. When the owner's process dies or its connection is lost, every handle of its
// references fails: calls, toHere() and remote() on it throw DisconnectedError naming the owner,
// and calls already pending fail the same way (promptly: they do not wait for a timeout). Once
// the job has ended (every worker called shutdown()), a handle may not be used (StateError).
//
// Shutdown. While a worker waits in its graceful Agent::shutdown() for the rest of the job, its
// references work as before: it owns, builds and serves values, and takes and hands out handles
// (a worker that only hosts objects calls shutdown() at once). Once every worker has joined, each
// deletes every handle it holds, and the barrier waits until every fork and delete of the job is
// settled; debugCounts(agent) is then all zero on every worker (tests assert it).
//
// Thread-safety: a handle and its copies may be used from any number of threads at once. Methods
// of one remote object may run concurrently on the owner (rref/remote_class.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "common/error.h"
#include "common/future.h"
#include "rpc/agent.h"
#include "rpc/codec.h"
#include "rref/remote_class.h"

namespace weft {

template <class T>
class RRef;

namespace rref {

class RRefExtension;
struct OwnerRecord;

// One handle as this worker holds it, shared by all copies of an RRef<T>.
struct RRefCore {
  std::shared_ptr<RRefExtension> ctx;
  uint64_t id = 0;
  uint64_t fork = 0;  // this worker's fork; 0 on the owner
  int owner = -1;
  bool isOwner = false;
  std::string typeName;
  std::shared_ptr<OwnerRecord> record;  // on the owner
  std::atomic<bool> confirmed{false};
  std::atomic<bool> unusable{false};  // failed or released (detail::check says why)
  bool released = false;              // under the context's mutex: deleted by shutdown
  Status failure;                     // under the context's mutex: why it failed

  RRefCore() = default;
  RRefCore(const RRefCore&) = delete;
  RRefCore& operator=(const RRefCore&) = delete;
  ~RRefCore();
};

// How many entries the RRef tables of one agent hold (owned values, their forks, live user
// handles, handles waiting for the owner's confirmation, children waiting to be accepted).
// After a graceful shutdown: the counts when the connections closed.
struct DebugCounts {
  size_t owned = 0;
  size_t forks = 0;
  size_t users = 0;
  size_t pendingUsers = 0;
  size_t pendingChildren = 0;
  bool empty() const { return owned == 0 && forks == 0 && users == 0 && pendingUsers == 0 && pendingChildren == 0; }
  std::string toString() const;
};
DebugCounts debugCounts(rpc::Agent& agent);


namespace detail {

// The wire name of T as an RRef's type: a remote class's declared name, else its codec's name.
template <class T>
std::string typeNameOf() {
  if constexpr (RemoteClass<T>) {
    return classInfo<T>().name;
  } else {
    return rpc::Codec<T>::typeName();
  }
}

enum class CreateKind : uint8_t { Constructor = 0, Function = 1, Method = 2 };

// Starts building a value on `to` (rpc/protocol.capnp, weft.rref.create); the arguments are
// written by fill into a list of n values.
std::shared_ptr<RRefCore> create(rpc::Agent& agent, const rpc::WorkerRef& to, const std::string& typeName,
                                 CreateKind kind, const std::string& name, uint64_t index, unsigned n,
                                 const std::function<void(rpc::EncodeContext&, capnp::List<rpc::wire::Value>::Builder)>& fill);

// Throws the error a handle that cannot be used raises (owner gone, agent shut down, empty).
void check(const std::shared_ptr<RRefCore>& core);
rpc::Agent& agentOf(const RRefCore& core);
const std::string& callFunction();
const std::string& fetchFunction();
const std::string& toHereLabel();
uint64_t callFunctionId();
uint64_t fetchFunctionId();
// Writes (rrefId, label) as args[0] of a call to weft.rref.call or weft.rref.fetch.
void writeTarget(rpc::EncodeContext& enc, rpc::wire::Value::Builder out, uint64_t id, const std::string& method);
// The owner's value (waits until it exists); the error it failed with otherwise.
Future<rpc::HeldValue> ownerValue(const RRefCore& core);

// A reference owned by this worker to a value it already has.
std::shared_ptr<RRefCore> makeOwned(rpc::Agent& agent, rpc::HeldValue value);

void encodeRef(const std::shared_ptr<RRefCore>& core, rpc::wire::Value::Builder out, rpc::EncodeContext& enc);
std::shared_ptr<RRefCore> decodeRef(rpc::wire::Value::Reader in, rpc::DecodeContext& dec, const std::string& typeName);

// For tests: called on the thread that drops a user's last handle of reference `id`, after the
// handle left the tables and before its delete goes out (the moment a shutdown may begin on
// another thread). An empty function removes it.
void setReleaseHook(std::function<void(uint64_t id)> hook);

template <class RRefT>
struct Access {
  static const std::shared_ptr<RRefCore>& core(const RRefT& r) { return r.core_; }
  static RRefT make(std::shared_ptr<RRefCore> core) { return RRefT(std::move(core)); }
};

// An argument as the declared parameter type P: itself when it already is one, else converted.
template <class P, class A>
decltype(auto) convertArg(const A& a) {
  if constexpr (std::is_same_v<std::decay_t<P>, A>) {
    return (a);
  } else {
    return std::decay_t<P>(a);
  }
}

template <class... P, class... Args>
void encodeConverted(rpc::EncodeContext& enc, capnp::List<rpc::wire::Value>::Builder out, std::tuple<P...>*,
                     const Args&... args) {
  rpc::encodeArguments(enc, out, convertArg<P>(args)...);
}

}  // namespace detail
}  // namespace rref

template <class T>
class RRef {
 public:
  using ValueType = T;

  // An empty handle: valid() is false and every use is an InvalidArgumentError.
  RRef() = default;

  bool valid() const { return core_ != nullptr; }
  // The owner's rank and name.
  int owner() const { return core().owner; }
  std::string ownerName() const { return rref::detail::agentOf(core()).worker(owner()).name; }
  bool isOwner() const { return core().isOwner; }
  bool confirmedByOwner() const { return core().confirmed.load(); }
  // The reference's id (creating worker's rank in the high 16 bits).
  uint64_t id() const { return core().id; }
  // The agent this handle belongs to (on the owner: the agent serving the value's methods).
  rpc::Agent& agent() const { return rref::detail::agentOf(core()); }

  // A copy of the value, fetched from the owner (waits for it to be built); on the owner, the
  // value itself. timeout: as rpc::CallOptions (unset: the agent's rpcTimeout).
  T toHere(std::optional<std::chrono::milliseconds> timeout = std::nullopt) const {
    return toHereAsync(timeout).get();
  }
  Future<T> toHereAsync(std::optional<std::chrono::milliseconds> timeout = std::nullopt) const {
    static_assert(!rref::detail::RemoteClass<T>, "RRef::toHere: a remote object cannot be copied; call its methods");
    try {
      rref::detail::check(core_);
    } catch (...) {
      return makeErrorFuture<T>(std::current_exception());
    }
    if (core_->isOwner) {
      return rref::detail::ownerValue(*core_).then([](const rpc::HeldValue& h) { return *static_cast<const T*>(h.object.get()); });
    }
    uint64_t id = core_->id;
    return rref::detail::agentOf(*core_).template callWith<T>(
        owner(), rref::detail::fetchFunction(), rref::detail::fetchFunctionId(), rpc::CallOptions{.timeout = timeout},
        [id](rpc::EncodeContext& enc, rpc::wire::Call::Builder call) {
          auto args = call.initArgs(1);
          rref::detail::writeTarget(enc, args[0], id, "");
        },
        &rref::detail::toHereLabel());
  }

  // The owner's object itself (waits until it is built; throws the error building it raised).
  // InvalidArgumentError on any worker but the owner.
  std::shared_ptr<T> localValue() const {
    rref::detail::check(core_);
    WEFT_ENFORCE(core_->isOwner, InvalidArgumentError, "RRef<", core_->typeName,
                 ">::localValue: this worker is not the owner (the owner is ", ownerName(),
                 "); use toHere() or rpcSync()");
    rpc::HeldValue h = rref::detail::ownerValue(*core_).get();
    return std::static_pointer_cast<T>(h.object);
  }

  template <class M, class... Args>
  auto rpcAsync(M method, const Args&... args) const {
    return rpcAsync(rpc::CallOptions{}, method, args...);
  }
  template <class M, class... Args>
  auto rpcAsync(const rpc::CallOptions& opts, M method, const Args&... args) const;
  template <class M, class... Args>
  auto rpcSync(M method, const Args&... args) const {
    return rpcAsync(rpc::CallOptions{}, method, args...).get();
  }
  template <class M, class... Args>
  auto rpcSync(const rpc::CallOptions& opts, M method, const Args&... args) const {
    return rpcAsync(opts, method, args...).get();
  }
  // Runs the method on the owner and keeps its result there.
  template <class M, class... Args>
  auto remote(M method, const Args&... args) const;

 private:
  friend struct rref::detail::Access<RRef<T>>;
  explicit RRef(std::shared_ptr<rref::RRefCore> core) : core_(std::move(core)) {}
  const rref::RRefCore& core() const {
    WEFT_ENFORCE(core_ != nullptr, InvalidArgumentError, "RRef: the handle is empty");
    return *core_;
  }

  std::shared_ptr<rref::RRefCore> core_;
};

// ---- implementation -------------------------------------------------------------

namespace rref::detail {

template <bool SameSize, class Params, class... Args>
struct ArgsConvert {
  static constexpr bool value = false;
};
template <class... P, class... Args>
struct ArgsConvert<true, std::tuple<P...>, Args...> {
  static constexpr bool value = (std::is_convertible_v<const Args&, std::decay_t<P>> && ...);
};

template <class T, class M, class... Args>
void checkMethodCall() {
  static_assert(RemoteClass<T>, "RRef::rpcAsync: T is not declared with WEFT_REMOTE_CLASS");
  using Traits = MethodTraits<M>;
  static_assert(std::is_base_of_v<typename Traits::Class, T>, "RRef::rpcAsync: the method is not a member of T");
  using Params = typename Traits::Parameters;
  static_assert(std::tuple_size_v<Params> == sizeof...(Args), "RRef::rpcAsync: wrong number of arguments for the method");
  static_assert(ArgsConvert<std::tuple_size_v<Params> == sizeof...(Args), Params, Args...>::value,
                "RRef::rpcAsync: an argument does not convert to the method's parameter");
}

}  // namespace rref::detail

template <class T>
template <class M, class... Args>
auto RRef<T>::rpcAsync(const rpc::CallOptions& opts, M method, const Args&... args) const {
  rref::detail::checkMethodCall<T, M, Args...>();
  using R = typename rref::detail::Unwrapped<std::decay_t<typename rref::detail::MethodTraits<M>::Result>>::Type;
  const rref::MethodInfo* info = nullptr;
  try {
    info = &rref::detail::methodOf<T>(method);
    rref::detail::check(core_);
  } catch (...) {
    return makeErrorFuture<R>(std::current_exception());
  }
  uint64_t id = core_->id;
  using Params = typename rref::detail::MethodTraits<M>::Parameters;
  return rref::detail::agentOf(*core_).template callWith<R>(
      owner(), rref::detail::callFunction(), rref::detail::callFunctionId(), opts,
      [&](rpc::EncodeContext& enc, rpc::wire::Call::Builder call) {
        auto list = call.initArgs(2);
        rref::detail::writeTarget(enc, list[0], id, info->name);
        rref::detail::encodeConverted(enc, list[1].initList(sizeof...(Args)), static_cast<Params*>(nullptr), args...);
      },
      &info->qualifiedName);
}

template <class T>
template <class M, class... Args>
auto RRef<T>::remote(M method, const Args&... args) const {
  rref::detail::checkMethodCall<T, M, Args...>();
  using R = typename rref::detail::Unwrapped<std::decay_t<typename rref::detail::MethodTraits<M>::Result>>::Type;
  static_assert(!std::is_void_v<R>, "RRef::remote: the method returns nothing to keep");
  const rref::MethodInfo& info = rref::detail::methodOf<T>(method);
  rref::detail::check(core_);
  using Params = typename rref::detail::MethodTraits<M>::Parameters;
  auto core = rref::detail::create(
      rref::detail::agentOf(*core_), owner(), rref::detail::typeNameOf<R>(), rref::detail::CreateKind::Method,
      info.name, core_->id, sizeof...(Args),
      [&](rpc::EncodeContext& enc, capnp::List<rpc::wire::Value>::Builder out) {
        rref::detail::encodeConverted(enc, out, static_cast<Params*>(nullptr), args...);
      });
  return rref::detail::Access<RRef<R>>::make(std::move(core));
}

namespace rpc {

template <class T, class... Args>
RRef<T> Agent::remote(const WorkerRef& to, const Args&... args) {
  static_assert(rref::detail::RemoteClass<T>, "Agent::remote<T>: T is not declared with WEFT_REMOTE_CLASS");
  using Ctors = typename std::decay_t<decltype(rref::detail::declOf<T>())>::Ctors;
  constexpr int index = rref::detail::PickConstructor<Ctors, Args...>::value;
  static_assert(index >= 0, "Agent::remote<T>: no constructor declared in WEFT_CONSTRUCTORS takes these arguments");
  using Sig = typename rref::detail::ConstructorAt<static_cast<size_t>(index), Ctors>::Type;
  using Params = typename rref::detail::MethodTraits<Sig T::*>::Parameters;
  const auto& info = rref::detail::classInfo<T>();
  auto core = rref::detail::create(*this, to, info.name, rref::detail::CreateKind::Constructor, info.name,
                                   static_cast<uint64_t>(index), sizeof...(Args),
                                   [&](EncodeContext& enc, capnp::List<wire::Value>::Builder out) {
                                     rref::detail::encodeConverted(enc, out, static_cast<Params*>(nullptr), args...);
                                   });
  return rref::detail::Access<RRef<T>>::make(std::move(core));
}

template <class R, class... A>
RRef<R> Agent::remote(const WorkerRef& to, const Function<R(A...)>& fn,
                      std::type_identity_t<const std::decay_t<A>&>... args) {
  static_assert(!std::is_void_v<R>, "Agent::remote: the function returns nothing to keep");
  auto core = rref::detail::create(*this, to, rref::detail::typeNameOf<std::decay_t<R>>(),
                                   rref::detail::CreateKind::Function, fn.name(), 0, sizeof...(A),
                                   [&](EncodeContext& enc, capnp::List<wire::Value>::Builder out) {
                                     encodeArguments(enc, out, args...);
                                   });
  return rref::detail::Access<RRef<std::decay_t<R>>>::make(std::move(core));
}

}  // namespace rpc

// A reference owned by this agent's worker to `value` (a copy of it: for a Tensor, a handle to
// the same storage, so the owner's later in-place updates are what toHere() returns), e.g. a
// module's parameters handed out to a remote optimizer. confirmedByOwner() is true at once.
template <class T>
RRef<T> makeRRef(rpc::Agent& agent, T value) {
  static_assert(!rref::detail::RemoteClass<T>, "makeRRef: build a remote class with Agent::remote<T>");
  auto core = rref::detail::makeOwned(agent, rpc::HeldValue::of<T>(std::move(value)));
  return rref::detail::Access<RRef<T>>::make(std::move(core));
}

namespace rpc {

// RRef<T> on the wire: a Value.rref descriptor (rpc/protocol.capnp, "Remote references").
template <class T>
struct Codec<RRef<T>> {
  static std::string typeName() { return "RRef<" + rref::detail::typeNameOf<T>() + ">"; }
  static void encode(const RRef<T>& v, wire::Value::Builder out, EncodeContext& ctx) {
    rref::detail::encodeRef(rref::detail::Access<RRef<T>>::core(v), out, ctx);
  }
  static RRef<T> decode(wire::Value::Reader in, DecodeContext& ctx) {
    if (in.which() != wire::Value::RREF) throwKindMismatch(typeName(), in);
    return rref::detail::Access<RRef<T>>::make(rref::detail::decodeRef(in, ctx, rref::detail::typeNameOf<T>()));
  }
};

}  // namespace rpc

namespace rref::detail {
// Installs the RRef layer on every Agent a program that includes this header builds.
bool installLayer();
inline const bool kLayerInstalled = installLayer();
}  // namespace rref::detail

}  // namespace weft
