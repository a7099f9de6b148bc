// CUDA elementwise ops, copies and the device runtime against the CPU
// (tests/cuda_compare.h). Each case skips without a device.
#include <doctest/doctest.h>

#include "cuda_compare.h"
#include "kernels/device.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/runtime.h"
#endif

using namespace weft;
using namespace weft::testing;

namespace {

const DType kFloatTypes[] = {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16};

}  // namespace

TEST_CASE("cuda: binary ops with broadcasting and views match the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  using F = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::pair<const char*, F> ops[] = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b, 0.5); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, add(abs(b), 0.5)); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(add(abs(a), 0.1), b); }},
  };
  for (DType t : kFloatTypes) {
    for (const auto& [name, f] : ops) {
      std::string n = std::string(name) + " " + dtypeName(t);
      compareWithCpu(n + " same shape", {randomTensor({37, 65}, t, 1), randomTensor({37, 65}, t, 2)},
                     [&](const std::vector<Tensor>& x) { return f(x[0], x[1]); });
      compareWithCpu(n + " row broadcast", {randomTensor({5, 7, 9}, t, 3), randomTensor({9}, t, 4)},
                     [&](const std::vector<Tensor>& x) { return f(x[0], x[1]); });
      compareWithCpu(n + " both broadcast", {randomTensor({5, 1, 9}, t, 5), randomTensor({1, 7, 1}, t, 6)},
                     [&](const std::vector<Tensor>& x) { return f(x[0], x[1]); });
      compareWithCpu(n + " transposed", {randomTensor({19, 23}, t, 7), randomTensor({23, 19}, t, 8)},
                     [&](const std::vector<Tensor>& x) { return f(x[0], x[1].t()); });
      compareWithCpu(n + " scalar", {randomTensor({1000}, t, 9), randomTensor({}, t, 10)},
                     [&](const std::vector<Tensor>& x) { return f(x[0], x[1]); });
      compareWithCpu(n + " empty", {randomTensor({0, 5}, t, 11), randomTensor({5}, t, 12)},
                     [&](const std::vector<Tensor>& x) { return f(x[0], x[1]); });
    }
  }
}

TEST_CASE("cuda: integer arithmetic wraps and integer division by zero is an error, as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType t : {DType::Int64, DType::Int32, DType::UInt8}) {
    compareWithCpu(std::string("int ops ") + dtypeName(t), {randomTensor({33, 17}, t, 1), randomTensor({17}, t, 2)},
                   [](const std::vector<Tensor>& x) {
                     return sub(mul(add(x[0], x[1]), x[1]), maximum(x[0], x[1]));
                   });
  }
  Tensor a = fromVector(std::vector<int64_t>{7, -7, 3}, {3}).to(Device::cuda(0));
  Tensor b = fromVector(std::vector<int64_t>{2, 2, 0}, {3}).to(Device::cuda(0));
  CHECK_THROWS_AS(div(a, b), InvalidArgumentError);
  Tensor ok = fromVector(std::vector<int64_t>{2, 2, -1}, {3}).to(Device::cuda(0));
  CHECK(div(a, ok).toVector<int64_t>() == std::vector<int64_t>{3, -3, -3});
}

TEST_CASE("cuda: unary ops forward and backward match the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  using F = std::function<Tensor(const Tensor&)>;
  const std::pair<const char*, F> ops[] = {
      {"neg", [](const Tensor& a) { return neg(a); }},
      {"exp", [](const Tensor& a) { return exp(a); }},
      {"log", [](const Tensor& a) { return log(add(abs(a), 0.1)); }},
      {"sqrt", [](const Tensor& a) { return sqrt(add(abs(a), 0.1)); }},
      {"abs", [](const Tensor& a) { return abs(a); }},
      {"relu", [](const Tensor& a) { return relu(a); }},
      {"tanh", [](const Tensor& a) { return tanh(a); }},
      {"sigmoid", [](const Tensor& a) { return sigmoid(a); }},
      {"gelu", [](const Tensor& a) { return gelu(mul(a, 3.0)); }},
      {"pow 3", [](const Tensor& a) { return pow(a, 3.0); }},
      {"pow 0.5", [](const Tensor& a) { return pow(add(abs(a), 0.1), 0.5); }},
      {"clamp", [](const Tensor& a) { return clamp(a, -0.3, 0.4); }},
      {"square", [](const Tensor& a) { return square(a); }},
      {"reciprocal", [](const Tensor& a) { return 1.0 / add(abs(a), 0.5); }},
      {"scalar add/mul", [](const Tensor& a) { return mul(add(a, 2.5), -1.5); }},
  };
  for (DType t : kFloatTypes) {
    for (const auto& [name, f] : ops) {
      std::string n = std::string(name) + " " + dtypeName(t);
      compareWithCpu(n, {randomTensor({129, 31}, t, 21)}, [&](const std::vector<Tensor>& x) { return f(x[0]); });
      compareWithCpu(n + " transposed", {randomTensor({31, 17}, t, 22)},
                     [&](const std::vector<Tensor>& x) { return f(x[0].t()); });
      compareWithCpu(n + " empty", {randomTensor({0}, t, 23)}, [&](const std::vector<Tensor>& x) { return f(x[0]); });
    }
  }
}

TEST_CASE("cuda: comparisons, where, maskedFill, triu and tril match the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType t : {DType::Float64, DType::Float32, DType::BFloat16, DType::Int64}) {
    std::string n = dtypeName(t);
    Tensor a = randomTensor({13, 11}, t, 31), b = randomTensor({11}, t, 32);
    for (auto [name, cmp] : {std::pair{"eq", &eq}, std::pair{"gt", &gt}, std::pair{"lt", &lt}}) {
      compareWithCpu(std::string(name) + " " + n, {a, b},
                     [cmp = cmp](const std::vector<Tensor>& x) { return cmp(x[0], x[1]); }, {.backward = false});
    }
    compareWithCpu("where " + n, {a, b, randomTensor({13, 1}, DType::Bool, 33)},
                   [](const std::vector<Tensor>& x) { return where(x[2], x[0], x[1]); });
    compareWithCpu("maskedFill " + n, {a, randomTensor({11}, DType::Bool, 34)},
                   [](const std::vector<Tensor>& x) { return maskedFill(x[0], x[1], -3); });
    compareWithCpu("triu " + n, {randomTensor({3, 7, 5}, t, 35)},
                   [](const std::vector<Tensor>& x) { return triu(x[0], 1); });
    compareWithCpu("tril " + n, {randomTensor({3, 5, 7}, t, 36)},
                   [](const std::vector<Tensor>& x) { return tril(x[0].transpose(1, 2), -1); });
  }
}

TEST_CASE("cuda: copies, casts, contiguous() and clone() of views") {
  WEFT_SKIP_WITHOUT_CUDA();
  const DType all[] = {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16,
                       DType::Int64,   DType::Int32,   DType::UInt8,    DType::Bool};
  for (DType from : all) {
    for (DType to : all) {
      Tensor x = randomTensor({6, 10}, from, 41, -300, 300);
      compareWithCpu(std::string("cast ") + dtypeName(from) + " to " + dtypeName(to), {x},
                     [to](const std::vector<Tensor>& v) { return v[0].t().to(to); }, {.backward = false});
    }
  }
  // contiguous() of a non-contiguous CUDA tensor (once an infinite recursion).
  Tensor x = arange(24, {.dtype = DType::Float32}).view({2, 3, 4});
  Tensor d = x.to(Device::cuda(0));
  Tensor p = d.permute({2, 0, 1}).contiguous();
  CHECK(p.isContiguous());
  CHECK(p.to(Device::cpu()).toVector<float>() == x.permute({2, 0, 1}).contiguous().toVector<float>());
  CHECK(d.narrow(2, 1, 2).clone().toVector<float>() == x.narrow(2, 1, 2).contiguous().toVector<float>());
  // copy_ into a strided destination, across devices and dtypes.
  Tensor dst = zeros({4, 6}, {.dtype = DType::Float64, .device = Device::cuda(0)});
  dst.t().copy_(arange(24, {.dtype = DType::Float32}).view({6, 4}));
  Tensor ref = zeros({4, 6}, {.dtype = DType::Float64});
  ref.t().copy_(arange(24, {.dtype = DType::Float32}).view({6, 4}));
  CHECK(dst.toVector<double>() == ref.toVector<double>());
  // fill_ on a view, in-place add_/mul_.
  Tensor f = zeros({5, 5}, {.device = Device::cuda(0)});
  f.narrow(1, 1, 2).fill_(3);
  f.add_(ones({5, 5}, {.device = Device::cuda(0)}), 2.0).mul_(0.5);
  Tensor fr = zeros({5, 5});
  fr.narrow(1, 1, 2).fill_(3);
  fr.add_(ones({5, 5}), 2.0).mul_(0.5);
  CHECK(f.toVector<float>() == fr.toVector<float>());
  // Printing reads through the host.
  std::ostringstream os;
  os << d.transpose(0, 2);
  CHECK(os.str().find("cuda:0") != std::string::npos);
}

#ifdef WEFT_HAVE_CUDA
TEST_CASE("cuda: the caching allocator reuses freed blocks without cudaMalloc") {
  WEFT_SKIP_WITHOUT_CUDA();
  namespace kc = weft::kernels::cuda;
  { Tensor warm = empty({1 << 20}, {.device = Device::cuda(0)}); }
  auto before = kc::allocatorStats(0);
  for (int i = 0; i < 50; ++i) {
    Tensor t = empty({1 << 20}, {.device = Device::cuda(0)});
  }
  auto after = kc::allocatorStats(0);
  CHECK(after.deviceMallocs == before.deviceMallocs);
  CHECK(after.cacheHits >= before.cacheHits + 50);
  CHECK(kc::releaseCachedMemory(0) > 0);
  CHECK(kc::allocatorStats(0).reservedBytes == kc::allocatorStats(0).allocatedBytes);
}

TEST_CASE("cuda: ops run on the thread's current stream and events order streams") {
  WEFT_SKIP_WITHOUT_CUDA();
  namespace kc = weft::kernels::cuda;
  kc::Stream s = kc::createStream(0);
  Tensor x = randomTensor({1 << 16}, DType::Float32, 51).to(Device::cuda(0));
  Tensor y;
  {
    kc::StreamGuard g(0, s);
    CHECK(kc::currentStream(0) == s);
    y = mul(exp(x), 2.0);
    kc::Event e = kc::createEvent(0);
    kc::recordEvent(0, e, s);
    kc::synchronizeEvent(0, e);
    kc::destroyEvent(0, e);
  }
  CHECK(kc::currentStream(0) != s);
  checkMatches("stream result", y, mul(exp(x.to(Device::cpu())), 2.0), defaultTolerance(DType::Float32));
  kc::synchronizeDevice(0);
  kc::destroyStream(0, s);
}

TEST_CASE("cuda: errors are typed and name the device") {
  WEFT_SKIP_WITHOUT_CUDA();
  int n = kernels::cudaDeviceCount();
  CHECK_THROWS_AS(zeros({2}, {.device = Device::cuda(n)}), InvalidArgumentError);
  // More memory than any device has: a DeviceError, and the process goes on.
  CHECK_THROWS_AS(empty({int64_t(1) << 45}, {.dtype = DType::Float32, .device = Device::cuda(0)}), DeviceError);
  Tensor ok = ones({3}, {.device = Device::cuda(0)});
  CHECK(ok.sum().item<float>() == 3.0f);
  // The calling thread's device is restored after an op on another device.
  CHECK(kernels::cuda::currentDevice() == 0);
}
#endif

TEST_CASE("cuda: pinned host tensors copy to the device and their blocks are not reused under a copy") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tensor src = randomTensor({1 << 22}, DType::Float32, 61);
  std::vector<Tensor> onDevice;
  for (int i = 0; i < 4; ++i) {
    Tensor pinned = mul(src, static_cast<double>(i + 1)).pinMemory();
    CHECK(pinned.isPinned());
    onDevice.push_back(pinned.to(Device::cuda(0)));
    // pinned is freed here while its copy may be in flight; the next pinMemory must not reuse it yet.
  }
  for (int i = 0; i < 4; ++i) {
    checkMatches("pinned copy " + std::to_string(i), onDevice[static_cast<size_t>(i)],
                 mul(src, static_cast<double>(i + 1)), {0, 0});
  }
  CHECK_FALSE(src.isPinned());
  CHECK_THROWS_AS(onDevice[0].pinMemory(), InvalidArgumentError);
}
