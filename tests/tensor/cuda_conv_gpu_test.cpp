// conv2d, maxPool2d, lstmCell and lstmLayer on cuda:0 against the CPU kernels
// (tests/cuda_compare.h): outputs and every input gradient, float64 to
// rounding and float32 to the documented tolerance, including odd sizes,
// empty batches and non-contiguous inputs.
#include <cmath>
#include <limits>
#include <string>

#include "cuda_compare.h"
#include "tensor/ops_nn.h"

using namespace weft;
using weft::testing::CompareOptions;
using weft::testing::compareWithCpu;
using weft::testing::randomTensor;

namespace {

const DType kTypes[] = {DType::Float64, DType::Float32};

std::string nameOf(const char* op, DType t, int i) {
  return std::string(op) + " " + dtypeName(t) + " case " + std::to_string(i);
}

struct ConvCase {
  Shape x, w;
  std::pair<int64_t, int64_t> stride, padding;
  bool bias;
};

}  // namespace

TEST_CASE("conv2d on CUDA matches the CPU across strides, padding, odd sizes and channel counts") {
  WEFT_SKIP_WITHOUT_CUDA();
  const ConvCase cases[] = {
      {{2, 3, 9, 11}, {4, 3, 3, 3}, {1, 1}, {1, 1}, true},     // 3 channels, same padding
      {{3, 1, 8, 7}, {5, 1, 2, 3}, {2, 1}, {0, 1}, false},     // 1 channel, rectangular kernel and stride
      {{2, 16, 7, 7}, {16, 16, 3, 3}, {2, 2}, {1, 1}, true},   // 16 channels, strided
      {{4, 16, 5, 6}, {8, 16, 1, 1}, {1, 1}, {0, 0}, true},    // pointwise: multiplies the images directly
      {{2, 3, 6, 5}, {7, 3, 1, 1}, {2, 2}, {1, 0}, false},     // 1x1 with stride and padding: unfolded
      {{1, 3, 5, 5}, {2, 3, 5, 5}, {1, 1}, {0, 0}, true},      // kernel as large as the input: one position
      {{5, 2, 4, 9}, {3, 2, 3, 2}, {3, 2}, {2, 1}, true},      // padding past the kernel's half, stride 3
      {{0, 3, 6, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1}, true},      // empty batch
  };
  for (DType t : kTypes) {
    int i = 0;
    for (const ConvCase& c : cases) {
      std::vector<Tensor> in{randomTensor(c.x, t, 10 + i), randomTensor(c.w, t, 20 + i)};
      if (c.bias) in.push_back(randomTensor({c.w[0]}, t, 30 + i));
      const ConvCase k = c;
      compareWithCpu(nameOf("conv2d", t, i), in, [k](const std::vector<Tensor>& v) {
        return conv2d(v[0], v[1], k.bias ? v[2] : Tensor(), k.stride, k.padding);
      });
      ++i;
    }
  }
}

TEST_CASE("conv2d on CUDA reads non-contiguous inputs and weights") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType t : kTypes) {
    // x viewed with H and W swapped, a channel slice of a wider tensor, a transposed weight.
    compareWithCpu(nameOf("conv2d transposed input", t, 0),
                   {randomTensor({2, 3, 10, 7}, t, 1), randomTensor({4, 3, 3, 2}, t, 2), randomTensor({4}, t, 3)},
                   [](const std::vector<Tensor>& v) {
                     return conv2d(v[0].transpose(2, 3), v[1], v[2], {1, 2}, {1, 0});
                   });
    compareWithCpu(nameOf("conv2d sliced input", t, 1),
                   {randomTensor({3, 6, 8, 8}, t, 4), randomTensor({5, 3, 3, 3}, t, 5)},
                   [](const std::vector<Tensor>& v) { return conv2d(v[0].narrow(1, 2, 3), v[1], Tensor(), 1, 1); });
    compareWithCpu(nameOf("conv2d transposed weight", t, 2),
                   {randomTensor({2, 4, 6, 6}, t, 6), randomTensor({4, 5, 3, 3}, t, 7)},
                   [](const std::vector<Tensor>& v) { return conv2d(v[0], v[1].transpose(0, 1), Tensor(), 2, 1); });
  }
}

TEST_CASE("conv2d on CUDA splits a batch whose unfolded images pass the scratch budget") {
  WEFT_SKIP_WITHOUT_CUDA();
  // 32 images of 16 channels at 96x96 with a 5x5 kernel: 400 x 9216 unfolded
  // entries per image, about 14 MiB in float32, so 256 MiB of scratch holds
  // 18 images: two chunks, the weight gradient summed over both.
  compareWithCpu("conv2d float32 in chunks",
                 {randomTensor({32, 16, 96, 96}, DType::Float32, 8), randomTensor({8, 16, 5, 5}, DType::Float32, 9),
                  randomTensor({8}, DType::Float32, 10)},
                 [](const std::vector<Tensor>& v) { return conv2d(v[0], v[1], v[2], 1, 2); },
                 CompareOptions{.rtolScale = 5, .atolScale = 20});
}

TEST_CASE("maxPool2d on CUDA matches the CPU for kernels, strides and padding") {
  WEFT_SKIP_WITHOUT_CUDA();
  struct PoolCase {
    Shape x;
    int64_t kernel, stride, padding;
  };
  const PoolCase cases[] = {
      {{2, 3, 8, 8}, 2, 2, 0},  {{2, 3, 9, 7}, 2, 2, 0},   {{1, 4, 11, 10}, 3, 2, 1}, {{3, 2, 7, 9}, 3, 1, 1},
      {{2, 1, 5, 5}, 5, 1, 2},  {{1, 16, 6, 13}, 4, 3, 2}, {{2, 2, 1, 1}, 1, 1, 0},   {{0, 3, 4, 4}, 2, 2, 0},
  };
  for (DType t : kTypes) {
    int i = 0;
    for (const PoolCase& c : cases) {
      const PoolCase k = c;
      compareWithCpu(nameOf("maxPool2d", t, i), {randomTensor(c.x, t, 40 + i)},
                     [k](const std::vector<Tensor>& v) { return maxPool2d(v[0], k.kernel, k.stride, k.padding); });
      ++i;
    }
    compareWithCpu(nameOf("maxPool2d transposed input", t, i), {randomTensor({2, 3, 9, 6}, t, 60)},
                   [](const std::vector<Tensor>& v) { return maxPool2d(v[0].transpose(2, 3), 3, 2, 1); });
  }
}

TEST_CASE("maxPool2d on CUDA keeps the first of tied maxima and lets NaN win, as the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType t : kTypes) {
    // Values in {0, 1, 2}: most windows hold ties, so the gradient lands on
    // the first maximum in row-major order or the comparison fails.
    Generator gen(70);
    Tensor ties = randint(0, 3, {2, 3, 10, 9}, {.dtype = DType::Int64}, &gen).to(t);
    compareWithCpu(nameOf("maxPool2d ties", t, 0), {ties},
                   [](const std::vector<Tensor>& v) { return maxPool2d(v[0], 3, 2, 1); });
    compareWithCpu(nameOf("maxPool2d ties 2x2", t, 1), {ties},
                   [](const std::vector<Tensor>& v) { return maxPool2d(v[0], 2); });
    std::vector<double> vals(2 * 6 * 6);
    for (size_t j = 0; j < vals.size(); ++j) vals[j] = static_cast<double>((j * 7) % 5);
    vals[3] = vals[17] = vals[40] = std::numeric_limits<double>::quiet_NaN();
    // NaN outputs: compared position by position here (allclose never
    // equates NaNs), the gradient through backward(w).
    Tensor withNan = fromVector(vals, {1, 2, 6, 6}).to(t);
    Tensor xc = withNan.clone().requiresGrad_(), xg = withNan.to(Device::cuda(0)).requiresGrad_();
    Tensor oc = maxPool2d(xc, 3, 1, 1), og = maxPool2d(xg, 3, 1, 1);
    const std::vector<double> a = oc.detach().to(DType::Float64).toVector<double>();
    const std::vector<double> b = og.detach().to(Device::cpu()).to(DType::Float64).toVector<double>();
    REQUIRE(a.size() == b.size());
    int nans = 0, mismatches = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      nans += std::isnan(a[j]) ? 1 : 0;
      const bool same = std::isnan(a[j]) ? std::isnan(b[j]) : a[j] == b[j];
      mismatches += same ? 0 : 1;
    }
    CHECK(nans > 0);
    CHECK(mismatches == 0);
    Tensor w = randomTensor(oc.shape(), t, 5);
    oc.backward(w);
    og.backward(w.to(Device::cuda(0)));
    weft::testing::checkMatches(nameOf("maxPool2d NaN gradient", t, 2), xg.grad(), xc.grad(),
                                weft::testing::defaultTolerance(t));
  }
}

TEST_CASE("lstmCell on CUDA matches the CPU through h' and c', with and without biases") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType t : kTypes) {
    for (int64_t N : {1, 5}) {
      for (bool biases : {true, false}) {
        const int64_t in = 7, H = 6;
        std::vector<Tensor> v{randomTensor({N, in}, t, 80), randomTensor({N, H}, t, 81), randomTensor({N, H}, t, 82),
                              randomTensor({4 * H, in}, t, 83), randomTensor({4 * H, H}, t, 84)};
        if (biases) {
          v.push_back(randomTensor({4 * H}, t, 85));
          v.push_back(randomTensor({4 * H}, t, 86));
        }
        for (int which : {0, 1}) {
          compareWithCpu(nameOf(which == 0 ? "lstmCell h'" : "lstmCell c'", t, static_cast<int>(N)), v,
                         [which, biases](const std::vector<Tensor>& a) {
                           auto [h1, c1] = lstmCell(a[0], a[1], a[2], a[3], a[4], biases ? a[5] : Tensor(),
                                                    biases ? a[6] : Tensor());
                           return which == 0 ? h1 : c1;
                         });
        }
      }
    }
    // Transposed operands: x read through .t(), wIh stored as [in, 4H].
    compareWithCpu(nameOf("lstmCell views", t, 0),
                   {randomTensor({7, 3}, t, 90), randomTensor({3, 5}, t, 91), randomTensor({3, 5}, t, 92),
                    randomTensor({7, 20}, t, 93), randomTensor({20, 5}, t, 94), randomTensor({20}, t, 95)},
                   [](const std::vector<Tensor>& a) {
                     return lstmCell(a[0].t(), a[1], a[2], a[3].t(), a[4], a[5], Tensor()).first;
                   });
  }
}

TEST_CASE("lstmLayer on CUDA matches the CPU for sequences of 1 and 7 steps and batches of 1 and 5") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType t : kTypes) {
    for (int64_t T : {1, 7}) {
      for (int64_t N : {1, 5}) {
        const int64_t in = 6, H = 9;
        std::vector<Tensor> v{randomTensor({T, N, in}, t, 100), randomTensor({N, H}, t, 101),
                              randomTensor({N, H}, t, 102),   randomTensor({4 * H, in}, t, 103),
                              randomTensor({4 * H, H}, t, 104), randomTensor({4 * H}, t, 105),
                              randomTensor({4 * H}, t, 106)};
        const char* names[] = {"lstmLayer output", "lstmLayer h", "lstmLayer c"};
        for (int which : {0, 1, 2}) {
          compareWithCpu(nameOf(names[which], t, static_cast<int>(10 * T + N)), v,
                         [which](const std::vector<Tensor>& a) {
                           LstmLayerOutput r = lstmLayer(a[0], a[1], a[2], a[3], a[4], a[5], a[6]);
                           return which == 0 ? r.output : which == 1 ? r.h : r.c;
                         });
        }
      }
    }
    // One bias, and x as a transposed view of [N, T, in].
    compareWithCpu(nameOf("lstmLayer views", t, 0),
                   {randomTensor({5, 7, 4}, t, 110), randomTensor({5, 3}, t, 111), randomTensor({5, 3}, t, 112),
                    randomTensor({12, 4}, t, 113), randomTensor({12, 3}, t, 114), randomTensor({12}, t, 115)},
                   [](const std::vector<Tensor>& a) {
                     return lstmLayer(a[0].transpose(0, 1), a[1], a[2], a[3], a[4], Tensor(), a[5]).output;
                   });
  }
}

TEST_CASE("lstmLayer on CUDA with an empty batch gives empty outputs and zero weight gradients") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType t : kTypes) {
    compareWithCpu(nameOf("lstmLayer empty batch", t, 0),
                   {randomTensor({3, 0, 4}, t, 120), randomTensor({0, 5}, t, 121), randomTensor({0, 5}, t, 122),
                    randomTensor({20, 4}, t, 123), randomTensor({20, 5}, t, 124), randomTensor({20}, t, 125),
                    randomTensor({20}, t, 126)},
                   [](const std::vector<Tensor>& a) {
                     LstmLayerOutput r = lstmLayer(a[0], a[1], a[2], a[3], a[4], a[5], a[6]);
                     return r.output;
                   });
  }
}

TEST_CASE("conv2d, maxPool2d and lstmLayer on CUDA compute 16-bit inputs in float32, as the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType t : {DType::BFloat16, DType::Float16}) {
    compareWithCpu(nameOf("conv2d", t, 0),
                   {randomTensor({2, 3, 7, 6}, t, 1), randomTensor({4, 3, 3, 3}, t, 2), randomTensor({4}, t, 3)},
                   [](const std::vector<Tensor>& v) { return conv2d(v[0], v[1], v[2], 2, 1); });
    compareWithCpu(nameOf("maxPool2d", t, 1), {randomTensor({2, 3, 7, 6}, t, 4)},
                   [](const std::vector<Tensor>& v) { return maxPool2d(v[0], 3, 2, 1); });
    compareWithCpu(nameOf("lstmLayer", t, 2),
                   {randomTensor({3, 2, 4}, t, 5), randomTensor({2, 5}, t, 6), randomTensor({2, 5}, t, 7),
                    randomTensor({20, 4}, t, 8), randomTensor({20, 5}, t, 9), randomTensor({20}, t, 10)},
                   [](const std::vector<Tensor>& a) {
                     return lstmLayer(a[0], a[1], a[2], a[3], a[4], a[5], Tensor()).output;
                   });
  }
}

TEST_CASE("conv2d, maxPool2d and lstmLayer on CUDA reject bad input with the CPU's errors") {
  WEFT_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  Tensor x = randomTensor({1, 3, 4, 4}, DType::Float32, 1).to(d);
  CHECK_THROWS_AS(conv2d(x, randomTensor({2, 4, 3, 3}, DType::Float32, 2).to(d)), InvalidArgumentError);
  CHECK_THROWS_AS(conv2d(x, randomTensor({2, 3, 3, 3}, DType::Float32, 2)), InvalidArgumentError);  // CPU weight
  CHECK_THROWS_AS(maxPool2d(x, 3, 1, 2), InvalidArgumentError);
  auto on = [&d](Shape s, uint64_t seed) { return randomTensor(std::move(s), DType::Float32, seed).to(d); };
  // wIh [8, 4] does not match x's 3 input features.
  CHECK_THROWS_AS(lstmLayer(on({2, 1, 3}, 3), on({1, 2}, 4), on({1, 2}, 5), on({8, 4}, 6), on({8, 2}, 7), Tensor(),
                            Tensor()),
                  InvalidArgumentError);
}
