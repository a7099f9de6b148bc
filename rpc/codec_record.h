// WEFT_CODEC_FIELDS: a codec for a struct, from the list of its fields. Part of rpc/codec.h,
// which includes this file: include that.
//
//   namespace app {
//   struct Batch { Tensor x; std::vector<int64_t> labels; std::optional<std::string> tag; };
//   WEFT_CODEC_FIELDS(Batch, x, labels, tag);
//   }
//
//   rpc::encodeArguments(enc, call.initArgs(1), app::Batch{x, {3, 1}, "train"});
//   auto [batch] = rpc::decodeArguments<app::Batch>("fit", args, dec);
//   // a mismatch names the field: "fit: argument 0: field 'labels': expected vector<int64>, got
//   // list of float64"
//
// Wire form: a `record` holding the type name as written in the macro ("Batch") and the listed
// fields, in order, each in its own codec's form. The field names do not travel: the receiver
// checks the type name and the field count, then decodes field i as its own field i. Both ends
// must therefore list the same fields in the same order.
//
// Rules: write WEFT_CODEC_FIELDS(Type, field, ...) at namespace scope in the namespace of Type
// (it defines functions found by argument-dependent lookup), after the struct, listing up to 32
// public fields. Type must be default-constructible (decoding fills a default-constructed value);
// unlisted fields keep their default. Each field's type needs a codec; a field may be another
// such struct, or the struct itself inside a container (recursive structs nest at run time, up to
// FrameLimits::maxNesting: each record is a level). A class template, or a type whose fields are
// private, can provide the same three functions by hand (see the macro): weftCodecFieldRefs(T&)
// and (const T&) returning std::tie of the fields, and weftCodecRecordInfo(const T*) returning
// {type name, "field1, field2"}.
//
// Threading: the codec holds no state; the contexts belong to the thread encoding or decoding one
// frame (rpc/codec.h).
#pragma once

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "rpc/codec.h"

namespace weft::rpc {

// What WEFT_CODEC_FIELDS records of a type: its name and its fields' names, for the wire and for
// error messages.
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
