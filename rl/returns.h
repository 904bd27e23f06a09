// REINFORCE's bookkeeping, shared by the agent and its tests: discounted
// returns normalized per episode, and the running reward that decides when
// CartPole is solved. Plain C++ (no LibTorch).
//
// Contract (the tutorials' and the peer benchmark's definitions):
// - A round of one observer is T steps with a reward each; episode_ends
//   lists the steps (ascending, in [0, T)) on which an episode ended. Steps
//   after the last end form an episode cut by the end of the round: it is
//   trained on but not counted.
// - EpisodeReturns(): G_t = r_t + gamma * G_{t+1} within each episode (G
//   restarts at every end), then per episode (G - mean) / (std + eps) with
//   the unbiased std and eps = float32's epsilon; an episode piece of one
//   step gets 0. Arithmetic in double, results rounded to float.
// - RunningReward: every counted episode updates
//   running = 0.05 * episode_reward + 0.95 * running, starting at 10.
// - Errors: INVALID_ARGUMENT for ends that are not ascending or outside the
//   round.
//
// Thread-safety: functions are pure; RunningReward is a plain value.
#ifndef BATON_RL_RETURNS_H_
#define BATON_RL_RETURNS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::rl {

absl::StatusOr<std::vector<float>> EpisodeReturns(const std::vector<float>& rewards,
                                                  const std::vector<int32_t>& episode_ends,
                                                  double gamma);

// The sums of rewards of the episodes that ended in the round, in order.
absl::StatusOr<std::vector<double>> EpisodeRewards(const std::vector<float>& rewards,
                                                   const std::vector<int32_t>& episode_ends);

struct RunningReward {
  static constexpr double kStart = 10.0;
  double value = kStart;
  int64_t episodes = 0;
  void Add(double episode_reward) {
    value = 0.05 * episode_reward + 0.95 * value;
    ++episodes;
  }
};

}  // namespace baton::rl

#endif  // BATON_RL_RETURNS_H_
