#include "rl/policy.h"

#include <cmath>
#include <string>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace baton::rl {
namespace {

std::string Describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::string shape = "[";
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&shape, i ? ", " : "", t.size(i));
  return absl::StrCat(std::string(c10::toString(t.scalar_type())), " ", shape, "]");
}

absl::Status CheckMatrix(const at::Tensor& t, const char* what, int64_t cols) {
  if (!t.defined() || t.dim() != 2 || t.size(1) != cols || t.scalar_type() != at::kFloat ||
      t.size(0) < 1) {
    return absl::InvalidArgumentError(absl::StrCat("policy: ", what, " must be float32 [B, ", cols,
                                                   "] with B >= 1; got ", Describe(t)));
  }
  return absl::OkStatus();
}

at::Tensor InitUniform(at::IntArrayRef shape, int64_t fan_in, at::Generator& gen) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  at::Tensor t = at::empty(shape, at::kFloat);
  t.uniform_(-bound, bound, gen);
  return t.set_requires_grad(true);
}

}  // namespace

Policy::Policy(uint64_t seed)
    : act_gen_(at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x9e3779b97f4a7c15ULL)) {
  at::Generator init = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  w1_ = InitUniform({kHidden, kInputs}, kInputs, init);
  b1_ = InitUniform({kHidden}, kInputs, init);
  w2_ = InitUniform({kActions, kHidden}, kHidden, init);
  b2_ = InitUniform({kActions}, kHidden, init);
}

at::Tensor Policy::Logits(const at::Tensor& states, const at::Tensor& masks) const {
  at::Tensor h = at::addmm(b1_, states, w1_.t());
  h = at::relu(h * masks);  // dropout, then ReLU (the tutorials' order)
  return at::addmm(b2_, h, w2_.t());
}

absl::StatusOr<Policy::Acted> Policy::Act(const at::Tensor& states) {
  RETURN_IF_ERROR(CheckMatrix(states, "states", kInputs));
  at::NoGradGuard no_grad;
  const int64_t b = states.size(0);
  const double keep = 1.0 - kDropout;
  Acted out;
  out.masks = at::empty({b, kHidden}, at::kFloat);
  out.masks.bernoulli_(keep, act_gen_).div_(keep);
  at::Tensor p1 = at::softmax(Logits(states, out.masks), 1).select(1, 1);
  at::Tensor u = at::empty({b}, at::kFloat);
  u.uniform_(0.0, 1.0, act_gen_);
  out.actions = u.lt(p1).to(at::kLong);
  return out;
}

absl::StatusOr<at::Tensor> Policy::Probs(const at::Tensor& states, const at::Tensor& masks) const {
  RETURN_IF_ERROR(CheckMatrix(states, "states", kInputs));
  RETURN_IF_ERROR(CheckMatrix(masks, "masks", kHidden));
  if (masks.size(0) != states.size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy: ", masks.size(0), " masks for ", states.size(0), " states"));
  }
  at::NoGradGuard no_grad;
  return at::softmax(Logits(states, masks), 1);
}

absl::StatusOr<at::Tensor> Policy::LogProbs(const at::Tensor& states, const at::Tensor& masks,
                                            const at::Tensor& actions) const {
  RETURN_IF_ERROR(CheckMatrix(states, "states", kInputs));
  RETURN_IF_ERROR(CheckMatrix(masks, "masks", kHidden));
  const int64_t b = states.size(0);
  if (masks.size(0) != b || !actions.defined() || actions.dim() != 1 || actions.size(0) != b ||
      actions.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy: LogProbs needs masks [", b, ", ", kHidden, "] and int64 actions [", b, "] for ", b,
        " states; got masks ", Describe(masks), " and actions ", Describe(actions)));
  }
  if (actions.lt(0).any().item<bool>() || actions.ge(kActions).any().item<bool>()) {
    return absl::InvalidArgumentError("policy: an action is not 0 or 1");
  }
  return at::log_softmax(Logits(states, masks), 1).gather(1, actions.unsqueeze(1)).squeeze(1);
}

}  // namespace baton::rl
