// Declarations and helpers shared by the Agent's tests (tests/rpc/agent_*_test.cpp): the
// functions callers and callees declare (echoes of every codec type, slow and gated bodies,
// throwing handlers), the bodies that implement them, and small checks of agent state.
#pragma once

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
#include "rpc/agent_group.h"
#include "captured_text.h"

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

namespace agent_test {

using Clock = std::chrono::steady_clock;

inline double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// "a, b, c", for messages about lists of names.
inline std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Same dtype, shape and bytes.
inline bool sameTensor(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ca = a.contiguous();
  Tensor cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.rawData(), cb.rawData(), ca.nbytes()) == 0;
}

// "TypeName: message" of an exception, for failure messages (doctest prints a
// const char* as a pointer).
inline std::string describeError(const std::exception& e) { return std::string(typeid(e).name()) + ": " + e.what(); }

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

inline void bindEchoes(Registry& r) {
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
inline void bindSlow(Registry& r) {
  r.impl(slow, [](int32_t ms, int32_t tag) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return tag;
  });
}

inline AgentStats stats(AgentGroup& g, int rank) { return g.agent(rank).stats(); }

// Every agent of g has no call in flight either way (replies may still be
// leaving a callee a moment after the caller has its result).
inline bool quiet(AgentGroup& g) {
  for (int r = 0; r < g.size(); ++r) {
    AgentStats s = stats(g, r);
    if (s.pendingOutgoing != 0 || s.activeIncoming != 0) return false;
  }
  return true;
}

}  // namespace agent_test

using namespace agent_test;
