// Reductions, extrema, cumsum and softmax on CUDA against the CPU kernels
// (tests/cuda_compare.h): every op over first, middle, last, several and all
// dims, keepDim, odd, size-1 and empty sizes, non-contiguous views, the
// shapes that take the split (two-pass) paths, float64/float32/bfloat16/
// float16 where the op takes them, forward and backward.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cuda_compare.h"
#include "tensor/ops.h"
#include "weft_test.h"

using namespace weft;
using namespace weft::testing;

namespace {

const std::vector<DType> kFloating = {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16};

std::string caseName(const char* op, const Shape& s, DType t, const std::string& extra = "") {
  return detail::concat(op, " ", s, " ", dtypeName(t), " ", extra);
}

// Random values with many ties: integers in [0, 10) as `dtype`.
Tensor tiedTensor(Shape shape, DType dtype, uint64_t seed) {
  return randomTensor(std::move(shape), DType::Int64, seed).to(dtype);
}

// Element by element, NaN where the other has NaN, equal elsewhere (exact).
void checkSameWithNan(const std::string& what, const Tensor& gpu, const Tensor& cpu) {
  INFO(what);
  auto g = gpu.to(Device::cpu()).to(DType::Float64).contiguous().toVector<double>();
  auto c = cpu.to(DType::Float64).contiguous().toVector<double>();
  REQUIRE(g.size() == c.size());
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": gpu " << g[i] << ", cpu " << c[i]);
    if (std::isnan(c[i])) {
      CHECK(std::isnan(g[i]));
    } else {
      CHECK((g[i] == c[i] || std::abs(g[i] - c[i]) <= 1e-6 * (1 + std::abs(c[i]))));
    }
  }
}

}  // namespace

TEST_CASE("sum and mean over any dims match the CPU, forward and backward") {
  WEFT_SKIP_WITHOUT_CUDA();
  const std::vector<Shape> shapes = {{7, 33, 5}, {1, 1, 1}, {0, 4, 3}, {3, 0, 2}, {257, 3, 1}, {2, 3, 300}};
  const std::vector<std::vector<int64_t>> dimSets = {{0}, {1}, {-1}, {0, 2}, {0, 1}, {1, 2}, {}};
  uint64_t seed = 1;
  for (DType dt : kFloating) {
    for (const Shape& s : shapes) {
      for (const auto& dims : dimSets) {
        for (bool keep : {false, true}) {
          const std::string extra = detail::concat("dims ", dims, " keepDim ", keep);
          compareWithCpu(caseName("sum", s, dt, extra), {randomTensor(s, dt, seed++)},
                         [&](const std::vector<Tensor>& x) { return sum(x[0], dims, keep); });
          // A mean over nothing is NaN on both devices, which the comparison does not take.
          const bool hasEmptyDim = std::find(s.begin(), s.end(), 0) != s.end();
          if (hasEmptyDim) continue;
          compareWithCpu(caseName("mean", s, dt, extra), {randomTensor(s, dt, seed++)},
                         [&](const std::vector<Tensor>& x) { return mean(x[0], dims, keep); });
        }
      }
    }
  }
}

TEST_CASE("sum of non-contiguous views matches the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
    compareWithCpu(caseName("sum of t()", {37, 19}, dt), {randomTensor({37, 19}, dt, 3)},
                   [](const std::vector<Tensor>& x) { return sum(x[0].t(), {1}); });
    compareWithCpu(caseName("sum of permute", {4, 5, 6}, dt), {randomTensor({4, 5, 6}, dt, 4)},
                   [](const std::vector<Tensor>& x) { return sum(x[0].permute({2, 0, 1}), {0, 2}, true); });
    compareWithCpu(caseName("sum of narrow", {9, 40}, dt), {randomTensor({9, 40}, dt, 5)},
                   [](const std::vector<Tensor>& x) { return sum(x[0].narrow(1, 3, 31), {0}); });
    compareWithCpu(caseName("sum of expand", {1, 40}, dt), {randomTensor({1, 40}, dt, 6)},
                   [](const std::vector<Tensor>& x) { return sum(x[0].expand({12, 40}), {1}); });
  }
}

TEST_CASE("sums that take the split paths match the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  // The CPU sums the leading axis of a float32 [R, K] buffer in float32
  // (kernels/cpu/reduce.cpp, sumCols), the device in float64: over
  // thousands of rows the CPU's own rounding exceeds the default float32
  // tolerance. The float32 column sums are therefore compared with the CPU at
  // a wider atol, and with a float64 CPU sum at the default one.
  for (const Shape& s : std::vector<Shape>{{16385, 96}, {3, 20000, 5}}) {
    Tensor x = randomTensor(s, DType::Float32, 90);
    const std::vector<int64_t> dims = s.size() == 2 ? std::vector<int64_t>{0} : std::vector<int64_t>{1};
    Tensor exact = sum(x.to(DType::Float64), dims).to(DType::Float32);
    checkMatches(caseName("sum cols against float64", s, DType::Float32), sum(x.to(Device::cuda(0)), dims), exact,
                 defaultTolerance(DType::Float32));
  }
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
    const CompareOptions columns{.atolScale = dt == DType::Float32 ? 100.0 : 1.0};
    // Few long rows: the rows are cut into pieces and combined in a second pass.
    compareWithCpu(caseName("sum rows", {3, 300001}, dt), {randomTensor({3, 300001}, dt, 7)},
                   [](const std::vector<Tensor>& x) { return sum(x[0], {1}); });
    compareWithCpu(caseName("sum all", {1 << 20}, dt), {randomTensor({1 << 20}, dt, 8)},
                   [](const std::vector<Tensor>& x) { return sum(x[0]); });
    // Few columns over many rows: column pieces and a second pass.
    compareWithCpu(caseName("sum cols", {16385, 96}, dt), {randomTensor({16385, 96}, dt, 9)},
                   [](const std::vector<Tensor>& x) { return sum(x[0], {0}); }, columns);
    compareWithCpu(caseName("sum middle", {3, 20000, 5}, dt), {randomTensor({3, 20000, 5}, dt, 10)},
                   [](const std::vector<Tensor>& x) { return sum(x[0], {1}); }, columns);
  }
}

TEST_CASE("sumTo reduces a bias gradient over the leading rows as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16}) {
    compareWithCpu(caseName("sumTo bias", {8192, 256}, dt), {randomTensor({8192, 256}, dt, 11)},
                   [](const std::vector<Tensor>& x) { return sumTo(x[0], {256}); });
    compareWithCpu(caseName("sumTo keep", {4, 33, 7}, dt), {randomTensor({4, 33, 7}, dt, 12)},
                   [](const std::vector<Tensor>& x) { return sumTo(x[0], {33, 1}); });
    compareWithCpu(caseName("sumTo odd", {1000, 3}, dt), {randomTensor({1000, 3}, dt, 13)},
                   [](const std::vector<Tensor>& x) { return sumTo(x[0], {1, 3}); });
  }
}

TEST_CASE("integer and bool sums are exact Int64 sums as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::Int64, DType::Int32, DType::UInt8, DType::Bool}) {
    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{0}, {1}, {}}) {
      compareWithCpu(caseName("sum int", {300, 1001}, dt), {randomTensor({300, 1001}, dt, 14)},
                     [&](const std::vector<Tensor>& x) { return sum(x[0], dims); });
    }
  }
  // uint8 sums do not wrap at 256.
  Tensor big = full({1000}, 200, {.dtype = DType::UInt8});
  Tensor s = sum(big.to(Device::cuda(0)));
  CHECK(s.dtype() == DType::Int64);
  CHECK(s.to(Device::cpu()).item<int64_t>() == 200000);
}

TEST_CASE("max and min over all elements match the CPU for every dtype") {
  WEFT_SKIP_WITHOUT_CUDA();
  const std::vector<DType> types = {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16,
                                    DType::Int64,   DType::Int32,   DType::UInt8,    DType::Bool};
  for (DType dt : types) {
    for (const Shape& s : std::vector<Shape>{{1}, {7, 13}, {1 << 20}}) {
      compareWithCpu(caseName("max all", s, dt), {randomTensor(s, dt, 15)},
                     [](const std::vector<Tensor>& x) { return max(x[0]); });
      compareWithCpu(caseName("min all", s, dt), {randomTensor(s, dt, 16)},
                     [](const std::vector<Tensor>& x) { return min(x[0].reshape({-1})); });
    }
  }
  // Ties share the gradient equally (the gradient rule runs on the device).
  compareWithCpu("max all ties", {tiedTensor({50, 40}, DType::Float32, 17)},
                 [](const std::vector<Tensor>& x) { return max(x[0]); });
}

TEST_CASE("max, min, argmax and argmin along a dim match the CPU, first index on ties") {
  WEFT_SKIP_WITHOUT_CUDA();
  const std::vector<Shape> shapes = {{5, 7, 9}, {1, 1, 1}, {4, 0, 3}, {2, 3, 2500}, {3000, 2, 3}};
  uint64_t seed = 20;
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16, DType::Int64, DType::UInt8}) {
    for (const Shape& s : shapes) {
      for (int64_t dim : {0, 1, 2, -1}) {
        if (s[dim < 0 ? dim + 3 : dim] == 0) continue;  // nothing to choose from: an error on both devices
        for (bool keep : {false, true}) {
          const std::string extra = detail::concat("dim ", dim, " keepDim ", keep);
          Tensor x = tiedTensor(s, dt, seed++);
          compareWithCpu(caseName("max values", s, dt, extra), {x},
                         [&](const std::vector<Tensor>& v) { return max(v[0], dim, keep).first; });
          compareWithCpu(caseName("max indices", s, dt, extra), {x},
                         [&](const std::vector<Tensor>& v) { return max(v[0], dim, keep).second; });
          compareWithCpu(caseName("min values", s, dt, extra), {x},
                         [&](const std::vector<Tensor>& v) { return min(v[0], dim, keep).first; });
          compareWithCpu(caseName("min indices", s, dt, extra), {x},
                         [&](const std::vector<Tensor>& v) { return min(v[0], dim, keep).second; });
          compareWithCpu(caseName("argmax", s, dt, extra), {x},
                         [&](const std::vector<Tensor>& v) { return argmax(v[0], dim, keep); });
          compareWithCpu(caseName("argmin", s, dt, extra), {x},
                         [&](const std::vector<Tensor>& v) { return argmin(v[0], dim, keep); });
        }
      }
    }
  }
}

TEST_CASE("extrema of long rows and columns find the first tied position across pieces") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::Float32, DType::Float64}) {
    Tensor rows = tiedTensor({2, 500001}, dt, 30);
    compareWithCpu("argmax long rows", {rows}, [](const std::vector<Tensor>& v) { return argmax(v[0], 1); });
    compareWithCpu("argmin long rows", {rows}, [](const std::vector<Tensor>& v) { return argmin(v[0], 1); });
    compareWithCpu("max long rows", {rows}, [](const std::vector<Tensor>& v) { return max(v[0], 1).first; });
    Tensor cols = tiedTensor({100003, 3}, dt, 31);
    compareWithCpu("argmax long cols", {cols}, [](const std::vector<Tensor>& v) { return argmax(v[0], 0); });
    compareWithCpu("argmin long cols", {cols}, [](const std::vector<Tensor>& v) { return argmin(v[0], 0); });
    compareWithCpu("max of t()", {randomTensor({33, 70}, dt, 32)},
                   [](const std::vector<Tensor>& v) { return max(v[0].t(), 1).first; });
  }
  // One long vector: the first of equal maxima far apart wins.
  std::vector<float> host(1 << 20, 0.0f);
  host[12345] = 1;
  host[700000] = 1;
  host[1000000] = 1;
  Tensor h = fromVector(host);
  CHECK(argmax(h.to(Device::cuda(0)), 0).to(Device::cpu()).item<int64_t>() == 12345);
  CHECK(argmin(h.to(Device::cuda(0)), 0).to(Device::cpu()).item<int64_t>() == 0);
}

TEST_CASE("a NaN wins max, min, argmax and argmin on the device as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
    Tensor x = randomTensor({6, 3000}, DType::Float64, 40);
    std::vector<double> h = x.toVector<double>();
    h[0 * 3000 + 5] = nan;     // row 0: two NaNs, the first wins
    h[0 * 3000 + 2999] = nan;
    h[2 * 3000 + 1500] = nan;  // row 2: one NaN in the middle
    h[5 * 3000 + 0] = nan;     // row 5: a NaN first
    Tensor c = fromVector(h, {6, 3000}).to(dt);
    Tensor d = c.to(Device::cuda(0));
    for (int64_t dim : {0, 1}) {
      auto [mv, mi] = max(c, dim);
      auto [gv, gi] = max(d, dim);
      checkSameWithNan("max values", gv, mv);
      CHECK(gi.to(Device::cpu()).toVector<int64_t>() == mi.toVector<int64_t>());
      auto [nv, ni] = min(c, dim);
      auto [hv, hi] = min(d, dim);
      checkSameWithNan("min values", hv, nv);
      CHECK(hi.to(Device::cpu()).toVector<int64_t>() == ni.toVector<int64_t>());
      CHECK(argmax(d, dim).to(Device::cpu()).toVector<int64_t>() == argmax(c, dim).toVector<int64_t>());
      CHECK(argmin(d, dim).to(Device::cpu()).toVector<int64_t>() == argmin(c, dim).toVector<int64_t>());
    }
    CHECK(std::isnan(max(d).to(Device::cpu()).to(DType::Float64).item<double>()));
    CHECK(std::isnan(min(d).to(Device::cpu()).to(DType::Float64).item<double>()));
    CHECK(argmax(d.reshape({-1}), 0).to(Device::cpu()).item<int64_t>() == 5);
  }
}

TEST_CASE("extrema of empty CUDA tensors fail as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tensor e = zeros({0, 3}).to(Device::cuda(0));
  CHECK_THROWS_AS(max(e), InvalidArgumentError);
  CHECK_THROWS_AS(argmax(e, 0), InvalidArgumentError);
  auto [v, i] = max(e, 1);
  CHECK(v.shape() == Shape{0});
  CHECK(i.shape() == Shape{0});
}

TEST_CASE("cumsum along any dim matches the CPU, forward and backward") {
  WEFT_SKIP_WITHOUT_CUDA();
  const std::vector<Shape> shapes = {{7, 33, 5}, {1, 1, 1}, {0, 4, 3}, {3, 5000, 1}, {2, 2, 1500}, {9, 1, 31}};
  uint64_t seed = 50;
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16, DType::Int64, DType::Int32, DType::UInt8,
                   DType::Bool}) {
    for (const Shape& s : shapes) {
      for (int64_t dim : {0, 1, 2}) {
        compareWithCpu(caseName("cumsum", s, dt, "dim " + std::to_string(dim)), {randomTensor(s, dt, seed++)},
                       [&](const std::vector<Tensor>& x) { return cumsum(x[0], dim); });
      }
    }
  }
  compareWithCpu("cumsum of t()", {randomTensor({40, 3000}, DType::Float32, 60)},
                 [](const std::vector<Tensor>& x) { return cumsum(x[0].t(), 1); });
  compareWithCpu("cumsum 0-D", {randomTensor({}, DType::Float64, 61)},
                 [](const std::vector<Tensor>& x) { return cumsum(x[0], 0); });
}

TEST_CASE("softmax and logSoftmax along any dim match the CPU, forward and backward") {
  WEFT_SKIP_WITHOUT_CUDA();
  const std::vector<Shape> shapes = {{37, 10}, {4, 1500}, {3, 4, 5}, {1, 1}, {0, 7}, {6, 1}, {2, 3, 40000}};
  uint64_t seed = 70;
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
    for (const Shape& s : shapes) {
      for (int64_t dim = 0; dim < static_cast<int64_t>(s.size()); ++dim) {
        Tensor x = randomTensor(s, dt, seed++, -8, 8);
        compareWithCpu(caseName("softmax", s, dt, "dim " + std::to_string(dim)), {x},
                       [&](const std::vector<Tensor>& v) { return softmax(v[0], dim); });
        compareWithCpu(caseName("logSoftmax", s, dt, "dim " + std::to_string(dim)), {x},
                       [&](const std::vector<Tensor>& v) { return logSoftmax(v[0], dim); });
      }
    }
  }
  compareWithCpu("softmax of t()", {randomTensor({50, 70}, DType::Float32, 80)},
                 [](const std::vector<Tensor>& v) { return softmax(v[0].t(), -1); });
  compareWithCpu("logSoftmax of narrow", {randomTensor({9, 2100}, DType::Float64, 81)},
                 [](const std::vector<Tensor>& v) { return logSoftmax(v[0].narrow(1, 1, 2050), 1); });
  compareWithCpu("softmax of large logits", {randomTensor({8, 3000}, DType::Float32, 82, 1000, 2000)},
                 [](const std::vector<Tensor>& v) { return softmax(v[0], 1); });
}

TEST_CASE("softmax rows with -inf, +inf and NaN come out as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t cols : {5, 2000}) {
    std::vector<double> h(static_cast<size_t>(5 * cols), 0.5);
    for (int64_t c = 0; c < cols; ++c) h[c] = static_cast<double>(c % 7) - 3;  // row 0: finite
    h[1 * cols + 2] = -inf;                                                     // row 1: one -inf
    h[1 * cols + cols - 1] = -inf;
    for (int64_t c = 0; c < cols; ++c) h[2 * cols + c] = -inf;  // row 2: all -inf
    h[3 * cols + 1] = inf;                                       // row 3: +inf
    h[4 * cols + cols - 2] = nan;                                // row 4: NaN
    for (DType dt : {DType::Float64, DType::Float32}) {
      Tensor c = fromVector(h, {5, cols}).to(dt);
      Tensor d = c.to(Device::cuda(0));
      for (int64_t dim : {0, 1}) {
        checkSameWithNan("softmax special values", softmax(d, dim), softmax(c, dim));
        checkSameWithNan("logSoftmax special values", logSoftmax(d, dim), logSoftmax(c, dim));
      }
    }
  }
}
