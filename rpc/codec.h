// Codec<T>: how a C++ value becomes a wire::Value (rpc/protocol.capnp) and comes back, checked
// against the type the receiver declared.
//
//   struct Point { double x; double y; std::string label; };
//   WEFT_CODEC_FIELDS(Point, x, y, label);           // namespace scope, the struct's namespace
//
//   rpc::FrameWriter writer;                           // rpc/frame.h
//   auto call = writer.message().initCall();
//   rpc::EncodeContext enc(writer);
//   rpc::encodeArguments(enc, call.initArgs(2), tensor, std::vector<Point>{{1, 2, "a"}});
//   ...
//   // on the receiver, with the IncomingFrame `frame` the decoder produced:
//   rpc::DecodeContext dec(frame);
//   auto [t, points] = rpc::decodeArguments<Tensor, std::vector<Point>>(
//       "plot", frame.message().getCall().getArgs(), dec);
//   // a mismatch throws ProtocolError: "plot: argument 1: element 0: field 'label': expected
//   // string, got int"
//
// Types and their wire form (Value union member):
//   bool                                  boolean
//   signed integers (int8_t..int64_t)     int      (range-checked against the declared type)
//   unsigned integers (uint8_t..uint64_t) uint     (range-checked likewise)
//   enums over those integer types        int      (the underlying integer, range-checked against
//                                                   the underlying type; which enumerators are
//                                                   valid is the receiver's to check)
//   float / double                        float32 / float64
//   std::string                           text
//   std::vector<uint8_t>, <std::byte>     bytes
//   Tensor                                tensor   (an undefined Tensor is `none`)
//   std::vector<T>, T arithmetic          intList / uintList / float32List / float64List / boolList
//   std::vector<T>, other T               list
//   std::map / std::unordered_map<K, V>   map      (duplicate keys are rejected)
//   std::optional<T>                      none, or T's own form (T may not itself be an optional)
//   std::tuple<...> / std::pair<A, B>     tuple    (the element count must match)
//   WEFT_CODEC_FIELDS structs             record   (type name and field count must match)
// Plain char types have no codec (their signedness differs between platforms): use int8_t,
// uint8_t or std::string.
//
// Tensors: a TensorDesc in the message, the bytes as an out-of-band buffer of the frame. A
// contiguous CPU tensor's bytes are sent from its own Storage (no copy, see rpc/frame.h); a
// non-contiguous view is first made contiguous: that copy is the only one the codec makes. The
// same bytes passed twice in one frame (the same tensor, or equal views) travel once, and the
// receiver's tensors then share one Storage, as the sender's did. A decoded tensor is a
// contiguous CPU tensor whose Storage is the buffer the frame decoder read the bytes into; it
// requires grad when the sender's did (a leaf). CUDA tensors are refused with
// InvalidArgumentError (device tensors need a device map, which the agent will own).
//
// Decoding is driven by the declared type, never by the bytes: the receiver compares the union
// member with the one its type maps to and throws ProtocolError naming the path to the value
// ("element 3: key: ...", "field 'label': ...") and both kinds. Hostile input is bounded:
// nesting beyond FrameLimits::maxNesting is rejected (recursive structs can nest at run time),
// list lengths are bounded by the frame's bytes and Cap'n Proto's traversal limit, malformed
// pointers surface as ProtocolError ("malformed value: ..."), never as a crash.
//
// Extension point: a type outside this file gets a codec by specialising Codec (see the
// `Codec` comment below), e.g. RRef<T> in rref/ with a `Value.rref` member appended to the
// schema. Per-frame state such a codec needs (the RRef fork bookkeeping of one message) is
// attached to the Encode/DecodeContext by the layer that owns it and found by type:
//
//   enc.extensions().attach(&forkRecorder);      // rref layer, before encoding a call
//   auto* forks = ctx.extensions().find<ForkRecorder>();   // in Codec<RRef<T>>::encode
//
// Threading: contexts belong to the thread encoding or decoding one frame.
#pragma once

#include <kj/exception.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.h"
#include "rpc/frame.h"
#include "tensor/tensor.h"

namespace weft::rpc {

class Agent;

// ---- per-frame contexts ------------------------------------------------------------------

// Per-frame objects of other layers, found by their type (no RTTI). The pointers are borrowed:
// whoever attaches an object keeps it alive while the context is used.
class CodecExtensions {
 public:
  template <class X>
  void attach(X* x) {
    slots_.push_back({&kTag<X>, x});
  }
  // The most recently attached X, or null.
  template <class X>
  X* find() const {
    for (auto it = slots_.rbegin(); it != slots_.rend(); ++it) {
      if (it->tag == &kTag<X>) return static_cast<X*>(it->object);
    }
    return nullptr;
  }

 private:
  template <class X>
  static constexpr char kTag = 0;
  struct Slot {
    const void* tag;
    void* object;
  };
  std::vector<Slot> slots_;
};

// State of encoding one frame's values: where tensor bytes go, and which worker the frame is
// for (set by the Agent; codecs of references, rref/, need it).
class EncodeContext {
 public:
  explicit EncodeContext(FrameWriter& writer) : writer_(writer) {}
  EncodeContext(FrameWriter& writer, Agent* agent, int peerRank) : writer_(writer), agent_(agent), peer_(peerRank) {}
  ~EncodeContext() {
    if (!committed_) {
      for (auto& undo : onDiscard_) undo();
    }
  }
  EncodeContext(const EncodeContext&) = delete;
  EncodeContext& operator=(const EncodeContext&) = delete;

  // The agent sending the frame and the rank it goes to; null and -1 outside an agent.
  Agent* agent() const { return agent_; }
  int peerRank() const { return peer_; }

  // A codec that wrote a remote reference (Value.rref) marks the frame, so that the receiver
  // looks for references when the frame arrives (rpc/protocol.capnp, callFlagHasRRefs).
  void markHasRRefs() { hasRRefs_ = true; }
  bool hasRRefs() const { return hasRRefs_; }

  // A tensor that requires grad was written: remembers it and returns its position among them
  // (TensorDesc.gradSlot). Distributed autograd records them as a send node's inputs.
  uint32_t noteGradTensor(const Tensor& t) {
    gradTensors_.push_back(t);
    return static_cast<uint32_t>(gradTensors_.size() - 1);
  }
  const std::vector<Tensor>& gradTensors() const { return gradTensors_; }

  // Bookkeeping a codec did for this frame (a fork registered for the receiver) that must be
  // undone when the frame is never sent: run when the context is destroyed without commit().
  void onDiscard(std::function<void()> undo) { onDiscard_.push_back(std::move(undo)); }
  // The frame was handed to the connection: keep the bookkeeping.
  void commit() { committed_ = true; }

  // Makes t's bytes an out-of-band buffer of the frame (once per distinct byte range) and
  // returns its index. t must be defined and on the CPU (InvalidArgumentError otherwise).
  uint32_t addTensor(const Tensor& t);

  CodecExtensions& extensions() { return extensions_; }
  FrameWriter& writer() { return writer_; }

 private:
  // A byte range already sent in this frame, so equal tensors travel once.
  struct SentKey {
    const Storage* storage;
    size_t offset;
    size_t size;
    bool operator==(const SentKey&) const = default;
  };
  struct SentKeyHash {
    size_t operator()(const SentKey& k) const {
      return std::hash<const void*>()(k.storage) ^ (k.offset * 0x9e3779b97f4a7c15ull) ^ (k.size << 1);
    }
  };
  FrameWriter& writer_;
  Agent* agent_ = nullptr;
  int peer_ = -1;
  bool hasRRefs_ = false;
  bool committed_ = false;
  std::vector<std::function<void()>> onDiscard_;
  std::vector<Tensor> gradTensors_;
  std::unordered_map<SentKey, uint32_t, SentKeyHash> sent_;
  CodecExtensions extensions_;
};

// State of decoding one frame's values: its buffers and the nesting budget.
class DecodeContext {
 public:
  // Values of `frame`, nested at most as deep as the decoder that produced it allowed (or
  // maxNesting). The frame must outlive the context.
  explicit DecodeContext(const IncomingFrame& frame) : DecodeContext(frame, frame.maxNesting()) {}
  DecodeContext(const IncomingFrame& frame, uint32_t maxNesting) : DecodeContext(frame.buffers(), maxNesting) {
    frame_ = &frame;
  }
  DecodeContext(std::span<const std::shared_ptr<Storage>> buffers, uint32_t maxNesting)
      : buffers_(buffers), maxNesting_(maxNesting) {}

  // Buffer `index`, checked to exist and to be exactly byteLength long (ProtocolError if not).
  const std::shared_ptr<Storage>& buffer(uint32_t index, uint64_t byteLength) const;

  // Entered by every container codec; throws ProtocolError past maxNesting levels.
  class NestingGuard {
   public:
    explicit NestingGuard(DecodeContext& ctx);
    ~NestingGuard() { --ctx_.depth_; }
    NestingGuard(const NestingGuard&) = delete;
    NestingGuard& operator=(const NestingGuard&) = delete;

   private:
    DecodeContext& ctx_;
  };

  CodecExtensions& extensions() { return extensions_; }
  // The frame being decoded (its attachments), or null for bare buffers.
  const IncomingFrame* frame() const { return frame_; }

 private:
  const IncomingFrame* frame_ = nullptr;
  std::span<const std::shared_ptr<Storage>> buffers_;
  uint32_t maxNesting_;
  uint32_t depth_ = 0;
  CodecExtensions extensions_;
};

// ---- the trait ---------------------------------------------------------------------------

// Codec<T> is specialised for every type that can cross the wire. A specialisation provides:
//   static std::string typeName();        // for error messages: "vector<string>"
//   static void encode(const T& v, wire::Value::Builder out, EncodeContext& ctx);
//   static T decode(wire::Value::Reader in, DecodeContext& ctx);   // throws ProtocolError
// decode must check in.which() before reading a member, report a mismatch with
// throwKindMismatch, and enter a DecodeContext::NestingGuard when it decodes nested values.
// The primary template is left undefined, so using a type without a codec fails to compile.
template <class T>
struct Codec;

template <class T>
concept Encodable = requires(const T& v, wire::Value::Builder b, wire::Value::Reader r, EncodeContext& e,
                             DecodeContext& d) {
  { Codec<T>::typeName() } -> std::convertible_to<std::string>;
  Codec<T>::encode(v, b, e);
  { Codec<T>::decode(r, d) } -> std::same_as<T>;
};

// "string", "list of 3", "unknown kind 42", ...: what a received value is, for error messages.
std::string describeKind(wire::Value::Reader in);
// Throws ProtocolError "expected <expected>, got <describeKind(in)>".
[[noreturn]] void throwKindMismatch(const std::string& expected, wire::Value::Reader in);

namespace detail {

// Runs f; a ProtocolError or Cap'n Proto exception escaping it is rethrown as a ProtocolError
// whose message starts with where() (the path to the value being decoded). `where` is only
// called on failure, so the success path builds no strings.
template <class Where, class F>
decltype(auto) decodingAt(Where&& where, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const ProtocolError& e) {
    throw ProtocolError(std::string(where()) + ": " + e.what());
  } catch (const kj::Exception& e) {
    throw ProtocolError(std::string(where()) + ": malformed value: " + e.getDescription().cStr());
  }
}
// where() for "element 3", "entry 0", ...
struct At {
  const char* label;
  size_t index;
  std::string operator()() const { return std::string(label) + " " + std::to_string(index); }
};
// where() for a fixed label: "key", "value".
struct Label {
  const char* label;
  std::string operator()() const { return label; }
};

[[noreturn]] void throwOutOfRange(const char* typeName, std::string value);
void encodeTensor(const Tensor& t, wire::Value::Builder out, EncodeContext& ctx);
Tensor decodeTensor(wire::Value::Reader in, DecodeContext& ctx);

template <class T>
inline constexpr bool kIsCharType = std::is_same_v<T, char> || std::is_same_v<T, wchar_t> ||
                                    std::is_same_v<T, char8_t> || std::is_same_v<T, char16_t> ||
                                    std::is_same_v<T, char32_t>;
template <class T>
concept WireInteger = std::integral<T> && !std::same_as<T, bool> && !kIsCharType<T>;
template <class T>
concept WireArithmetic = WireInteger<T> || std::same_as<T, bool> || std::same_as<T, float> || std::same_as<T, double>;
template <class T>
concept ByteLike = std::same_as<T, uint8_t> || std::same_as<T, std::byte>;

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <WireInteger T>
std::string integerName() {
  return (std::is_signed_v<T> ? "int" : "uint") + std::to_string(8 * sizeof(T));
}

}  // namespace detail

// ---- scalars -----------------------------------------------------------------------------

template <>
struct Codec<bool> {
  static std::string typeName() { return "bool"; }
  static void encode(const bool& v, wire::Value::Builder out, EncodeContext&) { out.setBoolean(v); }
  static bool decode(wire::Value::Reader in, DecodeContext&) {
    if (in.which() != wire::Value::BOOLEAN) throwKindMismatch(typeName(), in);
    return in.getBoolean();
  }
};

template <detail::WireInteger T>
struct Codec<T> {
  static std::string typeName() { return detail::integerName<T>(); }
  static void encode(const T& v, wire::Value::Builder out, EncodeContext&) {
    if constexpr (std::is_signed_v<T>) {
      out.setInt(v);
    } else {
      out.setUint(v);
    }
  }
  static T decode(wire::Value::Reader in, DecodeContext&) {
    if constexpr (std::is_signed_v<T>) {
      if (in.which() != wire::Value::INT) throwKindMismatch(typeName(), in);
      int64_t v = in.getInt();
      if (!std::in_range<T>(v)) detail::throwOutOfRange(typeName().c_str(), std::to_string(v));
      return static_cast<T>(v);
    } else {
      if (in.which() != wire::Value::UINT) throwKindMismatch(typeName(), in);
      uint64_t v = in.getUint();
      if (!std::in_range<T>(v)) detail::throwOutOfRange(typeName().c_str(), std::to_string(v));
      return static_cast<T>(v);
    }
  }
};

// An enum travels as its underlying integer in the `int` member, whatever the underlying type's
// signedness (so both ends need only agree on the enum). Decoding checks the value fits the
// underlying type; encoding an unsigned 64-bit value above INT64_MAX is an InvalidArgumentError.
// Enums over a char type or bool have no codec, as those types have none.
template <class T>
concept WireEnum = std::is_enum_v<T> && detail::WireInteger<std::underlying_type_t<T>>;

template <WireEnum T>
struct Codec<T> {
  using Underlying = std::underlying_type_t<T>;
  static std::string typeName() { return "enum(" + detail::integerName<Underlying>() + ")"; }
  static void encode(const T& v, wire::Value::Builder out, EncodeContext&) {
    auto u = static_cast<Underlying>(v);
    WEFT_ENFORCE(std::in_range<int64_t>(u), InvalidArgumentError, "rpc: the ", typeName(), " value ",
                 static_cast<uint64_t>(u), " does not fit the wire's int64");
    out.setInt(static_cast<int64_t>(u));
  }
  static T decode(wire::Value::Reader in, DecodeContext&) {
    if (in.which() != wire::Value::INT) throwKindMismatch(typeName(), in);
    int64_t v = in.getInt();
    if (!std::in_range<Underlying>(v)) detail::throwOutOfRange(typeName().c_str(), std::to_string(v));
    return static_cast<T>(static_cast<Underlying>(v));
  }
};

template <>
struct Codec<float> {
  static std::string typeName() { return "float32"; }
  static void encode(const float& v, wire::Value::Builder out, EncodeContext&) { out.setFloat32(v); }
  static float decode(wire::Value::Reader in, DecodeContext&) {
    if (in.which() != wire::Value::FLOAT32) throwKindMismatch(typeName(), in);
    return in.getFloat32();
  }
};

template <>
struct Codec<double> {
  static std::string typeName() { return "float64"; }
  static void encode(const double& v, wire::Value::Builder out, EncodeContext&) { out.setFloat64(v); }
  static double decode(wire::Value::Reader in, DecodeContext&) {
    if (in.which() != wire::Value::FLOAT64) throwKindMismatch(typeName(), in);
    return in.getFloat64();
  }
};

template <>
struct Codec<std::string> {
  static std::string typeName() { return "string"; }
  static void encode(const std::string& v, wire::Value::Builder out, EncodeContext&) {
    out.setText(capnp::Text::Reader(v.data(), v.size()));
  }
  static std::string decode(wire::Value::Reader in, DecodeContext&) {
    if (in.which() != wire::Value::TEXT) throwKindMismatch(typeName(), in);
    capnp::Text::Reader t = in.getText();
    return std::string(t.begin(), t.size());
  }
};

template <detail::ByteLike B>
struct Codec<std::vector<B>> {
  static std::string typeName() { return "bytes"; }
  static void encode(const std::vector<B>& v, wire::Value::Builder out, EncodeContext&) {
    out.setBytes(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(v.data()), v.size()));
  }
  static std::vector<B> decode(wire::Value::Reader in, DecodeContext&) {
    if (in.which() != wire::Value::BYTES) throwKindMismatch(typeName(), in);
    capnp::Data::Reader d = in.getBytes();
    const B* p = reinterpret_cast<const B*>(d.begin());
    return std::vector<B>(p, p + d.size());
  }
};

template <>
struct Codec<Tensor> {
  static std::string typeName() { return "tensor"; }
  static void encode(const Tensor& v, wire::Value::Builder out, EncodeContext& ctx) {
    detail::encodeTensor(v, out, ctx);
  }
  static Tensor decode(wire::Value::Reader in, DecodeContext& ctx) { return detail::decodeTensor(in, ctx); }
};

// ---- containers --------------------------------------------------------------------------

// Encodes / decodes one value through its codec (the entry points containers and the argument
// functions below use; Encodable checks the type has a codec).
template <class T>
void encodeValue(const T& v, wire::Value::Builder out, EncodeContext& ctx) {
  static_assert(Encodable<T>, "this type has no weft::rpc::Codec: see rpc/codec.h for the supported types");
  Codec<T>::encode(v, out, ctx);
}
template <class T>
T decodeValue(wire::Value::Reader in, DecodeContext& ctx) {
  static_assert(Encodable<T>, "this type has no weft::rpc::Codec: see rpc/codec.h for the supported types");
  return Codec<T>::decode(in, ctx);
}

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

// ---- user structs ------------------------------------------------------------------------

// WEFT_CODEC_FIELDS(Type, field, ...) gives a struct a codec: its listed fields, in order, as a
// `record`. Write it at namespace scope in the namespace of Type (it defines functions found by
// argument-dependent lookup), after the struct, listing up to 32 public fields. Type must be
// default-constructible (decoding fills a default-constructed value); unlisted fields keep
// their default. Each field's type needs a codec; a field may be another such struct.
//
//   namespace app {
//   struct Batch { Tensor x; std::vector<int64_t> labels; std::optional<std::string> tag; };
//   WEFT_CODEC_FIELDS(Batch, x, labels, tag);
//   }
//
// A class template, or a type whose fields are private, can provide the same three functions
// by hand (see the macro): weftCodecFieldRefs(T&) and (const T&) returning std::tie of the
// fields, and weftCodecRecordInfo(const T*) returning {type name, "field1, field2"}.
struct RecordInfo {
  const char* typeName;
  const char* fieldNames;  // comma-separated, as written in WEFT_CODEC_FIELDS
};

namespace detail {
// The name of field i of a record ("label"), from RecordInfo::fieldNames.
std::string recordFieldName(const RecordInfo& info, size_t i);
}  // namespace detail

template <class T>
concept CodecRecord = std::is_class_v<T> && requires(T& v, const T& c) {
  { weftCodecFieldRefs(v) };
  { weftCodecFieldRefs(c) };
  { weftCodecRecordInfo(static_cast<const T*>(nullptr)) } -> std::same_as<RecordInfo>;
};

template <CodecRecord T>
struct Codec<T> {
  static RecordInfo info() { return weftCodecRecordInfo(static_cast<const T*>(nullptr)); }
  static std::string typeName() { return info().typeName; }

  static void encode(const T& v, wire::Value::Builder out, EncodeContext& ctx) {
    auto refs = weftCodecFieldRefs(v);
    constexpr size_t n = std::tuple_size_v<decltype(refs)>;
    auto record = out.initRecord();
    record.setTypeName(info().typeName);
    auto fields = record.initFields(n);
    [&]<size_t... I>(std::index_sequence<I...>) {
      (encodeValue(std::get<I>(refs), fields[I], ctx), ...);
    }(std::make_index_sequence<n>());
  }

  static T decode(wire::Value::Reader in, DecodeContext& ctx) {
    if (in.which() != wire::Value::RECORD) throwKindMismatch("struct " + typeName(), in);
    auto record = in.getRecord();
    auto name = record.getTypeName();
    if (std::string_view(name.cStr(), name.size()) != info().typeName) {
      throw ProtocolError("expected struct " + typeName() + ", got struct " + std::string(name.cStr(), name.size()));
    }
    T v{};
    auto refs = weftCodecFieldRefs(v);
    constexpr size_t n = std::tuple_size_v<decltype(refs)>;
    auto fields = record.getFields();
    if (fields.size() != n) {
      throw ProtocolError("expected struct " + typeName() + " with " + std::to_string(n) + " fields, got " +
                          std::to_string(fields.size()));
    }
    DecodeContext::NestingGuard guard(ctx);
    [&]<size_t... I>(std::index_sequence<I...>) {
      ((std::get<I>(refs) = detail::decodingAt([] { return "field '" + detail::recordFieldName(info(), I) + "'"; }, [&] {
          return decodeValue<std::remove_cvref_t<std::tuple_element_t<I, decltype(refs)>>>(fields[I], ctx);
        })),
       ...);
    }(std::make_index_sequence<n>());
    return v;
  }
};

// ---- arguments and results -----------------------------------------------------------------

// Encodes a function's arguments into `out`, which must have exactly sizeof...(Args) elements
// (call.initArgs(sizeof...(Args))). A value Cap'n Proto cannot hold (a list or string of 2^29
// elements or more) is an InvalidArgumentError naming the argument.
template <class... Args>
void encodeArguments(EncodeContext& ctx, capnp::List<wire::Value>::Builder out, const Args&... args) {
  WEFT_CHECK(out.size() == sizeof...(Args)) << "encodeArguments: a list of " << out.size() << " for "
                                            << sizeof...(Args) << " arguments";
  [[maybe_unused]] unsigned i = 0;
  try {
    (encodeValue(args, out[i++], ctx), ...);
  } catch (const kj::Exception& e) {
    throw InvalidArgumentError("rpc: cannot encode argument " + std::to_string(i - 1) + ": " +
                               e.getDescription().cStr());
  }
}

// Encodes a function's return value into `out` (response.initValue()); errors as above.
template <class T>
void encodeResult(EncodeContext& ctx, wire::Value::Builder out, const T& value) {
  try {
    encodeValue(value, out, ctx);
  } catch (const kj::Exception& e) {
    throw InvalidArgumentError(std::string("rpc: cannot encode the result: ") + e.getDescription().cStr());
  }
}

// The same for arguments held in a tuple (a call queued before it is sent).
template <class... Args>
void encodeArgumentTuple(EncodeContext& ctx, capnp::List<wire::Value>::Builder out, const std::tuple<Args...>& args) {
  std::apply([&](const Args&... a) { encodeArguments(ctx, out, a...); }, args);
}

// Decodes the arguments of `function` as the declared types Args (decayed: a parameter
// `const Tensor&` decodes as Tensor). Throws ProtocolError naming the function and the 0-based
// argument index: "add: argument 1: expected tensor, got string", "add: expected 2 arguments,
// got 3".
template <class... Args>
std::tuple<std::decay_t<Args>...> decodeArguments(std::string_view function, capnp::List<wire::Value>::Reader in,
                                                   DecodeContext& ctx) {
  if (in.size() != sizeof...(Args)) {
    throw ProtocolError(std::string(function) + ": expected " + std::to_string(sizeof...(Args)) + " argument" +
                        (sizeof...(Args) == 1 ? "" : "s") + ", got " + std::to_string(in.size()));
  }
  return [&]<size_t... I>(std::index_sequence<I...>) {
    return std::tuple<std::decay_t<Args>...>{
        detail::decodingAt([&] { return std::string(function) + ": argument " + std::to_string(I); },
                           [&] { return decodeValue<std::decay_t<Args>>(in[I], ctx); })...};
  }(std::index_sequence_for<Args...>());
}

// Decodes a call's result as T; errors read "add: result: expected tensor, got int".
template <class T>
T decodeResult(std::string_view function, wire::Value::Reader in, DecodeContext& ctx) {
  return detail::decodingAt([&] { return std::string(function) + ": result"; },
                            [&] { return decodeValue<T>(in, ctx); });
}

}  // namespace weft::rpc

// ---- WEFT_CODEC_FIELDS machinery ---------------------------------------------------------------

#define WEFT_CODEC_DETAIL_FIELD(obj, f) obj.f
#define WEFT_CODEC_DETAIL_FE1(m, o, x) m(o, x)
#define WEFT_CODEC_DETAIL_FE2(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE1(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE3(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE2(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE4(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE3(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE5(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE4(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE6(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE5(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE7(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE6(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE8(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE7(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE9(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE8(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE10(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE9(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE11(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE10(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE12(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE11(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE13(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE12(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE14(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE13(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE15(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE14(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE16(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE15(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE17(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE16(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE18(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE17(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE19(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE18(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE20(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE19(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE21(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE20(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE22(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE21(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE23(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE22(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE24(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE23(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE25(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE24(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE26(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE25(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE27(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE26(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE28(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE27(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE29(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE28(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE30(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE29(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE31(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE30(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_FE32(m, o, x, ...) m(o, x), WEFT_CODEC_DETAIL_FE31(m, o, __VA_ARGS__)
#define WEFT_CODEC_DETAIL_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, \
                               _19, _20, _21, _22, _23, _24, _25, _26, _27, _28, _29, _30, _31, _32, NAME, ...)  \
  NAME
#define WEFT_CODEC_DETAIL_FOR_EACH(m, o, ...)                                                                   \
  WEFT_CODEC_DETAIL_PICK(__VA_ARGS__, WEFT_CODEC_DETAIL_FE32, WEFT_CODEC_DETAIL_FE31, WEFT_CODEC_DETAIL_FE30, \
                         WEFT_CODEC_DETAIL_FE29, WEFT_CODEC_DETAIL_FE28, WEFT_CODEC_DETAIL_FE27,              \
                         WEFT_CODEC_DETAIL_FE26, WEFT_CODEC_DETAIL_FE25, WEFT_CODEC_DETAIL_FE24,              \
                         WEFT_CODEC_DETAIL_FE23, WEFT_CODEC_DETAIL_FE22, WEFT_CODEC_DETAIL_FE21,              \
                         WEFT_CODEC_DETAIL_FE20, WEFT_CODEC_DETAIL_FE19, WEFT_CODEC_DETAIL_FE18,              \
                         WEFT_CODEC_DETAIL_FE17, WEFT_CODEC_DETAIL_FE16, WEFT_CODEC_DETAIL_FE15,              \
                         WEFT_CODEC_DETAIL_FE14, WEFT_CODEC_DETAIL_FE13, WEFT_CODEC_DETAIL_FE12,              \
                         WEFT_CODEC_DETAIL_FE11, WEFT_CODEC_DETAIL_FE10, WEFT_CODEC_DETAIL_FE9,               \
                         WEFT_CODEC_DETAIL_FE8, WEFT_CODEC_DETAIL_FE7, WEFT_CODEC_DETAIL_FE6,                 \
                         WEFT_CODEC_DETAIL_FE5, WEFT_CODEC_DETAIL_FE4, WEFT_CODEC_DETAIL_FE3,                 \
                         WEFT_CODEC_DETAIL_FE2, WEFT_CODEC_DETAIL_FE1)(m, o, __VA_ARGS__)

#define WEFT_CODEC_FIELDS(Type, ...)                                                                   \
  inline auto weftCodecFieldRefs(Type& weftValue) {                                                    \
    return std::tie(WEFT_CODEC_DETAIL_FOR_EACH(WEFT_CODEC_DETAIL_FIELD, weftValue, __VA_ARGS__));      \
  }                                                                                                    \
  inline auto weftCodecFieldRefs(const Type& weftValue) {                                              \
    return std::tie(WEFT_CODEC_DETAIL_FOR_EACH(WEFT_CODEC_DETAIL_FIELD, weftValue, __VA_ARGS__));      \
  }                                                                                                    \
  inline ::weft::rpc::RecordInfo weftCodecRecordInfo(const Type*) { return {#Type, #__VA_ARGS__}; }    \
  static_assert(std::is_default_constructible_v<Type>,                                                 \
                "WEFT_CODEC_FIELDS: " #Type " must be default-constructible (decoding fills a default value)")
