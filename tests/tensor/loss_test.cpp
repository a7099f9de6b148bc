// nllLoss, crossEntropy and mseLoss: values against PyTorch, backward against
// finite differences, and the error cases.
#include <cmath>

#include "gradcheck.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::expectClose;
using weft::testing::gradcheck;
using weft::testing::kF64;

namespace {

Tensor logits3x4() {
  return fromVector<double>({0.2, -1.3, 0.7, 2.1, 1.5, 0.3, -0.4, 0.0, -0.9, 0.8, 1.2, -2.2}, {3, 4});
}

// sin(0), sin(1), ..., sin(23) as [2, 3, 2, 2]: torch.arange(24.).reshape(2,3,2,2).sin()
Tensor spatialLogits() {
  std::vector<double> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<double>(i));
  return fromVector(v, {2, 3, 2, 2});
}

Tensor target(std::vector<int64_t> v, Shape shape) { return fromVector(v, std::move(shape)); }

}  // namespace

TEST_CASE("crossEntropy matches PyTorch for every reduction") {
  // torch: F.cross_entropy(x, t, reduction=r) with x = logits3x4(), t = [3, 0, 1]
  Tensor x = logits3x4();
  Tensor t = target({3, 0, 1}, {3});
  expectClose(crossEntropy(x, t, Reduction::None),
              fromVector<double>({0.3573519119313818, 0.5151520460594644, 1.0022097855184866}), 1e-12, 1e-14);
  CHECK(crossEntropy(x, t).dim() == 0);
  CHECK(crossEntropy(x, t).item<double>() == doctest::Approx(0.6249045811697777).epsilon(1e-12));
  CHECK(crossEntropy(x, t, Reduction::Sum).item<double>() == doctest::Approx(1.874713743509333).epsilon(1e-12));
  CHECK(crossEntropy(x.to(DType::Float32), t).item<float>() == doctest::Approx(0.6249045811697777).epsilon(1e-6));
}

TEST_CASE("an ignored target adds nothing and the mean divides by the others") {
  // torch: F.cross_entropy(x, [3, -100, 1], reduction=r); F.nll_loss(x, [3, -100, 1], reduction=r)
  Tensor x = logits3x4();
  Tensor t = target({3, -100, 1}, {3});
  expectClose(crossEntropy(x, t, Reduction::None),
              fromVector<double>({0.3573519119313818, 0.0, 1.0022097855184866}), 1e-12, 1e-14);
  CHECK(crossEntropy(x, t).item<double>() == doctest::Approx(0.6797808487249342).epsilon(1e-12));
  CHECK(crossEntropy(x, t, Reduction::Sum).item<double>() == doctest::Approx(1.3595616974498683).epsilon(1e-12));
  CHECK(nllLoss(x, t).item<double>() == doctest::Approx(-1.45).epsilon(1e-12));
  CHECK(nllLoss(x, t, Reduction::None).toVector<double>() == std::vector<double>{-2.1, 0.0, -0.8});
  // Another ignore value.
  CHECK(nllLoss(x, target({3, 7, 1}, {3}), Reduction::Mean, 7).item<double>() == doctest::Approx(-1.45));
  // torch: x.requires_grad_(); F.cross_entropy(x, [3, -100, 1]).backward(); x.grad
  Tensor xs = x.detach().requiresGrad_();
  crossEntropy(xs, t).backward();
  expectClose(xs.grad(),
              fromVector<double>({0.05231359011184634, 0.011672739739595584, 0.08625052876408895, -0.15023685861553082,
                                  0.0, 0.0, 0.0, 0.0, 0.03352858346875201, -0.31646629797291725, 0.27380010953353573,
                                  0.009137604970629532},
                                 {3, 4}),
              1e-10, 1e-12);
}

TEST_CASE("a mean over only ignored targets is NaN with a zero gradient, as in PyTorch") {
  Tensor x = logits3x4().requiresGrad_();
  Tensor t = target({-100, -100, -100}, {3});
  Tensor loss = nllLoss(x, t);
  CHECK(std::isnan(loss.item<double>()));
  loss.backward();
  CHECK(x.grad().toVector<double>() == std::vector<double>(12, 0.0));
  CHECK(crossEntropy(x, t, Reduction::Sum).item<double>() == 0.0);
}

TEST_CASE("crossEntropy handles [N, C, d1, d2] inputs like PyTorch") {
  // torch: y = torch.arange(24.).reshape(2,3,2,2).sin(); t = [[[0,2],[1,-100]],[[2,2],[0,1]]]
  //        F.cross_entropy(y, t, reduction='none').flatten(), F.cross_entropy(y, t)
  Tensor y = spatialLogits();
  Tensor t = target({0, 2, 1, -100, 2, 2, 0, 1}, {2, 2, 2});
  Tensor none = crossEntropy(y, t, Reduction::None);
  CHECK(none.shape() == Shape{2, 2, 2});
  expectClose(none,
              fromVector<double>({1.4251958174228057, 1.0260790847095265, 1.6194598832593856, 0.0, 0.4289355597652648,
                                  0.6015685049828331, 0.43393553802443496, 1.1048316676922423},
                                 {2, 2, 2}),
              1e-10, 1e-12);
  CHECK(crossEntropy(y, t).item<double>() == doctest::Approx(0.9485722936937846).epsilon(1e-10));
  expectClose(nllLoss(logSoftmax(y, 1), t, Reduction::None), none, 1e-12, 1e-14);
}

TEST_CASE("crossEntropy equals nllLoss of logSoftmax in value and gradient") {
  for (DType dt : {DType::Float32, DType::Float64}) {
    for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      CAPTURE(dt);
      CAPTURE(static_cast<int>(r));
      Tensor logits = randn({64, 10}, {.dtype = dt});
      Tensor t = randint(0, 10, {64});
      Tensor a = logits.detach().requiresGrad_(), b = logits.detach().requiresGrad_();
      Tensor la = crossEntropy(a, t, r), lb = nllLoss(logSoftmax(b, 1), t, r);
      expectClose(la, lb, 1e-5, 1e-6);
      Tensor g = onesLike(la);
      la.backward(g);
      lb.backward(g);
      expectClose(a.grad(), b.grad(), 1e-5, 1e-6);
    }
  }
}

TEST_CASE("nllLoss and crossEntropy pass gradcheck for every reduction and layout") {
  Tensor t = target({2, -100, 0, 3, 1}, {5});
  Tensor ts = target({0, 2, 1, -100, 2, 2, 0, 1}, {2, 2, 2});
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    CAPTURE(static_cast<int>(r));
    CHECK(gradcheck([t, r](const auto& in) { return nllLoss(in[0], t, r); }, {randn({5, 4}, kF64)}));
    CHECK(gradcheck([t, r](const auto& in) { return crossEntropy(in[0], t, r); }, {randn({5, 4}, kF64)}));
    CHECK(gradcheck([t, r](const auto& in) { return crossEntropy(in[0], t, r); }, {randn({4, 5}, kF64).t()}));
    CHECK(gradcheck([ts, r](const auto& in) { return nllLoss(in[0], ts, r); }, {randn({2, 3, 2, 2}, kF64)}));
    CHECK(gradcheck([ts, r](const auto& in) { return crossEntropy(in[0], ts, r); },
                    {randn({2, 2, 2, 3}, kF64).permute({0, 3, 1, 2})}));
    // A single sample: [C] scores and a 0-D target.
    CHECK(gradcheck([r](const auto& in) { return crossEntropy(in[0], scalarTensor(1, DType::Int64), r); },
                    {randn({3}, kF64)}));
  }
}

TEST_CASE("mseLoss matches PyTorch and passes gradcheck for input and target") {
  // torch: F.mse_loss(a, b, reduction=r) with a = [[1,2],[3,-1]], b = [[.5,2.5],[1,1]]
  Tensor a = fromVector<float>({1, 2, 3, -1}, {2, 2}), b = fromVector<float>({0.5, 2.5, 1, 1}, {2, 2});
  CHECK(mseLoss(a, b).item<float>() == 2.125f);
  CHECK(mseLoss(a, b, Reduction::Sum).item<float>() == 8.5f);
  CHECK(mseLoss(a, b, Reduction::None).toVector<float>() == std::vector<float>{0.25, 0.25, 4, 4});
  CHECK(mseLoss(a.t(), b.t()).item<float>() == 2.125f);
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    CAPTURE(static_cast<int>(r));
    CHECK(gradcheck([r](const auto& in) { return mseLoss(in[0], in[1], r); },
                    {randn({3, 4}, kF64), randn({4, 3}, kF64).t()}));
  }
  Tensor x = fromVector<double>({1, 2}).requiresGrad_();
  mseLoss(x, fromVector<double>({0, 0})).backward();
  CHECK(x.grad().toVector<double>() == std::vector<double>{1, 2});  // 2 * (x - t) / n
}

TEST_CASE("mseLoss over a large tensor sums in parallel to the serial result") {
  Tensor x = randn({300000}, kF64), t = randn({300000}, kF64);
  double expected = mean(square(sub(x, t))).item<double>();
  CHECK(mseLoss(x, t).item<double>() == doctest::Approx(expected).epsilon(1e-12));
}

TEST_CASE("losses report bad targets and shapes with errors naming the op") {
  Tensor x = zeros({3, 4});
  CHECK_THROWS_WITH_AS(nllLoss(x, target({0, 4, 1}, {3})),
                       doctest::Contains("nllLoss: target 4 at position 1 is out of range for 4 classes"), IndexError);
  CHECK_THROWS_WITH_AS(nllLoss(x, target({0, -1, 1}, {3})), doctest::Contains("nllLoss: target -1"), IndexError);
  CHECK_THROWS_WITH_AS(crossEntropy(x, target({9, 0, 0}, {3})), doctest::Contains("crossEntropy: target 9"),
                       IndexError);
  CHECK_THROWS_WITH_AS(crossEntropy(zeros({2, 3, 5}), target({0, 0, 0, 0, 0, 3, 0, 0, 0, 0}, {2, 5})),
                       doctest::Contains("crossEntropy: target 3 at position 5"), IndexError);
  CHECK_THROWS_WITH_AS(nllLoss(x, target({0, 1}, {2})),
                       doctest::Contains("nllLoss: target of shape [2] does not match input of shape [3, 4]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(crossEntropy(x, zeros({3})), doctest::Contains("crossEntropy: target must be int64"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(crossEntropy(target({1, 2}, {1, 2}), target({0}, {1})),
                       doctest::Contains("crossEntropy: expected a floating-point tensor"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(nllLoss(scalarTensor(1), scalarTensor(0, DType::Int64)),
                       doctest::Contains("nllLoss: input must have a class dimension"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(mseLoss(zeros({3, 1}), zeros({3})),
                       doctest::Contains("mseLoss: input of shape [3, 1] and target of shape [3] differ"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(mseLoss(zeros({3}), zeros({3}, kF64)), doctest::Contains("mseLoss: dtype mismatch"),
                       InvalidArgumentError);
}
