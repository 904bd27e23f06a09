#include "rl/cartpole.h"

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace baton::rl {
namespace {

// SplitMix64: advances `state` and returns the next output.
uint64_t SplitMix64Next(uint64_t& state) {
  state += 0x9e3779b97f4a7c15ULL;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

CartPole::CartPole(uint64_t seed) : rng_state_(seed) {}

double CartPole::UniformResetValue() {
  // The top 53 bits as a multiple of 2^-53: exact, uniform in [0, 1).
  const double u = static_cast<double>(SplitMix64Next(rng_state_) >> 11) * 0x1.0p-53;
  const double value = -kResetBound + (2 * kResetBound) * u;
  // 0.1 * u may round up to 0.1 for u close to 1; keep the interval open.
  return value < kResetBound ? value : std::nextafter(kResetBound, 0.0);
}

CartPoleObservation CartPole::Reset() {
  state_.x = UniformResetValue();
  state_.x_dot = UniformResetValue();
  state_.theta = UniformResetValue();
  state_.theta_dot = UniformResetValue();
  steps_ = 0;
  done_ = false;
  return observation();
}

CartPoleObservation CartPole::observation() const {
  return {static_cast<float>(state_.x), static_cast<float>(state_.x_dot),
          static_cast<float>(state_.theta), static_cast<float>(state_.theta_dot)};
}

absl::StatusOr<StepResult> CartPole::Step(int action) {
  if (action != 0 && action != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CartPole::Step: action must be 0 (push left) or 1 (push right), got ", action));
  }
  if (done_) {
    return absl::InvalidArgumentError(
        steps_ == 0 ? "CartPole::Step: no episode in progress; call Reset() first"
                    : absl::StrCat("CartPole::Step: the episode is over after ", steps_,
                                   " steps; call Reset() to start a new one"));
  }

  // gym's CartPoleEnv.step, operation for operation.
  const double x = state_.x;
  const double x_dot = state_.x_dot;
  const double theta = state_.theta;
  const double theta_dot = state_.theta_dot;
  const double force = action == 1 ? kForceMag : -kForceMag;
  const double costheta = std::cos(theta);
  const double sintheta = std::sin(theta);
  const double temp = (force + kPoleMassLength * (theta_dot * theta_dot) * sintheta) / kTotalMass;
  const double thetaacc = (kGravity * sintheta - costheta * temp) /
                          (kLength * (4.0 / 3.0 - kMassPole * (costheta * costheta) / kTotalMass));
  const double xacc = temp - kPoleMassLength * thetaacc * costheta / kTotalMass;
  state_.x = x + kTau * x_dot;
  state_.x_dot = x_dot + kTau * xacc;
  state_.theta = theta + kTau * theta_dot;
  state_.theta_dot = theta_dot + kTau * thetaacc;
  ++steps_;

  StepResult result;
  result.observation = observation();
  result.reward = 1.0;
  result.terminated = state_.x < -kXThreshold || state_.x > kXThreshold ||
                      state_.theta < -kThetaThresholdRadians ||
                      state_.theta > kThetaThresholdRadians;
  result.truncated = steps_ >= kMaxSteps;
  done_ = result.terminated || result.truncated;
  return result;
}

}  // namespace baton::rl
