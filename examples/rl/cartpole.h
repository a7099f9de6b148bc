// CartPole: the cart-and-pole balancing task of Gym's CartPole-v1, implemented in weft so that
// the rl example needs nothing outside it.
//
//   weft::examples::rl::CartPole env(seed);
//   CartPole::State s = env.reset();                  // uniform in ±0.05
//   CartPole::Step st = env.step(1);                  // push right; st.reward == 1
//   while (!st.done()) st = env.step(policy(st.state));
//
// Physics (Gym's CartPole-v1, kinematics "euler"): gravity 9.8, cart mass 1.0, pole mass 0.1,
// half pole length 0.5, force ±10 (action 1 pushes right, 0 left), tau 0.02 s per step,
// explicit Euler on (x, ẋ, θ, θ̇) with the accelerations of the current state. An episode
// terminates when |x| > 2.4 or |θ| > 12° after a step, and is truncated after 500 steps. Every
// step, the terminating one included, earns reward 1, so an episode's reward is its length.
// The state is kept in double precision, as Gym does.
//
// Thread-safety: none; one environment per thread (an observer owns one).
#pragma once

#include <array>
#include <cstdint>

#include "tensor/generator.h"

namespace weft::examples::rl {

class CartPole {
 public:
  // (x, ẋ, θ, θ̇): cart position (m), cart velocity, pole angle from upright (rad), its rate.
  using State = std::array<double, 4>;

  struct Step {
    State state;
    double reward = 0;
    bool terminated = false;  // the pole fell or the cart left the track
    bool truncated = false;   // the step limit was reached
    bool done() const { return terminated || truncated; }
  };

  static constexpr double kGravity = 9.8;
  static constexpr double kCartMass = 1.0;
  static constexpr double kPoleMass = 0.1;
  static constexpr double kTotalMass = kCartMass + kPoleMass;
  static constexpr double kHalfLength = 0.5;
  static constexpr double kPoleMassLength = kPoleMass * kHalfLength;
  static constexpr double kForce = 10.0;
  static constexpr double kTau = 0.02;
  static constexpr double kThetaLimit = 12.0 * 2.0 * 3.14159265358979323846 / 360.0;
  static constexpr double kXLimit = 2.4;
  static constexpr int64_t kMaxSteps = 500;
  // The reward threshold of CartPole-v1: solved when the running reward exceeds it.
  static constexpr double kRewardThreshold = 475.0;

  // The start states are drawn from a generator seeded with `seed`.
  explicit CartPole(uint64_t seed);

  // Starts an episode: every component uniform in [-0.05, 0.05).
  State reset();
  // Starts an episode in a given state (for tests and replays).
  void resetTo(const State& state);
  // One step: action 1 pushes the cart right, 0 left. InvalidArgumentError for any other action,
  // and StateError when no episode is running (before reset(), or after it is done).
  Step step(int64_t action);

  const State& state() const { return state_; }
  int64_t steps() const { return steps_; }

  // The physics of one step from `s`, without the episode's bookkeeping.
  static State integrate(const State& s, int64_t action);
  // Whether `s` is outside the allowed region (|x| > 2.4 or |θ| > 12°).
  static bool outOfBounds(const State& s);

 private:
  Generator gen_;
  State state_{};
  int64_t steps_ = 0;
  bool running_ = false;
};

}  // namespace weft::examples::rl
