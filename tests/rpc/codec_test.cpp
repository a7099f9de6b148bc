// Codec<T>: every supported type round-trips through a real frame; declared and sent types are
// checked, with errors naming the function, the argument and the path to the value.
#include <cmath>
#include <cstring>
#include <limits>

#include "rpc/codec.h"
#include "weft_test.h"

using namespace weft;
using namespace weft::rpc;

namespace geo {

struct Point {
  double x = 0;
  double y = 0;
  std::string label;
  bool operator==(const Point&) const = default;
};
WEFT_CODEC_FIELDS(Point, x, y, label);

struct Polygon {
  std::vector<Point> outline;
  std::optional<std::map<std::string, int32_t>> tags;
  Tensor mask;
  uint8_t layer = 0;
};
WEFT_CODEC_FIELDS(Polygon, outline, tags, mask, layer);

// Recursive: its depth is only known at run time.
struct Tree {
  int64_t value = 0;
  std::vector<Tree> children;
};
WEFT_CODEC_FIELDS(Tree, value, children);

enum class Shade : uint8_t { Light = 1, Dark = 200 };
enum class Offset : int16_t { Back = -300, Forward = 300 };
enum Plain { kZero, kOne };
enum class Huge : uint64_t { Top = std::numeric_limits<uint64_t>::max() };

// Same fields as Point under another name.
struct Vec2 {
  double x = 0;
  double y = 0;
  std::string label;
};
WEFT_CODEC_FIELDS(Vec2, x, y, label);

}  // namespace geo

namespace {

// One value through a whole frame: encode, flatten, decode the bytes, decode the value.
struct Wire {
  std::vector<std::byte> bytes;
  std::optional<IncomingFrame> frame;

  template <class... Args>
  static Wire call(const Args&... args) {
    FrameWriter writer;
    auto call = writer.message().initCall();
    call.setCallId(1);
    EncodeContext ctx(writer);
    encodeArguments(ctx, call.initArgs(sizeof...(Args)), args...);
    return finish(std::move(writer));
  }
  // Flattens the frame `writer` built and decodes it back.
  static Wire finish(FrameWriter&& writer) {
    Wire w;
    std::move(writer).finish().appendTo(w.bytes);
    FrameDecoder decoder;
    Status s = decoder.feed(w.bytes.data(), w.bytes.size());
    REQUIRE(s.ok());
    w.frame = decoder.next();
    REQUIRE(w.frame.has_value());
    return w;
  }
  capnp::List<wire::Value>::Reader args() const { return frame->message().getCall().getArgs(); }
};

template <class T>
T roundTrip(const T& v) {
  Wire w = Wire::call(v);
  DecodeContext ctx(*w.frame);
  return std::get<0>(decodeArguments<T>("roundTrip", w.args(), ctx));
}

// The ProtocolError message of decoding the arguments of `w` as Args.
template <class... Args>
std::string decodeError(const Wire& w, const char* function = "add", uint32_t maxNesting = 64) {
  DecodeContext ctx(*w.frame, maxNesting);
  try {
    decodeArguments<Args...>(function, w.args(), ctx);
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "(no error)";
}

bool sameValues(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.rawData(), cb.rawData(), ca.nbytes()) == 0;
}

geo::Tree chain(int depth) {
  geo::Tree t{depth, {}};
  for (int d = depth - 1; d >= 0; --d) t = geo::Tree{d, {std::move(t)}};
  return t;
}

}  // namespace

TEST_CASE("scalars round-trip exactly, including their extremes") {
  CHECK(roundTrip(true) == true);
  CHECK(roundTrip(false) == false);
  CHECK(roundTrip(std::numeric_limits<int8_t>::min()) == std::numeric_limits<int8_t>::min());
  CHECK(roundTrip(std::numeric_limits<int16_t>::max()) == std::numeric_limits<int16_t>::max());
  CHECK(roundTrip(int32_t{-123456}) == -123456);
  CHECK(roundTrip(std::numeric_limits<int64_t>::min()) == std::numeric_limits<int64_t>::min());
  CHECK(roundTrip(std::numeric_limits<uint8_t>::max()) == 255);
  CHECK(roundTrip(std::numeric_limits<uint32_t>::max()) == std::numeric_limits<uint32_t>::max());
  CHECK(roundTrip(std::numeric_limits<uint64_t>::max()) == std::numeric_limits<uint64_t>::max());
  CHECK(roundTrip(1.5f) == 1.5f);
  CHECK(roundTrip(std::numeric_limits<double>::denorm_min()) == std::numeric_limits<double>::denorm_min());
  CHECK(std::isinf(roundTrip(-std::numeric_limits<double>::infinity())));
  CHECK(std::isnan(roundTrip(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("strings and bytes round-trip, embedded zeros and all") {
  CHECK(roundTrip(std::string()) == "");
  CHECK(roundTrip(std::string("héllo, wörld")) == "héllo, wörld");
  std::string withZero("a\0b\0", 4);
  CHECK(roundTrip(withZero) == withZero);
  std::vector<uint8_t> bytes = {0, 1, 2, 255, 0};
  CHECK(roundTrip(bytes) == bytes);
  std::vector<std::byte> raw = {std::byte{9}, std::byte{0}};
  CHECK(roundTrip(raw) == raw);
  CHECK(roundTrip(std::vector<uint8_t>{}).empty());
}

TEST_CASE("tensors of every dtype and of zero, one or many bytes round-trip") {
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64}) {
    Tensor t = arange(0, 24, 1, {.dtype = dt}).view({2, 3, 4});
    Tensor got = roundTrip(t);
    CHECK(sameValues(got, t));
    CHECK(got.isContiguous());
  }
  Tensor empty = zeros({0, 5});
  Tensor gotEmpty = roundTrip(empty);
  CHECK(gotEmpty.shape() == Shape{0, 5});
  Tensor scalar = scalarTensor(3.25, DType::Float64);
  Tensor gotScalar = roundTrip(scalar);
  CHECK(gotScalar.dim() == 0);
  CHECK(gotScalar.item<double>() == 3.25);
  Tensor kib = randn({256});  // 1 KiB
  CHECK(sameValues(roundTrip(kib), kib));
  Tensor big = randn({int64_t{16} << 20});  // 64 MiB
  CHECK(sameValues(roundTrip(big), big));
  CHECK_FALSE(roundTrip(Tensor()).defined());
}

TEST_CASE("int32, uint8 and bool tensors round-trip with their dtype and values") {
  Tensor i = fromVector<int32_t>({-2147483647 - 1, -1, 0, 2147483647}, {2, 2});
  Tensor gotI = roundTrip(i);
  CHECK(gotI.dtype() == DType::Int32);
  CHECK(gotI.toVector<int32_t>() == i.toVector<int32_t>());
  Tensor u = fromVector<uint8_t>({0, 1, 128, 255, 7, 9}, {2, 3});
  Tensor gotU = roundTrip(u.t());  // a view: sent as its own contiguous bytes
  CHECK(gotU.dtype() == DType::UInt8);
  CHECK(gotU.shape() == Shape{3, 2});
  CHECK(gotU.toVector<uint8_t>() == std::vector<uint8_t>{0, 255, 1, 7, 128, 9});
  Tensor mask = gt(fromVector<float>({1, 5, 2, 8}), scalarTensor(3));
  Tensor gotMask = roundTrip(mask);
  CHECK(gotMask.dtype() == DType::Bool);
  CHECK(gotMask.toVector<bool>() == std::vector<bool>{false, true, false, true});
  CHECK(roundTrip(zeros({0, 3}, {.dtype = DType::Bool})).shape() == Shape{0, 3});
}

TEST_CASE("storage-only dtypes travel as their bytes") {
  auto storage = Storage::allocate(8, Device::cpu());
  uint16_t halves[4] = {0x3c00, 0x4000, 0xbc00, 0};
  std::memcpy(storage->data(), halves, 8);
  Tensor h = makeTensor(storage, {4}, {1}, 0, DType::Float16);
  Tensor got = roundTrip(h);
  CHECK(got.dtype() == DType::Float16);
  CHECK(std::memcmp(got.rawData(), halves, 8) == 0);
}

TEST_CASE("non-contiguous views are sent as their own contiguous bytes") {
  Tensor base = arange(0, 12, 1, {.dtype = DType::Float32}).view({3, 4});
  Tensor transposed = base.t();
  Tensor got = roundTrip(transposed);
  CHECK(got.shape() == Shape{4, 3});
  CHECK(sameValues(got, transposed));
  Tensor column = base.select(1, 2);  // stride 4
  CHECK(sameValues(roundTrip(column), column));
  Tensor expanded = arange(0, 3, 1, {.dtype = DType::Float64}).unsqueeze(0).expand({1000, 3});
  Wire w = Wire::call(expanded);
  CHECK(w.frame->buffers()[0]->nbytes() == 1000 * 3 * 8);
  DecodeContext ctx(*w.frame);
  CHECK(sameValues(std::get<0>(decodeArguments<Tensor>("f", w.args(), ctx)), expanded));
}

TEST_CASE("a contiguous tensor is encoded without copying its bytes, a view with one copy") {
  Tensor t = randn({1000});
  Tensor view = t.narrow(0, 100, 200);  // contiguous at an offset
  Tensor strided = t.view({500, 2}).select(1, 0);
  FrameWriter writer;
  writer.message().initCall();
  EncodeContext ctx(writer);
  uint32_t i0 = ctx.addTensor(t);
  uint32_t i1 = ctx.addTensor(view);
  uint32_t i2 = ctx.addTensor(strided);
  OutgoingFrame f = std::move(writer).finish();
  auto spans = f.spans();
  size_t first = spans.size() - 3;
  CHECK(static_cast<const void*>(spans[first + i0].data()) == t.rawData());
  CHECK(static_cast<const void*>(spans[first + i1].data()) == view.rawData());
  CHECK(spans[first + i1].size() == 800);
  // The strided view's bytes come from a contiguous copy, owned by the frame.
  CHECK(static_cast<const void*>(spans[first + i2].data()) != strided.rawData());
  CHECK(spans[first + i2].size() == 2000);
}

TEST_CASE("the same tensor passed twice travels once and arrives as one shared storage") {
  Tensor a = randn({64});
  Tensor b = randn({64});
  Wire w = Wire::call(a, b, a, a.narrow(0, 0, 64));
  CHECK(w.frame->buffers().size() == 2);
  DecodeContext ctx(*w.frame);
  auto [ga, gb, ga2, ga3] = decodeArguments<Tensor, Tensor, Tensor, Tensor>("f", w.args(), ctx);
  CHECK(ga.storage() == ga2.storage());
  CHECK(ga.storage() == ga3.storage());
  CHECK(ga.storage() != gb.storage());
  CHECK(sameValues(ga, a));
  CHECK(sameValues(gb, b));
}

TEST_CASE("a decoded tensor's storage is the buffer the frame decoder read its bytes into") {
  Tensor t = randn({4096});
  Wire w = Wire::call(t);
  DecodeContext ctx(*w.frame);
  Tensor got = std::get<0>(decodeArguments<Tensor>("f", w.args(), ctx));
  CHECK(got.storage() == w.frame->buffers()[0]);
  CHECK(got.rawData() == w.frame->buffers()[0]->data());
}

TEST_CASE("a tensor that requires grad arrives as a leaf that requires grad") {
  Tensor w0 = randn({3, 3}).requiresGrad_();
  Tensor got = roundTrip(w0);
  CHECK(got.requiresGrad());
  CHECK(got.isLeaf());
  CHECK_FALSE(roundTrip(randn({2})).requiresGrad());
  // A non-leaf is sent as its values (its graph stays with the sender).
  Tensor y = w0 * 2.0;
  Tensor gotY = roundTrip(y);
  CHECK(gotY.requiresGrad());
  CHECK(gotY.isLeaf());
}

TEST_CASE("packed vectors of arithmetic types round-trip") {
  CHECK(roundTrip(std::vector<int32_t>{-1, 0, 7, std::numeric_limits<int32_t>::min()}) ==
        std::vector<int32_t>{-1, 0, 7, std::numeric_limits<int32_t>::min()});
  CHECK(roundTrip(std::vector<uint16_t>{0, 65535}) == std::vector<uint16_t>{0, 65535});
  CHECK(roundTrip(std::vector<uint64_t>{std::numeric_limits<uint64_t>::max()}) ==
        std::vector<uint64_t>{std::numeric_limits<uint64_t>::max()});
  CHECK(roundTrip(std::vector<bool>{true, false, true}) == std::vector<bool>{true, false, true});
  CHECK(roundTrip(std::vector<float>{0.5f, -2.f}) == std::vector<float>{0.5f, -2.f});
  std::vector<double> many(100000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<double>(i) * 0.25;
  CHECK(roundTrip(many) == many);
  CHECK(roundTrip(std::vector<int64_t>{}).empty());
}

TEST_CASE("containers nest: vectors of maps of optional tuples") {
  using Inner = std::tuple<int32_t, std::string, Tensor>;
  using Nested = std::vector<std::map<std::string, std::optional<Inner>>>;
  Tensor t = randn({2, 2});
  Nested v = {
      {{"a", Inner{1, "one", t}}, {"b", std::nullopt}},
      {},
      {{"c", Inner{-3, "", Tensor()}}},
  };
  Nested got = roundTrip(v);
  REQUIRE(got.size() == 3);
  REQUIRE(got[0].size() == 2);
  REQUIRE(got[0].at("a").has_value());
  CHECK(std::get<0>(*got[0].at("a")) == 1);
  CHECK(std::get<1>(*got[0].at("a")) == "one");
  CHECK(sameValues(std::get<2>(*got[0].at("a")), t));
  CHECK_FALSE(got[0].at("b").has_value());
  CHECK(got[1].empty());
  CHECK(std::get<0>(*got[2].at("c")) == -3);
  CHECK_FALSE(std::get<2>(*got[2].at("c")).defined());

  std::unordered_map<int64_t, std::vector<std::string>> um = {{1, {"x", "y"}}, {-5, {}}};
  CHECK(roundTrip(um) == um);
  std::pair<std::string, std::vector<double>> p{"w", {1.0, 2.0}};
  CHECK(roundTrip(p) == p);
  CHECK(roundTrip(std::tuple<>()) == std::tuple<>());
  std::optional<int32_t> none;
  CHECK(roundTrip(none) == std::nullopt);
  CHECK(roundTrip(std::optional<int32_t>(0)) == 0);
  std::vector<std::vector<int32_t>> vv = {{1}, {}, {2, 3}};
  CHECK(roundTrip(vv) == vv);
}

TEST_CASE("structs declared with WEFT_CODEC_FIELDS round-trip, nested and recursive") {
  geo::Point p{1.5, -2, "corner"};
  CHECK(roundTrip(p) == p);
  geo::Polygon s{{p, {0, 0, ""}}, std::map<std::string, int32_t>{{"z", 3}}, ones({2, 2}), 7};
  geo::Polygon got = roundTrip(s);
  CHECK(got.outline == s.outline);
  REQUIRE(got.tags.has_value());
  CHECK(got.tags->at("z") == 3);
  CHECK(sameValues(got.mask, s.mask));
  CHECK(got.layer == 7);
  geo::Tree tree{1, {{2, {}}, {3, {{4, {}}}}}};
  geo::Tree gotTree = roundTrip(tree);
  REQUIRE(gotTree.children.size() == 2);
  CHECK(gotTree.children[1].children[0].value == 4);
  CHECK(Codec<geo::Polygon>::typeName() == "Polygon");
  CHECK(Codec<std::vector<std::optional<geo::Point>>>::typeName() == "vector<optional<Point>>");
}

TEST_CASE("function arguments decode as their declared types, decayed") {
  Tensor a = randn({3});
  Wire w = Wire::call(a, 2.5, std::string("mode"));
  DecodeContext ctx(*w.frame);
  auto [t, scale, mode] = decodeArguments<const Tensor&, double, const std::string&>("scale", w.args(), ctx);
  CHECK(sameValues(t, a));
  CHECK(scale == 2.5);
  CHECK(mode == "mode");
  Wire none = Wire::call();
  DecodeContext ctx2(*none.frame);
  CHECK(decodeArguments<>("ping", none.args(), ctx2) == std::tuple<>());
}

TEST_CASE("arguments held in a tuple encode like a parameter pack") {
  FrameWriter writer;
  auto call = writer.message().initCall();
  EncodeContext ectx(writer);
  std::tuple<int32_t, std::string, std::vector<double>> args{7, "seven", {7.0}};
  encodeArgumentTuple(ectx, call.initArgs(3), args);
  Wire w = Wire::finish(std::move(writer));
  DecodeContext ctx(*w.frame);
  CHECK(decodeArguments<int32_t, std::string, std::vector<double>>("f", w.args(), ctx) == args);
}

TEST_CASE("results decode as their declared type, and a mismatch names the result") {
  FrameWriter writer;
  auto response = writer.message().initResponse();
  response.setCallId(3);
  EncodeContext ectx(writer);
  encodeResult(ectx, response.initValue(), std::string("oops"));
  Wire w = Wire::finish(std::move(writer));
  DecodeContext ctx(*w.frame);
  auto value = w.frame->message().getResponse().getValue();
  CHECK(decodeResult<std::string>("add", value, ctx) == "oops");
  CHECK_THROWS_WITH_AS(decodeResult<Tensor>("add", value, ctx), "add: result: expected tensor, got string",
                       ProtocolError);
}

// ---- mismatches ------------------------------------------------------------------------------

TEST_CASE("a type mismatch names the function and the argument index") {
  Wire w = Wire::call(randn({2}), std::string("x"));
  CHECK(decodeError<Tensor, Tensor>(w) == "add: argument 1: expected tensor, got string");
  CHECK(decodeError<std::string, std::string>(w) == "add: argument 0: expected string, got tensor");
  CHECK(decodeError<Tensor>(w) == "add: expected 1 argument, got 2");
  CHECK(decodeError<Tensor, std::string, int>(w) == "add: expected 3 arguments, got 2");
}

TEST_CASE("a mismatch deep inside a value names the path to it") {
  std::vector<geo::Point> pts = {{0, 0, "a"}, {1, 1, "b"}};
  Wire w = Wire::call(pts);
  CHECK(decodeError<std::vector<geo::Vec2>>(w, "plot") ==
        "plot: argument 0: element 0: expected struct Vec2, got struct Point");

  std::map<std::string, std::vector<std::string>> m = {{"k", {"v"}}};
  Wire wm = Wire::call(m);
  CHECK(decodeError<std::map<std::string, std::vector<int64_t>>>(wm, "f") ==
        "f: argument 0: entry 0: value: expected vector<int64>, got list");
  CHECK(decodeError<std::map<int64_t, std::vector<std::string>>>(wm, "f") ==
        "f: argument 0: entry 0: key: expected int64, got string");

  Wire wt = Wire::call(std::make_tuple(1, std::string("s"), 2.0));
  CHECK(decodeError<std::tuple<int32_t, std::string, float>>(wt, "f") ==
        "f: argument 0: element 2: expected float32, got float64");
  CHECK(decodeError<std::pair<int32_t, std::string>>(wt, "f") ==
        "f: argument 0: expected pair<int32, string> (2 elements), got a tuple of 3");

  geo::Polygon s{{{1, 2, "x"}}, std::nullopt, Tensor(), 1};
  Wire ws = Wire::call(s);
  CHECK(decodeError<geo::Point>(ws, "f") == "f: argument 0: expected struct Point, got struct Polygon");
}

TEST_CASE("integers are range-checked against the declared type") {
  Wire w = Wire::call(int64_t{300}, uint64_t{70000}, std::vector<int64_t>{1, -129});
  CHECK(decodeError<int8_t, uint64_t, std::vector<int64_t>>(w, "f") ==
        "f: argument 0: value 300 is out of range for int8");
  CHECK(decodeError<int16_t, uint16_t, std::vector<int64_t>>(w, "f") ==
        "f: argument 1: value 70000 is out of range for uint16");
  CHECK(decodeError<int16_t, uint32_t, std::vector<int8_t>>(w, "f") ==
        "f: argument 2: element 1: value -129 is out of range for int8");
  // Signed and unsigned are different kinds: the declarations disagree.
  CHECK(decodeError<uint64_t, uint64_t, std::vector<int64_t>>(w, "f") == "f: argument 0: expected uint64, got int");
}

TEST_CASE("enums travel as their underlying integer and are range-checked against it") {
  CHECK(roundTrip(geo::Shade::Dark) == geo::Shade::Dark);
  CHECK(roundTrip(geo::Offset::Back) == geo::Offset::Back);
  CHECK(roundTrip(geo::kOne) == geo::kOne);
  CHECK(roundTrip(std::vector<geo::Shade>{geo::Shade::Light, geo::Shade::Dark}) ==
        std::vector<geo::Shade>{geo::Shade::Light, geo::Shade::Dark});
  CHECK(Codec<geo::Shade>::typeName() == "enum(uint8)");
  // The int member, whatever the underlying signedness.
  Wire w = Wire::call(geo::Shade::Dark, geo::Offset::Back, int64_t{256}, uint64_t{1});
  CHECK(w.args()[0].which() == wire::Value::INT);
  CHECK(decodeError<int64_t, geo::Offset, int64_t, uint64_t>(w, "f") == "(no error)");
  CHECK(decodeError<geo::Shade, geo::Shade, geo::Shade, uint64_t>(w, "f") ==
        "f: argument 1: value -300 is out of range for enum(uint8)");
  CHECK(decodeError<geo::Shade, geo::Offset, geo::Shade, uint64_t>(w, "f") ==
        "f: argument 2: value 256 is out of range for enum(uint8)");
  CHECK(decodeError<geo::Shade, geo::Offset, int64_t, geo::Shade>(w, "f") ==
        "f: argument 3: expected enum(uint8), got uint");
  // An unsigned 64-bit value the int member cannot hold is refused when sent.
  CHECK_THROWS_AS(Wire::call(geo::Huge::Top), InvalidArgumentError);
}

TEST_CASE("a struct with a different number of fields is rejected") {
  FrameWriter writer;
  auto call = writer.message().initCall();
  auto record = call.initArgs(1)[0].initRecord();
  record.setTypeName("Point");
  record.initFields(2);
  Wire w = Wire::finish(std::move(writer));
  DecodeContext ctx(*w.frame);
  CHECK_THROWS_WITH_AS(decodeArguments<geo::Point>("f", w.args(), ctx),
                       "f: argument 0: expected struct Point with 3 fields, got 2", ProtocolError);
}

// ---- hostile values ----------------------------------------------------------------------------

namespace {

// A frame whose single argument was written by `fill` straight into the Cap'n Proto builder,
// with `buffers` out-of-band buffers of the given sizes.
template <class Fill>
Wire handMade(Fill fill, std::vector<size_t> buffers = {}) {
  FrameWriter writer;
  auto call = writer.message().initCall();
  fill(call.initArgs(1)[0]);
  for (size_t n : buffers) writer.addBuffer(n ? Storage::allocate(n, Device::cpu()) : nullptr, 0, n);
  return Wire::finish(std::move(writer));
}

void setDesc(wire::Value::Builder v, std::vector<int64_t> shape, uint64_t bytes, uint32_t buffer,
             uint16_t dtype = 0) {
  auto d = v.initTensor();
  d.setDtype(static_cast<wire::DType>(dtype));
  auto dims = d.initShape(static_cast<unsigned>(shape.size()));
  for (size_t i = 0; i < shape.size(); ++i) dims.set(static_cast<unsigned>(i), shape[i]);
  d.setByteLength(bytes);
  d.setBuffer(buffer);
}

}  // namespace

TEST_CASE("tensor descriptors that lie are rejected before a tensor is built") {
  CHECK(decodeError<Tensor>(handMade([](auto v) { setDesc(v, {2, 2}, 16, 1); }, {16})) ==
        "add: argument 0: tensor names out-of-band buffer 1, but the frame has 1");
  CHECK(decodeError<Tensor>(handMade([](auto v) { setDesc(v, {2, 2}, 16, 0); }, {8})) ==
        "add: argument 0: tensor of 16 bytes names out-of-band buffer 0, which holds 8");
  CHECK(decodeError<Tensor>(handMade([](auto v) { setDesc(v, {2, 3}, 16, 0); }, {16})) ==
        "add: argument 0: tensor of shape [2, 3] and dtype float32 cannot be 16 bytes long");
  CHECK(decodeError<Tensor>(handMade([](auto v) { setDesc(v, {int64_t{1} << 40, int64_t{1} << 40}, 0, 0); }, {0}))
            .find("cannot be 0 bytes long") != std::string::npos);
  CHECK(decodeError<Tensor>(handMade([](auto v) { setDesc(v, {-1, -4}, 16, 0); }, {16})) ==
        "add: argument 0: tensor has negative size -1 in dimension 0");
  CHECK(decodeError<Tensor>(handMade([](auto v) { setDesc(v, std::vector<int64_t>(17, 1), 4, 0); }, {4})) ==
        "add: argument 0: tensor has 17 dimensions, more than the 16 weft supports");
  CHECK(decodeError<Tensor>(handMade([](auto v) { setDesc(v, {2}, 8, 0, 9); }, {8})) ==
        "add: argument 0: tensor has unknown dtype 9");
  CHECK(decodeError<Tensor>(handMade(
            [](auto v) {
              setDesc(v, {1}, 8, 0, static_cast<uint16_t>(DType::Int64));
              v.getTensor().setRequiresGrad(true);
            },
            {8})) == "add: argument 0: tensor of dtype int64 claims to require grad");
}

TEST_CASE("a bool tensor whose bytes are not all 0 or 1 is rejected") {
  auto bytes = Storage::allocate(4, Device::cpu());
  const uint8_t raw[4] = {0, 1, 2, 1};
  std::memcpy(bytes->data(), raw, 4);
  FrameWriter writer;
  auto call = writer.message().initCall();
  setDesc(call.initArgs(1)[0], {2, 2}, 4, 0, static_cast<uint16_t>(DType::Bool));
  writer.addBuffer(bytes, 0, 4);
  CHECK(decodeError<Tensor>(Wire::finish(std::move(writer))) ==
        "add: argument 0: bool tensor of shape [2, 2] has byte 2 at element 2 (a bool is 0 or 1)");
  // The same bytes as uint8 are fine.
  FrameWriter asBytes;
  auto call2 = asBytes.message().initCall();
  setDesc(call2.initArgs(1)[0], {2, 2}, 4, 0, static_cast<uint16_t>(DType::UInt8));
  asBytes.addBuffer(bytes, 0, 4);
  Wire w = Wire::finish(std::move(asBytes));
  DecodeContext ctx(*w.frame);
  CHECK(std::get<0>(decodeArguments<Tensor>("f", w.args(), ctx)).toVector<uint8_t>() ==
        std::vector<uint8_t>{0, 1, 2, 1});
  CHECK(decodeError<Tensor>(handMade([](auto v) { setDesc(v, {2}, 2, 0, 8); }, {2})) ==
        "add: argument 0: tensor has unknown dtype 8");
}

TEST_CASE("duplicate map keys are rejected") {
  Wire w = handMade([](auto v) {
    auto entries = v.initMap(2);
    for (unsigned i = 0; i < 2; ++i) {
      entries[i].initKey().setText("same");
      entries[i].initValue().setInt(static_cast<int64_t>(i));
    }
  });
  CHECK(decodeError<std::map<std::string, int32_t>>(w, "f") ==
        "f: argument 0: entry 1: duplicate key in map<string, int32>");
  CHECK(decodeError<std::unordered_map<std::string, int32_t>>(w, "f") ==
        "f: argument 0: entry 1: duplicate key in unordered_map<string, int32>");
}

TEST_CASE("values nested past the limit are rejected, whichever limit trips first") {
  geo::Tree deep = chain(30);  // 62 levels: a struct and a vector per tree level
  Wire w = Wire::call(deep);
  // The codec's own limit.
  std::string e = decodeError<geo::Tree>(w, "f", 10);
  CHECK_MESSAGE(e.find("nested deeper than the limit of 10 levels") != std::string::npos, e);
  // Within the limit it decodes.
  CHECK(decodeError<geo::Tree>(w, "f", 64) == "(no error)");
  CHECK(decodeError<geo::Tree>(w, "f", 59).find("nested deeper than the limit of 59") != std::string::npos);
  // Cap'n Proto's pointer nesting limit (derived from FrameLimits::maxNesting) guards the reader.
  FrameDecoder d(FrameLimits{.maxNesting = 8});
  REQUIRE(d.feed(w.bytes.data(), w.bytes.size()).ok());
  auto f = d.next();
  REQUIRE(f.has_value());
  DecodeContext ctx(*f, 1000);
  try {
    decodeArguments<geo::Tree>("f", f->message().getCall().getArgs(), ctx);
    FAIL("a 30-level tree decoded under a nesting limit of 8");
  } catch (const ProtocolError& err) {
    CHECK_MESSAGE(std::string(err.what()).find("malformed value") != std::string::npos, err.what());
  }
}

TEST_CASE("a frame's values are decoded under its decoder's nesting limit") {
  Wire w = Wire::call(chain(12));  // 26 levels
  FrameDecoder d(FrameLimits{.maxNesting = 20});
  REQUIRE(d.feed(w.bytes.data(), w.bytes.size()).ok());
  auto f = d.next();
  REQUIRE(f.has_value());
  CHECK(f->maxNesting() == 20);
  DecodeContext ctx(*f);
  CHECK_THROWS_WITH_AS(decodeArguments<geo::Tree>("f", f->message().getCall().getArgs(), ctx),
                       doctest::Contains("nested deeper than the limit of 20 levels"), ProtocolError);
}

TEST_CASE("a list of zero-sized elements cannot pose as a huge list") {
  // A List(Value) pointer claiming 2^28 elements of zero size: one word on the wire.
  Wire w = handMade([](auto v) { v.initList(1); });
  // Rewrite the inner list's pointer in place: element size 0 (void), 2^28 elements. The
  // segment starts after the 32-byte preamble and the 8-byte segment table.
  const size_t segment = 40;
  size_t words = (w.bytes.size() - segment) / 8;
  size_t last = 0;
  bool patched = false;
  for (size_t i = 1; i < words; ++i) {
    uint64_t p;
    std::memcpy(&p, w.bytes.data() + segment + 8 * i, 8);
    // A list pointer (tag 1) with inline-composite elements (size 7) of 3 words in all: the
    // args list comes first, the inner one-element list last.
    if ((p & 3) == 1 && ((p >> 32) & 7) == 7 && (p >> 35) == 3) {
      last = i;
      patched = true;
    }
  }
  if (patched) {
    uint64_t p;
    std::memcpy(&p, w.bytes.data() + segment + 8 * last, 8);
    p = (p & 0xffffffffull) | (uint64_t{1} << 63);  // size 0, count 2^28
    std::memcpy(w.bytes.data() + segment + 8 * last, &p, 8);
  }
  REQUIRE(patched);
  FrameDecoder d;
  REQUIRE(d.feed(w.bytes.data(), w.bytes.size()).ok());
  auto f = d.next();
  REQUIRE(f.has_value());
  DecodeContext ctx(*f);
  try {
    auto v = decodeArguments<std::vector<std::optional<geo::Point>>>("f", f->message().getCall().getArgs(), ctx);
    // Cap'n Proto may refuse the list or charge it to the traversal limit; either way it must not
    // have produced 2^28 elements.
    CHECK(std::get<0>(v).size() < 1000);
  } catch (const ProtocolError& err) {
    CHECK_MESSAGE(std::string(err.what()).rfind("f: argument 0", 0) == 0, err.what());
  }
}

TEST_CASE("extensions attached to a context are found by type") {
  struct ForkLog {
    int sent = 0;
  };
  struct Other {};
  FrameWriter writer;
  EncodeContext ctx(writer);
  ForkLog log;
  CHECK(ctx.extensions().find<ForkLog>() == nullptr);
  ctx.extensions().attach(&log);
  CHECK(ctx.extensions().find<ForkLog>() == &log);
  CHECK(ctx.extensions().find<Other>() == nullptr);
}

TEST_CASE("encoding refuses tensors the wire cannot carry") {
  FrameWriter writer;
  EncodeContext ctx(writer);
  CHECK_THROWS_AS(ctx.addTensor(Tensor()), InvalidArgumentError);
  CHECK(nameId("add") == nameId(std::string("a") + "dd"));
  CHECK(nameId("add") != nameId("sub"));
  static_assert(nameId("") == 0xcbf29ce484222325ull);
  static_assert(nameId("a") == 0xaf63dc4c8601ec8cull);  // FNV-1a test vector
}
