// The Agent's behaviour, with every agent of a job living in this process
// (tests/rpc/agent_util.h: each has its own loop thread, pool and sockets, and
// they talk over real TCP on 127.0.0.1): values of every codec type through real
// calls, declaration mismatches, many concurrent calls, nested calls on a small
// pool, remote errors, timeouts and what they leave behind, a peer that goes
// away, graceful and abrupt shutdown, and start errors. Every wait is bounded.
#include <doctest/doctest.h>
#include <dirent.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "rpc/agent.h"
#include "tensor/ops.h"  // every op beside the agent: programs use both
#include "rpc/agent_util.h"
#include "text_util.h"

using namespace weft;
using namespace weft::rpc;
using namespace std::chrono_literals;
using weft::testing::AgentGroup;
using weft::testing::eventually;

namespace sprites {

struct Color {
  uint8_t r = 0;
  uint8_t g = 0;
  uint8_t b = 0;
  std::string name;
  bool operator==(const Color&) const = default;
};
WEFT_CODEC_FIELDS(Color, r, g, b, name);

// A struct holding another struct, containers of them and a tensor.
struct Sprite {
  std::string id;
  Color color;
  std::vector<Color> palette;
  std::optional<int32_t> layer;
  std::map<std::string, double> props;
  Tensor pixels;
};
WEFT_CODEC_FIELDS(Sprite, id, color, palette, layer, props, pixels);

}  // namespace sprites

using weft::testing::contains;

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// "a, b, c", for messages about lists of names.
std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Same dtype, shape and bytes.
bool sameTensor(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ca = a.contiguous();
  Tensor cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.rawData(), cb.rawData(), ca.nbytes()) == 0;
}

// "TypeName: message" of an exception, for failure messages (doctest prints a
// const char* as a pointer).
std::string describeError(const std::exception& e) { return std::string(typeid(e).name()) + ": " + e.what(); }

// Runs f and returns the message of the E it throws; any other outcome fails the check.
template <class E, class F>
std::string messageOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("expected " << std::string(typeid(E).name()) << ", got " << describeError(e));
    return {};
  }
  FAIL_CHECK("expected " << std::string(typeid(E).name()) << ", nothing was thrown");
  return {};
}

// A door handlers wait at until the test opens it (or a bound passes, so a
// failing test cannot leave a pool thread stuck).
class Gate {
 public:
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void wait(std::chrono::milliseconds bound = 5s) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, bound, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// ---- declarations shared by callers and callees ---------------------------------------------

const Function<bool(bool)> echoBool{"echo.bool"};
const Function<int8_t(int8_t)> echoI8{"echo.i8"};
const Function<int16_t(int16_t)> echoI16{"echo.i16"};
const Function<int32_t(int32_t)> echoI32{"echo.i32"};
const Function<int64_t(int64_t)> echoI64{"echo.i64"};
const Function<uint8_t(uint8_t)> echoU8{"echo.u8"};
const Function<uint16_t(uint16_t)> echoU16{"echo.u16"};
const Function<uint32_t(uint32_t)> echoU32{"echo.u32"};
const Function<uint64_t(uint64_t)> echoU64{"echo.u64"};
const Function<float(float)> echoF32{"echo.f32"};
const Function<double(double)> echoF64{"echo.f64"};
const Function<std::string(std::string)> echoString{"echo.string"};
const Function<std::vector<uint8_t>(std::vector<uint8_t>)> echoBytes{"echo.bytes"};
const Function<std::vector<std::byte>(std::vector<std::byte>)> echoRawBytes{"echo.rawbytes"};
const Function<std::vector<int64_t>(std::vector<int64_t>)> echoVecI64{"echo.vec.i64"};
const Function<std::vector<int8_t>(std::vector<int8_t>)> echoVecI8{"echo.vec.i8"};
const Function<std::vector<uint64_t>(std::vector<uint64_t>)> echoVecU64{"echo.vec.u64"};
const Function<std::vector<float>(std::vector<float>)> echoVecF32{"echo.vec.f32"};
const Function<std::vector<double>(std::vector<double>)> echoVecF64{"echo.vec.f64"};
const Function<std::vector<bool>(std::vector<bool>)> echoVecBool{"echo.vec.bool"};
const Function<std::vector<std::string>(std::vector<std::string>)> echoVecString{"echo.vec.string"};
const Function<std::vector<std::vector<int32_t>>(std::vector<std::vector<int32_t>>)> echoNested{"echo.vec.vec.i32"};
const Function<std::vector<std::vector<std::string>>(std::vector<std::vector<std::string>>)> echoNestedStrings{
    "echo.vec.vec.string"};
const Function<std::vector<Tensor>(std::vector<Tensor>)> echoVecTensor{"echo.vec.tensor"};
const Function<std::map<std::string, std::vector<int64_t>>(std::map<std::string, std::vector<int64_t>>)> echoMap{
    "echo.map"};
const Function<std::unordered_map<int64_t, std::string>(std::unordered_map<int64_t, std::string>)> echoUMap{
    "echo.umap"};
const Function<std::optional<std::string>(std::optional<std::string>)> echoOptional{"echo.optional"};
const Function<std::optional<Tensor>(std::optional<Tensor>)> echoOptionalTensor{"echo.optional.tensor"};
const Function<std::tuple<int32_t, std::string, double, bool>(std::tuple<int32_t, std::string, double, bool>)>
    echoTuple{"echo.tuple"};
const Function<std::pair<std::string, int64_t>(std::pair<std::string, int64_t>)> echoPair{"echo.pair"};
const Function<sprites::Sprite(sprites::Sprite)> echoSprite{"echo.sprite"};
const Function<Tensor(Tensor)> echoTensor{"echo.tensor"};

// Several parameters of different kinds, and the result built from all of them.
const Function<std::string(int32_t, std::string, std::vector<double>, bool)> describe{"describe"};
// The callee's view of two tensor arguments: whether they share storage, and both back.
const Function<std::tuple<bool, Tensor, Tensor>(Tensor, Tensor)> pairOfTensors{"tensors.pair"};
// A checksum computed on the callee, so each direction of a transfer is checked on its own.
const Function<double(Tensor)> tensorSum{"tensor.sum"};

const Function<void(int32_t)> note{"note"};
const Function<void()> ping{"ping"};
const Function<int32_t()> answer{"answer"};
const Function<std::string()> whoami{"whoami"};

const Function<int64_t(int64_t)> squareOf{"square"};
// Sleeps `ms` milliseconds on a pool thread, then returns tag.
const Function<int32_t(int32_t, int32_t)> slow{"slow"};
// Waits at the test's gate, then returns its argument.
const Function<int32_t(int32_t)> hold{"hold"};
// relay(depth, acc): see the nested-calls test.
const Function<int64_t(int32_t, int64_t)> relay{"relay"};

const Function<int32_t(int32_t)> throwsRuntime{"throws.runtime"};
const Function<int32_t(int32_t)> throwsInvalid{"throws.invalid"};
const Function<int32_t(int32_t)> failedFuture{"future.failed"};
const Function<int32_t(int32_t)> failedFutureLater{"future.failed.later"};
const Function<int32_t(int32_t)> failedStatus{"future.failed.status"};

template <class T>
void bindEcho(Registry& r, const Function<T(T)>& fn) {
  r.impl(fn, [](T v) { return v; });
}

void bindEchoes(Registry& r) {
  bindEcho(r, echoBool);
  bindEcho(r, echoI8);
  bindEcho(r, echoI16);
  bindEcho(r, echoI32);
  bindEcho(r, echoI64);
  bindEcho(r, echoU8);
  bindEcho(r, echoU16);
  bindEcho(r, echoU32);
  bindEcho(r, echoU64);
  bindEcho(r, echoF32);
  bindEcho(r, echoF64);
  bindEcho(r, echoString);
  bindEcho(r, echoBytes);
  bindEcho(r, echoRawBytes);
  bindEcho(r, echoVecI64);
  bindEcho(r, echoVecI8);
  bindEcho(r, echoVecU64);
  bindEcho(r, echoVecF32);
  bindEcho(r, echoVecF64);
  bindEcho(r, echoVecBool);
  bindEcho(r, echoVecString);
  bindEcho(r, echoNested);
  bindEcho(r, echoNestedStrings);
  bindEcho(r, echoVecTensor);
  bindEcho(r, echoMap);
  bindEcho(r, echoUMap);
  bindEcho(r, echoOptional);
  bindEcho(r, echoOptionalTensor);
  bindEcho(r, echoTuple);
  bindEcho(r, echoPair);
  bindEcho(r, echoSprite);
  bindEcho(r, echoTensor);
  r.impl(describe, [](int32_t n, const std::string& s, const std::vector<double>& v, bool flag) {
    double total = 0;
    for (double x : v) total += x;
    return std::to_string(n) + "|" + s + "|" + std::to_string(total) + "|" + (flag ? "yes" : "no");
  });
  r.impl(pairOfTensors, [](Tensor a, Tensor b) { return std::make_tuple(a.storage() == b.storage(), a, b); });
  r.impl(tensorSum, [](const Tensor& t) { return t.to(DType::Float64).sum().item<double>(); });
}

// An agent's two-thread pool is enough for the tests; slow bodies sleep on it.
void bindSlow(Registry& r) {
  r.impl(slow, [](int32_t ms, int32_t tag) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return tag;
  });
}

AgentStats stats(AgentGroup& g, int rank) { return g.agent(rank).stats(); }

// Every agent of g has no call in flight either way (replies may still be
// leaving a callee a moment after the caller has its result).
bool quiet(AgentGroup& g) {
  for (int r = 0; r < g.size(); ++r) {
    AgentStats s = stats(g, r);
    if (s.pendingOutgoing != 0 || s.activeIncoming != 0) return false;
  }
  return true;
}

}  // namespace

// ---- values ------------------------------------------------------------------------------------

TEST_CASE("every scalar type round-trips through a real call, extremes included") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  CHECK(a.sync(1, echoBool, true) == true);
  CHECK(a.sync(1, echoBool, false) == false);
  for (int8_t v : {std::numeric_limits<int8_t>::min(), int8_t{-1}, int8_t{0}, std::numeric_limits<int8_t>::max()}) {
    CHECK(a.sync(1, echoI8, v) == v);
  }
  for (int16_t v : {std::numeric_limits<int16_t>::min(), int16_t{-300}, std::numeric_limits<int16_t>::max()}) {
    CHECK(a.sync(1, echoI16, v) == v);
  }
  for (int32_t v : {std::numeric_limits<int32_t>::min(), -123456, std::numeric_limits<int32_t>::max()}) {
    CHECK(a.sync(1, echoI32, v) == v);
  }
  for (int64_t v : {std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{1} << 40,
                    std::numeric_limits<int64_t>::max()}) {
    CHECK(a.sync(1, echoI64, v) == v);
  }
  for (uint8_t v : {uint8_t{0}, uint8_t{128}, std::numeric_limits<uint8_t>::max()}) CHECK(a.sync(1, echoU8, v) == v);
  for (uint16_t v : {uint16_t{0}, std::numeric_limits<uint16_t>::max()}) CHECK(a.sync(1, echoU16, v) == v);
  for (uint32_t v : {0u, 1u << 31, std::numeric_limits<uint32_t>::max()}) CHECK(a.sync(1, echoU32, v) == v);
  for (uint64_t v : {uint64_t{0}, uint64_t{1} << 63, std::numeric_limits<uint64_t>::max()}) {
    CHECK(a.sync(1, echoU64, v) == v);
  }

  CHECK(a.sync(1, echoF32, 1.5f) == 1.5f);
  CHECK(a.sync(1, echoF32, std::numeric_limits<float>::lowest()) == std::numeric_limits<float>::lowest());
  CHECK(a.sync(1, echoF32, std::numeric_limits<float>::denorm_min()) == std::numeric_limits<float>::denorm_min());
  CHECK(std::isnan(a.sync(1, echoF32, std::numeric_limits<float>::quiet_NaN())));
  CHECK(a.sync(1, echoF32, std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(a.sync(1, echoF64, 0.1) == 0.1);
  CHECK(a.sync(1, echoF64, std::numeric_limits<double>::max()) == std::numeric_limits<double>::max());
  CHECK(a.sync(1, echoF64, std::numeric_limits<double>::denorm_min()) == std::numeric_limits<double>::denorm_min());
  CHECK(std::isnan(a.sync(1, echoF64, std::numeric_limits<double>::quiet_NaN())));
  CHECK(a.sync(1, echoF64, -std::numeric_limits<double>::infinity()) == -std::numeric_limits<double>::infinity());
  double negZero = a.sync(1, echoF64, -0.0);
  CHECK(negZero == 0.0);
  CHECK(std::signbit(negZero));
}

TEST_CASE("strings and bytes round-trip through a real call: empty, with NUL bytes, and 1 MiB") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  CHECK(a.sync(1, echoString, std::string()).empty());
  std::string withNul("a\0b\0\0c", 6);
  std::string gotNul = a.sync(1, echoString, withNul);
  CHECK(gotNul.size() == 6);
  CHECK(gotNul == withNul);
  CHECK(a.sync(1, echoString, std::string("héllo, wörld")) == "héllo, wörld");

  std::mt19937 rng(7);
  std::string mib(size_t{1} << 20, '\0');
  for (char& c : mib) c = static_cast<char>(rng() & 0xff);  // every byte value, NULs included
  std::string gotMib = a.sync(1, echoString, mib);
  CHECK(gotMib.size() == mib.size());
  CHECK(gotMib == mib);

  std::vector<uint8_t> bytes(100000);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  bytes[0] = 0;
  CHECK(a.sync(1, echoBytes, bytes) == bytes);
  CHECK(a.sync(1, echoBytes, std::vector<uint8_t>{}).empty());
  std::vector<std::byte> raw = {std::byte{0}, std::byte{255}, std::byte{0}, std::byte{17}};
  CHECK(a.sync(1, echoRawBytes, raw) == raw);
}

TEST_CASE("vectors, nested vectors, maps, optionals, tuples and pairs round-trip through a real call") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  std::vector<int64_t> ints = {std::numeric_limits<int64_t>::min(), -1, 0, 1, std::numeric_limits<int64_t>::max()};
  CHECK(a.sync(1, echoVecI64, ints) == ints);
  CHECK(a.sync(1, echoVecI64, std::vector<int64_t>{}).empty());
  std::vector<int8_t> small = {-128, 0, 127};
  CHECK(a.sync(1, echoVecI8, small) == small);
  std::vector<uint64_t> unsignedInts = {0, std::numeric_limits<uint64_t>::max()};
  CHECK(a.sync(1, echoVecU64, unsignedInts) == unsignedInts);
  std::vector<float> floats = {0.5f, -2.25f, std::numeric_limits<float>::infinity()};
  CHECK(a.sync(1, echoVecF32, floats) == floats);
  std::vector<double> doubles(10000);
  for (size_t i = 0; i < doubles.size(); ++i) doubles[i] = std::sqrt(static_cast<double>(i)) - 50.0;
  CHECK(a.sync(1, echoVecF64, doubles) == doubles);
  std::vector<bool> bools = {true, false, false, true, true};
  CHECK(a.sync(1, echoVecBool, bools) == bools);
  std::vector<std::string> strings = {"", "one", std::string("t\0o", 3), std::string(1000, 'x')};
  CHECK(a.sync(1, echoVecString, strings) == strings);

  std::vector<std::vector<int32_t>> nested = {{}, {1}, {2, 3, -4}, {}};
  CHECK(a.sync(1, echoNested, nested) == nested);
  std::vector<std::vector<std::string>> nestedStrings = {{"a", "b"}, {}, {"c"}};
  CHECK(a.sync(1, echoNestedStrings, nestedStrings) == nestedStrings);

  std::map<std::string, std::vector<int64_t>> map = {{"", {}}, {"alpha", {1, 2}}, {"beta", {-3}}};
  CHECK(a.sync(1, echoMap, map) == map);
  CHECK(a.sync(1, echoMap, std::map<std::string, std::vector<int64_t>>{}).empty());
  std::unordered_map<int64_t, std::string> umap = {{-5, "minus five"}, {0, ""}, {1LL << 50, "big"}};
  CHECK(a.sync(1, echoUMap, umap) == umap);

  CHECK(a.sync(1, echoOptional, std::optional<std::string>("set")) == std::optional<std::string>("set"));
  CHECK(a.sync(1, echoOptional, std::optional<std::string>("")) == std::optional<std::string>(""));
  CHECK_FALSE(a.sync(1, echoOptional, std::nullopt).has_value());
  Tensor t = arange(0, 6, 1, {.dtype = DType::Float32}).view({2, 3});
  std::optional<Tensor> gotT = a.sync(1, echoOptionalTensor, std::optional<Tensor>(t));
  REQUIRE(gotT.has_value());
  CHECK(sameTensor(*gotT, t));
  CHECK_FALSE(a.sync(1, echoOptionalTensor, std::nullopt).has_value());

  auto tuple = std::make_tuple(int32_t{-7}, std::string("seven"), 7.5, true);
  CHECK(a.sync(1, echoTuple, tuple) == tuple);
  auto pair = std::make_pair(std::string("key"), int64_t{1} << 62);
  CHECK(a.sync(1, echoPair, pair) == pair);

  std::vector<Tensor> tensors = {randn({3}), Tensor(), arange(0, 4, 1, {.dtype = DType::Int64})};
  std::vector<Tensor> gotTensors = a.sync(1, echoVecTensor, tensors);
  REQUIRE(gotTensors.size() == 3);
  CHECK(sameTensor(gotTensors[0], tensors[0]));
  CHECK_FALSE(gotTensors[1].defined());
  CHECK(sameTensor(gotTensors[2], tensors[2]));

  std::string described = a.sync(1, describe, 3, std::string("three"), std::vector<double>{1.5, 1.5}, true);
  CHECK(described == "3|three|" + std::to_string(3.0) + "|yes");
}

TEST_CASE("a struct declared with WEFT_CODEC_FIELDS, holding another, round-trips through a real call") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();

  sprites::Sprite s;
  s.id = "hero";
  s.color = {255, 0, 12, "red"};
  s.palette = {{1, 2, 3, "a"}, {4, 5, 6, ""}};
  s.layer = -3;
  s.props = {{"speed", 1.25}, {"mass", -0.5}};
  s.pixels = randn({4, 4});
  sprites::Sprite got = g.agent(0).sync(1, echoSprite, s);
  CHECK(got.id == s.id);
  CHECK(got.color == s.color);
  CHECK(got.palette == s.palette);
  CHECK(got.layer == s.layer);
  CHECK(got.props == s.props);
  CHECK(sameTensor(got.pixels, s.pixels));

  sprites::Sprite bare;  // empty containers, no layer, undefined tensor
  sprites::Sprite gotBare = g.agent(0).sync(1, echoSprite, bare);
  CHECK(gotBare.id.empty());
  CHECK(gotBare.palette.empty());
  CHECK_FALSE(gotBare.layer.has_value());
  CHECK_FALSE(gotBare.pixels.defined());
}

TEST_CASE("tensors of 0 B and 1 KiB round-trip through a real call in float32, float64 and int64") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  for (DType dt : {DType::Float32, DType::Float64, DType::Int64}) {
    CAPTURE(dt);
    for (Shape shape : {Shape{0}, Shape{3, 0}}) {
      Tensor empty = zeros(shape, {.dtype = dt});
      Tensor got = a.sync(1, echoTensor, empty);
      CHECK(got.dtype() == dt);
      CHECK(got.shape() == shape);
      CHECK(got.nbytes() == 0);
    }
    int64_t kibElements = 1024 / static_cast<int64_t>(elementSize(dt));
    Tensor kib = dt == DType::Int64 ? randint(-1000000, 1000000, {kibElements}) : randn({kibElements}, {.dtype = dt});
    CHECK(kib.nbytes() == 1024);
    Tensor got = a.sync(1, echoTensor, kib);
    CHECK(sameTensor(got, kib));
    CHECK(got.isContiguous());
    CHECK(a.sync(1, tensorSum, kib) == doctest::Approx(kib.to(DType::Float64).sum().item<double>()));
  }
  Tensor scalar = scalarTensor(-2.5, DType::Float64);
  Tensor gotScalar = a.sync(1, echoTensor, scalar);
  CHECK(gotScalar.dim() == 0);
  CHECK(gotScalar.item<double>() == -2.5);
  CHECK_FALSE(a.sync(1, echoTensor, Tensor()).defined());
}

TEST_CASE("tensors of 64 MiB round-trip through a real call with their content intact") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  constexpr int64_t kBytes = int64_t{64} << 20;
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64}) {
    CAPTURE(dt);
    int64_t n = kBytes / static_cast<int64_t>(elementSize(dt));
    Tensor big = dt == DType::Float32 ? randn({n}) : arange(0, 3.0 * static_cast<double>(n), 3, {.dtype = dt});
    big = big.view({n / 1024, 1024});
    REQUIRE(static_cast<int64_t>(big.nbytes()) == kBytes);
    Tensor got = a.sync(1, echoTensor, big);
    CHECK(got.shape() == big.shape());
    CHECK(got.rawData() != big.rawData());
    CHECK(sameTensor(got, big));
    if (dt == DType::Float32) {
      // The callee sees the same content (not only the echo as a whole).
      CHECK(a.sync(1, tensorSum, big) ==
            doctest::Approx(big.to(DType::Float64).sum().item<double>()).epsilon(1e-9));
    }
  }
}

TEST_CASE("non-contiguous views travel as their own values, and a tensor passed twice arrives as one storage") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  Tensor base = randn({6, 8});
  Tensor transposed = base.t();
  REQUIRE_FALSE(transposed.isContiguous());
  Tensor got = a.sync(1, echoTensor, transposed);
  CHECK(got.shape() == Shape{8, 6});
  CHECK(got.isContiguous());
  CHECK(sameTensor(got, transposed));

  Tensor narrowed = base.narrow(1, 2, 3);  // rows of 3 out of 8
  REQUIRE_FALSE(narrowed.isContiguous());
  CHECK(sameTensor(a.sync(1, echoTensor, narrowed), narrowed));
  Tensor offsetRows = base.narrow(0, 4, 2);  // contiguous, at an offset into the storage
  CHECK(sameTensor(a.sync(1, echoTensor, offsetRows), offsetRows));

  Tensor row = arange(0, 5, 1, {.dtype = DType::Float64});
  Tensor expanded = row.unsqueeze(0).expand({300, 5});  // stride 0
  REQUIRE(expanded.stride(0) == 0);
  Tensor gotExpanded = a.sync(1, echoTensor, expanded);
  CHECK(gotExpanded.shape() == Shape{300, 5});
  CHECK(sameTensor(gotExpanded, expanded));
  CHECK(gotExpanded.storage()->nbytes() >= 300 * 5 * 8);

  Tensor permuted = arange(0, 24, 1, {.dtype = DType::Int64}).view({2, 3, 4}).permute({2, 0, 1});
  CHECK(sameTensor(a.sync(1, echoTensor, permuted), permuted));

  // The same tensor twice: one storage on the callee, and one again in the reply.
  Tensor t = randn({32});
  auto [shared, x, y] = a.sync(1, pairOfTensors, t, t);
  CHECK(shared);
  CHECK(sameTensor(x, t));
  CHECK(sameTensor(y, t));
  CHECK(x.storage() == y.storage());
  Tensor other = randn({32});
  auto [sharedOther, p, q] = a.sync(1, pairOfTensors, t, other);
  CHECK_FALSE(sharedOther);
  CHECK(sameTensor(p, t));
  CHECK(sameTensor(q, other));
}

TEST_CASE("void functions and functions without arguments work, by rank and by name") {
  AgentGroup g(2);
  std::atomic<int> noted{0};
  std::atomic<int> pinged{0};
  g.agent(1).registry().impl(note, [&](int32_t v) { noted += v; });
  g.agent(1).registry().impl(ping, [&] { ++pinged; });
  g.agent(1).registry().impl(answer, [] { return int32_t{42}; });
  g.agent(1).registry().impl(whoami, [](const CallContext& ctx) { return ctx.callerName + "@" + *ctx.function; });
  g.start();
  Agent& a = g.agent(0);

  a.sync(1, note, 5);
  a.sync("worker1", note, 7);
  CHECK(noted == 12);
  a.sync(1, ping);
  Future<void> f = a.async("worker1", ping);
  REQUIRE(f.waitFor(5s));
  CHECK_FALSE(f.hasError());
  CHECK(pinged == 2);
  CHECK(a.sync(1, answer) == 42);
  CHECK(a.sync("worker1", answer) == 42);
  CHECK(a.sync(1, whoami) == "worker0@whoami");
}

TEST_CASE("workers are listed by rank and found by name or rank, and an agent can call itself") {
  AgentGroup g(3, [](int rank, Options& o) { o.name = rank == 1 ? "middle" : ""; });
  for (int r = 0; r < 3; ++r) bindEcho(g.agent(r).registry(), echoI64);
  g.start();
  Agent& a = g.agent(2);
  std::vector<WorkerInfo> ws = a.workers();
  REQUIRE(ws.size() == 3);
  CHECK(ws[0].name == "worker0");
  CHECK(ws[1].name == "middle");
  CHECK(ws[2].name == "worker2");
  for (int r = 0; r < 3; ++r) CHECK(ws[static_cast<size_t>(r)].rank == r);
  CHECK(a.worker("middle").rank == 1);
  CHECK(a.worker(0).name == "worker0");
  CHECK(a.name() == "worker2");
  CHECK(a.rank() == 2);
  CHECK(a.worldSize() == 3);
  CHECK(a.listenPort() != 0);
  CHECK(a.sync("middle", echoI64, 11) == 11);
  CHECK(a.sync(ws[0], echoI64, 12) == 12);
  CHECK(a.isAlive(2));
  CHECK(a.sync(2, echoI64, 13) == 13);          // itself, by rank
  CHECK(a.sync("worker2", echoI64, 14) == 14);  // and by name
}

// ---- declaration mismatches --------------------------------------------------------------------

TEST_CASE("an argument that does not decode as the callee declared it is a ProtocolError naming the function and "
          "the argument index") {
  // Two declarations of one name with different signatures, as two programs out of step would have.
  const Function<int32_t(int32_t, std::string)> callerView{"mismatch.args"};
  const Function<int32_t(int32_t, int32_t)> calleeView{"mismatch.args"};
  const Function<int32_t(int32_t)> resultCallerView{"mismatch.result"};
  const Function<std::string(int32_t)> resultCalleeView{"mismatch.result"};
  const Function<int32_t(int32_t)> arityCallerView{"mismatch.arity"};
  const Function<int32_t(int32_t, int32_t)> arityCalleeView{"mismatch.arity"};

  AgentGroup g(2);
  g.agent(1).registry().impl(calleeView, [](int32_t a, int32_t b) { return a + b; });
  g.agent(1).registry().impl(resultCalleeView, [](int32_t a) { return std::to_string(a); });
  g.agent(1).registry().impl(arityCalleeView, [](int32_t a, int32_t b) { return a * b; });
  g.start();
  Agent& a = g.agent(0);

  std::string args = messageOf<ProtocolError>([&] { a.sync(1, callerView, 1, std::string("two")); });
  CHECK(contains(args, "mismatch.args"));
  CHECK(contains(args, "argument 1"));
  CHECK(contains(args, "string"));

  std::string result = messageOf<ProtocolError>([&] { a.sync(1, resultCallerView, 5); });
  CHECK(contains(result, "mismatch.result"));
  CHECK(contains(result, "result"));
  CHECK(contains(result, "string"));

  std::string arity = messageOf<ProtocolError>([&] { a.sync(1, arityCallerView, 5); });
  CHECK(contains(arity, "mismatch.arity"));
  CHECK(contains(arity, "argument"));

  // A mismatch costs only that call: the connection keeps working.
  const Function<int32_t(int32_t, int32_t)> rightView{"mismatch.args"};
  CHECK(a.sync(1, rightView, 2, 3) == 5);
  CHECK(a.isAlive(1));
  CHECK(eventually([&] { return quiet(g); }, 2s));
}

// ---- many calls ----------------------------------------------------------------------------------

TEST_CASE("10,000 concurrent async calls all complete with the right results") {
  AgentGroup g(2);
  g.agent(1).registry().impl(squareOf, [](int64_t v) { return v * v; });
  g.start();
  Agent& a = g.agent(0);

  constexpr int kCalls = 10000;
  std::vector<Future<int64_t>> futures;
  futures.reserve(kCalls);
  auto t0 = Clock::now();
  for (int i = 0; i < kCalls; ++i) futures.push_back(a.async(1, squareOf, int64_t{i} - 5000));
  Future<std::vector<int64_t>> all = whenAll(futures);
  REQUIRE(all.waitFor(30s));
  double seconds = secondsSince(t0);
  MESSAGE("10,000 async calls in " << seconds << " s");
  const std::vector<int64_t>& results = all.get();
  REQUIRE(results.size() == static_cast<size_t>(kCalls));
  int wrong = 0;
  for (int i = 0; i < kCalls; ++i) wrong += results[static_cast<size_t>(i)] != (int64_t{i} - 5000) * (int64_t{i} - 5000);
  CHECK(wrong == 0);
  CHECK(eventually([&] { return quiet(g); }, 2s));
  CHECK(stats(g, 0).callsSent >= static_cast<uint64_t>(kCalls));
  CHECK(stats(g, 1).callsServed >= static_cast<uint64_t>(kCalls));
  CHECK(stats(g, 0).timeouts == 0);
}

TEST_CASE("callers on several threads of several agents get their own results") {
  AgentGroup g(3);
  for (int r = 0; r < 3; ++r) {
    g.agent(r).registry().impl(squareOf, [r](int64_t v) { return v * v + r; });  // + r: who answered
  }
  g.start();

  constexpr int kThreads = 6;
  constexpr int kCallsPerThread = 600;
  std::atomic<int> wrong{0};
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      int from = t % 3;
      Agent& a = g.agent(from);
      std::vector<std::pair<int, Future<int64_t>>> batch;
      for (int i = 0; i < kCallsPerThread; ++i) {
        int to = (from + 1 + i % 2) % 3;
        int64_t v = t * 100000 + i;
        if (i % 5 == 0) {
          try {
            if (a.sync(to, squareOf, v) != v * v + to) ++wrong;
          } catch (...) {
            ++wrong;
          }
        } else {
          batch.emplace_back(to, a.async(to, squareOf, v));
        }
      }
      for (size_t k = 0; k < batch.size(); ++k) {
        auto& [to, f] = batch[k];
        if (!f.waitFor(20s) || f.hasError()) {
          ++wrong;
          continue;
        }
        // The calls of a batch were made with i = every index not divisible by 5, in order.
        size_t i = k + k / 4 + 1;
        int64_t v = t * 100000 + static_cast<int64_t>(i);
        if (f.get() != v * v + to) ++wrong;
      }
      ++done;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(done == kThreads);
  CHECK(wrong == 0);
  CHECK(eventually([&] { return quiet(g); }, 2s));
}

// ---- nested calls --------------------------------------------------------------------------------

TEST_CASE("chains of nested calls 8 levels deep across 3 workers finish on pools of 2 threads") {
  constexpr int kWorkers = 3;
  constexpr int kDepth = 8;
  AgentGroup g(kWorkers, [](int, Options& o) { o.numWorkerThreads = 2; });
  for (int r = 0; r < kWorkers; ++r) {
    Agent* self = &g.agent(r);
    // relay(depth, acc): records this worker in acc, then either answers or asks
    // the next worker (round robin) and adds 1000 to what comes back; the pool
    // thread returns at once with a future, so no thread waits on a nested call.
    g.agent(r).registry().impl(relay, [self, r](int32_t depth, int64_t acc) -> Future<int64_t> {
      int64_t here = acc * 4 + r + 1;
      if (depth == 0) return makeReadyFuture(here);
      return self->async((r + 1) % kWorkers, relay, depth - 1, here).then([](int64_t v) { return v + 1000; });
    });
  }
  g.start();

  // What a chain started at worker `first` with acc = seed returns.
  auto expected = [](int first, int64_t seed) {
    int64_t acc = seed;
    int r = first;
    for (int d = kDepth; d >= 0; --d) {
      acc = acc * 4 + r + 1;
      r = (r + 1) % kWorkers;
    }
    return acc + 1000 * kDepth;
  };

  constexpr int kChainsPerWorker = 4;
  std::vector<Future<int64_t>> chains;
  std::vector<int64_t> want;
  auto t0 = Clock::now();
  for (int origin = 0; origin < kWorkers; ++origin) {
    for (int c = 0; c < kChainsPerWorker; ++c) {
      int first = (origin + 1 + c) % kWorkers;  // some chains start at the caller itself
      int64_t seed = origin * 10 + c;
      chains.push_back(g.agent(origin).async(first, relay, kDepth, seed));
      want.push_back(expected(first, seed));
    }
  }
  Future<std::vector<int64_t>> all = whenAll(chains);
  REQUIRE(all.waitFor(10s));
  MESSAGE(chains.size() << " chains of " << kDepth + 1 << " calls in " << secondsSince(t0) << " s");
  CHECK(all.get() == want);
  CHECK(eventually([&] { return quiet(g); }, 2s));
}

// ---- errors from the callee ----------------------------------------------------------------------

TEST_CASE("a handler's exception arrives as RemoteError naming the worker, the function and the message") {
  AgentGroup g(2);
  Registry& reg = g.agent(1).registry();
  reg.impl(throwsRuntime, [](int32_t v) -> int32_t { throw std::runtime_error("boom " + std::to_string(v)); });
  reg.impl(throwsInvalid, [](int32_t v) -> int32_t {
    throw InvalidArgumentError("throws.invalid: value " + std::to_string(v) + " is not acceptable");
  });
  reg.impl(failedFuture, [](int32_t v) {
    return makeErrorFuture<int32_t>(std::make_exception_ptr(std::runtime_error("failed future " + std::to_string(v))));
  });
  std::vector<std::thread> completers;
  std::mutex completersMu;
  reg.impl(failedFutureLater, [&](int32_t v) {
    Promise<int32_t> p;
    Future<int32_t> f = p.getFuture();
    std::lock_guard<std::mutex> lock(completersMu);
    completers.emplace_back([p, v]() mutable {
      std::this_thread::sleep_for(50ms);
      p.setError(std::make_exception_ptr(std::runtime_error("later " + std::to_string(v))));
    });
    return f;
  });
  reg.impl(failedStatus, [](int32_t) { return makeErrorFuture<int32_t>(Status::notFound("no such record")); });
  bindEcho(reg, echoI32);
  g.start();
  Agent& a = g.agent(0);

  try {
    a.sync(1, throwsRuntime, 7);
    FAIL_CHECK("no exception");
  } catch (const RemoteError& e) {
    CHECK(e.worker() == "worker1");
    CHECK(e.function() == "throws.runtime");
    CHECK(contains(e.remoteMessage(), "boom 7"));
    CHECK(contains(e.what(), "worker1"));
    CHECK(contains(e.what(), "throws.runtime"));
    CHECK(contains(e.what(), "boom 7"));
  } catch (const std::exception& e) {
    FAIL_CHECK("expected RemoteError, got " << describeError(e));
  }

  std::string invalid = messageOf<InvalidArgumentError>([&] { a.sync(1, throwsInvalid, 3); });
  CHECK(contains(invalid, "value 3 is not acceptable"));

  try {
    a.sync(1, failedFuture, 4);
    FAIL_CHECK("no exception");
  } catch (const RemoteError& e) {
    CHECK(e.worker() == "worker1");
    CHECK(e.function() == "future.failed");
    CHECK(contains(e.remoteMessage(), "failed future 4"));
  } catch (const std::exception& e) {
    FAIL_CHECK("expected RemoteError, got " << describeError(e));
  }

  Future<int32_t> later = a.async(1, failedFutureLater, 5);
  REQUIRE(later.waitFor(5s));
  CHECK(contains(messageOf<RemoteError>([&] { later.get(); }), "later 5"));

  CHECK(contains(messageOf<NotFoundError>([&] { a.sync(1, failedStatus, 1); }), "no such record"));

  // None of it broke the connection.
  CHECK(a.sync(1, echoI32, 9) == 9);
  CHECK(a.isAlive(1));
  {
    std::lock_guard<std::mutex> lock(completersMu);
    for (auto& t : completers) t.join();
  }
}

TEST_CASE("an unknown function or worker is a NotFoundError, and a call before start or after shutdown a StateError") {
  const Function<int32_t(int32_t)> nobodyServes{"nobody.serves.this"};
  AgentGroup g(2);
  bindEcho(g.agent(1).registry(), echoI32);

  // Before start.
  CHECK(contains(messageOf<StateError>([&] { g.agent(0).sync(1, echoI32, 1); }), "echo.i32"));
  Future<int32_t> early = g.agent(0).async(1, echoI32, 1);
  REQUIRE(early.waitFor(1s));
  CHECK_THROWS_AS(early.get(), StateError);

  g.start();
  Agent& a = g.agent(0);

  std::string unknownFn = messageOf<NotFoundError>([&] { a.sync(1, nobodyServes, 1); });
  CHECK(contains(unknownFn, "nobody.serves.this"));
  CHECK(contains(unknownFn, "worker1"));

  auto t0 = Clock::now();
  CHECK(contains(messageOf<NotFoundError>([&] { a.sync("nobody", echoI32, 1); }), "nobody"));
  CHECK_THROWS_AS(a.sync(2, echoI32, 1), NotFoundError);
  CHECK_THROWS_AS(a.sync(100, echoI32, 1), NotFoundError);
  CHECK_THROWS_AS(a.worker("nobody"), NotFoundError);
  CHECK_THROWS_AS(a.worker(5), NotFoundError);
  Future<int32_t> toNobody = a.async("nobody", echoI32, 1);
  REQUIRE(toNobody.waitFor(1s));
  CHECK_THROWS_AS(toNobody.get(), NotFoundError);
  CHECK(secondsSince(t0) < 1.0);  // none of it waits for anything

  CHECK(a.sync(1, echoI32, 2) == 2);
  auto reports = g.shutdownAll();
  for (auto& r : reports) CHECK(r.clean());

  // After shutdown.
  CHECK(contains(messageOf<StateError>([&] { a.sync(1, echoI32, 1); }), "echo.i32"));
  Future<int32_t> late = g.agent(1).async(0, echoI32, 1);
  REQUIRE(late.waitFor(1s));
  CHECK_THROWS_AS(late.get(), StateError);
}

// ---- timeouts --------------------------------------------------------------------------------------

TEST_CASE("a call past its timeout fails with TimeoutError, the callee is told, and the late reply leaks nothing") {
  AgentGroup g(2);
  bindSlow(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  auto t0 = Clock::now();
  Future<int32_t> f = a.async(1, slow, {.timeout = 100ms}, 500, 1);
  REQUIRE(f.waitFor(3s));
  double waited = secondsSince(t0);
  CHECK(waited >= 0.095);
  CHECK(waited < 0.45);
  std::string message = messageOf<TimeoutError>([&] { f.get(); });
  CHECK(contains(message, "worker1"));
  CHECK(contains(message, "slow"));
  CHECK(contains(message, "after 0.1"));  // the time waited, in seconds
  CHECK(a.stats().timeouts == 1);
  CHECK(a.stats().pendingOutgoing == 0);

  // The callee hears of the cancel while its body still sleeps.
  CHECK(eventually([&] { return stats(g, 1).cancelsReceived >= 1; }, 1s));
  // A call made meanwhile gets its own reply, not the late one.
  CHECK(a.sync(1, slow, 0, 2) == 2);

  // Once the first body has finished, nothing of that call is left on either side.
  CHECK(eventually([&] { return stats(g, 1).activeIncoming == 0; }, 2s));
  // Either the callee dropped the cancelled call's reply, or it sent it and the
  // caller dropped it as late: every reply sent is accounted for (slow(0, 2) is
  // the one other call answered so far).
  CHECK(eventually([&] { return stats(g, 1).callsServed == 1 + stats(g, 0).lateResponses; }, 2s));
  AgentStats caller = stats(g, 0);
  AgentStats callee = stats(g, 1);
  CHECK(caller.pendingOutgoing == 0);
  CHECK(callee.activeIncoming == 0);
  CHECK(caller.lateResponses <= 1);
  CHECK(caller.timeouts == 1);
  CHECK(a.isAlive(1));
  CHECK(a.sync(1, slow, 0, 3) == 3);
  // The callee counts a reply once its write returns, which may be after the caller has it.
  CHECK(eventually([&] { return stats(g, 1).callsServed == 2 + stats(g, 0).lateResponses; }, 2s));
}

TEST_CASE("hundreds of calls timing out together each fail once and leave nothing behind") {
  AgentGroup g(2);
  Gate gate;
  std::atomic<int> bodies{0};
  g.agent(1).registry().impl(hold, [&](int32_t v) {
    ++bodies;
    gate.wait();
    return v;
  });
  g.start();
  Agent& a = g.agent(0);

  constexpr int kCalls = 500;
  std::vector<Future<int32_t>> futures;
  for (int i = 0; i < kCalls; ++i) futures.push_back(a.async(1, hold, {.timeout = 50ms}, i));
  int timedOut = 0;
  for (auto& f : futures) {
    REQUIRE(f.waitFor(5s));
    try {
      f.get();
    } catch (const TimeoutError&) {
      ++timedOut;
    } catch (...) {
    }
  }
  CHECK(timedOut == kCalls);
  CHECK(a.stats().timeouts == static_cast<uint64_t>(kCalls));
  CHECK(a.stats().pendingOutgoing == 0);
  CHECK(eventually([&] { return stats(g, 1).cancelsReceived == static_cast<uint64_t>(kCalls); }, 2s));
  // Only calls already running when their cancel came have started their bodies:
  // at most one per pool thread (agentOptions: numWorkerThreads = 2).
  const int started = bodies.load();
  CHECK(started <= 2);

  gate.open();
  CHECK(eventually([&] { return stats(g, 1).activeIncoming == 0; }, 5s));
  CHECK(eventually([&] { return stats(g, 1).callsServed == stats(g, 0).lateResponses; }, 2s));
  // The calls still queued when cancelled were dropped without running.
  CHECK(bodies.load() == started);
  // The connection is as good as new.
  CHECK(a.sync(1, hold, {.timeout = 2s}, 7) == 7);
  CHECK(eventually([&] { return quiet(g); }, 2s));
}

TEST_CASE("the default timeout comes from Options::rpcTimeout, and a timeout of 0 means none") {
  AgentGroup g(2, [](int rank, Options& o) {
    if (rank == 0) o.rpcTimeout = 150ms;
  });
  bindSlow(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  auto t0 = Clock::now();
  CHECK_THROWS_AS(a.sync(1, slow, 400, 1), TimeoutError);
  double waited = secondsSince(t0);
  CHECK(waited >= 0.14);
  CHECK(waited < 0.38);

  t0 = Clock::now();
  CHECK(a.sync(1, slow, {.timeout = 0ms}, 400, 2) == 2);
  CHECK(secondsSince(t0) >= 0.39);
  CHECK(a.sync(1, slow, {.timeout = 2s}, 300, 3) == 3);
  CHECK(eventually([&] { return quiet(g); }, 2s));
  CHECK(a.stats().timeouts == 1);
}

// ---- failures and shutdown ---------------------------------------------------------------------

TEST_CASE("a peer shut down abruptly mid-call fails that call with DisconnectedError promptly, and the rest keep "
          "working") {
  AgentGroup g(3, [](int, Options& o) { o.shutdownTimeout = 3s; });
  Gate gate;
  g.agent(2).registry().impl(hold, [&gate](int32_t v) {
    gate.wait();
    return v;
  });
  for (int r = 0; r < 3; ++r) bindEcho(g.agent(r).registry(), echoI32);
  g.start();

  Future<int32_t> pending = g.agent(0).async(2, hold, 1);
  REQUIRE(eventually([&] { return stats(g, 2).activeIncoming == 1; }, 2s));

  auto t0 = Clock::now();
  ShutdownReport victimReport;
  std::thread stopper([&] { victimReport = g.agent(2).shutdown({.graceful = false}); });
  bool failedInTime = pending.waitFor(2s);
  double took = secondsSince(t0);
  gate.open();
  stopper.join();
  REQUIRE(failedInTime);
  MESSAGE("pending call failed " << took * 1000 << " ms after the peer's shutdown began");
  CHECK(took < 2.0);
  CHECK(contains(messageOf<DisconnectedError>([&] { pending.get(); }), "worker2"));
  CHECK_FALSE(victimReport.graceful);

  // Later calls to it fail at once.
  t0 = Clock::now();
  CHECK_THROWS_AS(g.agent(0).sync(2, echoI32, 1), DisconnectedError);
  CHECK(secondsSince(t0) < 0.2);
  CHECK_FALSE(g.agent(0).isAlive(2));
  CHECK(eventually([&] { return !g.agent(1).isAlive(2); }, 2s));
  CHECK_THROWS_AS(g.agent(1).sync("worker2", echoI32, 1), DisconnectedError);

  // The others are unaffected.
  CHECK(g.agent(0).isAlive(1));
  CHECK(g.agent(0).sync(1, echoI32, 5) == 5);
  CHECK(g.agent(1).sync(0, echoI32, 6) == 6);

  // Their graceful shutdown names the one that left and does not wait for it.
  t0 = Clock::now();
  std::vector<ShutdownReport> reports(2);
  std::thread s0([&] { reports[0] = g.agent(0).shutdown(); });
  std::thread s1([&] { reports[1] = g.agent(1).shutdown(); });
  s0.join();
  s1.join();
  CHECK(secondsSince(t0) < 3.5);
  for (auto& r : reports) {
    INFO("missing: " << joined(r.missing));
    CHECK(r.graceful);
    CHECK(r.missing == std::vector<std::string>{"worker2"});
  }
}

namespace {

// Shuts down the sending side of this process's established TCP connections whose local port is
// `port`, as a cable pulled under a writer would: the next write to one fails with EPIPE.
int shutDownWritesOnPort(uint16_t port) {
  int cut = 0;
  DIR* d = ::opendir("/proc/self/fd");
  REQUIRE(d != nullptr);
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    sockaddr_storage local{};
    sockaddr_storage peer{};
    socklen_t len = sizeof local;
    socklen_t peerLen = sizeof peer;
    if (e->d_name[0] == '.' || ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0 ||
        local.ss_family != AF_INET || ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLen) != 0) {
      continue;  // not a connected IPv4 socket
    }
    if (ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port) == port && ::shutdown(fd, SHUT_WR) == 0) ++cut;
  }
  ::closedir(d);
  return cut;
}

}  // namespace

TEST_CASE("a write to a connection cut under the caller fails the call with DisconnectedError, not SIGPIPE") {
  // SIGPIPE's default action ends the process: a caller's thread writing to a connection whose
  // sending side is gone must get EPIPE instead, whatever the program's signal settings.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  struct sigaction previous {};
  REQUIRE(::sigaction(SIGPIPE, &dfl, &previous) == 0);
  // The write races the loop thread noticing the cut from the other side; a few rounds make sure
  // that the caller's write meets it.
  for (int round = 0; round < 5; ++round) {
    const uint16_t port0 = weft::testing::freePort();
    AgentGroup g(2, [port0](int r, Options& o) {
      o.shutdownTimeout = 1s;
      if (r == 0) o.listenPort = port0;
    });
    for (int r = 0; r < 2; ++r) bindEcho(g.agent(r).registry(), echoI32);
    g.start();
    REQUIRE(g.agent(0).sync(1, echoI32, 7) == 7);
    // worker0's end of its connection with worker1 (accepted on worker0's listening port).
    REQUIRE(shutDownWritesOnPort(port0) == 1);
    // The frame is written by this thread (nothing is queued on the connection).
    Future<int32_t> call = g.agent(0).async(1, echoI32, 8);
    REQUIRE(call.waitFor(5s));
    CHECK_THROWS_AS(call.get(), DisconnectedError);
    for (int r = 0; r < 2; ++r) g.agent(r).shutdown({.graceful = false});
  }
  ::sigaction(SIGPIPE, &previous, nullptr);
}

TEST_CASE("a graceful shutdown begun with calls in flight lets them all complete") {
  AgentGroup g(3);
  for (int r = 0; r < 3; ++r) bindSlow(g.agent(r).registry());
  g.start();

  std::vector<Future<int32_t>> inFlight;
  std::vector<int32_t> want;
  for (int from = 0; from < 3; ++from) {
    for (int i = 0; i < 3; ++i) {
      int32_t tag = from * 10 + i;
      inFlight.push_back(g.agent(from).async((from + 1) % 3, slow, 200, tag));
      want.push_back(tag);
    }
  }
  auto t0 = Clock::now();
  std::vector<ShutdownReport> reports = g.shutdownAll();
  double took = secondsSince(t0);
  CHECK(took < 5.0);
  for (auto& r : reports) {
    CHECK(r.graceful);
    CHECK(r.clean());
  }
  std::vector<int32_t> got;
  for (auto& f : inFlight) {
    REQUIRE(f.isReady());  // the barrier waited for them
    if (f.hasError()) {
      FAIL_CHECK("a call in flight failed: " << f.status());
      got.push_back(-1);
    } else {
      got.push_back(f.get());
    }
  }
  CHECK(got == want);
  CHECK(took >= 0.19);  // each callee's slow bodies were still running when shutdown began
  for (int r = 0; r < 3; ++r) {
    CHECK(stats(g, r).pendingOutgoing == 0);
    CHECK(stats(g, r).activeIncoming == 0);
  }
  // shutdown is idempotent.
  CHECK(g.agent(0).shutdown().clean());
}

TEST_CASE("a worker in shutdown stays a full member of the job until every worker has joined: it serves, and its "
          "threads may call out") {
  AgentGroup g(2);
  for (int r = 0; r < 2; ++r) bindEcho(g.agent(r).registry(), echoI32);
  g.start();

  ShutdownReport r1;
  std::atomic<bool> left{false};
  std::thread leaving([&] {
    r1 = g.agent(1).shutdown();
    left = true;
  });
  // worker1 is in its shutdown (it waits for worker0 there); worker0 is not. Both directions work.
  for (int32_t i = 0; i < 20; ++i) {
    CHECK(g.agent(0).sync(1, echoI32, i) == i);
    CHECK(g.agent(1).sync(0, echoI32, i) == i);
    std::this_thread::sleep_for(10ms);
  }
  CHECK_FALSE(left.load());
  ShutdownReport r0 = g.agent(0).shutdown();
  leaving.join();
  CHECK(r0.clean());
  CHECK(r1.clean());
  // Once the job has ended, neither makes calls.
  CHECK_THROWS_AS(g.agent(1).sync(0, echoI32, 1), StateError);
}

TEST_CASE("a graceful shutdown waits, past its timeout, for a live worker that is still working: no cliff") {
  // The timeout bounds only the drain after every worker has joined.
  AgentGroup g(3, [](int, Options& o) { o.shutdownTimeout = 300ms; });
  for (int r = 0; r < 3; ++r) bindEcho(g.agent(r).registry(), echoI32);
  g.start();

  auto t0 = Clock::now();
  std::vector<ShutdownReport> reports(3);
  std::atomic<int> left{0};
  std::thread s0([&] {
    reports[0] = g.agent(0).shutdown();
    ++left;
  });
  std::thread s1([&] {
    reports[1] = g.agent(1).shutdown();
    ++left;
  });
  // worker2 keeps working with both for ten times their shutdown timeout.
  int64_t sum = 0;
  int64_t want = 0;
  for (int32_t i = 0; secondsSince(t0) < 3.0; ++i) {
    sum += g.agent(2).sync(i % 2, echoI32, i);
    want += i;
    std::this_thread::sleep_for(5ms);
  }
  CHECK(sum == want);
  CHECK(left.load() == 0);
  auto t1 = Clock::now();
  reports[2] = g.agent(2).shutdown();
  s0.join();
  s1.join();
  CHECK(secondsSince(t1) < 5.0);  // once the last worker joined, nothing is waited for
  for (auto& r : reports) {
    INFO("missing: " << joined(r.missing));
    CHECK(r.graceful);
    CHECK(r.clean());
  }
}

TEST_CASE("a worker that dies while others wait in the shutdown barrier fails it promptly on each, naming it") {
  // waiting: the ranks in the barrier when rank `victim` is lost; the others are still working and
  // learn of it from those that leave (their later shutdown names the victim, not them).
  struct Case {
    std::vector<int> waiting;
    int victim;
  };
  for (const Case& c : {Case{{0, 1}, 2}, Case{{1, 2}, 3}, Case{{0, 1, 2}, 3}}) {
    CAPTURE(c.victim);
    CAPTURE(c.waiting.size());
    AgentGroup g(4, [](int, Options& o) { o.shutdownTimeout = 30s; });
    for (int r = 0; r < 4; ++r) bindEcho(g.agent(r).registry(), echoI32);
    g.start();
    const std::string victimName = "worker" + std::to_string(c.victim);

    std::vector<ShutdownReport> reports(4);
    std::array<std::atomic<double>, 4> leftAt;
    for (auto& a : leftAt) a = -1;
    auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int r : c.waiting) {
      threads.emplace_back([&, r] {
        reports[static_cast<size_t>(r)] = g.agent(r).shutdown();
        leftAt[static_cast<size_t>(r)] = secondsSince(t0);
      });
    }
    std::this_thread::sleep_for(500ms);
    for (int r : c.waiting) CHECK(leftAt[static_cast<size_t>(r)] < 0);  // still waiting
    double lostAt = secondsSince(t0);
    g.agent(c.victim).shutdown({.graceful = false});  // its connections close, as when it dies
    for (auto& t : threads) t.join();
    for (int r : c.waiting) {
      CAPTURE(r);
      MESSAGE("rank " << r << " left the barrier " << (leftAt[static_cast<size_t>(r)] - lostAt) * 1000
                      << " ms after the victim was lost");
      CHECK(leftAt[static_cast<size_t>(r)] - lostAt < 1.0);
      INFO("missing: " << joined(reports[static_cast<size_t>(r)].missing));
      CHECK(reports[static_cast<size_t>(r)].missing == std::vector<std::string>{victimName});
    }
    // A worker that was still working shuts down at once, naming the victim too.
    for (int r = 0; r < 4; ++r) {
      if (r == c.victim || std::count(c.waiting.begin(), c.waiting.end(), r)) continue;
      CAPTURE(r);
      auto t1 = Clock::now();
      ShutdownReport late = g.agent(r).shutdown();
      CHECK(secondsSince(t1) < 2.5);
      INFO("missing: " << joined(late.missing));
      CHECK(late.missing == std::vector<std::string>{victimName});
    }
  }
}

TEST_CASE("an abrupt shutdown fails this side's pending calls with CancelledError") {
  AgentGroup g(2, [](int, Options& o) { o.shutdownTimeout = 2s; });
  Gate gate;
  g.agent(1).registry().impl(hold, [&gate](int32_t v) {
    gate.wait();
    return v;
  });
  g.start();

  Future<int32_t> pending = g.agent(0).async(1, hold, 1);
  REQUIRE(eventually([&] { return stats(g, 1).activeIncoming == 1; }, 2s));
  auto t0 = Clock::now();
  ShutdownReport r0 = g.agent(0).shutdown({.graceful = false});
  CHECK(secondsSince(t0) < 1.0);
  CHECK_FALSE(r0.graceful);
  REQUIRE(pending.waitFor(1s));
  CHECK_THROWS_AS(pending.get(), CancelledError);
  CHECK(g.agent(0).stats().pendingOutgoing == 0);

  // The other side learns the peer is gone, and its own shutdown reports it.
  CHECK(eventually([&] { return !g.agent(1).isAlive(0); }, 2s));
  gate.open();
  t0 = Clock::now();
  ShutdownReport r1 = g.agent(1).shutdown();
  CHECK(secondsSince(t0) < 2.5);
  INFO("missing: " << joined(r1.missing));
  CHECK(r1.missing == std::vector<std::string>{"worker0"});
}

// ---- start errors ------------------------------------------------------------------------------

namespace {

// Short rendezvous and shutdown bounds for jobs that cannot form.
void shortStart(int, Options& o) {
  o.storeTimeout = 1500ms;
  o.shutdownTimeout = 1s;
}

std::string whatOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
}

// The messages of the starts that failed (startEach's non-null entries).
std::vector<std::string> startFailures(const std::vector<std::exception_ptr>& errors) {
  std::vector<std::string> out;
  for (auto& e : errors) {
    if (e) out.push_back(whatOf(e));
  }
  return out;
}

}  // namespace

TEST_CASE("two workers with the same name are a clear error at start") {
  AgentGroup g(2, [](int r, Options& o) {
    shortStart(r, o);
    o.name = std::string(1, 'a');  // not = "a": GCC 12 warns falsely (-Wrestrict) on that
  });
  auto t0 = Clock::now();
  std::vector<std::exception_ptr> errors = g.startEach();
  CHECK(secondsSince(t0) < 3.0);
  std::vector<std::string> failures = startFailures(errors);
  INFO("failures: " << joined(failures));
  CHECK(failures.size() == 2);  // the other hears of it through the store
  CHECK(std::any_of(failures.begin(), failures.end(),
                    [](const std::string& m) { return contains(m, "duplicate") && contains(m, "'a'"); }));
}

TEST_CASE("workers that disagree on the world size are a clear error at start") {
  AgentGroup g(2, [](int r, Options& o) {
    shortStart(r, o);
    if (r == 1) o.worldSize = 3;
  });
  auto t0 = Clock::now();
  std::vector<std::exception_ptr> errors = g.startEach();
  CHECK(secondsSince(t0) < 3.0);
  std::vector<std::string> failures = startFailures(errors);
  INFO("failures: " << joined(failures));
  CHECK(failures.size() == 2);  // neither can form a job
  CHECK(std::any_of(failures.begin(), failures.end(),
                    [](const std::string& m) {
                      return contains(m, "world size") && contains(m, "2") && contains(m, "3");
                    }));
}

TEST_CASE("a rank outside the world is rejected before anything starts") {
  Options o = weft::testing::agentOptions(3, 3, weft::testing::freePort());
  std::string m = messageOf<InvalidArgumentError>([&] { o.validate(); });
  CHECK(contains(m, "rank 3"));
  CHECK(contains(m, "worldSize 3"));
  CHECK_THROWS_AS(Agent{o}, InvalidArgumentError);
  o.rank = -1;
  CHECK_THROWS_AS(Agent{o}, InvalidArgumentError);
}

TEST_CASE("two workers claiming one rank are a clear error at start, and nobody waits past the store timeout") {
  AgentGroup g(3, [](int r, Options& o) {
    shortStart(r, o);
    if (r == 2) o.rank = 1;
  });
  auto t0 = Clock::now();
  std::vector<std::exception_ptr> errors = g.startEach();
  CHECK(secondsSince(t0) < 3.0);
  std::vector<std::string> failures = startFailures(errors);
  INFO("failures: " << joined(failures));
  CHECK(failures.size() == 3);  // rank 2 never arrives, so no one can form the job
  CHECK(std::any_of(failures.begin(), failures.end(),
                    [](const std::string& m) { return contains(m, "rank 1") || contains(m, "worker2"); }));
}

TEST_CASE("an agent waiting in start for a peer that never comes is released at once by its shutdown") {
  AgentGroup g(2, [](int, Options& o) {
    o.storeTimeout = 10s;
    o.shutdownTimeout = 1s;
  });
  // Only rank 0 starts: it waits for rank 1.
  std::exception_ptr error;
  std::atomic<bool> done{false};
  std::thread starter([&] {
    try {
      g.agent(0).start();
    } catch (...) {
      error = std::current_exception();
    }
    done = true;
  });
  std::this_thread::sleep_for(200ms);
  if (done) {
    starter.join();
    FAIL("start() returned before it was shut down: " << (error ? whatOf(error) : std::string("no error")));
  }
  auto t0 = Clock::now();
  ShutdownReport report = g.agent(0).shutdown({.graceful = false});
  bool released = eventually([&] { return done.load(); }, 2s);
  double took = secondsSince(t0);
  starter.join();
  CHECK(released);
  CHECK(took < 2.0);
  CHECK_FALSE(report.graceful);
  REQUIRE(error);
  // The interrupted start fails as cancelled (or as a start on an agent shut down).
  bool cancelled = false;
  try {
    std::rethrow_exception(error);
  } catch (const CancelledError&) {
    cancelled = true;
  } catch (const StateError&) {
    cancelled = true;
  } catch (const std::exception& e) {
    FAIL_CHECK("start() failed with " << describeError(e));
  }
  CHECK(cancelled);
  CHECK_FALSE(g.agent(0).started());
}

TEST_CASE("every worker of a job that cannot form learns why, without waiting out the store timeout") {
  // The worker that detects the problem is not the only one to hear of it: the
  // others would otherwise wait the whole store timeout (300 s by default) and
  // then blame a worker that did arrive.
  struct Case {
    std::string what;
    std::function<void(int, Options&)> configure;
    std::vector<std::string> words;  // each error names the problem with all of these
  };
  std::vector<Case> cases = {
      {"duplicate names", [](int, Options& o) { o.name = std::string(1, 'a'); }, {"duplicate", "'a'"}},
      {"world size mismatch", [](int r, Options& o) { o.worldSize = r == 1 ? 3 : 2; }, {"world size"}},
      {"one rank twice", [](int r, Options& o) { o.rank = r == 2 ? 1 : r; }, {"rank 1"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    int world = c.what == "one rank twice" ? 3 : 2;
    AgentGroup g(world, [&](int r, Options& o) {
      o.storeTimeout = 3s;
      o.shutdownTimeout = 1s;
      c.configure(r, o);
    });
    auto t0 = Clock::now();
    std::vector<std::exception_ptr> errors = g.startEach();
    CHECK(secondsSince(t0) < 1.5);
    for (size_t r = 0; r < errors.size(); ++r) {
      CAPTURE(r);
      REQUIRE(errors[r]);
      std::string m = whatOf(errors[r]);
      INFO(m);
      for (const std::string& w : c.words) CHECK(contains(m, w));
    }
  }
}
