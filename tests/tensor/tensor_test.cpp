#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tensor/ops.h"
#include "weft_test.h"

using namespace weft;

TEST_CASE("views share storage and report strides") {
  Tensor x = arange(12, {.dtype = DType::Float32}).view({3, 4});
  Tensor t = x.t();
  CHECK(t.shape() == Shape{4, 3});
  CHECK(t.strides() == Shape{1, 4});
  CHECK_FALSE(t.isContiguous());
  CHECK(t.storage() == x.storage());
  CHECK(t.contiguous().toVector<float>()[1] == 4);
  Tensor n = x.narrow(1, 1, 2);
  CHECK(n.toVector<float>() == std::vector<float>{1, 2, 5, 6, 9, 10});
  CHECK(x.select(0, 2).toVector<float>() == std::vector<float>{8, 9, 10, 11});
}

TEST_CASE("view refuses incompatible strides while reshape copies") {
  Tensor x = arange(6, {.dtype = DType::Float64}).view({2, 3}).t();
  CHECK_THROWS_WITH_AS(x.view({6}), doctest::Contains("incompatible"), InvalidArgumentError);
  CHECK(x.reshape({6}).toVector<double>() == std::vector<double>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("shape errors name the op and the shapes") {
  Tensor a = zeros({2, 3}), b = zeros({4});
  CHECK_THROWS_WITH_AS(add(a, b), doctest::Contains("add: shapes [2, 3] and [4]"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(add(a, zeros({3}, {.dtype = DType::Float64})), doctest::Contains("dtype mismatch"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(a.narrow(1, 2, 5), IndexError);
  CHECK_THROWS_AS(a.select(0, 2), IndexError);
  CHECK_THROWS_AS(a.transpose(0, 3), IndexError);
}

TEST_CASE("the default generator is reproducible after manualSeed") {
  manualSeed(7);
  std::vector<float> a = randn({5}).toVector<float>();
  manualSeed(7);
  std::vector<float> b = randn({5}).toVector<float>();
  CHECK(a == b);
  Generator g(3);
  Tensor r = randint(2, 5, {1000}, {.dtype = DType::Int64}, &g);
  auto v = r.toVector<int64_t>();
  CHECK(*std::min_element(v.begin(), v.end()) == 2);
  CHECK(*std::max_element(v.begin(), v.end()) == 4);
  Tensor u = rand({10000}, {.dtype = DType::Float64}, &g);
  double m = u.mean().item<double>();
  CHECK(m == doctest::Approx(0.5).epsilon(0.02));
}

TEST_CASE("to(dtype) converts and clone copies") {
  Tensor x = fromVector<double>({1.5, -2.25});
  CHECK(x.to(DType::Float32).toVector<float>() == std::vector<float>{1.5f, -2.25f});
  CHECK(x.to(DType::Int64).toVector<int64_t>() == std::vector<int64_t>{1, -2});
  Tensor c = x.clone();
  {
    NoGradGuard ng;
    c.fill_(0);
  }
  CHECK(x.toVector<double>()[0] == 1.5);
}

TEST_CASE("printing looks like PyTorch's") {
  Tensor x = fromVector<float>({1, -2.5, 0, 3}, {2, 2});
  CHECK(x.toString() == "tensor([[ 1.0000, -2.5000],\n        [ 0.0000,  3.0000]])");
  CHECK(fromVector<int64_t>({1, 2}).toString() == "tensor([1, 2])");
  Tensor big = zeros({2000});
  CHECK(big.toString().find("...") != std::string::npos);
}

TEST_CASE("copy_ broadcasts into a strided destination") {
  Tensor x = zeros({3, 2}, {.dtype = DType::Float64});
  Tensor t = x.t();
  t.copy_(fromVector<double>({1, 2, 3}));
  CHECK(x.toVector<double>() == std::vector<double>{1, 1, 2, 2, 3, 3});
}

TEST_CASE("integer division by zero is an error, not a crash") {
  Tensor a = fromVector<int64_t>({4, 5}), b = fromVector<int64_t>({2, 0});
  CHECK_THROWS_WITH_AS(div(a, b), doctest::Contains("division by zero"), InvalidArgumentError);
}

TEST_CASE("a CUDA allocation on a device that is not there is a clear error") {
  // cuda:0 without a device (or without CUDA), the first index past the last device with one.
  const int missing = kernels::cudaDeviceCount();
  const std::string named = "cannot allocate on cuda:" + std::to_string(missing);
  CHECK_THROWS_WITH_AS(zeros({2}, {.device = Device::cuda(missing)}), doctest::Contains(named.c_str()),
                       InvalidArgumentError);
}

TEST_CASE("live and peak bytes count what tensors hold, not the kept buffers") {
  const Storage::MemoryStats before = Storage::memoryStats();
  Storage::resetPeakBytes();
  CHECK(Storage::memoryStats().peakBytes == before.liveBytes);
  {
    Tensor a = empty({1000}, {.dtype = DType::Float64});  // 8,000 bytes
    Tensor view = a.narrow(0, 10, 20);                    // shares a's storage
    CHECK(Storage::memoryStats().liveBytes == before.liveBytes + 8000);
    {
      Tensor b = empty({3 << 20}, {.dtype = DType::Float32});  // 12 MiB, kept for reuse once freed
      CHECK(Storage::memoryStats().liveBytes == before.liveBytes + 8000 + (size_t{12} << 20));
    }
    CHECK(Storage::memoryStats().liveBytes == before.liveBytes + 8000);
  }
  const Storage::MemoryStats after = Storage::memoryStats();
  CHECK(after.liveBytes == before.liveBytes);
  CHECK(after.peakBytes == before.liveBytes + 8000 + (size_t{12} << 20));
  Storage::resetPeakBytes();
  CHECK(Storage::memoryStats().peakBytes == before.liveBytes);
  CHECK_THROWS_AS(Storage::memoryStats(Device::cuda(16)), InvalidArgumentError);
  Storage::releaseCachedMemory();
}

TEST_CASE("freed large CPU buffers are kept up to the most bytes ever live, then handed back for reuse") {
  Storage::releaseCachedMemory();
  // 96 buffers of 4 MiB live at once (384 MiB, above the 256 MiB floor): a step's activations.
  constexpr int64_t kBuffers = 96;
  constexpr size_t kBytes = size_t{4} << 20;
  std::vector<void*> first;
  {
    std::vector<Tensor> step;
    for (int64_t i = 0; i < kBuffers; ++i) step.push_back(empty({static_cast<int64_t>(kBytes / 4)}));
    for (const Tensor& t : step) first.push_back(t.rawData());
  }
  // All of them are kept, not only the first 256 MiB...
  CHECK(Storage::cachedBytes() == kBuffers * kBytes);
  // ...and the next step gets the same buffers back.
  {
    std::vector<Tensor> step;
    for (int64_t i = 0; i < kBuffers; ++i) step.push_back(empty({static_cast<int64_t>(kBytes / 4)}));
    int64_t reused = 0;
    for (const Tensor& t : step) reused += std::find(first.begin(), first.end(), t.rawData()) != first.end();
    CHECK(reused == kBuffers);
    CHECK(Storage::cachedBytes() == 0);
  }
  CHECK(Storage::releaseCachedMemory() == kBuffers * kBytes);
  CHECK(Storage::cachedBytes() == 0);
}

TEST_CASE("a released storage gives its bytes back while its tensors live on, and reallocate refills it") {
  Tensor a = arange(0, 1000, 1, {.dtype = DType::Float64});  // 8,000 bytes
  Tensor saved = a.detach();                                // another view of the same storage
  const uint64_t version = a.version();
  const size_t before = Storage::memoryStats().liveBytes;
  a.storage()->release();
  CHECK(Storage::memoryStats().liveBytes == before - 8000);
  CHECK(a.storage()->nbytes() == 0);
  CHECK(a.storage()->data() == nullptr);
  CHECK_THROWS_WITH_AS((void)saved.sum(), doctest::Contains("views a released storage"), StateError);
  a.storage()->reallocate(8000);
  CHECK(Storage::memoryStats().liveBytes == before);
  std::vector<double> values(1000, 2.5);
  std::memcpy(a.storage()->data(), values.data(), 8000);
  CHECK(saved.toVector<double>() == values);  // the saved view sees the refilled buffer
  CHECK(a.version() == version);              // neither step counts as an in-place write
  a.storage()->release();
  a.storage()->release();                     // twice is harmless
  CHECK(Storage::memoryStats().liveBytes == before - 8000);
}

TEST_CASE("freed large CPU buffers are reused by the next allocation of the same size") {
  Storage::releaseCachedMemory();
  CHECK(Storage::cachedBytes() == 0);
  void* first = nullptr;
  {
    Tensor big = empty({3 << 20}, {.dtype = DType::Float32});  // 12 MiB
    first = big.rawData();
  }
  CHECK(Storage::cachedBytes() == (size_t{12} << 20));
  {
    Tensor again = empty({3 << 20}, {.dtype = DType::Float32});
    CHECK(again.rawData() == first);
    CHECK(Storage::cachedBytes() == 0);
    Tensor other = empty({1 << 20}, {.dtype = DType::Float32});  // another size: a new block
    CHECK(other.rawData() != first);
  }
  CHECK(Storage::releaseCachedMemory() == (size_t{16} << 20));
  CHECK(Storage::cachedBytes() == 0);
  {
    Tensor mid = empty({25000});  // 100,000 bytes: kept as 25 pages
  }
  CHECK(Storage::cachedBytes() == 25 * 4096);
  Storage::releaseCachedMemory();
  {
    Tensor small = empty({1000});  // below 64 KiB: the C heap, never cached
  }
  CHECK(Storage::cachedBytes() == 0);
}

TEST_CASE("abs clears the sign bit of floats, -0 and NaN included, as PyTorch") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType type : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    CAPTURE(dtypeName(type));
    // Long enough for the vectorised body and a tail.
    std::vector<double> in(37, -1.5);
    in[0] = -0.0;
    in[1] = -nan;
    in[2] = 2.0;
    in[36] = -0.0;
    std::vector<double> out = abs(fromVector<double>(in).to(type)).toVector<double>();
    CHECK(out[0] == 0.0);
    CHECK_FALSE(std::signbit(out[0]));
    CHECK(std::isnan(out[1]));
    CHECK_FALSE(std::signbit(out[1]));
    CHECK(out[2] == 2.0);
    CHECK(out[20] == 1.5);
    CHECK_FALSE(std::signbit(out[36]));
  }
}

TEST_CASE("pinMemory without a CUDA build is an InvalidArgumentError") {
  if (kernels::cudaBuilt()) return;  // covered by the gpu tests
  CHECK_THROWS_AS(ones({2}).pinMemory(), InvalidArgumentError);
  CHECK_FALSE(ones({2}).isPinned());
}
