// max/min/argmax/argmin, softmax/logSoftmax and sum/mean: values against
// known results, backward against finite differences, and the error cases.
#include <cmath>
#include <limits>

#include "gradcheck.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::expectClose;
using weft::testing::gradcheck;
using weft::testing::kF64;

namespace {

// A [2, 3, 4] float64 tensor with ties (x[0, 2, 0] == x[0, 2, 1]), used for
// the constants below.
Tensor sample() {
  return fromVector<double>({0.5, -1.0, 2.0, 0.0, 3.0, 1.5, -2.0, 0.25, 1.0, 1.0, 0.5, -0.75,
                             -0.5, 2.5, 1.0, 1.0, 0.0, -3.0, 4.0, 2.0, 2.0, 0.5, -1.0, 3.0},
                            {2, 3, 4});
}

}  // namespace

TEST_CASE("max and min over all elements return the extreme value for every dtype") {
  Tensor x = sample();
  CHECK(max(x).item<double>() == 4.0);
  CHECK(min(x).item<double>() == -3.0);
  CHECK(max(x).dim() == 0);
  CHECK(max(x.to(DType::Float32)).item<float>() == 4.0f);
  Tensor ints = fromVector<int64_t>({7, -2, 9, 9, 0});
  CHECK(max(ints).dtype() == DType::Int64);
  CHECK(max(ints).item<int64_t>() == 9);
  CHECK(min(ints).item<int64_t>() == -2);
  // Non-contiguous input.
  CHECK(max(x.transpose(0, 2)).item<double>() == 4.0);
}

TEST_CASE("the gradient of max over all elements is shared equally among tied maxima") {
  // torch: x = [[1,3,3],[2,2,1]]; x.max().backward() -> [[0,.5,.5],[0,0,0]]
  Tensor x = fromVector<double>({1, 3, 3, 2, 2, 1}, {2, 3}).requiresGrad_();
  max(x).backward();
  CHECK(x.grad().toVector<double>() == std::vector<double>{0, 0.5, 0.5, 0, 0, 0});
  Tensor y = fromVector<double>({1, 3, 3, 1, 2, 1}, {2, 3}).requiresGrad_();
  mul(min(y), 6.0).backward();
  CHECK(y.grad().toVector<double>() == std::vector<double>{2, 0, 0, 2, 0, 2});
}

TEST_CASE("max and min over all elements pass gradcheck") {
  CHECK(gradcheck([](const auto& in) { return max(in[0]); }, {randn({3, 5}, kF64)}));
  CHECK(gradcheck([](const auto& in) { return min(in[0]); }, {randn({4, 3}, kF64).t()}));
}

TEST_CASE("max and min along each dimension match PyTorch, first index on ties") {
  // torch: v, i = x.max(d) / x.min(d) for the sample tensor (float64).
  Tensor x = sample();
  struct Expected {
    int64_t dim;
    std::vector<double> maxV;
    std::vector<int64_t> maxI;
    std::vector<double> minV;
    std::vector<int64_t> minI;
  };
  std::vector<Expected> cases = {
      {0,
       {0.5, 2.5, 2.0, 1.0, 3.0, 1.5, 4.0, 2.0, 2.0, 1.0, 0.5, 3.0},
       {0, 1, 0, 1, 0, 0, 1, 1, 1, 0, 0, 1},
       {-0.5, -1.0, 1.0, 0.0, 0.0, -3.0, -2.0, 0.25, 1.0, 0.5, -1.0, -0.75},
       {1, 0, 1, 0, 1, 1, 0, 0, 0, 1, 1, 0}},
      {1,
       {3.0, 1.5, 2.0, 0.25, 2.0, 2.5, 4.0, 3.0},
       {1, 1, 0, 1, 2, 0, 1, 2},
       {0.5, -1.0, -2.0, -0.75, -0.5, -3.0, -1.0, 1.0},
       {0, 0, 1, 2, 0, 1, 2, 0}},
      {2, {2.0, 3.0, 1.0, 2.5, 4.0, 3.0}, {2, 0, 0, 1, 2, 3}, {-1.0, -2.0, -0.75, -0.5, -3.0, -1.0}, {1, 2, 3, 0, 1, 2}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.dim);
    auto [mv, mi] = max(x, c.dim);
    auto [nv, ni] = min(x, c.dim);
    CHECK(mv.toVector<double>() == c.maxV);
    CHECK(mi.toVector<int64_t>() == c.maxI);
    CHECK(mi.dtype() == DType::Int64);
    CHECK(nv.toVector<double>() == c.minV);
    CHECK(ni.toVector<int64_t>() == c.minI);
    CHECK(argmax(x, c.dim).toVector<int64_t>() == c.maxI);
    CHECK(argmin(x, c.dim).toVector<int64_t>() == c.minI);
    Shape kept = x.shape();
    kept[c.dim] = 1;
    CHECK(max(x, c.dim, true).first.shape() == kept);
    CHECK(argmin(x, c.dim, true).shape() == kept);
    // The same answers from a float32 copy, an int64 copy and a permuted view.
    CHECK(max(x.to(DType::Float32), c.dim).second.toVector<int64_t>() == c.maxI);
    CHECK(argmin(mul(x, 4.0).to(DType::Int64), c.dim).toVector<int64_t>() == c.minI);
    Tensor permuted = x.permute({2, 0, 1}).contiguous().permute({1, 2, 0});
    CHECK_FALSE(permuted.isContiguous());
    CHECK(max(permuted, c.dim).second.toVector<int64_t>() == c.maxI);
  }
  CHECK(argmax(x, -1).toVector<int64_t>() == argmax(x, 2).toVector<int64_t>());
}

TEST_CASE("max and min along a dimension route the gradient to the chosen index") {
  Tensor x = fromVector<double>({1, 3, 3, 2, 2, 1}, {2, 3}).requiresGrad_();
  auto [v, i] = max(x, 1);
  mul(v, fromVector<double>({10, 20})).sum().backward();
  CHECK(x.grad().toVector<double>() == std::vector<double>{0, 10, 0, 20, 0, 0});
}

TEST_CASE("max and min along a dimension pass gradcheck on several dims and layouts") {
  for (int64_t d : {0, 1, 2, -1}) {
    for (bool keep : {false, true}) {
      CAPTURE(d);
      CAPTURE(keep);
      CHECK(gradcheck([d, keep](const auto& in) { return max(in[0], d, keep).first; }, {randn({3, 4, 5}, kF64)}));
      CHECK(gradcheck([d, keep](const auto& in) { return min(in[0], d, keep).first; },
                      {randn({5, 4, 3}, kF64).transpose(0, 2)}));
    }
  }
  // Wide inner dimension: more columns than one kernel block.
  CHECK(gradcheck([](const auto& in) { return max(in[0], 0).first; }, {randn({3, 300}, kF64)}));
}

TEST_CASE("a NaN wins max, min and argmax as in PyTorch") {
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = fromVector<double>({1, nan, 3, 5, 4, 2}, {2, 3});
  CHECK(std::isnan(max(x).item<double>()));
  CHECK(std::isnan(min(x).item<double>()));
  CHECK(argmax(x, 1).toVector<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK(argmin(x, 1).toVector<int64_t>() == std::vector<int64_t>{1, 2});
}

TEST_CASE("max over a long tensor finds the first of tied maxima across threads") {
  int64_t n = 200000;
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<double>(i));
  v[70000] = 5.0;
  v[190000] = 5.0;
  v[150000] = -5.0;
  Tensor x = fromVector(v);
  CHECK(max(x).item<double>() == 5.0);
  CHECK(argmax(x, 0).item<int64_t>() == 70000);
  CHECK(argmin(x, 0).item<int64_t>() == 150000);
  CHECK(argmax(x.to(DType::Float32), 0).item<int64_t>() == 70000);
  // The same through the row-wise path: [2, n/2].
  CHECK(argmax(x.view({2, n / 2}), 1).toVector<int64_t>() == std::vector<int64_t>{70000, 90000});
}

TEST_CASE("reductions reject empty inputs and bad dims with errors naming the op") {
  CHECK_THROWS_WITH_AS(max(empty({0, 3})), doctest::Contains("max: cannot reduce an empty tensor"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(min(empty({0})), doctest::Contains("min"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(max(empty({0, 3}), 0), doctest::Contains("max: cannot reduce dimension 0 of size 0"),
                       InvalidArgumentError);
  // Reducing a non-empty dim of an empty tensor is fine.
  CHECK(argmax(empty({0, 3}), 1).shape() == Shape{0});
  CHECK_THROWS_WITH_AS(max(zeros({2, 3}), 2), doctest::Contains("max: dimension 2 out of range"), IndexError);
  CHECK_THROWS_WITH_AS(argmin(zeros({2, 3}), -3), doctest::Contains("argmin"), IndexError);
  CHECK_THROWS_WITH_AS(softmax(zeros({2, 3}), 5), doctest::Contains("softmax"), IndexError);
  CHECK_THROWS_WITH_AS(logSoftmax(fromVector<int64_t>({1, 2}), 0), doctest::Contains("logSoftmax"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(sum(zeros({2, 3}), {0, -2}), doctest::Contains("sum: a dimension appears twice"),
                       InvalidArgumentError);
}

TEST_CASE("softmax and logSoftmax match PyTorch along a middle and the last dim") {
  // torch: x.softmax(1).flatten().tolist() and x.log_softmax(2).flatten().tolist()
  Tensor x = sample();
  Tensor sm1 = fromVector<double>(
      {0.06742535823245292, 0.04861082403130227, 0.8055124120405226,  0.36279310456968256, 0.8214090194651259,
       0.5922010701861591,  0.014753474459327466, 0.465835567266526,  0.11116562230242114, 0.3591881057825386,
       0.1797341135001498,  0.17137132816379141, 0.06742535823245292, 0.8776379181857815,  0.047123416524664154,
       0.09003057317038046, 0.11116562230242114, 0.003586705577354715, 0.9464991225528937, 0.24472847105479764,
       0.8214090194651259,  0.11877537623686388, 0.006377460922442298, 0.6652409557748218},
      {2, 3, 4});
  Tensor lsm2 = fromVector<double>(
      {-1.842349582389822,  -3.342349582389822, -0.342349582389822,  -2.342349582389822, -0.2575805084953792,
       -1.7575805084953793, -5.257580508495379, -3.007580508495379,  -1.0225604911833701, -1.0225604911833701,
       -1.5225604911833701, -2.77256049118337,  -3.402826555965505,  -0.4028265559655049, -1.9028265559655049,
       -1.9028265559655049, -4.143721747718616, -7.143721747718616,  -0.1437217477186159, -2.143721747718616,
       -1.3840917012886902, -2.8840917012886904, -4.38409170128869,  -0.38409170128869025},
      {2, 3, 4});
  expectClose(softmax(x, 1), sm1, 1e-12, 1e-14);
  expectClose(logSoftmax(x, 2), lsm2, 1e-12, 1e-14);
  expectClose(logSoftmax(x, -1), lsm2, 1e-12, 1e-14);
  expectClose(softmax(x.to(DType::Float32), 1), sm1.to(DType::Float32), 1e-5, 1e-6);
  expectClose(logSoftmax(x.to(DType::Float32), 2), lsm2.to(DType::Float32), 1e-5, 1e-6);
  // Non-contiguous input: the transposed tensor's dim 2 is the sample's dim 0.
  Tensor xt = x.transpose(0, 2);
  expectClose(softmax(xt, 2), softmax(x, 0).transpose(0, 2).contiguous(), 1e-12, 1e-14);
  expectClose(exp(logSoftmax(x, 0)), softmax(x, 0), 1e-12, 1e-14);
}

TEST_CASE("softmax stays finite for large logits") {
  // torch: torch.tensor([1000., 1001., 1002.]).softmax(0) / .log_softmax(0)
  Tensor x = fromVector<float>({1000, 1001, 1002});
  expectClose(softmax(x, 0), fromVector<float>({0.09003057330846786f, 0.2447284758090973f, 0.6652409434318542f}));
  expectClose(logSoftmax(x, 0),
              fromVector<float>({-2.4076058864593506f, -1.4076058864593506f, -0.40760594606399536f}));
  expectClose(logSoftmax(fromVector<double>({-1e300, 0.0}), 0), fromVector<double>({-1e300, 0.0}));
}

TEST_CASE("softmax rows sum to one on wide and strided layouts") {
  Tensor x = randn({3, 300, 5}, kF64);
  for (int64_t d : {0, 1, 2}) {
    CAPTURE(d);
    Tensor s = sum(softmax(x, d), {d});
    expectClose(s, onesLike(s), 1e-12, 1e-12);
  }
  Tensor y = randn({2, 400, 3}, kF64);  // inner 400 > one kernel block when reducing dim 0
  expectClose(sum(softmax(y.permute({1, 0, 2}), 1), {1}), ones({400, 3}, kF64), 1e-12, 1e-12);
}

TEST_CASE("softmax and logSoftmax pass gradcheck on several dims and layouts") {
  for (int64_t d : {0, 1, 2, -1}) {
    CAPTURE(d);
    CHECK(gradcheck([d](const auto& in) { return softmax(in[0], d); }, {randn({2, 3, 4}, kF64)}));
    CHECK(gradcheck([d](const auto& in) { return logSoftmax(in[0], d); }, {randn({2, 3, 4}, kF64)}));
    CHECK(gradcheck([d](const auto& in) { return logSoftmax(in[0], d); }, {randn({4, 3, 2}, kF64).transpose(0, 2)}));
  }
  CHECK(gradcheck([](const auto& in) { return softmax(in[0], 0); }, {randn({3, 130}, kF64)}));
  CHECK(gradcheck([](const auto& in) { return logSoftmax(in[0], 0); }, {randn({3, 130}, kF64)}));
}

TEST_CASE("sum and mean over dims pass gradcheck, including non-contiguous inputs") {
  CHECK(gradcheck([](const auto& in) { return sum(in[0], {0, 2}); }, {randn({2, 3, 4}, kF64)}));
  CHECK(gradcheck([](const auto& in) { return sum(in[0], {1}, true); }, {randn({4, 3, 2}, kF64).transpose(0, 2)}));
  CHECK(gradcheck([](const auto& in) { return mean(in[0], {-1}); }, {randn({3, 5}, kF64).t()}));
  CHECK(gradcheck([](const auto& in) { return mean(in[0]); }, {randn({3, 5}, kF64)}));
}
