// Function<Sig>: the typed handle through which a remote function is declared,
// implemented and called.
//
// A declaration lives in a header that callers and implementers share; it names
// the function and fixes its signature, so every call is checked at compile
// time and every argument travels through Codec<T> (rpc/codec.h):
//
//   // api.h
//   inline const weft::Function<Tensor(Tensor, Tensor)> add{"add"};
//   inline const weft::Function<void(std::string)> note{"note"};
//
//   // the worker that serves it
//   agent.registry().impl(add, [](Tensor a, Tensor b) { return a + b; });
//   // a caller
//   Tensor c = agent.call("worker1", add, a, b);
//
// The name is the function's identity on the wire: it travels as the 64-bit
// FNV-1a hash rpc::nameId(name) (plus the name itself, for error messages and to
// detect a hash collision), so two programs agree on a function exactly when they
// declare the same name. Declaring the same name with different signatures in
// two programs is caught when a call's arguments or result fail to decode: a
// ProtocolError naming the function and the argument.
//
// Parameters and the result may be any type with a Codec; the result may be
// void. Parameters are taken by value on the serving side (a `const Tensor&`
// parameter decodes as a Tensor).
//
// A Function is an immutable value; share it freely between threads.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "rpc/codec.h"
#include "rpc/frame.h"

namespace weft {

template <class Sig>
class Function;

template <class R, class... A>
class Function<R(A...)> {
  static_assert(std::is_void_v<R> || rpc::Encodable<R>,
                "weft::Function: the result type has no rpc::Codec (see rpc/codec.h)");
  static_assert((rpc::Encodable<std::decay_t<A>> && ...),
                "weft::Function: a parameter type has no rpc::Codec (see rpc/codec.h)");

 public:
  using Result = R;
  // The values a call carries, as the serving side decodes them.
  using Arguments = std::tuple<std::decay_t<A>...>;
  static constexpr size_t arity = sizeof...(A);

  // name: 1 to 256 bytes; checked when the function is implemented or called.
  explicit Function(std::string name) : name_(std::move(name)), id_(rpc::nameId(name_)) {}

  const std::string& name() const noexcept { return name_; }
  uint64_t id() const noexcept { return id_; }

 private:
  std::string name_;
  uint64_t id_;
};

}  // namespace weft
