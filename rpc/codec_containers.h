// Codecs of the standard containers. Part of rpc/codec.h, which includes this file: include that.
// Elements, keys and values travel through their own codecs, so containers nest freely and hold
// any type that has a codec (tensors, RRefs, WEFT_CODEC_FIELDS structs):
//
//   using Index = std::map<std::string, std::vector<std::optional<int64_t>>>;
//   rpc::encodeArguments(enc, call.initArgs(1), Index{{"a", {1, std::nullopt}}});
//   ...
//   auto [index] = rpc::decodeArguments<Index>("lookup", args, dec);
//   // sent a std::map<std::string, std::vector<std::string>> instead, it throws ProtocolError:
//   // "lookup: argument 0: entry 0: value: element 0: expected int64, got string"
//
// Types and their wire form (Value union member):
//   std::vector<T>, T arithmetic          boolList / intList / uintList / float32List / float64List
//                                         (packed: no Value per element; integers are range-checked
//                                         against T element by element)
//   std::vector<T>, other T               list     (std::vector<uint8_t> and <std::byte> are
//                                                   `bytes`, rpc/codec.h)
//   std::map / std::unordered_map<K, V>   map      (entries in the container's iteration order;
//                                                   a duplicate key is rejected)
//   std::optional<T>                      none, or T's own form (T may not itself be an optional:
//                                         both empty states would read as `none`)
//   std::tuple<...> / std::pair<A, B>     tuple    (the element count must match)
//
// Rules: decode checks the union member before reading it and enters a DecodeContext::NestingGuard
// for each level of values it opens (a list of values, a map, a tuple), so nesting stops at
// FrameLimits::maxNesting; errors name the path to the value ("element 3: ...", "entry 0: key:
// ...", "entry 2: value: ..."). Threading as in rpc/codec.h: the contexts belong to the thread
// encoding or decoding one frame.
#pragma once

#include <concepts>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rpc/codec.h"

namespace weft::rpc {

// ---- std::vector -------------------------------------------------------------------------

template <class T>
  requires(!detail::ByteLike<T>)
struct Codec<std::vector<T>> {
  static std::string typeName() { return "vector<" + Codec<T>::typeName() + ">"; }

  static void encode(const std::vector<T>& v, wire::Value::Builder out, EncodeContext& ctx) {
    auto n = static_cast<unsigned>(v.size());
    if constexpr (std::same_as<T, bool>) {
      auto list = out.initBoolList(n);
      for (unsigned i = 0; i < n; ++i) list.set(i, v[i]);
    } else if constexpr (detail::WireInteger<T> && std::is_signed_v<T>) {
      auto list = out.initIntList(n);
      for (unsigned i = 0; i < n; ++i) list.set(i, v[i]);
    } else if constexpr (detail::WireInteger<T>) {
      auto list = out.initUintList(n);
      for (unsigned i = 0; i < n; ++i) list.set(i, v[i]);
    } else if constexpr (std::same_as<T, float>) {
      auto list = out.initFloat32List(n);
      for (unsigned i = 0; i < n; ++i) list.set(i, v[i]);
    } else if constexpr (std::same_as<T, double>) {
      auto list = out.initFloat64List(n);
      for (unsigned i = 0; i < n; ++i) list.set(i, v[i]);
    } else {
      auto list = out.initList(n);
      for (unsigned i = 0; i < n; ++i) encodeValue(v[i], list[i], ctx);
    }
  }

  static std::vector<T> decode(wire::Value::Reader in, DecodeContext& ctx) {
    if constexpr (std::same_as<T, bool>) {
      return decodePacked<wire::Value::BOOL_LIST>(in, [](auto r) { return r.getBoolList(); });
    } else if constexpr (detail::WireInteger<T> && std::is_signed_v<T>) {
      return decodePacked<wire::Value::INT_LIST>(in, [](auto r) { return r.getIntList(); });
    } else if constexpr (detail::WireInteger<T>) {
      return decodePacked<wire::Value::UINT_LIST>(in, [](auto r) { return r.getUintList(); });
    } else if constexpr (std::same_as<T, float>) {
      return decodePacked<wire::Value::FLOAT32_LIST>(in, [](auto r) { return r.getFloat32List(); });
    } else if constexpr (std::same_as<T, double>) {
      return decodePacked<wire::Value::FLOAT64_LIST>(in, [](auto r) { return r.getFloat64List(); });
    } else {
      if (in.which() != wire::Value::LIST) throwKindMismatch(typeName(), in);
      DecodeContext::NestingGuard guard(ctx);
      auto list = in.getList();
      std::vector<T> out;
      out.reserve(list.size());
      for (unsigned i = 0; i < list.size(); ++i) {
        out.push_back(detail::decodingAt(detail::At{"element", i}, [&] { return decodeValue<T>(list[i], ctx); }));
      }
      return out;
    }
  }

 private:
  template <wire::Value::Which kKind, class Get>
  static std::vector<T> decodePacked(wire::Value::Reader in, Get get) {
    if (in.which() != kKind) throwKindMismatch(typeName(), in);
    auto list = get(in);
    std::vector<T> out(list.size());
    for (unsigned i = 0; i < list.size(); ++i) {
      auto v = list[i];
      if constexpr (detail::WireInteger<T>) {
        if (!std::in_range<T>(v)) {
          detail::decodingAt(detail::At{"element", i},
                             [&] { detail::throwOutOfRange(Codec<T>::typeName().c_str(), std::to_string(v)); });
        }
      }
      out[i] = static_cast<T>(v);
    }
    return out;
  }
};

// ---- maps --------------------------------------------------------------------------------

namespace detail {
template <class M>
struct MapCodec {
  using K = typename M::key_type;
  using V = typename M::mapped_type;

  static void encode(const M& m, wire::Value::Builder out, EncodeContext& ctx) {
    auto list = out.initMap(static_cast<unsigned>(m.size()));
    unsigned i = 0;
    for (const auto& [k, v] : m) {
      auto entry = list[i++];
      encodeValue(k, entry.initKey(), ctx);
      encodeValue(v, entry.initValue(), ctx);
    }
  }
  static M decode(const std::string& typeName, wire::Value::Reader in, DecodeContext& ctx) {
    if (in.which() != wire::Value::MAP) throwKindMismatch(typeName, in);
    DecodeContext::NestingGuard guard(ctx);
    auto list = in.getMap();
    M out;
    for (unsigned i = 0; i < list.size(); ++i) {
      auto entry = list[i];
      detail::decodingAt(detail::At{"entry", i}, [&] {
        K k = detail::decodingAt(detail::Label{"key"}, [&] { return decodeValue<K>(entry.getKey(), ctx); });
        V v = detail::decodingAt(detail::Label{"value"}, [&] { return decodeValue<V>(entry.getValue(), ctx); });
        if (!out.try_emplace(std::move(k), std::move(v)).second) {
          throw ProtocolError("duplicate key in " + typeName);
        }
      });
    }
    return out;
  }
};
}  // namespace detail

template <class K, class V, class Cmp, class Alloc>
struct Codec<std::map<K, V, Cmp, Alloc>> {
  using M = std::map<K, V, Cmp, Alloc>;
  static std::string typeName() { return "map<" + Codec<K>::typeName() + ", " + Codec<V>::typeName() + ">"; }
  static void encode(const M& m, wire::Value::Builder out, EncodeContext& ctx) { detail::MapCodec<M>::encode(m, out, ctx); }
  static M decode(wire::Value::Reader in, DecodeContext& ctx) { return detail::MapCodec<M>::decode(typeName(), in, ctx); }
};

template <class K, class V, class Hash, class Eq, class Alloc>
struct Codec<std::unordered_map<K, V, Hash, Eq, Alloc>> {
  using M = std::unordered_map<K, V, Hash, Eq, Alloc>;
  static std::string typeName() {
    return "unordered_map<" + Codec<K>::typeName() + ", " + Codec<V>::typeName() + ">";
  }
  static void encode(const M& m, wire::Value::Builder out, EncodeContext& ctx) { detail::MapCodec<M>::encode(m, out, ctx); }
  static M decode(wire::Value::Reader in, DecodeContext& ctx) { return detail::MapCodec<M>::decode(typeName(), in, ctx); }
};

// ---- std::optional -----------------------------------------------------------------------

namespace detail {
template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};
}  // namespace detail

template <class T>
struct Codec<std::optional<T>> {
  static_assert(!detail::IsOptional<T>::value,
                "std::optional<std::optional<T>> cannot cross the wire: both empty states would read as `none`");
  static std::string typeName() { return "optional<" + Codec<T>::typeName() + ">"; }
  static void encode(const std::optional<T>& v, wire::Value::Builder out, EncodeContext& ctx) {
    if (v) {
      encodeValue(*v, out, ctx);
    } else {
      out.setNone();
    }
  }
  static std::optional<T> decode(wire::Value::Reader in, DecodeContext& ctx) {
    if (in.which() == wire::Value::NONE) return std::nullopt;
    return decodeValue<T>(in, ctx);
  }
};

// ---- tuples ------------------------------------------------------------------------------

namespace detail {
template <class Tuple>
struct TupleCodec {
  static constexpr size_t kSize = std::tuple_size_v<Tuple>;

  static void encode(const Tuple& t, wire::Value::Builder out, EncodeContext& ctx) {
    auto list = out.initTuple(kSize);
    [&]<size_t... I>(std::index_sequence<I...>) {
      (encodeValue(std::get<I>(t), list[I], ctx), ...);
    }(std::make_index_sequence<kSize>());
  }
  static Tuple decode(const std::string& typeName, wire::Value::Reader in, DecodeContext& ctx) {
    if (in.which() != wire::Value::TUPLE) throwKindMismatch(typeName, in);
    auto list = in.getTuple();
    if (list.size() != kSize) {
      throw ProtocolError("expected " + typeName + " (" + std::to_string(kSize) + " elements), got a tuple of " +
                          std::to_string(list.size()));
    }
    DecodeContext::NestingGuard guard(ctx);
    return [&]<size_t... I>(std::index_sequence<I...>) {
      // Braced initialisation evaluates the elements in order.
      return Tuple{detail::decodingAt(detail::At{"element", I}, [&] {
        return decodeValue<std::tuple_element_t<I, Tuple>>(list[I], ctx);
      })...};
    }(std::make_index_sequence<kSize>());
  }
};
}  // namespace detail

template <class... Ts>
struct Codec<std::tuple<Ts...>> {
  static std::string typeName() {
    std::string s = "tuple<";
    ((s += Codec<Ts>::typeName() + ", "), ...);
    if constexpr (sizeof...(Ts) > 0) s.resize(s.size() - 2);
    return s + ">";
  }
  static void encode(const std::tuple<Ts...>& v, wire::Value::Builder out, EncodeContext& ctx) {
    detail::TupleCodec<std::tuple<Ts...>>::encode(v, out, ctx);
  }
  static std::tuple<Ts...> decode(wire::Value::Reader in, DecodeContext& ctx) {
    return detail::TupleCodec<std::tuple<Ts...>>::decode(typeName(), in, ctx);
  }
};

template <class A, class B>
struct Codec<std::pair<A, B>> {
  static std::string typeName() { return "pair<" + Codec<A>::typeName() + ", " + Codec<B>::typeName() + ">"; }
  static void encode(const std::pair<A, B>& v, wire::Value::Builder out, EncodeContext& ctx) {
    detail::TupleCodec<std::pair<A, B>>::encode(v, out, ctx);
  }
  static std::pair<A, B> decode(wire::Value::Reader in, DecodeContext& ctx) {
    return detail::TupleCodec<std::pair<A, B>>::decode(typeName(), in, ctx);
  }
};

}  // namespace weft::rpc
