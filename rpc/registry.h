// Registry: the functions one Agent serves, bound to their declarations.
//
//   weft::rpc::Agent agent(opt);
//   agent.registry().impl(add, [](Tensor a, Tensor b) { return a + b; });
//   agent.registry().impl(fetch, [&](int64_t id) -> weft::Future<Tensor> {   // answers later
//     return agent.callAsync("store", lookup, id);                               // a nested call
//   });
//   agent.registry().impl(whoami, [](const weft::rpc::CallContext& ctx) { return ctx.callerName; });
//   agent.start();                                  // the registry is frozen from here on
//
// A body is any callable taking the function's parameters (by value or const&),
// optionally preceded by `const rpc::CallContext&`, and returning the declared
// result R, or Future<R>: then the reply is sent when that future completes, and
// the pool thread that ran the body is free at once. This is how a handler makes
// nested calls without blocking a thread: how deep calls nest is not bounded
// by the size of the pool. A body returning the wrong type does not compile.
//
// Bodies run on the agent's handler pool (Options::numWorkerThreads threads),
// several at a time: a body that touches shared state locks it. An exception
// thrown by a body (or carried by the future it returned) travels back to the
// caller, whose get() throws RemoteError naming this worker, the function and
// the exception's message (typed weft errors keep their type: a body throwing
// InvalidArgumentError makes the caller's get() throw InvalidArgumentError).
//
// There is no global registry of bodies: each Agent owns one and serves exactly
// what was bound to it. (Declarations are process-wide: a Function, a remote
// class, a layer's extension factory; docs/design.md, "Extension points".) impl() after Agent::start() is a StateError; binding a name
// twice, or two names with the same 64-bit id, is an InvalidArgumentError.
//
// Thread-safety: impl() is for the thread setting up the agent, before start();
// afterwards the registry is read-only and read from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "common/type_tag.h"
#include "rpc/codec.h"
#include "rpc/function.h"

namespace weft::rpc {

// Who is being served, for a body that asks for it.
struct CallContext {
  std::string callerName;
  int callerRank = -1;
  uint64_t callId = 0;
  const std::string* function = nullptr;  // the registered name; lives as long as the registry
};

// A value a function produced, type-erased: a response encodes it, and remote() (rref/) keeps
// it on the callee as the value of a remote reference.
struct HeldValue {
  std::shared_ptr<void> object;  // null for a function returning void
  const void* type = nullptr;    // typeTag<R>() of the decayed result type (typeTag<void>() for none)
  std::string typeName;          // Codec<R>::typeName(), or the remote class's name
  // Writes the value into a response; null when the type has no codec (a remote object).
  void (*encode)(const void* object, EncodeContext&, wire::Value::Builder) = nullptr;

  template <class R>
  static HeldValue of(R value) {
    HeldValue h;
    h.object = std::make_shared<R>(std::move(value));
    h.type = typeTag<R>();
    h.typeName = Codec<R>::typeName();
    h.encode = [](const void* object, EncodeContext& ctx, wire::Value::Builder out) {
      encodeResult(ctx, out, *static_cast<const R*>(object));
    };
    return h;
  }
  static HeldValue none() {
    HeldValue h;
    h.type = typeTag<void>();
    h.typeName = "none";
    h.encode = [](const void*, EncodeContext&, wire::Value::Builder out) { out.setNone(); };
    return h;
  }
  // Writes the value; InvalidArgumentError when its type cannot cross the wire.
  void encodeInto(EncodeContext& ctx, wire::Value::Builder out) const {
    WEFT_ENFORCE(encode != nullptr, InvalidArgumentError, "rpc: a value of type '", typeName,
                 "' cannot be sent (it has no codec)");
    encode(object.get(), ctx, out);
  }
};

namespace detail {

template <class T>
struct IsFuture : std::false_type {};
template <class T>
struct IsFuture<Future<T>> : std::true_type {
  using Value = T;
};

template <class R>
HeldValue holdResult(R value) {
  if constexpr (std::is_void_v<R>) {
    return HeldValue::none();
  } else {
    return HeldValue::of<R>(std::move(value));
  }
}

// One registered function, type-erased. `run` decodes the arguments of a call (throwing
// ProtocolError on a mismatch) and runs the body, on a pool thread. `runOnLoop` (set instead
// for Registry::implOnLoop) runs on the loop thread when the call arrives and keeps the frame.
struct Handler {
  std::string name;
  uint64_t id = 0;
  std::function<Future<HeldValue>(const CallContext&, capnp::List<wire::Value>::Reader, DecodeContext&)> run;
  std::function<Future<HeldValue>(const CallContext&, std::shared_ptr<IncomingFrame>)> runOnLoop;
};

template <class R, class F, class... Args>
decltype(auto) invokeBody(F& body, const CallContext& ctx, Args&&... args) {
  if constexpr (std::is_invocable_v<F&, const CallContext&, Args...>) {
    return std::invoke(body, ctx, std::forward<Args>(args)...);
  } else {
    return std::invoke(body, std::forward<Args>(args)...);
  }
}

}  // namespace detail

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Binds body to fn (see the header comment for what body may be).
  template <class R, class... A, class F>
  void impl(const Function<R(A...)>& fn, F&& body);

  // For layers above rpc (rref/, dist_autograd/): binds `name` to a body that runs on the
  // agent's loop thread as soon as the call arrives, in the order calls arrive on each
  // connection, and receives the whole frame (keep it to decode later). The body must not
  // block; it hands slow work to Agent::post and returns a future. Names starting with
  // "weft." are reserved for these.
  void implOnLoop(std::string name,
                  std::function<Future<HeldValue>(const CallContext&, std::shared_ptr<IncomingFrame>)> body);

  // The handler registered under this id, or null.
  const detail::Handler* find(uint64_t id) const;
  bool contains(std::string_view name) const;
  // The registered names, sorted.
  std::vector<std::string> names() const;
  size_t size() const { return handlers_.size(); }

  // Called by Agent::start(): later impl() calls are a StateError.
  void freeze() { frozen_ = true; }
  bool frozen() const { return frozen_; }

 private:
  void add(detail::Handler handler);

  std::unordered_map<uint64_t, std::unique_ptr<detail::Handler>> handlers_;
  bool frozen_ = false;
};

// ---- implementation -------------------------------------------------------------

template <class R, class... A, class F>
void Registry::impl(const Function<R(A...)>& fn, F&& body) {
  using Body = std::decay_t<F>;
  constexpr bool plain = std::is_invocable_v<Body&, std::decay_t<A>...>;
  constexpr bool withContext = std::is_invocable_v<Body&, const CallContext&, std::decay_t<A>...>;
  static_assert(plain || withContext,
                "Registry::impl: the body cannot be called with the function's parameters "
                "(optionally preceded by const rpc::CallContext&)");
  using Returned = std::conditional_t<withContext, std::invoke_result<Body&, const CallContext&, std::decay_t<A>...>,
                                      std::invoke_result<Body&, std::decay_t<A>...>>::type;
  static_assert(std::is_same_v<std::decay_t<Returned>, std::decay_t<R>> ||
                    std::is_same_v<std::decay_t<Returned>, Future<std::decay_t<R>>> ||
                    (!std::is_void_v<R> && std::is_convertible_v<Returned, R> &&
                     !detail::IsFuture<std::decay_t<Returned>>::value),
                "Registry::impl: the body must return the declared result type R, or Future<R>");

  detail::Handler h;
  h.name = fn.name();
  h.id = fn.id();
  h.run = [body = Body(std::forward<F>(body)), name = fn.name()](
              const CallContext& ctx, capnp::List<wire::Value>::Reader in, DecodeContext& dec) mutable {
    auto args = decodeArguments<A...>(name, in, dec);
    using Result = std::decay_t<R>;
    if constexpr (detail::IsFuture<std::decay_t<Returned>>::value) {
      Future<Result> result = std::apply(
          [&](auto&&... a) { return detail::invokeBody<R>(body, ctx, std::move(a)...); }, std::move(args));
      if constexpr (std::is_void_v<R>) {
        return result.then([] { return HeldValue::none(); });
      } else {
        return result.then([](const Result& v) { return HeldValue::of<Result>(v); });
      }
    } else if constexpr (std::is_void_v<R>) {
      std::apply([&](auto&&... a) { detail::invokeBody<R>(body, ctx, std::move(a)...); }, std::move(args));
      return makeReadyFuture(HeldValue::none());
    } else {
      Result result = std::apply(
          [&](auto&&... a) -> Result { return detail::invokeBody<R>(body, ctx, std::move(a)...); }, std::move(args));
      return makeReadyFuture(HeldValue::of<Result>(std::move(result)));
    }
  };
  add(std::move(h));
}

}  // namespace weft::rpc
