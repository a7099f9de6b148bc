// The rl example's pieces that need no RPC: the CartPole-v1 physics against steps computed by
// hand from Gym's equations (in double precision, as Gym computes them), termination and
// truncation, and the REINFORCE returns against PyTorch's arithmetic.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "examples/rl/cartpole.h"
#include "examples/rl/returns.h"

using weft::examples::rl::CartPole;
using weft::examples::rl::discountedReturns;
using weft::examples::rl::kReturnEps;
using weft::examples::rl::normalizeInPlace;

namespace {

void checkState(const CartPole::State& got, const CartPole::State& want) {
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
  }
}

}  // namespace

TEST_CASE("CartPole steps follow Gym's explicit Euler equations") {
  CartPole env(1);
  env.resetTo({0.01, -0.02, 0.03, 0.04});
  // x' = x + tau·ẋ, ẋ' = ẋ + tau·ẍ, θ' = θ + tau·θ̇, θ̇' = θ̇ + tau·θ̈, the accelerations from the
  // state before the step (force +10 for action 1, -10 for action 0).
  CartPole::Step s = env.step(1);
  checkState(s.state, {0.009600000000000001, 0.17467919574755525, 0.030799999999999998, -0.2430687179600081});
  CHECK(s.reward == 1.0);
  CHECK_FALSE(s.done());
  s = env.step(0);
  checkState(s.state, {0.013093583914951107, -0.020868848948191993, 0.025938625640799837, 0.0591679999394166});
  s = env.step(1);
  checkState(s.state, {0.012676206935987267, 0.1738717748734813, 0.02712198563958817, -0.22521957255967326});
  CHECK(env.steps() == 3);
  checkState(env.state(), s.state);
  checkState(CartPole::integrate({0.01, -0.02, 0.03, 0.04}, 1),
             {0.009600000000000001, 0.17467919574755525, 0.030799999999999998, -0.2430687179600081});
}

TEST_CASE("CartPole terminates when the pole passes 12 degrees and rewards the last step too") {
  CartPole env(1);
  env.resetTo({0, 0, 0, 0});
  // Pushing right all the time tips the pole left past -12° at the ninth step.
  int steps = 0;
  double reward = 0;
  CartPole::Step s;
  do {
    s = env.step(1);
    reward += s.reward;
    ++steps;
  } while (!s.done() && steps < 100);
  CHECK(steps == 9);
  CHECK(reward == 9.0);
  CHECK(s.terminated);
  CHECK_FALSE(s.truncated);
  checkState(s.state, {0.14065097203306187, 1.7603811257683097, -0.21518604988500967, -2.777886494012814});
  CHECK(s.state[2] < -CartPole::kThetaLimit);
  CHECK(CartPole::kThetaLimit == doctest::Approx(12.0 * M_PI / 180.0).epsilon(1e-15));
  // The episode is over: another step is refused until the next reset.
  CHECK_THROWS_AS(env.step(1), weft::StateError);
  env.reset();
  CHECK_NOTHROW(env.step(1));
}

TEST_CASE("CartPole terminates when the cart leaves the track at 2.4") {
  CartPole env(1);
  env.resetTo({2.39, 1.0, 0, 0});  // x after the step: 2.39 + 0.02 · 1.0 = 2.41
  CartPole::Step s = env.step(1);
  CHECK(s.state[0] == doctest::Approx(2.41));
  CHECK(s.terminated);
  env.resetTo({-2.39, 0.4, 0, 0});  // x after the step: -2.382, inside
  CHECK_FALSE(env.step(0).done());
  CHECK(CartPole::outOfBounds({-2.41, 0, 0, 0}));
  CHECK(CartPole::outOfBounds({0, 0, 0.21, 0}));
  CHECK_FALSE(CartPole::outOfBounds({2.4, 0, 0.2, 0}));
}

TEST_CASE("CartPole truncates a balanced episode after 500 steps") {
  CartPole env(1);
  env.resetTo({0, 0, 0, 0});
  // A hand-written controller that keeps the pole up: push towards where the pole is falling.
  CartPole::Step s;
  double reward = 0;
  for (int i = 0; i < CartPole::kMaxSteps; ++i) {
    const auto& x = env.state();
    s = env.step(x[2] + 0.5 * x[3] + 0.01 * x[0] + 0.1 * x[1] > 0 ? 1 : 0);
    reward += s.reward;
    if (s.done()) break;
  }
  CHECK(env.steps() == 500);
  CHECK(reward == 500.0);
  CHECK(s.truncated);
  CHECK_FALSE(s.terminated);
  CHECK_THROWS_AS(env.step(0), weft::StateError);
}

TEST_CASE("CartPole starts uniformly within 0.05 of upright, reproducibly from its seed") {
  CartPole a(543), b(543), c(544);
  double largest = 0;
  bool differs = false;
  for (int episode = 0; episode < 200; ++episode) {
    CartPole::State sa = a.reset(), sb = b.reset(), sc = c.reset();
    CHECK(sa == sb);
    differs = differs || sa != sc;
    for (double v : sa) {
      CHECK(v >= -0.05);
      CHECK(v < 0.05);
      largest = std::max(largest, std::abs(v));
    }
    CHECK(a.steps() == 0);
  }
  CHECK(differs);
  CHECK(largest > 0.045);  // the whole range is used
}

TEST_CASE("CartPole refuses an action other than 0 or 1 and a step before reset") {
  CartPole env(1);
  CHECK_THROWS_AS(env.step(0), weft::StateError);
  env.reset();
  CHECK_THROWS_AS(env.step(2), weft::InvalidArgumentError);
  CHECK_THROWS_AS(env.step(-1), weft::InvalidArgumentError);
  CHECK(env.steps() == 0);
}

TEST_CASE("REINFORCE returns are discounted per episode and normalised as PyTorch's example does") {
  std::vector<double> g = discountedReturns({1, 1, 1}, 0.99);
  REQUIRE(g.size() == 3);
  CHECK(g[0] == doctest::Approx(2.9701).epsilon(1e-14));
  CHECK(g[1] == doctest::Approx(1.99).epsilon(1e-14));
  CHECK(g[2] == 1.0);
  CHECK(discountedReturns({}, 0.99).empty());

  CHECK(kReturnEps == 1.1920928955078125e-07);
  // (G - mean) / (std + eps) with the unbiased std, as torch computes it for these values.
  std::vector<double> v{2.9701, 1.99, 1.0, 0.5};
  normalizeInPlace(v, kReturnEps);
  const std::vector<double> want{1.2372884065949716, 0.34238121156611223, -0.5615654500792002, -1.0181041680818834};
  for (size_t i = 0; i < 4; ++i) CHECK(v[i] == doctest::Approx(want[i]).epsilon(1e-12));
  // One value: no spread to divide by; it becomes 0 instead of torch's NaN.
  std::vector<double> one{5.0};
  normalizeInPlace(one, kReturnEps);
  CHECK(one[0] == 0.0);
}
