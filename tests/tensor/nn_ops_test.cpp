#include <cmath>
#include <tuple>
#include <vector>

#include "blas_core_types.h"
#include "gradcheck.h"
#include "kernels/cpu/parallel.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::expectClose;
using weft::testing::gradcheck;
using weft::testing::kF64;

namespace {

// wave(shape, phase)[i] = scale * sin(0.37 * i + phase), in float64: the
// deterministic inputs shared with tests/tensor/nn_ops_reference.py.
Tensor wave(Shape shape, double phase, double scale = 1.0) {
  std::vector<double> v(static_cast<size_t>(shapeNumel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(0.37 * static_cast<double>(i) + phase);
  return fromVector(v, std::move(shape));
}

Tensor ids(const std::vector<int64_t>& v, Shape shape = {}) {
  return shape.empty() ? fromVector(v) : fromVector(v, std::move(shape));
}

// Reference values printed by tests/tensor/nn_ops_reference.py (PyTorch 1.13, float64).
// kConvStridedOut: shape [1, 3, 2, 4]
const std::vector<double> kConvStridedOut = {
    1.3904306842165473, 1.842160744013916, 2.1505826115411444, 2.2739528339008075, 0.05667436726399111,
    -0.40469922108940015, -0.7052790459327839, -0.8043830380573104, 2.009088429423376, 1.5923916333068522,
    1.0894405200918214, 0.5683071635016068, -0.2971065387179248, 0.14690085042684375, 0.7002943188321082,
    1.2881746566353356, -0.17661248854389122, -0.4041320841046464, -0.4419329542226941, -0.28489892845945375,
    2.398029405754239, 2.6204976226902854, 2.623315123433731, 2.406100572476443,
};
// kConvPaddedOut: shape [2, 2, 4, 4]
const std::vector<double> kConvPaddedOut = {
    0.1930126101625824, 0.7212394481170917, 1.3195871626053093, 0.8006602202964707, 1.1129475619589917,
    2.5250237044430603, 2.903679775293346, 1.4000260400057543, 1.4893103703295292, 2.4839349167281797,
    1.7423444848073755, 0.5534054461945977, 0.5794621628764898, 0.727660216868748, 0.20571834125346009,
    -0.011857668482999002, -0.029375877788937785, -0.036127444251846164, -0.0008058228140945941, 0.17748803638868968,
    -0.032068522497975906, 0.5292427453852137, 0.9801825664194803, 0.8573092928067314, 0.4411499825264239,
    1.4409956126783114, 1.388499953863467, 0.7236839768614135, 0.3683953799682725, 0.7338078799595203,
    0.27217354435974533, -0.0150950849769281, -0.3679317084957187, -1.0436633861917337, -1.5598910339448158,
    -0.8960121613667339, -1.301191464965497, -2.76496381386087, -2.946641451732055, -1.360794997284633,
    -1.368709995146614, -2.142942837091632, -1.2663434217509653, -0.30231650508449054, -0.4458626630946194,
    -0.46995413345009357, 0.0754665344337476, 0.13228592669621336, 0.05599798321125769, 0.018459964158631957,
    -0.01753111981778717, -0.19862537824407056, -0.06372718939337618, -0.7719864915551287, -1.162040580416242,
    -0.9137505075305926, -0.4810674205662194, -1.4388132125961768, -1.288071878548557, -0.5988989099831169,
    -0.28345896541206655, -0.5074440985305805, -0.018719003174235426, 0.1684030302916667,
};
// kPool3s2p1Out: shape [1, 2, 3, 3]
const std::vector<double> kPool3s2p1Out = {
    0.8368987907984977, 0.9871001010138504, 0.9871001010138504, 0.8368987907984977, 0.6263130303216559,
    0.8658339111297899, 0.9881682338770004, 0.9767586218757036, 0.8658339111297899, -0.12489503711675232,
    -0.056340764791063265, 0.3085130054579907, 0.8692233858119126, 0.9891904763471814, 0.9752752764111603,
    0.5711968696599872, 0.23572377958110885, -0.40735492973497006,
};
// kPool2Out: shape [1, 2, 2, 2]
const std::vector<double> kPool2Out = {
    0.8368987907984977, 0.9871001010138504, -0.06314327224661277, 0.6263130303216559, -0.12489503711675232,
    -0.056340764791063265, 0.8692233858119126, 0.9891904763471814,
};
// kBagSum: shape [4, 3]
const std::vector<double> kBagSum = {
    0.16747322070970194, 0.5776354966609272, 0.909617517949709, 0.0, 0.0, 0.0, -1.5056601391973516,
    -1.1185017694862722, -0.579959432404226, 0.2818663274502027, -0.3433726919255841, -0.9221378282833594,
};
// kBagMean: shape [4, 3]
const std::vector<double> kBagMean = {
    0.05582440690323398, 0.1925451655536424, 0.3032058393165697, 0.0, 0.0, 0.0, -0.7528300695986758,
    -0.5592508847431361, -0.289979716202113, 0.14093316372510134, -0.17168634596279206, -0.4610689141416797,
};
// kBagMax: shape [4, 3]
const std::vector<double> kBagMax = {
    0.966184951612734, 0.994043202198076, 0.8873623686333753, 0.0, 0.0, 0.0, -0.5082790774992584, -0.1624620152151542,
    0.2053435186845546, 0.6605812012792007, 0.34439346725839, -0.01840630693305381,
};
// kBagWeightedSum: shape [4, 3]
const std::vector<double> kBagWeightedSum = {
    0.09727371065845614, 0.5011856164606284, 0.8372644002428672, 0.0, 0.0, 0.0, -1.0711455336898754,
    -0.8538065392135515, -0.5209088350422145, 0.19299728097750726, 0.18763296610145885, 0.1568734094896131,
};
// kBag2dMean: shape [3, 3]
const std::vector<double> kBag2dMean = {
    0.8133830764459673, 0.669218334728233, 0.43447803085016073, -0.15480487335209858, 0.18858501675940756,
    0.5064508095448345, -0.37871487382899804, -0.6877661591839741, -0.9037315213503057,
};
// kLstmH: shape [2, 2]
const std::vector<double> kLstmH = {
    -0.07329421100958583, 0.16770385328838647, -0.07657616278688396, 0.0403265301100581,
};
// kLstmC: shape [2, 2]
const std::vector<double> kLstmC = {
    -0.1184401159805473, 0.29737318665081625, -0.10796291776196931, 0.056925203636157384,
};

// Direct convolution by definition, for checking the im2col path.
Tensor naiveConv2d(const Tensor& x, const Tensor& w, const Tensor& b, int64_t sh, int64_t sw, int64_t ph,
                   int64_t pw) {
  int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  int64_t O = w.size(0), kh = w.size(2), kw = w.size(3);
  int64_t oH = (H + 2 * ph - kh) / sh + 1, oW = (W + 2 * pw - kw) / sw + 1;
  std::vector<double> xv = x.toVector<double>(), wv = w.toVector<double>();
  std::vector<double> bv = b.defined() ? b.toVector<double>() : std::vector<double>(O, 0.0);
  std::vector<double> out(N * O * oH * oW);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < oH; ++i)
        for (int64_t j = 0; j < oW; ++j) {
          double acc = bv[o];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t a = 0; a < kh; ++a)
              for (int64_t q = 0; q < kw; ++q) {
                int64_t ih = i * sh - ph + a, iw = j * sw - pw + q;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += xv[((n * C + c) * H + ih) * W + iw] * wv[((o * C + c) * kh + a) * kw + q];
              }
          out[((n * O + o) * oH + i) * oW + j] = acc;
        }
  return fromVector(out, {N, O, oH, oW});
}

}  // namespace

// ---- forward values against PyTorch ------------------------------------------

TEST_CASE("conv2d matches PyTorch with a rectangular kernel, stride and padding") {
  Tensor out = conv2d(wave({1, 2, 4, 5}, 0.1), wave({3, 2, 3, 2}, 0.5, 0.5), wave({3}, 0.9), {2, 1}, {1, 0});
  expectClose(out, fromVector(kConvStridedOut, {1, 3, 2, 4}), 1e-10, 1e-12);
  Tensor padded = conv2d(wave({2, 1, 3, 3}, 0.2), wave({2, 1, 2, 2}, 0.7), Tensor(), 1, 1);
  expectClose(padded, fromVector(kConvPaddedOut, {2, 2, 4, 4}), 1e-10, 1e-12);
}

TEST_CASE("maxPool2d matches PyTorch with and without padding") {
  Tensor x = wave({1, 2, 5, 5}, 0.3);
  expectClose(maxPool2d(x, 3, 2, 1), fromVector(kPool3s2p1Out, {1, 2, 3, 3}), 1e-12, 1e-12);
  expectClose(maxPool2d(x, 2), fromVector(kPool2Out, {1, 2, 2, 2}), 1e-12, 1e-12);
}

TEST_CASE("embeddingBag matches PyTorch in every mode, with an empty bag") {
  Tensor w = wave({6, 3}, 0.2);
  Tensor idx = ids({1, 0, 4, 4, 5, 2, 3}), off = ids({0, 3, 3, 5});
  expectClose(embeddingBag(w, idx, off, EmbeddingBagMode::Sum), fromVector(kBagSum, {4, 3}), 1e-12, 1e-12);
  expectClose(embeddingBag(w, idx, off, EmbeddingBagMode::Mean), fromVector(kBagMean, {4, 3}), 1e-12, 1e-12);
  expectClose(embeddingBag(w, idx, off, EmbeddingBagMode::Max), fromVector(kBagMax, {4, 3}), 1e-12, 1e-12);
  expectClose(embeddingBag(w, idx, off, EmbeddingBagMode::Sum, wave({7}, 1.1)), fromVector(kBagWeightedSum, {4, 3}),
              1e-12, 1e-12);
  expectClose(embeddingBag(w, ids({1, 2, 5, 0, 3, 3}, {3, 2}), Tensor(), EmbeddingBagMode::Mean),
              fromVector(kBag2dMean, {3, 3}), 1e-12, 1e-12);
}

TEST_CASE("lstmCell matches torch.nn.LSTMCell") {
  auto [h1, c1] = lstmCell(wave({2, 3}, 0.1), wave({2, 2}, 0.2, 0.5), wave({2, 2}, 0.3), wave({8, 3}, 0.4, 0.5),
                           wave({8, 2}, 0.6, 0.5), wave({8}, 0.7, 0.1), wave({8}, 0.8, 0.1));
  expectClose(h1, fromVector(kLstmH, {2, 2}), 1e-12, 1e-12);
  expectClose(c1, fromVector(kLstmC, {2, 2}), 1e-12, 1e-12);
}

// ---- forward values against direct definitions ----------------------------------

TEST_CASE("conv2d agrees with the direct definition on larger inputs and in float32") {
  struct Case {
    Shape x, w;
    int64_t sh, sw, ph, pw;
  };
  for (const Case& c : {Case{{2, 3, 17, 19}, {8, 3, 3, 3}, 1, 1, 1, 1}, Case{{3, 4, 30, 30}, {6, 4, 5, 3}, 2, 3, 2, 1},
                        Case{{2, 16, 12, 12}, {5, 16, 1, 1}, 1, 1, 0, 0},
                        Case{{1, 2, 9, 9}, {3, 2, 1, 1}, 2, 2, 1, 0}}) {
    Tensor x = randn(c.x, kF64), w = randn(c.w, kF64), b = randn({c.w[0]}, kF64);
    Tensor expected = naiveConv2d(x, w, b, c.sh, c.sw, c.ph, c.pw);
    expectClose(conv2d(x, w, b, {c.sh, c.sw}, {c.ph, c.pw}), expected, 1e-10, 1e-10);
    Tensor f32 = conv2d(x.to(DType::Float32), w.to(DType::Float32), b.to(DType::Float32), {c.sh, c.sw}, {c.ph, c.pw});
    expectClose(f32.to(DType::Float64), expected, 1e-4, 1e-4);
  }
}

TEST_CASE("embedding gathers rows for indices of any shape") {
  Tensor w = fromVector<float>({0, 1, 10, 11, 20, 21}, {3, 2});
  Tensor out = embedding(w, ids({2, 0, 1, 2}, {2, 2}));
  REQUIRE(out.shape() == Shape{2, 2, 2});
  CHECK(out.toVector<float>() == std::vector<float>{20, 21, 0, 1, 10, 11, 20, 21});
  CHECK(embedding(w, ids({1}, {1})).shape() == Shape{1, 2});
}

// ---- backward -----------------------------------------------------------------------

TEST_CASE("embedding backward scatter-adds into the rows of the weight gradient") {
  Tensor w = zeros({4, 2}, kF64).requiresGrad_();
  Tensor g = fromVector<double>({1, 2, 3, 4, 5, 6}, {3, 2});
  embedding(w, ids({3, 0, 3})).backward(g);
  CHECK(w.grad().toVector<double>() == std::vector<double>{3, 4, 0, 0, 0, 0, 6, 8});
  CHECK(gradcheck([](const auto& in) { return embedding(in[0], ids({0, 2, 2, 4, 1, 0}, {2, 3})); },
                  {randn({5, 3}, kF64)}));
}

TEST_CASE("embedding backward with many duplicate indices matches a serial reference") {
  // Large enough for the threaded scatter.
  int64_t num = 50, dim = 64, n = 2000;
  Generator gen(3);
  Tensor idx = randint(0, num, {n}, {.dtype = DType::Int64}, &gen);
  Tensor w = randn({num, dim}, kF64).requiresGrad_();
  Tensor g = randn({n, dim}, kF64);
  embedding(w, idx).backward(g);
  std::vector<double> expected(num * dim, 0.0), gv = g.toVector<double>();
  std::vector<int64_t> iv = idx.toVector<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < dim; ++d) expected[iv[i] * dim + d] += gv[i * dim + d];
  expectClose(w.grad(), fromVector(expected, {num, dim}), 1e-12, 1e-10);
}

TEST_CASE("embeddingBag passes gradcheck in every mode with offsets and an empty bag") {
  Tensor idx = ids({1, 0, 4, 4, 5, 2, 3}), off = ids({0, 3, 3, 5});
  for (EmbeddingBagMode mode : {EmbeddingBagMode::Sum, EmbeddingBagMode::Mean, EmbeddingBagMode::Max}) {
    CHECK(gradcheck([&](const auto& in) { return embeddingBag(in[0], idx, off, mode); }, {randn({6, 3}, kF64)}));
    Tensor fixed = ids({1, 2, 5, 0, 3, 3}, {3, 2});
    CHECK(gradcheck([&](const auto& in) { return embeddingBag(in[0], fixed, Tensor(), mode); }, {randn({6, 3}, kF64)}));
  }
  // Per-sample weights: gradients for both the table and the weights.
  CHECK(gradcheck([&](const auto& in) { return embeddingBag(in[0], idx, off, EmbeddingBagMode::Sum, in[1]); },
                  {randn({6, 3}, kF64), randn({7}, kF64)}));
  // A trailing empty bag.
  CHECK(gradcheck([&](const auto& in) { return embeddingBag(in[0], idx, ids({0, 2, 7}), EmbeddingBagMode::Mean); },
                  {randn({6, 3}, kF64)}));
}

TEST_CASE("embeddingBag Max routes each gradient element to the winning row") {
  Tensor w = fromVector<double>({1, 9, 5, 2, 3, 3}, {3, 2}).requiresGrad_();
  Tensor out = embeddingBag(w, ids({0, 1, 2}), ids({0}), EmbeddingBagMode::Max);
  CHECK(out.toVector<double>() == std::vector<double>{5, 9});
  out.backward(fromVector<double>({10, 20}, {1, 2}));
  CHECK(w.grad().toVector<double>() == std::vector<double>{0, 20, 10, 0, 0, 0});
}

TEST_CASE("embeddingBag backward on many bags matches a serial reference") {
  int64_t num = 40, dim = 32, n = 3000, bags = 300;
  Generator gen(11);
  Tensor idx = randint(0, num, {n}, {.dtype = DType::Int64}, &gen);
  std::vector<int64_t> off(bags);
  for (int64_t b = 0; b < bags; ++b) off[b] = b * n / bags;
  Tensor w = randn({num, dim}, kF64).requiresGrad_();
  Tensor g = randn({bags, dim}, kF64);
  embeddingBag(w, idx, ids(off), EmbeddingBagMode::Mean).backward(g);
  std::vector<double> expected(num * dim, 0.0), gv = g.toVector<double>();
  std::vector<int64_t> iv = idx.toVector<int64_t>();
  for (int64_t b = 0; b < bags; ++b) {
    int64_t s = off[b], e = b + 1 < bags ? off[b + 1] : n;
    for (int64_t j = s; j < e; ++j)
      for (int64_t d = 0; d < dim; ++d) expected[iv[j] * dim + d] += gv[b * dim + d] / static_cast<double>(e - s);
  }
  expectClose(w.grad(), fromVector(expected, {num, dim}), 1e-12, 1e-10);
}

TEST_CASE("conv2d passes gradcheck across strides, paddings and layouts") {
  auto conv = [](std::pair<int64_t, int64_t> s, std::pair<int64_t, int64_t> p) {
    return [s, p](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], s, p); };
  };
  Tensor b = randn({3}, kF64);
  CHECK(gradcheck(conv({1, 1}, {0, 0}), {randn({2, 2, 5, 5}, kF64), randn({3, 2, 3, 3}, kF64), b}));
  CHECK(gradcheck(conv({2, 2}, {1, 1}), {randn({2, 2, 5, 6}, kF64), randn({3, 2, 3, 3}, kF64), b}));
  CHECK(gradcheck(conv({2, 1}, {1, 0}), {randn({1, 2, 6, 5}, kF64), randn({3, 2, 3, 2}, kF64), b}));
  CHECK(gradcheck(conv({1, 1}, {0, 0}), {randn({2, 4, 3, 3}, kF64), randn({3, 4, 1, 1}, kF64), b}));
  CHECK(gradcheck(conv({3, 3}, {2, 2}), {randn({1, 1, 7, 7}, kF64), randn({3, 1, 4, 4}, kF64), b}));
  // A permuted (non-contiguous) input and no bias.
  CHECK(gradcheck([](const auto& in) { return conv2d(in[0], in[1], Tensor(), 1, 1); },
                  {randn({2, 4, 4, 3}, kF64).permute({0, 3, 1, 2}), randn({2, 3, 3, 3}, kF64)}));
}

TEST_CASE("maxPool2d passes gradcheck with overlapping, padded and strided windows") {
  Tensor x = randn({2, 3, 6, 7}, kF64);
  CHECK(gradcheck([](const auto& in) { return maxPool2d(in[0], 2); }, {x}));
  CHECK(gradcheck([](const auto& in) { return maxPool2d(in[0], 3, 2, 1); }, {x}));
  CHECK(gradcheck([](const auto& in) { return maxPool2d(in[0], 3, 1); }, {x}));
  CHECK(gradcheck([](const auto& in) { return maxPool2d(in[0], 2, 1, 1); }, {x.transpose(2, 3)}));
}

TEST_CASE("maxPool2d backward routes each gradient to its window's maximum") {
  Tensor x = fromVector<double>({1, 5, 2, 0, 3, 4, 9, 1, 0, 8, 7, 6, 2, 1, 3, 0}, {1, 1, 4, 4}).requiresGrad_();
  Tensor out = maxPool2d(x, 2);
  CHECK(out.toVector<double>() == std::vector<double>{5, 9, 8, 7});
  out.backward(fromVector<double>({1, 2, 3, 4}, {1, 1, 2, 2}));
  CHECK(x.grad().toVector<double>() == std::vector<double>{0, 1, 0, 0, 0, 0, 2, 0, 0, 3, 4, 0, 0, 0, 0, 0});
}

TEST_CASE("maxPool2d's 2x2 windows keep the first maximum and the first NaN, on rows of any width") {
  // Widths on both sides of the four-outputs-at-a-time path, odd sizes
  // (the last row and column are outside every window), ties and NaNs.
  for (int64_t w : {2, 7, 8, 9, 17, 30}) {
    const int64_t h = 5, planes = 3;
    std::vector<double> v(static_cast<size_t>(planes * h * w));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7) % 5);  // many ties
    for (size_t i = 3; i < v.size(); i += 11) v[i] = std::nan("");
    for (DType dt : {DType::Float32, DType::Float64}) {
      Tensor x = fromVector(v, {1, planes, h, w}).to(dt).requiresGrad_();
      Tensor out = maxPool2d(x, 2);
      out.sum().backward();
      std::vector<double> got = out.to(DType::Float64).toVector<double>();
      std::vector<double> grad = x.grad().to(DType::Float64).toVector<double>();
      std::vector<double> wantGrad(v.size(), 0.0);
      const int64_t oh = h / 2, ow = w / 2;
      for (int64_t p = 0; p < planes; ++p) {
        for (int64_t i = 0; i < oh; ++i) {
          for (int64_t j = 0; j < ow; ++j) {
            size_t best = static_cast<size_t>((p * h + 2 * i) * w + 2 * j);
            for (int64_t di = 0; di < 2; ++di) {
              for (int64_t dj = 0; dj < 2; ++dj) {
                size_t k = static_cast<size_t>((p * h + 2 * i + di) * w + 2 * j + dj);
                if (v[k] > v[best] || (std::isnan(v[k]) && !std::isnan(v[best]))) best = k;
              }
            }
            double o = got[static_cast<size_t>((p * oh + i) * ow + j)];
            CHECK((std::isnan(v[best]) ? std::isnan(o) : o == v[best]));
            wantGrad[best] = 1.0;
          }
        }
      }
      CHECK(grad == wantGrad);
    }
  }
}

TEST_CASE("conv2d gives the same bits with one thread or several, for batches of any size") {
  weft::testing::checkRequestedBlasCore();
  // Images are spread over threads in the forward pass and gradX, and the
  // weight gradient is summed in a fixed number of chunks: the result must
  // not depend on the thread count. The larger images make products that are
  // cut into blocks.
  const int saved = kernels::cpu::numThreads();
  using Case = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // batch, in channels, image side, out channels
  for (auto [batch, inC, side, outC] : {Case{1, 3, 9, 4}, Case{3, 3, 9, 4}, Case{8, 3, 9, 4}, Case{11, 3, 9, 4},
                                        Case{1, 8, 30, 16}, Case{2, 8, 30, 16}}) {
    for (auto [s, p] : {std::pair<int64_t, int64_t>{1, 0}, {2, 1}}) {
      CAPTURE(batch);
      CAPTURE(side);
      const int64_t kSide = side > 9 ? 5 : 3;
      Tensor x = wave({batch, inC, side, side - 1}, 0.3), w = wave({outC, inC, kSide, kSide}, 0.9, 0.4);
      Tensor b = wave({outC}, 0.1);
      auto run = [&](int threads) {
        kernels::cpu::setNumThreads(threads);
        Tensor xs = x.to(DType::Float32).requiresGrad_(), ws = w.to(DType::Float32).requiresGrad_();
        Tensor bs = b.to(DType::Float32).requiresGrad_();
        Tensor out = conv2d(xs, ws, bs, s, p);
        mul(out, out).sum().backward();
        return std::vector<std::vector<float>>{out.toVector<float>(), xs.grad().toVector<float>(),
                                               ws.grad().toVector<float>(), bs.grad().toVector<float>()};
      };
      auto one = run(1), two = run(2);
      kernels::cpu::setNumThreads(saved);
      CHECK(one == two);
      // And the float32 weight gradient agrees with float64.
      Tensor wd = w.clone().requiresGrad_();
      Tensor outd = conv2d(x, wd, b, s, p);
      mul(outd, outd).sum().backward();
      expectClose(fromVector(std::vector<double>(one[2].begin(), one[2].end()), w.shape()), wd.grad(), 1e-3, 1e-4);
    }
  }
}

TEST_CASE("lstmCell passes gradcheck for every input, through h' and c'") {
  std::vector<Tensor> in{randn({3, 4}, kF64), randn({3, 2}, kF64), randn({3, 2}, kF64), randn({8, 4}, kF64),
                         randn({8, 2}, kF64),  randn({8}, kF64),    randn({8}, kF64)};
  auto cell = [](const std::vector<Tensor>& t) { return lstmCell(t[0], t[1], t[2], t[3], t[4], t[5], t[6]); };
  CHECK(gradcheck([&](const auto& t) { return cell(t).first; }, in));
  CHECK(gradcheck([&](const auto& t) { return cell(t).second; }, in));
  CHECK(gradcheck([&](const auto& t) { auto [h, c] = cell(t); return add(h, mul(c, 0.5)); }, in));
  // Without biases, and with a transposed input weight.
  CHECK(gradcheck([](const auto& t) { return lstmCell(t[0], t[1], t[2], t[3], t[4], Tensor(), Tensor()).first; },
                  {randn({2, 3}, kF64), randn({2, 2}, kF64), randn({2, 2}, kF64), randn({3, 8}, kF64).t(),
                   randn({8, 2}, kF64)}));
}

namespace {

// lstmCell applied step by step: the definition lstmLayer must match.
LstmLayerOutput lstmLayerByCells(const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& wIh,
                                 const Tensor& wHh, const Tensor& bIh, const Tensor& bHh) {
  Tensor h = h0, c = c0;
  std::vector<Tensor> outs;
  for (int64_t t = 0; t < x.size(0); ++t) {
    std::tie(h, c) = lstmCell(x.select(0, t), h, c, wIh, wHh, bIh, bHh);
    outs.push_back(h);
  }
  return {stack(outs, 0), h, c};
}

}  // namespace

TEST_CASE("lstmLayer equals lstmCell step by step, values and every gradient, in float64 and float32") {
  // Batches below, at and above the row-chunk size, with and without biases.
  for (int64_t n : {1, 5, 16, 37}) {
    for (bool bias : {true, false}) {
      const int64_t T = 6, in = 3, H = 5;
      std::vector<Tensor> base{wave({T, n, in}, 0.1), wave({n, H}, 0.2, 0.5), wave({n, H}, 0.3),
                               wave({4 * H, in}, 0.4, 0.5), wave({4 * H, H}, 0.6, 0.5)};
      if (bias) {
        base.push_back(wave({4 * H}, 0.7, 0.1));
        base.push_back(wave({4 * H}, 0.8, 0.1));
      }
      for (DType dt : {DType::Float64, DType::Float32}) {
        const double tol = dt == DType::Float64 ? 1e-12 : 2e-5;
        auto run = [&](bool layer) {
          std::vector<Tensor> args;
          for (const Tensor& t : base) args.push_back(t.to(dt).detach().requiresGrad_());
          Tensor bi = bias ? args[5] : Tensor(), bh = bias ? args[6] : Tensor();
          LstmLayerOutput o = layer ? lstmLayer(args[0], args[1], args[2], args[3], args[4], bi, bh)
                                    : lstmLayerByCells(args[0], args[1], args[2], args[3], args[4], bi, bh);
          // A loss through the output, the last h and the last c.
          add(add(mul(o.output, o.output).sum(), mul(o.h, 0.5).sum()), mul(o.c, 2.0).sum()).backward();
          std::vector<Tensor> got{o.output.detach(), o.h.detach(), o.c.detach()};
          for (const Tensor& t : args) got.push_back(t.grad());
          return got;
        };
        std::vector<Tensor> layer = run(true), cells = run(false);
        REQUIRE(layer.size() == cells.size());
        for (size_t i = 0; i < layer.size(); ++i) {
          CAPTURE(i);
          REQUIRE(layer[i].defined());
          REQUIRE(cells[i].defined());
          expectClose(layer[i], cells[i], tol, tol);
        }
      }
    }
  }
}

TEST_CASE("lstmLayer passes gradcheck for every input, through its output and its last state") {
  for (int64_t n : {2, 17}) {
    std::vector<Tensor> in{randn({3, n, 2}, kF64), randn({n, 3}, kF64), randn({n, 3}, kF64), randn({12, 2}, kF64),
                           randn({12, 3}, kF64),   randn({12}, kF64),   randn({12}, kF64)};
    auto layer = [](const std::vector<Tensor>& t) { return lstmLayer(t[0], t[1], t[2], t[3], t[4], t[5], t[6]); };
    CHECK(gradcheck([&](const auto& t) { return layer(t).output; }, in));
    CHECK(gradcheck([&](const auto& t) { return add(layer(t).h, mul(layer(t).c, 0.5)); }, in));
  }
}

TEST_CASE("lstmLayer gives the same bits with one thread or several") {
  weft::testing::checkRequestedBlasCore();
  const int saved = kernels::cpu::numThreads();
  // [T, N, in, hidden]: batch rows in three chunks, and a batch of one chunk
  // whose recurrent products are large enough to be cut into blocks.
  for (auto [T, N, I, H] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{20, 48, 32, 64}, {5, 8, 32, 256}}) {
    auto run = [&](int threads) {
      kernels::cpu::setNumThreads(threads);
      Generator g(3);
      std::vector<Tensor> in{randn({T, N, I}, {}, &g),  randn({N, H}, {}, &g), randn({N, H}, {}, &g),
                             randn({4 * H, I}, {}, &g), randn({4 * H, H}, {}, &g), randn({4 * H}, {}, &g),
                             randn({4 * H}, {}, &g)};
      for (Tensor& t : in) t.requiresGrad_();
      LstmLayerOutput o = lstmLayer(in[0], in[1], in[2], in[3], in[4], in[5], in[6]);
      add(mul(o.output, o.output).sum(), o.c.sum()).backward();
      std::vector<std::vector<float>> got{o.output.toVector<float>(), o.h.toVector<float>()};
      for (const Tensor& t : in) got.push_back(t.grad().toVector<float>());
      return got;
    };
    CAPTURE(N);
    CAPTURE(H);
    auto one = run(1), two = run(2), three = run(3);
    kernels::cpu::setNumThreads(saved);
    CHECK(one == two);
    CHECK(one == three);
  }
}

TEST_CASE("lstmLayer and conv2d give the same bits with any thread count under each OpenBLAS core type this CPU runs") {
  weft::testing::checkUnderEachBlasCoreType(
      "lstmLayer gives the same bits with one thread or several,conv2d gives the same bits with one thread or several*",
      2);
}

TEST_CASE("lstmLayer names the op and the shapes on bad input") {
  Tensor h = zeros({2, 3}), w = zeros({12, 4}), wh = zeros({12, 3});
  CHECK_THROWS_WITH_AS(lstmLayer(zeros({2, 4}), h, h, w, wh, Tensor(), Tensor()),
                       doctest::Contains("lstmLayer: input must be 3-D [T, N, in]"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(lstmLayer(zeros({0, 2, 4}), h, h, w, wh, Tensor(), Tensor()),
                       doctest::Contains("with T > 0"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(lstmLayer(zeros({5, 2, 5}), h, h, w, wh, Tensor(), Tensor()),
                       doctest::Contains("lstmLayer: wIh of shape [12, 4] must be [4*hidden, in]"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(lstmLayer(zeros({5, 3, 4}), h, h, w, wh, Tensor(), Tensor()),
                       doctest::Contains("must both be [3, 3]"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(lstmLayer(zeros({5, 2, 4}), h, h, w, wh, zeros({11}), Tensor()),
                       doctest::Contains("bias of shape [11] must be [12]"), InvalidArgumentError);
}

TEST_CASE("dropout passes gradcheck with a fixed mask") {
  CHECK(gradcheck(
      [](const auto& in) {
        Generator g(5);
        return dropout(in[0], 0.4, true, &g);
      },
      {randn({4, 5}, kF64)}));
}

// ---- dropout semantics ---------------------------------------------------------------

TEST_CASE("dropout zeroes about p of the elements and scales the rest by 1/(1-p)") {
  Generator g(42);
  const double p = 0.3;
  Tensor out = dropout(ones({200000}), p, true, &g);
  std::vector<float> v = out.toVector<float>();
  const float kept = static_cast<float>(1.0 / (1.0 - p));
  int64_t zeros = 0, other = 0;
  for (float e : v) {
    if (e == 0.0f) ++zeros;
    else if (e != kept) ++other;
  }
  CHECK(other == 0);
  double frac = static_cast<double>(zeros) / static_cast<double>(v.size());
  // The standard deviation of the fraction is about 0.001.
  CHECK(std::abs(frac - p) < 0.006);
}

TEST_CASE("dropout is reproducible with a seeded generator") {
  Tensor x = randn({1000});
  Generator a(7), b(7), c(8);
  Tensor da = dropout(x, 0.5, true, &a), db = dropout(x, 0.5, true, &b), dc = dropout(x, 0.5, true, &c);
  CHECK(da.toVector<float>() == db.toVector<float>());
  CHECK(da.toVector<float>() != dc.toVector<float>());
}

TEST_CASE("dropout drops exactly the elements whose draw from the generator falls below p") {
  // Element i is dropped when the generator's i-th nextDouble() is below p,
  // for every p (including ones whose scaled threshold is not exact).
  for (double p : {0.1, 0.25, 1.0 / 3.0, 0.5, 0.9}) {
    Generator g(11), ref(11);
    Tensor out = dropout(ones({5000}, kF64), p, true, &g);
    std::vector<double> v = out.toVector<double>();
    for (size_t i = 0; i < v.size(); ++i) {
      const bool dropped = ref.nextDouble() < p;
      CHECK(v[i] == (dropped ? 0.0 : 1.0 / (1.0 - p)));
    }
    CHECK(g.nextU64() == ref.nextU64());  // and leaves the generator where the draws end
  }
}

TEST_CASE("dropout is the identity outside training or with p = 0, and zeros with p = 1") {
  Tensor x = randn({10}).requiresGrad_();
  CHECK(dropout(x, 0.5, false).sameAs(x));
  CHECK(dropout(x, 0.0, true).sameAs(x));
  Tensor z = dropout(x, 1.0, true);
  CHECK(z.toVector<float>() == std::vector<float>(10, 0.0f));
  z.sum().backward();
  CHECK(x.grad().toVector<float>() == std::vector<float>(10, 0.0f));
}

TEST_CASE("dropout's gradient is the mask it applied") {
  Generator g(9);
  Tensor x = full({1000}, 2.0, kF64).requiresGrad_();
  Tensor out = dropout(x, 0.25, true, &g);
  out.sum().backward();
  // d out / d x = mask = out / x.
  expectClose(x.grad(), mul(out.detach(), 0.5), 1e-15, 0.0);
}

// ---- errors ----------------------------------------------------------------------------

TEST_CASE("an out-of-range index names the index and the table size") {
  Tensor w = ones({6, 3});
  CHECK_THROWS_WITH_AS(embedding(w, ids({1, 7})),
                       doctest::Contains("index 7 (at position 1) is out of range for a table of 6 rows"), IndexError);
  CHECK_THROWS_WITH_AS(embedding(w, ids({-1})), doctest::Contains("index -1"), IndexError);
  CHECK_THROWS_WITH_AS(embeddingBag(w, ids({0, 6}), ids({0})), doctest::Contains("embeddingBag: index 6"), IndexError);
  CHECK_THROWS_WITH_AS(embedding(w, fromVector<double>({1.0})), doctest::Contains("indices must be int64"),
                       InvalidArgumentError);
}

TEST_CASE("embeddingBag rejects bad offsets and misused arguments") {
  Tensor w = ones({6, 3});
  Tensor idx = ids({1, 2, 3});
  CHECK_THROWS_WITH_AS(embeddingBag(w, idx, ids({1, 2})), doctest::Contains("offsets[0] must be 0"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(embeddingBag(w, idx, ids({0, 2, 1})), doctest::Contains("offsets must be non-decreasing"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(embeddingBag(w, idx, ids({0, 4})),
                       doctest::Contains("offsets[1] = 4 is beyond the end of the 3"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(embeddingBag(w, idx, Tensor()), doctest::Contains("1-D indices need offsets"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(embeddingBag(w, ids({1, 2}, {1, 2}), ids({0})), doctest::Contains("offsets must be undefined"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(embeddingBag(w, idx, ids({0}), EmbeddingBagMode::Mean, ones({3})),
                       doctest::Contains("only supported in Sum mode"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(embeddingBag(w, idx, ids({0}), EmbeddingBagMode::Sum, ones({2})),
                       doctest::Contains("perSampleWeights of shape [2] must match indices of shape [3]"),
                       InvalidArgumentError);
  // No bags at all is a valid, empty result.
  CHECK(embeddingBag(w, idx, fromVector<int64_t>({}), EmbeddingBagMode::Sum).shape() == Shape{0, 3});
}

TEST_CASE("conv2d, maxPool2d and lstmCell name the op and the shapes on bad input") {
  CHECK_THROWS_WITH_AS(conv2d(ones({1, 2, 5, 5}), ones({4, 3, 3, 3})),
                       doctest::Contains("conv2d: weight of shape [4, 3, 3, 3] expects 3 input channels, got input of "
                                         "shape [1, 2, 5, 5]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(conv2d(ones({1, 2, 3, 3}), ones({4, 2, 5, 5})),
                       doctest::Contains("larger than the padded input"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(conv2d(ones({2, 5, 5}), ones({4, 2, 3, 3})), doctest::Contains("input must be 4-D"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(conv2d(ones({1, 2, 5, 5}), ones({4, 2, 3, 3}), ones({3})),
                       doctest::Contains("bias of shape [3]"), InvalidArgumentError);
  CHECK_THROWS_AS(conv2d(ones({1, 2, 5, 5}), ones({4, 2, 3, 3}), Tensor(), 0), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(maxPool2d(ones({1, 1, 4, 4}), 2, 2, 2),
                       doctest::Contains("padding 2 must be between 0 and half"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(maxPool2d(ones({1, 1, 2, 2}), 3), doctest::Contains("input of shape [1, 1, 2, 2] is smaller"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(lstmCell(ones({2, 3}), ones({2, 2}), ones({2, 2}), ones({8, 4}), ones({8, 2}), Tensor(),
                                Tensor()),
                       doctest::Contains("lstmCell: wIh of shape [8, 4] must be [4*hidden, in] for input of shape "
                                         "[2, 3]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(lstmCell(ones({2, 3}), ones({3, 2}), ones({2, 2}), ones({8, 3}), ones({8, 2}), Tensor(),
                                Tensor()),
                       doctest::Contains("h of shape [3, 2]"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(dropout(ones({3}), 1.5, true),
                       doctest::Contains("dropout: probability has to be between 0 and 1"), InvalidArgumentError);
  CHECK_THROWS_AS(dropout(ones({3}), -0.1, false), InvalidArgumentError);
}
