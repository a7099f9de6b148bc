#include "cartpole.h"

#include <cmath>

#include "common/error.h"

namespace weft::examples::rl {

CartPole::CartPole(uint64_t seed) : gen_(seed) {}

CartPole::State CartPole::reset() {
  State s;
  for (double& v : s) v = -0.05 + 0.1 * gen_.nextDouble();
  resetTo(s);
  return s;
}

void CartPole::resetTo(const State& state) {
  state_ = state;
  steps_ = 0;
  running_ = true;
}

CartPole::State CartPole::integrate(const State& s, int64_t action) {
  const auto [x, xDot, theta, thetaDot] = s;
  const double force = action == 1 ? kForce : -kForce;
  const double cosTheta = std::cos(theta);
  const double sinTheta = std::sin(theta);
  const double temp = (force + kPoleMassLength * thetaDot * thetaDot * sinTheta) / kTotalMass;
  const double thetaAcc = (kGravity * sinTheta - cosTheta * temp) /
                          (kHalfLength * (4.0 / 3.0 - kPoleMass * cosTheta * cosTheta / kTotalMass));
  const double xAcc = temp - kPoleMassLength * thetaAcc * cosTheta / kTotalMass;
  return {x + kTau * xDot, xDot + kTau * xAcc, theta + kTau * thetaDot, thetaDot + kTau * thetaAcc};
}

bool CartPole::outOfBounds(const State& s) {
  return s[0] < -kXLimit || s[0] > kXLimit || s[2] < -kThetaLimit || s[2] > kThetaLimit;
}

CartPole::Step CartPole::step(int64_t action) {
  WEFT_ENFORCE(action == 0 || action == 1, InvalidArgumentError, "CartPole::step: action must be 0 (left) or 1 (right), got ",
               action);
  WEFT_ENFORCE(running_, StateError, "CartPole::step: no episode is running (call reset() first)");
  state_ = integrate(state_, action);
  ++steps_;
  Step out;
  out.state = state_;
  out.reward = 1.0;
  out.terminated = outOfBounds(state_);
  out.truncated = !out.terminated && steps_ >= kMaxSteps;
  running_ = !out.done();
  return out;
}

}  // namespace weft::examples::rl
