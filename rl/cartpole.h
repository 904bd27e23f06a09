// CartPole: gym's CartPole-v1 (gym/envs/classic_control/cartpole.py wrapped
// in TimeLimit(max_episode_steps=500)) re-implemented in C++ for the
// reinforcement-learning example, where one agent drives many observers and
// each observer steps its own environment.
//
// Contract: the dynamics are gym's, in double precision (gym uses Python
// floats), with its default "euler" kinematics (not "semi-implicit euler"):
// the new positions use the old velocities. An episode starts with Reset(), which
// draws each of the four state values uniformly from [-0.05, 0.05). Step()
// applies a force of -10 N (action 0) or +10 N (action 1) for 0.02 s and
// returns reward 1.0 for every step taken, the terminating one included. The
// episode is
//   terminated when x < -2.4 or x > 2.4 or theta < -12 deg or theta > 12 deg
//              (theta threshold 12 * 2 * pi / 360 rad, as gym computes it);
//   truncated  when its 500th step has been taken (kMaxSteps);
// both flags may be set on the 500th step. Observations are the state cast
// to float32, as gym returns them (so an observation of a state just below
// 0.05 may round to 0.05f).
//
// Randomness: each instance owns a SplitMix64 generator (Steele, Lea and
// Flood, 2014; the constants of java.util.SplittableRandom) seeded by the
// constructor. A draw u = (next() >> 11) * 2^-53 is uniform in [0, 1) and
// becomes -0.05 + 0.1 * u, lowered to the largest double below 0.05 in the
// (rounding) case it reaches 0.05. Reset() takes four draws, in the order
// x, x_dot, theta, theta_dot. Integer arithmetic and single-rounding IEEE
// operations only (the library is compiled without FMA contraction), so the
// same seed gives the same episodes on every platform; the dynamics also call
// std::sin and std::cos, which glibc rounds correctly in practice.
//
// Errors: Step() returns INVALID_ARGUMENT for an action other than 0 or 1,
// and for a step when no episode is in progress (before the first Reset(),
// or after the episode terminated or was truncated); the message says to call
// Reset().
//
// Thread-safety: not thread-safe; an instance is owned and used by one thread
// at a time (in the example, each observer owns its own CartPole).
#ifndef BATON_RL_CARTPOLE_H_
#define BATON_RL_CARTPOLE_H_

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"

namespace baton::rl {

// The physical state, in gym's order: cart position (m), cart velocity
// (m/s), pole angle from vertical (rad), pole angular velocity (rad/s).
struct CartPoleState {
  double x = 0.0;
  double x_dot = 0.0;
  double theta = 0.0;
  double theta_dot = 0.0;
};

// The observation gym returns: the state as float32, in the same order.
using CartPoleObservation = std::array<float, 4>;

struct StepResult {
  CartPoleObservation observation;  // after the step
  double reward = 0.0;              // 1.0 for every step taken
  bool terminated = false;          // the cart or the pole left its bounds
  bool truncated = false;           // the 500th step of the episode
};

class CartPole {
 public:
  // gym's constants (CartPole-v1).
  static constexpr double kGravity = 9.8;
  static constexpr double kMassCart = 1.0;
  static constexpr double kMassPole = 0.1;
  static constexpr double kTotalMass = kMassPole + kMassCart;
  static constexpr double kLength = 0.5;  // half the pole's length
  static constexpr double kPoleMassLength = kMassPole * kLength;
  static constexpr double kForceMag = 10.0;
  static constexpr double kTau = 0.02;  // seconds between state updates
  static constexpr double kXThreshold = 2.4;
  static constexpr double kThetaThresholdRadians =
      12 * 2 * 3.141592653589793 / 360;  // math.pi, evaluated as in gym
  static constexpr int kMaxSteps = 500;  // TimeLimit of CartPole-v1
  static constexpr double kResetBound = 0.05;

  // Seeds the generator; no episode is in progress until Reset().
  explicit CartPole(uint64_t seed);

  // Starts a new episode from a random state (the generator advances) and
  // returns its observation.
  CartPoleObservation Reset();

  // Advances the episode by one step. action: 0 pushes the cart left, 1
  // pushes it right. Errors: see the header comment.
  absl::StatusOr<StepResult> Step(int action);

  // The current state and its observation.
  const CartPoleState& state() const { return state_; }
  CartPoleObservation observation() const;

  // Replaces the physical state (for tests and for starting from a chosen
  // state); the step count and whether the episode is over are unchanged.
  void set_state(const CartPoleState& state) { state_ = state; }

  // Steps taken in the current episode.
  int steps() const { return steps_; }

  // True when no episode is in progress: before the first Reset(), or once
  // the episode terminated or was truncated.
  bool done() const { return done_; }

 private:
  // A uniform double in [-kResetBound, kResetBound).
  double UniformResetValue();

  uint64_t rng_state_;  // SplitMix64
  CartPoleState state_;
  int steps_ = 0;
  bool done_ = true;
};

}  // namespace baton::rl

#endif  // BATON_RL_CARTPOLE_H_
