// RemoteModule<M>: an nn::Module that lives on another worker of the job, used from any worker as
// if it were local, after torch.distributed.nn.RemoteModule. Typical use: a large embedding table
// kept on a parameter server, called by trainers and trained by a DistributedOptimizer over its
// parameter RRefs.
//
//   #include "rref/remote_module.h"
//
//   weft::RemoteModule<nn::EmbeddingBag> emb(agent, "ps/cpu", 100, 16, EmbeddingBagMode::Sum);
//   Tensor e = emb.forward(indices, offsets);                 // runs on "ps"
//   weft::Future<Tensor> f = emb.forwardAsync(indices, offsets);
//   std::vector<weft::RRef<Tensor>> params = emb.remoteParameters();   // owned by "ps"
//   emb.eval();                                               // the module on "ps" changes mode
//   agent.call("trainer0", runTrainer, emb);                  // a RemoteModule is an RPC argument
//
// Placement. "worker/cpu", the worker by name. "worker/cuda:N" is refused with
// InvalidArgumentError: tensors cross the wire on the CPU only (rpc/codec.h), so a module on a GPU
// could neither take its inputs nor hand out its parameters. Anything else is an
// InvalidArgumentError naming the placement.
//
// Creation. The constructor returns at once (Agent::remote<T>, rref/rref.h): the module is built on
// the owner from the constructor arguments, and calls made meanwhile wait there for it. If building
// it fails (nn's own argument checks), the first use fails with the owner's error.
//
// Declaring a module type. The owner builds M from arguments that arrive over the wire, so M's
// constructors must be declared, once per type, in a header every program of the job includes,
// at namespace scope in M's namespace:
//
//   WEFT_REMOTE_MODULE(Tower, Tower, WEFT_CONSTRUCTORS((int64_t), (int64_t, double)));
//
// The first argument is the module's wire name (an identifier, unique in the job: "RemoteModule<
// Tower>"), the second the type, the third its constructors by parameter types (each parameter
// type needs a codec; enums have one). The constructor of RemoteModule picks the first listed
// constructor its arguments convert to, at compile time; list the defaulted forms explicitly.
// weft's nn::Embedding, nn::EmbeddingBag and nn::Linear are declared below.
//
// Forward. M's forward overloads taking 1, 2 or 3 tensors are found at compile time; forward()
// with another count, or with arguments that are not tensors, does not compile. An undefined
// Tensor travels as such (EmbeddingBag's 2-D form: forward(indices2d), or indices and an
// undefined offsets). The result is a copy received from the owner.
//
// Parameters. remoteParameters() returns, in M::parameters() order, one RRef<Tensor> per parameter,
// owned by the module's worker and holding the parameter itself (the same tensor, not a copy):
// in-place updates on the owner through them (an optimizer) change what the module computes with,
// and toHere() returns the current values. It costs one round trip plus one remote() per parameter.
//
// Lifetime. A RemoteModule is a handle (an RRef to the module plus its placement): copies share the
// module, and the owner frees it when the last handle on every worker is dropped (rref/rref.h,
// Lifetime). The parameter RRefs keep the parameters alive by themselves.
//
// Concurrency. forward calls from several workers (or several in flight from one) run concurrently
// on the owner, on its handler threads; the module itself is not locked, so M::forward must not
// change module state (true of every module in nn/; see nn/module.h, Threading). Parameters updated
// in place while forwards run are read as they are (no lock, as Hogwild training expects).
// train()/eval() wait for the forwards running on the owner and hold new ones back while the mode
// changes. A handle may be used from any number of threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "rpc/agent.h"
#include "rpc/codec.h"
#include "rref/remote_class.h"
#include "rref/rref.h"
#include "tensor/tensor.h"

namespace weft {

namespace rref {

// A placement string taken apart: "ps/cpu" -> {"ps", "cpu"}.
struct ModulePlacement {
  std::string worker;
  std::string device;
};

// Parses "worker/cpu" or "worker/cuda:N"; InvalidArgumentError naming `placement` otherwise. A
// well-formed CUDA placement is returned as such (RemoteModule refuses it, saying why).
inline ModulePlacement parseModulePlacement(std::string_view placement) {
  auto malformed = [&] {
    return InvalidArgumentError("RemoteModule: malformed placement \"" + std::string(placement) +
                                "\" (expected \"worker/cpu\" or \"worker/cuda:N\")");
  };
  size_t slash = placement.find('/');
  if (slash == std::string_view::npos || slash == 0) throw malformed();
  std::string_view worker = placement.substr(0, slash);
  std::string_view device = placement.substr(slash + 1);
  if (device != "cpu") {
    constexpr std::string_view kCuda = "cuda:";
    if (!device.starts_with(kCuda)) throw malformed();
    std::string_view index = device.substr(kCuda.size());
    if (index.empty() || index.size() > 4) throw malformed();
    for (char c : index) {
      if (c < '0' || c > '9') throw malformed();
    }
  }
  return {std::string(worker), std::string(device)};
}

namespace detail {

template <class M, class Seq>
struct ForwardWithTensors;
template <class M, size_t... I>
struct ForwardWithTensors<M, std::index_sequence<I...>> {
  static constexpr bool value = requires(M& m, const Tensor& t) {
    { m.forward((static_cast<void>(I), t)...) } -> std::convertible_to<Tensor>;
  };
};

// Whether M::forward can be called with n tensors.
template <class M, size_t N>
inline constexpr bool kForwardTakes = ForwardWithTensors<M, std::make_index_sequence<N>>::value;

inline constexpr size_t kMaxForwardTensors = 3;

// "1 or 2": the tensor counts M::forward takes, for error messages.
template <class M>
std::string forwardAritiesOf() {
  std::string s;
  auto add = [&s](bool takes, size_t n) {
    if (takes) s += (s.empty() ? "" : " or ") + std::to_string(n);
  };
  add(kForwardTakes<M, 1>, 1);
  add(kForwardTakes<M, 2>, 2);
  add(kForwardTakes<M, 3>, 3);
  return s;
}

}  // namespace detail

// The owner's side of a RemoteModule<M>: the remote class that holds the module. Declared per M by
// WEFT_REMOTE_MODULE; RemoteModule is the interface users call.
template <class M>
class ModuleHost {
  static_assert(std::is_base_of_v<nn::Module, M>, "RemoteModule<M>: M must derive from nn::Module");

 public:
  template <class... A>
    requires std::is_constructible_v<M, A...>
  explicit ModuleHost(A&&... args) : module_(std::make_shared<M>(std::forward<A>(args)...)) {}

  // M::forward with inputs.size() tensors; InvalidArgumentError for a count M has no forward for.
  Tensor forward(std::vector<Tensor> inputs) {
    std::shared_lock<std::shared_mutex> lock(mode_);
    switch (inputs.size()) {
      case 1:
        if constexpr (detail::kForwardTakes<M, 1>) return module_->forward(inputs[0]);
        break;
      case 2:
        if constexpr (detail::kForwardTakes<M, 2>) return module_->forward(inputs[0], inputs[1]);
        break;
      case 3:
        if constexpr (detail::kForwardTakes<M, 3>) return module_->forward(inputs[0], inputs[1], inputs[2]);
        break;
      default:
        break;
    }
    throw InvalidArgumentError(::weft::detail::concat("RemoteModule(", module_->typeName(), ")::forward: takes ",
                                                      detail::forwardAritiesOf<M>(), " tensors, got ", inputs.size()));
  }

  int64_t parameterCount() const { return static_cast<int64_t>(module_->parameters().size()); }
  // Parameter `index` of M::parameters(): the module's tensor itself.
  Tensor parameter(int64_t index) const {
    std::vector<Tensor> params = module_->parameters();
    WEFT_ENFORCE(index >= 0 && index < static_cast<int64_t>(params.size()), InvalidArgumentError, "RemoteModule(",
                 module_->typeName(), "): parameter ", index, " of ", params.size());
    return params[static_cast<size_t>(index)];
  }

  void train(bool on) {
    std::unique_lock<std::shared_mutex> lock(mode_);
    module_->train(on);
  }
  bool isTraining() const {
    std::shared_lock<std::shared_mutex> lock(mode_);
    return module_->isTraining();
  }

  // The module itself, for code running on the owner.
  const std::shared_ptr<M>& module() const { return module_; }

 private:
  std::shared_ptr<M> module_;
  // Shared by forwards, exclusive while the mode changes (nn::Module::train is not thread-safe).
  mutable std::shared_mutex mode_;
};

namespace detail {

// The remote-class declaration of ModuleHost<M> (see WEFT_REMOTE_MODULE).
template <class M, class Ctors>
auto moduleHostDecl(const char* wireName) {
  using H = ModuleHost<M>;
  return classDecl<H, Ctors>(wireName, method(&H::forward, "forward"), method(&H::parameterCount, "parameterCount"),
                             method(&H::parameter, "parameter"), method(&H::train, "train"),
                             method(&H::isTraining, "isTraining"));
}

}  // namespace detail
}  // namespace rref

template <class M>
class RemoteModule {
 public:
  using Host = rref::ModuleHost<M>;

  // An empty handle: valid() is false and every use is an InvalidArgumentError.
  RemoteModule() = default;

  // Builds M(args...) on the placement's worker (see the top of this file). Returns at once.
  template <class... Args>
  RemoteModule(rpc::Agent& agent, std::string_view placement, const Args&... args)
      : placement_(rref::parseModulePlacement(placement)) {
    static_assert(rref::detail::RemoteClass<Host>,
                  "RemoteModule<M>: M is not declared with WEFT_REMOTE_MODULE (rref/remote_module.h)");
    WEFT_ENFORCE(placement_.device == "cpu", InvalidArgumentError, "RemoteModule: placement \"", placement,
                 "\": CUDA placement of remote modules is not supported yet (tensors cross the wire on the CPU "
                 "only); use \"",
                 placement_.worker, "/cpu\"");
    host_ = agent.remote<Host>(placement_.worker, args...);
  }

  bool valid() const { return host_.valid(); }
  // "ps/cpu"
  std::string placement() const { return placement_.worker + "/" + placement_.device; }
  // The worker the module lives on.
  const std::string& workerName() const { return placement_.worker; }
  // The reference to the owner's host object (its methods: forward, parameterCount, parameter,
  // train, isTraining).
  const RRef<Host>& moduleRRef() const { return host_; }

  // M::forward(inputs...) on the owner.
  template <class... Ts>
  Tensor forward(const Ts&... inputs) const {
    return forwardAsync(inputs...).get();
  }
  template <class... Ts>
  Future<Tensor> forwardAsync(const Ts&... inputs) const {
    static_assert((std::is_convertible_v<const Ts&, Tensor> && ...), "RemoteModule::forward takes tensors");
    static_assert(sizeof...(Ts) >= 1 && sizeof...(Ts) <= rref::detail::kMaxForwardTensors &&
                      rref::detail::kForwardTakes<M, sizeof...(Ts)>,
                  "RemoteModule::forward: M has no forward taking this many tensors");
    return host_.rpcAsync(&Host::forward, std::vector<Tensor>{Tensor(inputs)...});
  }

  // One RRef per parameter of the module, owned by its worker (see the top of this file).
  std::vector<RRef<Tensor>> remoteParameters() const {
    int64_t n = host_.rpcSync(&Host::parameterCount);
    std::vector<RRef<Tensor>> out;
    out.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out.push_back(host_.remote(&Host::parameter, i));
    return out;
  }

  // Sets the owner's module (and its descendants) to training or evaluation mode.
  void train(bool on = true) const { host_.rpcSync(&Host::train, on); }
  void eval() const { train(false); }
  bool isTraining() const { return host_.rpcSync(&Host::isTraining); }

 private:
  friend struct rpc::Codec<RemoteModule<M>>;
  RemoteModule(RRef<Host> host, rref::ModulePlacement placement)
      : host_(std::move(host)), placement_(std::move(placement)) {}

  RRef<Host> host_;
  rref::ModulePlacement placement_;
};

namespace rpc {

// RemoteModule<M> on the wire: a tuple of its RRef and its placement string.
template <class M>
struct Codec<RemoteModule<M>> {
  using Parts = std::tuple<RRef<rref::ModuleHost<M>>, std::string>;
  static std::string typeName() { return rref::detail::typeNameOf<rref::ModuleHost<M>>(); }
  static void encode(const RemoteModule<M>& v, wire::Value::Builder out, EncodeContext& ctx) {
    detail::TupleCodec<Parts>::encode(Parts(v.host_, v.placement()), out, ctx);
  }
  static RemoteModule<M> decode(wire::Value::Reader in, DecodeContext& ctx) {
    auto [host, placement] = detail::TupleCodec<Parts>::decode(typeName(), in, ctx);
    rref::ModulePlacement parsed;
    try {
      parsed = rref::parseModulePlacement(placement);
    } catch (const InvalidArgumentError& e) {
      throw ProtocolError(e.what());
    }
    return RemoteModule<M>(std::move(host), std::move(parsed));
  }
};

}  // namespace rpc
}  // namespace weft

// Declares module type Type as usable through RemoteModule<Type>, under the wire name
// "RemoteModule<Name>" (Name: an identifier, unique in the job), with the constructors Ctors
// (WEFT_CONSTRUCTORS). At namespace scope, in Type's namespace; see the top of this file.
#define WEFT_REMOTE_MODULE(Name, Type, Ctors)                                                           \
  inline auto weftRemoteClass(const ::weft::rref::ModuleHost<Type>*) {                                \
    return ::weft::rref::detail::moduleHostDecl<Type, Ctors>("RemoteModule<" #Name ">");               \
  }                                                                                                    \
  inline const bool weftRemoteModuleRegistered_##Name =                                                \
      ::weft::rref::detail::registerRemoteClass<::weft::rref::ModuleHost<Type>>()

namespace weft::nn {

WEFT_REMOTE_MODULE(Embedding, Embedding, WEFT_CONSTRUCTORS((int64_t, int64_t), (Tensor)));
WEFT_REMOTE_MODULE(EmbeddingBag, EmbeddingBag,
                   WEFT_CONSTRUCTORS((int64_t, int64_t), (int64_t, int64_t, EmbeddingBagMode)));
WEFT_REMOTE_MODULE(Linear, Linear, WEFT_CONSTRUCTORS((int64_t, int64_t), (int64_t, int64_t, bool)));

}  // namespace weft::nn
