// Policy: the CartPole policy of PyTorch's RPC tutorials (Linear(4, 128),
// Dropout(0.6), ReLU, Linear(128, 2), softmax), split into the two things a
// REINFORCE agent does with it:
// - Act(): picks actions for a batch of observations, without autograd, and
//   returns the dropout masks it drew;
// - LogProbs(): log pi(action | observation) under given masks, with
//   autograd, for the update.
// Running the update's forward again with the masks that Act() drew gives
// exactly the values of the forward that chose the actions (the same
// operations on the same numbers), so the gradient is the tutorials' (which
// keep every step's autograd graph instead). Acting needs no graph, and one
// batched forward and backward over a whole round replaces one per step.
//
// Contract:
// - Parameters are initialized as torch.nn.Linear does (weight and bias
//   uniform in +-1/sqrt(fan_in)), from a generator seeded by the
//   constructor; acting draws from a second generator seeded from the same
//   seed. The process-wide LibTorch generator is never used.
// - Dropout is in training mode while acting, as in the tutorials: a mask
//   element is 0 with probability 0.6, else 1 / 0.4.
// - Act(states [B, 4] float32) -> actions [B] int64 in {0, 1}, sampled with
//   P(1) = softmax(logits)[1], and masks [B, 128] float32.
// - LogProbs(states [B, 4], masks [B, 128], actions [B]) -> [B] float32,
//   differentiable in the parameters.
// - Bad shapes or dtypes give INVALID_ARGUMENT naming the argument.
//
// Thread-safety: Act() and LogProbs() may run concurrently with each other;
// nothing may run while the parameters change (an optimizer step): the
// caller excludes that (rl::ReinforceAgent holds a reader/writer lock).
#ifndef BATON_RL_POLICY_H_
#define BATON_RL_POLICY_H_

#include <cstdint>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace baton::rl {

class Policy {
 public:
  static constexpr int64_t kInputs = 4;
  static constexpr int64_t kHidden = 128;
  static constexpr int64_t kActions = 2;
  static constexpr double kDropout = 0.6;

  explicit Policy(uint64_t seed);

  struct Acted {
    at::Tensor actions;  // [B] int64
    at::Tensor masks;    // [B, kHidden] float32: 0 or 1 / (1 - kDropout)
  };
  absl::StatusOr<Acted> Act(const at::Tensor& states);

  absl::StatusOr<at::Tensor> LogProbs(const at::Tensor& states, const at::Tensor& masks,
                                      const at::Tensor& actions) const;

  // Action probabilities [B, 2] under the given masks (no autograd).
  absl::StatusOr<at::Tensor> Probs(const at::Tensor& states, const at::Tensor& masks) const;

  // weight1 [128, 4], bias1 [128], weight2 [2, 128], bias2 [2].
  std::vector<at::Tensor> parameters() const { return {w1_, b1_, w2_, b2_}; }

 private:
  at::Tensor Logits(const at::Tensor& states, const at::Tensor& masks) const;

  at::Tensor w1_, b1_, w2_, b2_;
  at::Generator act_gen_;
};

}  // namespace baton::rl

#endif  // BATON_RL_POLICY_H_
