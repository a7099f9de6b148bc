// Codec<T>: how a C++ value becomes a wire::Value (rpc/protocol.capnp) and comes back, checked
// against the type the receiver declared. Include this header for every codec: it holds the trait,
// the per-frame contexts, the scalar, string, byte and tensor codecs and the argument functions,
// and brings in the rest of the family:
//   rpc/codec_containers.h   std::vector, std::map, std::unordered_map, std::optional, std::tuple,
//                            std::pair
//   rpc/codec_record.h       WEFT_CODEC_FIELDS structs
// (rpc/codec.cpp: kind names and decoding errors; rpc/codec_tensor.cpp: tensors and the contexts.)
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
// Types and their wire form (Value union member), by the header that defines their codec:
//  rpc/codec.h
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
//  rpc/codec_containers.h
//   std::vector<T>, T arithmetic          intList / uintList / float32List / float64List / boolList
//   std::vector<T>, other T               list
//   std::map / std::unordered_map<K, V>   map      (duplicate keys are rejected)
//   std::optional<T>                      none, or T's own form (T may not itself be an optional)
//   std::tuple<...> / std::pair<A, B>     tuple    (the element count must match)
//  rpc/codec_record.h
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
// ("element 3: entry 0: key: ...", "field 'label': ...") and both kinds. Hostile input is bounded:
// nesting beyond FrameLimits::maxNesting is rejected (recursive structs can nest at run time),
// list lengths are bounded by the frame's bytes and Cap'n Proto's traversal limit, malformed
// pointers surface as ProtocolError ("malformed value: ..."), never as a crash.
//
// Extension point: a type outside these files gets a codec by specialising Codec (see the
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

// ---- one value ---------------------------------------------------------------------------

// Encodes / decodes one value through its codec (the entry points the container and record codecs
// and the argument functions below use; Encodable checks the type has a codec).
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

// The rest of the family. Each of these includes this file first, so including either alone
// brings the whole family too.
#include "rpc/codec_containers.h"
#include "rpc/codec_record.h"
