// CUDA embedding, embeddingBag, layerNorm, dropout, the index ops (cat,
// stack, indexSelect, gather, scatterAdd) and the Philox fills, against the
// CPU through tests/cuda_compare.h (forward and backward, odd and empty
// sizes, non-contiguous views, dtypes), plus the checks only the device has:
// the same typed errors, reproducible masks and fills, their statistics.
#include <cmath>
#include <string>
#include <vector>

#include "cuda_compare.h"
#include "kernels/cuda/random.h"
#include "kernels/cuda_call.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::compareWithCpu;
using weft::testing::CompareOptions;
using weft::testing::randomTensor;

namespace {

const Device kCuda = Device::cuda(0);

Tensor ids(std::vector<int64_t> v, Shape shape) { return fromVector(v, std::move(shape)); }
Tensor ids(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return fromVector(std::move(v), {n});
}

// n indices in [0, num), seeded.
Tensor randomIds(Shape shape, int64_t num, uint64_t seed) {
  Generator g(seed);
  return randint(0, num, std::move(shape), {.dtype = DType::Int64}, &g);
}

// A label for INFO, from weft's own printing of its parts.
template <class... P>
std::string label(DType dt, const P&... parts) {
  return weft::detail::concat(dtypeName(dt), parts...);
}

// The message f throws, or "" when it throws nothing; CHECKs that what it
// throws is an IndexError.
template <class F>
std::string indexErrorOf(F&& f) {
  try {
    f();
  } catch (const IndexError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected an IndexError, got: " << e.what());
  }
  return "";
}

// Philox-4x32-10 on the host: the reference the device fills are checked against.
void philoxHost(uint64_t counter, uint64_t seed, uint32_t out[4]) {
  uint32_t c[4] = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0};
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0], p1 = uint64_t{0xCD9E8D57u} * c[2];
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1;
    c[1] = static_cast<uint32_t>(p1);
    c[3] = static_cast<uint32_t>(p0);
    c[0] = n0;
    c[2] = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int i = 0; i < 4; ++i) out[i] = c[i];
}

}  // namespace

// ---- embedding -------------------------------------------------------------------

TEST_CASE("cuda embedding matches the CPU, forward and backward, with duplicates and odd sizes") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::Float64, DType::Float32}) {
    for (auto [num, dim] : {std::pair<int64_t, int64_t>{10, 7}, {37, 33}, {5, 1}, {64, 300}}) {
      INFO(label(dt, " num ", num, " dim ", dim));
      compareWithCpu("embedding", {randomTensor({num, dim}, dt, 1), randomIds({3, 41}, num, 2)},
                     [](const std::vector<Tensor>& x) { return embedding(x[0], x[1]); });
    }
    // Many repeats of few rows: the atomic scatter-add of the backward.
    compareWithCpu("embedding duplicates", {randomTensor({3, 130}, dt, 3), randomIds({2000}, 3, 4)},
                   [](const std::vector<Tensor>& x) { return embedding(x[0], x[1]); });
    // A transposed (non-contiguous) table and a strided index view.
    compareWithCpu("embedding views", {randomTensor({9, 12}, dt, 5), randomIds({40}, 12, 6)},
                   [](const std::vector<Tensor>& x) { return embedding(x[0].t(), x[1].narrow(0, 3, 30)); });
    compareWithCpu("embedding of no indices", {randomTensor({6, 4}, dt, 7), ids({}, {0})},
                   [](const std::vector<Tensor>& x) { return embedding(x[0], x[1]); });
  }
  compareWithCpu("embedding bfloat16", {randomTensor({11, 16}, DType::BFloat16, 8), randomIds({25}, 11, 9)},
                 [](const std::vector<Tensor>& x) { return embedding(x[0], x[1]); });
}

TEST_CASE("cuda embedding and embeddingBag reject out-of-range indices with the CPU's IndexError") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tensor w = randomTensor({5, 3}, DType::Float32, 1);
  for (const Tensor& bad : {ids({0, 4, 5, 1}), ids({2, -1, 0})}) {
    const std::string cpu = indexErrorOf([&] { embedding(w, bad); });
    const std::string gpu = indexErrorOf([&] { embedding(w.to(kCuda), bad.to(kCuda)); });
    CHECK(!cpu.empty());
    CHECK(gpu == cpu);
    Tensor offsets = ids({0, 1});
    const std::string cpuBag = indexErrorOf([&] { embeddingBag(w, bad, offsets, EmbeddingBagMode::Sum); });
    const std::string gpuBag =
        indexErrorOf([&] { embeddingBag(w.to(kCuda), bad.to(kCuda), offsets.to(kCuda), EmbeddingBagMode::Sum); });
    CHECK(!cpuBag.empty());
    CHECK(gpuBag == cpuBag);
  }
  CHECK_THROWS_AS(embedding(w.to(kCuda), ids({0})), InvalidArgumentError);  // indices on another device
}

TEST_CASE("cuda embeddingBag matches the CPU in every mode, with empty bags and sample weights") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::Float64, DType::Float32}) {
    for (EmbeddingBagMode mode : {EmbeddingBagMode::Sum, EmbeddingBagMode::Mean, EmbeddingBagMode::Max}) {
      INFO(label(dt, " mode ", static_cast<int>(mode)));
      // Bags of 3, 0, 1, 0, 5 and 8 indices: empty bags in the middle and at the end of runs.
      Tensor offsets = ids({0, 3, 3, 4, 4, 9});
      compareWithCpu("embeddingBag offsets", {randomTensor({13, 35}, dt, 11), randomIds({17}, 13, 12), offsets},
                     [mode](const std::vector<Tensor>& x) { return embeddingBag(x[0], x[1], x[2], mode); });
      compareWithCpu("embeddingBag trailing empty bag", {randomTensor({4, 5}, dt, 13), randomIds({6}, 4, 14)},
                     [mode](const std::vector<Tensor>& x) {
                       return embeddingBag(x[0], x[1], ids({0, 2, 6}).to(x[0].device()), mode);
                     });
      compareWithCpu("embeddingBag 2-D", {randomTensor({20, 260}, dt, 15), randomIds({7, 9}, 20, 16)},
                     [mode](const std::vector<Tensor>& x) { return embeddingBag(x[0], x[1], Tensor(), mode); });
      compareWithCpu("embeddingBag transposed table", {randomTensor({6, 10}, dt, 17), randomIds({3, 4}, 10, 18)},
                     [mode](const std::vector<Tensor>& x) { return embeddingBag(x[0].t(), x[1], Tensor(), mode); });
      compareWithCpu("embeddingBag no bags", {randomTensor({4, 3}, dt, 19), ids({}, {0, 5})},
                     [mode](const std::vector<Tensor>& x) { return embeddingBag(x[0], x[1], Tensor(), mode); });
    }
    // Per-sample weights (Sum): gradients for the table and the weights.
    compareWithCpu("embeddingBag sample weights",
                   {randomTensor({12, 45}, dt, 21), randomIds({30}, 12, 22), ids({0, 7, 7, 19, 30}),
                    randomTensor({30}, dt, 23)},
                   [](const std::vector<Tensor>& x) {
                     return embeddingBag(x[0], x[1], x[2], EmbeddingBagMode::Sum, x[3]);
                   });
  }
}

TEST_CASE("cuda embeddingBag Max keeps the CPU's rule for ties and NaN") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tensor w = fromVector(std::vector<double>{1, 5, 2, 5, NAN, 0, 7, NAN, 3, 3, 3, 3}, {4, 3});
  Tensor idx = ids({0, 1, 2, 3, 3, 1}), offsets = ids({0, 4});
  Tensor cpu = embeddingBag(w, idx, offsets, EmbeddingBagMode::Max);
  Tensor gpu = embeddingBag(w.to(kCuda), idx.to(kCuda), offsets.to(kCuda), EmbeddingBagMode::Max);
  REQUIRE(gpu.shape() == cpu.shape());
  // NaN where the CPU has NaN, the same values elsewhere.
  CHECK(weft::testing::maxAbsDiff(gpu, cpu).first == 0);
  CHECK(std::isnan(cpu.toVector<double>()[1]));
}

// ---- layer norm ----------------------------------------------------------------

TEST_CASE("cuda layerNorm matches the CPU over shapes, affine or not, forward and backward") {
  WEFT_SKIP_WITHOUT_CUDA();
  struct Case {
    Shape x, norm;
  };
  const std::vector<Case> cases = {{{5, 33}, {33}},     {{2, 3, 768}, {768}},  {{7, 1}, {1}},  {{3, 4, 5}, {4, 5}},
                                   {{2, 5000}, {5000}}, {{3000, 24}, {24}},    {{0, 8}, {8}},  {{1, 1031}, {1031}}};
  for (DType dt : {DType::Float64, DType::Float32}) {
    for (const Case& c : cases) {
      for (int affine = 0; affine < 4; ++affine) {
        INFO(label(dt, " x ", c.x, " over ", c.norm, " affine ", affine));
        std::vector<Tensor> in = {randomTensor(c.x, dt, 31), randomTensor(c.norm, dt, 32, 0.5, 1.5),
                                  randomTensor(c.norm, dt, 33)};
        const Shape norm = c.norm;
        // A row of one element normalises to 0 with rstd = 1/sqrt(eps): a
        // larger eps keeps the CPU's rounding residue (times rstd) below atol.
        const double eps = shapeNumel(norm) == 1 ? 1e-2 : 1e-5;
        compareWithCpu("layerNorm", in, [norm, affine, eps](const std::vector<Tensor>& x) {
          return layerNorm(x[0], norm, affine & 1 ? x[1] : Tensor(), affine & 2 ? x[2] : Tensor(), eps);
        });
      }
    }
    // A mean far larger than the spread, and a transposed input.
    compareWithCpu("layerNorm offset", {randomTensor({6, 100}, dt, 34, 999, 1001), randomTensor({100}, dt, 35)},
                   [](const std::vector<Tensor>& x) { return layerNorm(x[0], {100}, x[1], Tensor(), 1e-5); },
                   CompareOptions{.rtolScale = dt == DType::Float32 ? 10.0 : 1.0,
                                  .atolScale = dt == DType::Float32 ? 10.0 : 1.0});
    compareWithCpu("layerNorm transposed", {randomTensor({40, 9}, dt, 36), randomTensor({40}, dt, 37)},
                   [](const std::vector<Tensor>& x) { return layerNorm(x[0].t(), {40}, x[1], x[1], 1e-3); });
  }
  compareWithCpu("layerNorm bfloat16", {randomTensor({4, 64}, DType::BFloat16, 38)},
                 [](const std::vector<Tensor>& x) { return layerNorm(x[0], {64}); });
}

// ---- dropout and the Philox fills -------------------------------------------------

TEST_CASE("cuda dropout: reproducible masks, keep rate within a binomial bound, scaled values, same mask backward") {
  WEFT_SKIP_WITHOUT_CUDA();
  const int64_t n = 1 << 20;
  for (DType dt : {DType::Float32, DType::Float64}) {
    for (double p : {0.1, 0.5, 0.9}) {
      INFO(label(dt, " p ", p));
      Tensor x = randomTensor({n}, dt, 41, 0.5, 1.5).to(kCuda).requiresGrad_();
      Generator g1(77), g2(77), g3(78);
      Tensor a = dropout(x, p, true, &g1);
      Tensor b = dropout(x.detach(), p, true, &g2);
      Tensor c = dropout(x.detach(), p, true, &g3);
      Tensor a2 = dropout(x.detach(), p, true, &g1);  // the next draw of g1
      CHECK(a.device() == kCuda);
      const auto av = a.detach().to(Device::cpu()).to(DType::Float64).toVector<double>();
      const auto xv = x.detach().to(Device::cpu()).to(DType::Float64).toVector<double>();
      CHECK(av == b.to(Device::cpu()).to(DType::Float64).toVector<double>());
      CHECK(av != c.to(Device::cpu()).to(DType::Float64).toVector<double>());
      CHECK(av != a2.to(Device::cpu()).to(DType::Float64).toVector<double>());
      // Kept values are x / (1 - p) (rounded to the dtype), the rest 0.
      const double scale = dt == DType::Float32 ? static_cast<double>(static_cast<float>(1.0 / (1.0 - p)))
                                                : 1.0 / (1.0 - p);
      int64_t kept = 0, wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (av[i] == 0) continue;
        ++kept;
        const double want = xv[i] * scale;
        if (std::abs(av[i] - want) > 1e-6 * std::abs(want)) ++wrong;
      }
      CHECK(wrong == 0);
      // Binomial(n, 1 - p): within 6 standard deviations.
      const double mean = n * (1 - p), sd = std::sqrt(n * p * (1 - p));
      CHECK(std::abs(static_cast<double>(kept) - mean) < 6 * sd);
      // Backward multiplies by the same mask: d(sum a)/dx = a / x.
      a.sum().backward();
      const auto gv = x.grad().to(Device::cpu()).to(DType::Float64).toVector<double>();
      int64_t mismatched = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double want = av[i] == 0 ? 0 : scale;
        if (std::abs(gv[i] - want) > 1e-6 * scale) ++mismatched;
      }
      CHECK(mismatched == 0);
    }
  }
  Tensor x = ones({1000}).to(kCuda);
  CHECK(dropout(x, 1.0, true).to(Device::cpu()).sum().item<float>() == 0.0f);
  CHECK(dropout(x, 0.0, true).to(Device::cpu()).sum().item<float>() == 1000.0f);
  Tensor h = ones({4097}, {.dtype = DType::BFloat16}).to(kCuda);
  Tensor hd = dropout(h, 0.5, true);
  CHECK(hd.dtype() == DType::BFloat16);
  CHECK(hd.device() == kCuda);
}

TEST_CASE("cuda dropout repeats its mask after the generator state is restored") {
  WEFT_SKIP_WITHOUT_CUDA();
  Generator g(5);
  Tensor x = ones({3001}).to(kCuda);
  const GeneratorState s = g.state();
  const auto first = dropout(x, 0.3, true, &g).to(Device::cpu()).toVector<float>();
  g.setState(s);
  CHECK(dropout(x, 0.3, true, &g).to(Device::cpu()).toVector<float>() == first);
}

TEST_CASE("cuda uniform fills equal a host Philox-4x32-10 bit for bit") {
  WEFT_SKIP_WITHOUT_CUDA();
  // The host reference against Random123's known-answer vectors.
  uint32_t r[4];
  philoxHost(0, 0, r);
  CHECK((r[0] == 0x6627e8d5u && r[1] == 0xe169c58du && r[2] == 0xbc57ac4cu && r[3] == 0x9b00dbd8u));
  const int64_t n = 1001;
  const uint64_t seed = 0x1234567890abcdefULL, offset = 17;
  Tensor d = empty({n}, {.dtype = DType::Float64, .device = kCuda});
  Tensor f = empty({n}, {.dtype = DType::Float32, .device = kCuda});
  WEFT_CUDA_CALL(0, uniformFill(DType::Float64, d.rawData(), n, 0.0, 1.0, seed, offset));
  WEFT_CUDA_CALL(0, uniformFill(DType::Float32, f.rawData(), n, 0.0, 1.0, seed, offset));
  const auto dv = d.to(Device::cpu()).toVector<double>();
  const auto fv = f.to(Device::cpu()).toVector<float>();
  int64_t wrongD = 0, wrongF = 0;
  for (int64_t i = 0; i < n; ++i) {
    philoxHost(offset + i / 2, seed, r);
    const uint64_t bits = (static_cast<uint64_t>(r[2 * (i % 2)]) << 32) | r[2 * (i % 2) + 1];
    if (dv[i] != static_cast<double>(bits >> 11) * 0x1.0p-53) ++wrongD;
    philoxHost(offset + i / 4, seed, r);
    if (fv[i] != static_cast<float>(r[i % 4] >> 8) * 0x1.0p-24f) ++wrongF;
  }
  CHECK(wrongD == 0);
  CHECK(wrongF == 0);
}

TEST_CASE("cuda normal and randint fills: bounded statistics, the same numbers for the same key") {
  WEFT_SKIP_WITHOUT_CUDA();
  const int64_t n = 1 << 21;
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16}) {
    INFO(label(dt));
    Tensor a = empty({n}, {.dtype = dt, .device = kCuda});
    Tensor b = empty({n}, {.dtype = dt, .device = kCuda});
    Tensor c = empty({n}, {.dtype = dt, .device = kCuda});
    WEFT_CUDA_CALL(0, normalFill(dt, a.rawData(), n, 2.0, 3.0, 99, 0));
    WEFT_CUDA_CALL(0, normalFill(dt, b.rawData(), n, 2.0, 3.0, 99, 0));
    WEFT_CUDA_CALL(0, normalFill(dt, c.rawData(), n, 2.0, 3.0, 99, static_cast<uint64_t>(n)));
    const auto av = a.to(Device::cpu()).to(DType::Float64).toVector<double>();
    CHECK(av == b.to(Device::cpu()).to(DType::Float64).toVector<double>());
    CHECK(av != c.to(Device::cpu()).to(DType::Float64).toVector<double>());
    double sum = 0, sq = 0;
    int64_t beyond = 0;
    for (double v : av) {
      REQUIRE(std::isfinite(v));
      sum += v;
      sq += v * v;
      if (std::abs(v - 2.0) > 3.0 * 3.0) ++beyond;
    }
    const double mean = sum / n, var = sq / n - mean * mean;
    // sd of the sample mean: 3 / sqrt(n); of the sample variance about 9 * sqrt(2 / n).
    // bfloat16 rounds each value by up to 2^-8 relative.
    const double slack = dt == DType::BFloat16 ? 0.02 : 0.0;
    CHECK(std::abs(mean - 2.0) < 6 * 3.0 / std::sqrt(double(n)) + slack);
    CHECK(std::abs(var - 9.0) < 6 * 9.0 * std::sqrt(2.0 / n) + 9 * slack);
    // P(|z| > 3) = 0.0027.
    CHECK(std::abs(static_cast<double>(beyond) / n - 0.0027) < 0.0006);
  }
  Tensor k = empty({100000}, {.dtype = DType::Int64, .device = kCuda});
  WEFT_CUDA_CALL(0, randintFill(DType::Int64, k.rawData(), k.numel(), -3, 4, 1, 0));
  std::vector<int64_t> counts(7, 0);
  for (int64_t v : k.to(Device::cpu()).toVector<int64_t>()) {
    REQUIRE((v >= -3 && v < 4));
    ++counts[v + 3];
  }
  for (int64_t c : counts) CHECK(std::abs(static_cast<double>(c) - 100000.0 / 7) < 6 * std::sqrt(100000.0 / 7));
}

// ---- index ops ----------------------------------------------------------------------

TEST_CASE("cuda indexSelect matches the CPU over dims, duplicates, empty indices and dtypes") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16, DType::Int64}) {
    INFO(label(dt));
    for (int64_t dim : {0, 1, 2}) {
      const int64_t size = dim == 0 ? 6 : dim == 1 ? 7 : 35;
      compareWithCpu("indexSelect", {randomTensor({6, 7, 35}, dt, 51), randomIds({23}, size, 52)},
                     [dim](const std::vector<Tensor>& x) { return indexSelect(x[0], dim, x[1]); });
    }
    compareWithCpu("indexSelect transposed", {randomTensor({9, 4}, dt, 53), randomIds({12}, 9, 54)},
                   [](const std::vector<Tensor>& x) { return indexSelect(x[0].t(), 1, x[1]); });
    compareWithCpu("indexSelect no indices", {randomTensor({3, 5}, dt, 55), ids({}, {0})},
                   [](const std::vector<Tensor>& x) { return indexSelect(x[0], 1, x[1]); });
    compareWithCpu("indexSelect empty input", {randomTensor({0, 5}, dt, 56), ids({1, 4})},
                   [](const std::vector<Tensor>& x) { return indexSelect(x[0], 1, x[1]); });
  }
  Tensor a = randomTensor({4, 3}, DType::Float32, 57);
  Tensor bad = ids({0, 4});
  const std::string cpu = indexErrorOf([&] { indexSelect(a, 0, bad); });
  CHECK(!cpu.empty());
  CHECK(indexErrorOf([&] { indexSelect(a.to(kCuda), 0, bad.to(kCuda)); }) == cpu);
}

TEST_CASE("cuda gather and scatterAdd match the CPU over dims, layouts and dtypes") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::Float64, DType::Float32, DType::Int64, DType::Int32, DType::UInt8, DType::Float16}) {
    INFO(label(dt));
    for (int64_t dim : {0, 1, 2}) {
      const Shape xs = {5, 6, 7};
      Shape is = {4, 5, 6};
      is[dim] = 11;  // larger than x along dim, with repeats
      const int64_t size = xs[dim];
      compareWithCpu("gather", {randomTensor(xs, dt, 61), randomIds(is, size, 62)},
                     [dim](const std::vector<Tensor>& x) { return gather(x[0], dim, x[1]); });
      // A strided source of index's shape, and a larger one (index covers part of it).
      const Shape ss = {is[0] + 1, is[1] + 1, is[2] + 1};
      compareWithCpu("scatterAdd", {randomTensor(xs, dt, 63), randomIds(is, size, 64), randomTensor(ss, dt, 65)},
                     [dim, is](const std::vector<Tensor>& x) {
                       Tensor src = x[2].narrow(0, 1, is[0]).narrow(1, 1, is[1]).narrow(2, 1, is[2]);
                       return scatterAdd(x[0], dim, x[1], src);
                     });
      compareWithCpu("scatterAdd larger source",
                     {randomTensor(xs, dt, 63), randomIds(is, size, 64), randomTensor(ss, dt, 65)},
                     [dim](const std::vector<Tensor>& x) { return scatterAdd(x[0], dim, x[1], x[2]); });
    }
    // A transposed input and a broadcast (expanded, stride 0) source.
    compareWithCpu("gather transposed", {randomTensor({8, 5}, dt, 66), randomIds({5, 3}, 5, 67)},
                   [](const std::vector<Tensor>& x) { return gather(x[0].t(), 1, x[1]); });
    compareWithCpu("scatterAdd expanded source",
                   {randomTensor({9, 4}, dt, 68), randomIds({4, 20}, 9, 69), randomTensor({4, 1}, dt, 70)},
                   [](const std::vector<Tensor>& x) { return scatterAdd(x[0].t(), 1, x[1], x[2].expand({4, 20})); });
    compareWithCpu("gather empty", {randomTensor({3, 4}, dt, 71), ids({}, {0, 4})},
                   [](const std::vector<Tensor>& x) { return gather(x[0], 0, x[1]); });
  }
  Tensor x = randomTensor({3, 4}, DType::Float32, 72);
  Tensor bad = ids({0, 1, 2, 7}, {1, 4});
  const std::string cpu = indexErrorOf([&] { gather(x, 1, bad); });
  CHECK(!cpu.empty());
  CHECK(indexErrorOf([&] { gather(x.to(kCuda), 1, bad.to(kCuda)); }) == cpu);
  const std::string cpuScatter = indexErrorOf([&] { scatterAdd(x, 1, bad, x); });
  CHECK(indexErrorOf([&] { scatterAdd(x.to(kCuda), 1, bad.to(kCuda), x.to(kCuda)); }) == cpuScatter);
}

TEST_CASE("cuda cat and stack match the CPU with empty pieces, views and every dim") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::Float64, DType::Float32, DType::Int32, DType::Bool, DType::BFloat16}) {
    INFO(label(dt));
    for (int64_t dim : {0, 1, 2}) {
      Shape a = {3, 4, 5}, b = {3, 4, 5}, c = {3, 4, 5};
      b[dim] = 0;
      c[dim] = 7;
      compareWithCpu("cat", {randomTensor(a, dt, 81), randomTensor(b, dt, 82), randomTensor(c, dt, 83)},
                     [dim](const std::vector<Tensor>& x) { return cat({x[0], x[1], x[2]}, dim); });
      compareWithCpu("stack", {randomTensor({3, 4}, dt, 84), randomTensor({3, 4}, dt, 85)},
                     [dim](const std::vector<Tensor>& x) { return stack({x[0], x[1], x[0]}, dim); });
    }
    compareWithCpu("cat views", {randomTensor({6, 3}, dt, 86), randomTensor({2, 6}, dt, 87)},
                   [](const std::vector<Tensor>& x) { return cat({x[0].t(), x[1].narrow(1, 0, 6)}, 0); });
  }
  CHECK_THROWS_AS(cat({ones({2}).to(kCuda), ones({2})}, 0), InvalidArgumentError);
}

TEST_CASE("cuda rand, randn and randint fill on the device, reproducibly for a seed, CPU streams untouched") {
  WEFT_SKIP_WITHOUT_CUDA();
  const int64_t n = 1 << 20;
  Generator g1(3), g2(3), plain(3);
  Tensor a = randn({n}, {.device = kCuda}, &g1);
  Tensor b = randn({n}, {.device = kCuda}, &g2);
  Tensor c = randn({n}, {.device = kCuda}, &g1);  // the next counters of g1
  CHECK(a.device() == kCuda);
  const auto av = a.to(Device::cpu()).toVector<float>();
  CHECK(av == b.to(Device::cpu()).toVector<float>());
  CHECK(av != c.to(Device::cpu()).toVector<float>());
  double sum = 0, sq = 0;
  for (float v : av) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  CHECK(std::abs(mean) < 6 / std::sqrt(double(n)));
  CHECK(std::abs(var - 1) < 6 * std::sqrt(2.0 / n));
  // Device fills leave the xoshiro stream where it was.
  CHECK(randn({5}, {}, &g1).toVector<float>() == randn({5}, {}, &plain).toVector<float>());
  for (double u : rand({4097}, {.dtype = DType::Float64, .device = kCuda}, &g1).to(Device::cpu()).toVector<double>()) {
    REQUIRE((u >= 0 && u < 1));
  }
  for (int64_t k : randint(-2, 5, {4097}, {.dtype = DType::Int64, .device = kCuda}, &g1).to(Device::cpu()).toVector<int64_t>()) {
    REQUIRE((k >= -2 && k < 5));
  }
  Tensor r = randn({3, 4}, {.device = kCuda, .requiresGrad = true});
  CHECK(r.requiresGrad());
}
