// Learning-rate schedules against their formulas and torch.optim.lr_scheduler
// (fixtures/gen_lr_schedule_fixture.py), composition, use with an optimizer's groups, errors.
#include <cmath>
#include <numbers>
#include <vector>

#include "fixtures/lr_schedule_fixture.h"
#include "nn/lr_schedule.h"
#include "nn/optim.h"
#include "weft_test.h"

using namespace weft;
namespace optim = weft::nn::optim;
namespace lx = weft::testing::lr_schedule_fixture;

TEST_SUITE_BEGIN("lr_schedule");

TEST_CASE("LinearWarmup and CosineDecay follow torch's LinearLR and CosineAnnealingLR") {
  optim::LinearWarmup warm{.warmupSteps = 5, .maxLr = lx::kMaxLr, .startFactor = 0.1};
  for (size_t s = 0; s < lx::kLinear.size(); ++s) {
    CAPTURE(s);
    CHECK(warm(static_cast<int64_t>(s)) == doctest::Approx(lx::kLinear[s]).epsilon(1e-12));
  }
  optim::CosineDecay cos{.steps = 12, .maxLr = lx::kMaxLr, .minLr = lx::kMinLr};
  for (size_t s = 0; s < lx::kCosine.size(); ++s) {
    CAPTURE(s);
    CHECK(cos(static_cast<int64_t>(s)) == doctest::Approx(lx::kCosine[s]).epsilon(1e-12));
  }
  // Past its end the decay stays at minLr (torch's would rise again).
  CHECK(cos(13) == lx::kMinLr);
  CHECK(cos(1000) == lx::kMinLr);
}

TEST_CASE("WarmupCosine and Sequential{LinearWarmup, CosineDecay} follow torch's SequentialLR") {
  optim::WarmupCosine wc{.warmupSteps = 4, .totalSteps = 14, .maxLr = lx::kMaxLr, .minLr = lx::kMinLr,
                         .startFactor = 0.1};
  optim::Sequential seq{{optim::LinearWarmup{.warmupSteps = 4, .maxLr = lx::kMaxLr, .startFactor = 0.1},
                         optim::CosineDecay{.steps = 10, .maxLr = lx::kMaxLr, .minLr = lx::kMinLr}},
                        {4}};
  for (size_t s = 0; s < lx::kWarmupCosine.size(); ++s) {
    CAPTURE(s);
    CHECK(wc(static_cast<int64_t>(s)) == doctest::Approx(lx::kWarmupCosine[s]).epsilon(1e-12));
    CHECK(seq(static_cast<int64_t>(s)) == doctest::Approx(lx::kWarmupCosine[s]).epsilon(1e-12));
  }
  CHECK(wc(14) == lx::kMinLr);
  CHECK(wc(500) == lx::kMinLr);
}

TEST_CASE("WarmupCosine from zero: the formula at every step") {
  const double maxLr = 1e-3, minLr = 1e-4;
  optim::WarmupCosine wc{.warmupSteps = 10, .totalSteps = 110, .maxLr = maxLr, .minLr = minLr};
  for (int64_t s = 0; s < 130; ++s) {
    CAPTURE(s);
    double want;
    if (s < 10) {
      want = maxLr * double(s) / 10.0;
    } else if (s >= 110) {
      want = minLr;
    } else {
      want = minLr + 0.5 * (maxLr - minLr) * (1 + std::cos(std::numbers::pi * double(s - 10) / 100.0));
    }
    CHECK(wc(s) == doctest::Approx(want).epsilon(1e-14));
  }
  CHECK(wc(0) == 0.0);
  CHECK(wc(10) == maxLr);
  CHECK(wc(60) == doctest::Approx((maxLr + minLr) / 2).epsilon(1e-14));
  // No warm-up: the cosine from the first step.
  optim::WarmupCosine noWarm{.warmupSteps = 0, .totalSteps = 4, .maxLr = 1.0};
  CHECK(noWarm(0) == 1.0);
  CHECK(noWarm(2) == doctest::Approx(0.5).epsilon(1e-14));
  CHECK(noWarm(4) == 0.0);
  CHECK(optim::Constant{0.25}(7) == 0.25);
}

TEST_CASE("Sequential counts each schedule's steps from its milestone") {
  optim::Sequential seq{{optim::Constant{1.0}, [](int64_t s) { return double(s); }, optim::Constant{0.5}}, {3, 7}};
  std::vector<double> got;
  for (int64_t s = 0; s < 9; ++s) got.push_back(seq(s));
  CHECK(got == std::vector<double>{1, 1, 1, 0, 1, 2, 3, 0.5, 0.5});
}

TEST_CASE("a schedule drives every group of an optimizer through setLr") {
  Tensor a = zeros({2, 2}).requiresGrad_();
  Tensor b = zeros({2}).requiresGrad_();
  optim::AdamW opt(optim::decayGroups({{"w", a}, {"b", b}}, optim::AdamWOptions{.weightDecay = 0.1}));
  optim::WarmupCosine wc{.warmupSteps = 2, .totalSteps = 6, .maxLr = 0.01};
  for (int64_t s = 0; s < 8; ++s) {
    opt.setLr(wc(s));
    CHECK(opt.lr(0) == wc(s));
    CHECK(opt.lr(1) == wc(s));
  }
}

TEST_CASE("invalid schedules are errors naming the schedule") {
  CHECK_THROWS_WITH_AS((optim::WarmupCosine{.warmupSteps = 10, .totalSteps = 5, .maxLr = 1.0}(0)),
                       doctest::Contains("WarmupCosine: expected 0 <= warmupSteps <= totalSteps"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS((optim::WarmupCosine{.warmupSteps = 1, .totalSteps = 5, .maxLr = 1.0, .minLr = 2.0}(0)),
                       doctest::Contains("minLr 2 exceeds maxLr 1"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS((optim::CosineDecay{.steps = 5, .maxLr = 1.0}(-1)), doctest::Contains("CosineDecay: step -1"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS((optim::LinearWarmup{.warmupSteps = 5, .maxLr = 1.0, .startFactor = 1.5}(0)),
                       doctest::Contains("startFactor 1.5"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS((optim::Sequential{{optim::Constant{1.0}}, {3}}(0)),
                       doctest::Contains("1 schedules need 0 milestones, got 1"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS((optim::Sequential{{optim::Constant{1.0}, optim::Constant{2.0}, optim::Constant{3.0}}, {4, 4}}(0)),
                       doctest::Contains("milestone 1 (4) is not after the previous one"), InvalidArgumentError);
}
