// Remote classes: a C++ class whose objects can be built on another worker with
// Agent::remote<T>(...) and used there through RRef<T> (rref/rref.h).
//
//   // api.h, shared by every program of the job (namespace scope, the class's namespace)
//   class ParameterServer {
//    public:
//     explicit ParameterServer(double lr);
//     ParameterServer(double lr, int64_t width);
//     Tensor forward(const Tensor& x);
//     weft::Future<Tensor> slowForward(Tensor x);        // asynchronous on the owner
//     std::vector<weft::RRef<Tensor>> parameterRRefs();
//   };
//   WEFT_REMOTE_CLASS(ParameterServer, WEFT_CONSTRUCTORS((double), (double, int64_t)),
//                     forward, slowForward, parameterRRefs);
//
// The class's wire name is the first argument as written ("ParameterServer"); it
// must be unique in the job and the same in every program. The constructors are
// listed by parameter types; remote<T>(to, args...) picks the first one the
// arguments convert to, at compile time. The methods are listed by name (not
// overloaded, public); their parameters and results must have codecs
// (rpc/codec.h), RRefs included. A method may return Future<R>: the caller's
// result comes when that future completes, and no owner thread waits for it.
//
// Declaring a class in a header makes every program that includes it able to
// own such objects: the declaration registers the class (its name, constructors
// and methods) in a process-wide table of declarations when the program starts,
// as weft::Function declarations are process-wide. Objects, like all RRef state,
// belong to one Agent.
//
// Concurrency: methods of one object may run on several handler threads at once
// (calls from several workers, or several calls in flight from one); a class
// whose methods touch shared state guards it itself.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "common/type_tag.h"
#include "rpc/codec.h"
#include "rpc/function.h"
#include "rpc/registry.h"

namespace weft::rref {

// The constructors of a remote class, each as void(Params...): built by WEFT_CONSTRUCTORS.
template <class... Sigs>
struct Constructors {};

// Runtime description of a remote class, built once from its declaration.
struct MethodInfo {
  std::string name;           // "forward"
  std::string qualifiedName;  // "ParameterServer::forward", the name errors carry
  // Decodes the arguments (ProtocolError on a mismatch) and runs the method on `object`.
  std::function<Future<rpc::HeldValue>(const std::shared_ptr<void>& object, capnp::List<rpc::wire::Value>::Reader,
                                       rpc::DecodeContext&)>
      invoke;
};

struct ConstructorInfo {
  std::string signature;  // "(double, int64)"
  std::function<rpc::HeldValue(capnp::List<rpc::wire::Value>::Reader, rpc::DecodeContext&)> construct;
};

struct ClassInfo {
  std::string name;
  const void* type = nullptr;
  std::vector<ConstructorInfo> constructors;
  std::vector<MethodInfo> methods;
  std::string constructorLabel;  // "ParameterServer constructor"

  const MethodInfo* findMethod(std::string_view method) const {
    for (auto& m : methods) {
      if (m.name == method) return &m;
    }
    return nullptr;
  }
};

// The declared class of that wire name, or null (every program including the declaration has it).
const ClassInfo* findClass(std::string_view name);

namespace detail {

// Adds a class to the process-wide table; a second class under one name is an error at start-up.
bool registerClass(const ClassInfo& info);

template <class M>
struct MethodTraits;
template <class C, class R, class... A>
struct MethodTraits<R (C::*)(A...)> {
  using Class = C;
  using Result = R;
  using Parameters = std::tuple<A...>;
};
template <class C, class R, class... A>
struct MethodTraits<R (C::*)(A...) const> : MethodTraits<R (C::*)(A...)> {};
template <class C, class R, class... A>
struct MethodTraits<R (C::*)(A...) noexcept> : MethodTraits<R (C::*)(A...)> {};
template <class C, class R, class... A>
struct MethodTraits<R (C::*)(A...) const noexcept> : MethodTraits<R (C::*)(A...)> {};

// The result a caller receives: R, or the value of a Future<R> the method returns.
template <class R>
struct Unwrapped {
  using Type = R;
};
template <class R>
struct Unwrapped<Future<R>> {
  using Type = R;
};

template <class M>
struct MethodDecl {
  M pointer;
  const char* name;
};

template <class M>
constexpr MethodDecl<M> method(M pointer, const char* name) {
  return {pointer, name};
}

template <class T, class CtorList, class... Methods>
struct ClassDecl {
  using Type = T;
  using Ctors = CtorList;
  const char* name;
  std::tuple<MethodDecl<Methods>...> methods;
};

template <class T, class CtorList, class... Methods>
ClassDecl<T, CtorList, Methods...> classDecl(const char* name, MethodDecl<Methods>... methods) {
  return {name, std::tuple<MethodDecl<Methods>...>(methods...)};
}

template <class T>
concept RemoteClass = requires { weftRemoteClass(static_cast<const T*>(nullptr)); };

template <class T>
const auto& declOf() {
  static const auto decl = weftRemoteClass(static_cast<const T*>(nullptr));
  return decl;
}

template <class Tuple>
std::string signatureOf() {
  std::string s = "(";
  [&]<size_t... I>(std::index_sequence<I...>) {
    ((s += (I == 0 ? "" : ", ") + rpc::Codec<std::decay_t<std::tuple_element_t<I, Tuple>>>::typeName()), ...);
  }(std::make_index_sequence<std::tuple_size_v<Tuple>>());
  return s + ")";
}

template <class R>
Future<rpc::HeldValue> holdFuture(Future<R> f) {
  if constexpr (std::is_void_v<R>) {
    return f.then([] { return rpc::HeldValue::none(); });
  } else {
    return f.then([](const R& v) { return rpc::HeldValue::of<R>(v); });
  }
}

template <class T, class M>
MethodInfo methodInfo(const std::string& className, const MethodDecl<M>& decl) {
  using Traits = MethodTraits<M>;
  using R = typename Traits::Result;
  MethodInfo info;
  info.name = decl.name;
  info.qualifiedName = className + "::" + decl.name;
  info.invoke = [pm = decl.pointer, label = info.qualifiedName](const std::shared_ptr<void>& object,
                                                                 capnp::List<rpc::wire::Value>::Reader in,
                                                                 rpc::DecodeContext& dec) -> Future<rpc::HeldValue> {
    auto args = [&]<class... A>(std::tuple<A...>*) {
      return rpc::decodeArguments<A...>(label, in, dec);
    }(static_cast<typename Traits::Parameters*>(nullptr));
    T* self = static_cast<T*>(object.get());
    auto call = [&]() -> decltype(auto) {
      return std::apply([&](auto&&... a) -> R { return (self->*pm)(std::move(a)...); }, std::move(args));
    };
    if constexpr (rpc::detail::IsFuture<std::decay_t<R>>::value) {
      return holdFuture(call());
    } else if constexpr (std::is_void_v<R>) {
      call();
      return makeReadyFuture(rpc::HeldValue::none());
    } else {
      return makeReadyFuture(rpc::HeldValue::of<std::decay_t<R>>(call()));
    }
  };
  return info;
}

template <class T, class... P>
ConstructorInfo constructorInfo(const std::string& className, void (*)(P...)) {
  static_assert(std::is_constructible_v<T, std::decay_t<P>...>,
                "WEFT_CONSTRUCTORS lists a parameter list the class has no constructor for");
  ConstructorInfo info;
  info.signature = signatureOf<std::tuple<P...>>();
  info.construct = [className](capnp::List<rpc::wire::Value>::Reader in, rpc::DecodeContext& dec) {
    auto args = rpc::decodeArguments<P...>(className + " constructor", in, dec);
    rpc::HeldValue h;
    h.object = std::apply([](auto&&... a) { return std::make_shared<T>(std::move(a)...); }, std::move(args));
    h.type = typeTag<T>();
    h.typeName = className;
    return h;
  };
  return info;
}

template <class T>
ClassInfo buildClassInfo() {
  const auto& decl = declOf<T>();
  ClassInfo info;
  info.name = decl.name;
  info.type = typeTag<T>();
  info.constructorLabel = info.name + " constructor";
  [&]<class... Sigs>(Constructors<Sigs...>*) {
    (info.constructors.push_back(constructorInfo<T>(info.name, static_cast<Sigs*>(nullptr))), ...);
  }(static_cast<typename std::decay_t<decltype(decl)>::Ctors*>(nullptr));
  std::apply([&](const auto&... m) { (info.methods.push_back(methodInfo<T>(info.name, m)), ...); }, decl.methods);
  return info;
}

template <class T>
const ClassInfo& classInfo() {
  static const ClassInfo info = buildClassInfo<T>();
  return info;
}

template <class T>
bool registerRemoteClass() {
  return registerClass(classInfo<T>());
}

// The index of the first declared constructor the arguments convert to, or -1.
template <class CtorList, class... Args>
struct PickConstructor;
template <class... Args>
struct PickConstructor<Constructors<>, Args...> {
  static constexpr int value = -1;
};
template <class... P, class... Rest, class... Args>
struct PickConstructor<Constructors<void(P...), Rest...>, Args...> {
  static constexpr bool fits = [] {
    if constexpr (sizeof...(P) != sizeof...(Args)) {
      return false;
    } else {
      return (std::is_convertible_v<const Args&, std::decay_t<P>> && ...);
    }
  }();
  static constexpr int next = PickConstructor<Constructors<Rest...>, Args...>::value;
  static constexpr int value = fits ? 0 : (next < 0 ? -1 : next + 1);
};

template <size_t I, class CtorList>
struct ConstructorAt;
template <class First, class... Rest>
struct ConstructorAt<0, Constructors<First, Rest...>> {
  using Type = First;
};
template <size_t I, class First, class... Rest>
struct ConstructorAt<I, Constructors<First, Rest...>> : ConstructorAt<I - 1, Constructors<Rest...>> {};

// The declared name of method `pm` of T; InvalidArgumentError when it is not declared.
template <class T, class M>
const MethodInfo& methodOf(M pm) {
  const auto& decl = declOf<T>();
  int index = -1;
  int i = 0;
  std::apply(
      [&](const auto&... m) {
        (
            [&] {
              if constexpr (std::is_same_v<std::decay_t<decltype(m.pointer)>, M>) {
                if (index < 0 && m.pointer == pm) index = i;
              }
              ++i;
            }(),
            ...);
      },
      decl.methods);
  WEFT_ENFORCE(index >= 0, InvalidArgumentError, "RRef<", decl.name, ">: the method is not declared in WEFT_REMOTE_CLASS(",
               decl.name, ", ...)");
  return classInfo<T>().methods[static_cast<size_t>(index)];
}

}  // namespace detail

}  // namespace weft::rref

#define WEFT_RREF_DETAIL_CTOR(o, params) void params
#define WEFT_RREF_DETAIL_METHOD(Type, m) ::weft::rref::detail::method(&Type::m, #m)

// The constructors of a remote class, each as a parenthesised parameter list: (double), ().
#define WEFT_CONSTRUCTORS(...) \
  ::weft::rref::Constructors<WEFT_CODEC_DETAIL_FOR_EACH(WEFT_RREF_DETAIL_CTOR, _, __VA_ARGS__)>

// Declares Type (an unqualified class name, used in the class's namespace) as a remote class
// with the given constructors (WEFT_CONSTRUCTORS) and methods; see the top of this file.
#define WEFT_REMOTE_CLASS(Type, Ctors, ...)                                                            \
  inline auto weftRemoteClass(const Type*) {                                                           \
    return ::weft::rref::detail::classDecl<Type, Ctors>(                                               \
        #Type __VA_OPT__(, WEFT_CODEC_DETAIL_FOR_EACH(WEFT_RREF_DETAIL_METHOD, Type, __VA_ARGS__)));    \
  }                                                                                                    \
  inline const bool weftRemoteClassRegistered_##Type = ::weft::rref::detail::registerRemoteClass<Type>()
