// Tests of //dist_optim:functional_optimizer. LibTorch's own torch::optim
// optimizers are the reference: each test runs one over copies of the same
// parameters with .grad set to the same gradients.
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist_optim/functional_optimizer.h"

namespace baton::dist_optim {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<torch::optim::Optimizer> MakeReference(const OptimizerOptions& o,
                                                       std::vector<torch::Tensor> params) {
  namespace optim = torch::optim;
  switch (o.kind) {
    case OptimizerKind::kSGD:
      return std::make_unique<optim::SGD>(params, optim::SGDOptions(o.lr)
                                                      .momentum(o.momentum)
                                                      .dampening(o.dampening)
                                                      .nesterov(o.nesterov)
                                                      .weight_decay(o.weight_decay));
    case OptimizerKind::kAdam:
      return std::make_unique<optim::Adam>(params, optim::AdamOptions(o.lr)
                                                       .betas(std::make_tuple(o.beta1, o.beta2))
                                                       .eps(o.eps)
                                                       .weight_decay(o.weight_decay)
                                                       .amsgrad(o.amsgrad));
    case OptimizerKind::kAdamW:
      return std::make_unique<optim::AdamW>(params, optim::AdamWOptions(o.lr)
                                                        .betas(std::make_tuple(o.beta1, o.beta2))
                                                        .eps(o.eps)
                                                        .weight_decay(o.weight_decay)
                                                        .amsgrad(o.amsgrad));
    case OptimizerKind::kAdagrad:
      return std::make_unique<optim::Adagrad>(
          params, optim::AdagradOptions(o.lr)
                      .lr_decay(o.lr_decay)
                      .weight_decay(o.weight_decay)
                      .initial_accumulator_value(o.initial_accumulator_value)
                      .eps(o.eps));
    case OptimizerKind::kRMSprop:
      return std::make_unique<optim::RMSprop>(params, optim::RMSpropOptions(o.lr)
                                                          .alpha(o.alpha)
                                                          .eps(o.eps)
                                                          .weight_decay(o.weight_decay)
                                                          .momentum(o.momentum)
                                                          .centered(o.centered));
  }
  return nullptr;
}

struct Case {
  std::string name;
  OptimizerOptions options;
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  cases.push_back({"SGD", OptimizerOptions::SGD(0.1)});
  OptimizerOptions o = OptimizerOptions::SGD(0.1);
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 0.01;
  cases.push_back({"SGDNesterovWeightDecay", o});
  o = OptimizerOptions::SGD(0.1);
  o.momentum = 0.8;
  o.dampening = 0.3;
  cases.push_back({"SGDMomentumDampening", o});
  cases.push_back({"Adam", OptimizerOptions::Adam(0.01)});
  o = OptimizerOptions::Adam(0.01);
  o.amsgrad = true;
  o.weight_decay = 0.05;
  cases.push_back({"AdamAmsgradWeightDecay", o});
  cases.push_back({"AdamW", OptimizerOptions::AdamW(0.01)});
  o = OptimizerOptions::AdamW(0.01);
  o.amsgrad = true;
  o.beta1 = 0.8;
  cases.push_back({"AdamWAmsgrad", o});
  cases.push_back({"Adagrad", OptimizerOptions::Adagrad(0.1)});
  o = OptimizerOptions::Adagrad(0.1);
  o.lr_decay = 0.1;
  o.initial_accumulator_value = 0.5;
  o.weight_decay = 0.01;
  cases.push_back({"AdagradDecayAccumulatorWeightDecay", o});
  cases.push_back({"RMSprop", OptimizerOptions::RMSprop(0.01)});
  o = OptimizerOptions::RMSprop(0.01);
  o.centered = true;
  o.momentum = 0.9;
  o.weight_decay = 0.01;
  cases.push_back({"RMSpropCenteredMomentumWeightDecay", o});
  return cases;
}

std::vector<torch::Tensor> MakeParams(torch::Dtype dtype, uint64_t seed = 1) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> params;
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{5}, {3, 4}, {2, 3, 2}, {}}) {
    params.push_back(torch::randn(shape, torch::dtype(dtype)));
  }
  return params;
}

std::vector<torch::Tensor> Clone(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t.defined() ? t.clone() : t);
  return out;
}

// Gradients for step `step`; the last parameter has none on steps 0 and 2,
// so per-parameter state (step counts, lazy init) is exercised.
std::vector<torch::Tensor> MakeGrads(const std::vector<torch::Tensor>& params, int step) {
  torch::manual_seed(1000 + step);
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) grads.push_back(torch::randn_like(p));
  if (step == 0 || step == 2) grads.back() = torch::Tensor();
  return grads;
}

void ReferenceStep(torch::optim::Optimizer& ref, std::vector<torch::Tensor>& params,
                   const std::vector<torch::Tensor>& grads) {
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].mutable_grad() = grads[i].defined() ? grads[i].clone() : torch::Tensor();
  }
  ref.step();
}

double Tolerance(torch::Dtype dtype) { return dtype == torch::kFloat ? 1e-6 : 1e-12; }

void ExpectClose(const std::vector<torch::Tensor>& actual,
                 const std::vector<torch::Tensor>& expected, double tol,
                 const std::string& context) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_EQ(actual[i].sizes(), expected[i].sizes());
    const double diff = (actual[i] - expected[i]).abs().max().item<double>();
    EXPECT_LE(diff, tol) << context << ", parameter " << i;
  }
}

std::unique_ptr<FunctionalOptimizer> MustCreate(const OptimizerOptions& o,
                                                std::vector<torch::Tensor> params) {
  auto opt = FunctionalOptimizer::Create(o, std::move(params));
  EXPECT_TRUE(opt.ok()) << opt.status();
  return opt.ok() ? std::move(*opt) : nullptr;
}

class MatchesLibTorch : public ::testing::TestWithParam<std::tuple<Case, torch::Dtype>> {
 protected:
  const OptimizerOptions& options() const { return std::get<0>(GetParam()).options; }
  torch::Dtype dtype() const { return std::get<1>(GetParam()); }
};

TEST_P(MatchesLibTorch, FiveSteps) {
  std::vector<torch::Tensor> ours_params = MakeParams(dtype());
  std::vector<torch::Tensor> ref_params = Clone(ours_params);
  auto ours = MustCreate(options(), ours_params);
  ASSERT_NE(ours, nullptr);
  auto ref = MakeReference(options(), ref_params);
  for (int step = 0; step < 5; ++step) {
    const auto grads = MakeGrads(ours_params, step);
    ASSERT_TRUE(ours->Step(grads).ok());
    ReferenceStep(*ref, ref_params, grads);
    ExpectClose(ours_params, ref_params, Tolerance(dtype()), "step " + std::to_string(step));
  }
  EXPECT_EQ(ours->steps_taken(), 5);
  // Updates went into the caller's tensors, and the last parameter moved
  // although it skipped two steps.
  EXPECT_TRUE(ours->params()[0].is_same(ours_params[0]));
  EXPECT_FALSE(torch::equal(ours_params.back(), MakeParams(dtype()).back()));
}

TEST_P(MatchesLibTorch, SaveAfterThreeStepsLoadIntoFreshOptimizer) {
  std::vector<torch::Tensor> a_params = MakeParams(dtype());
  std::vector<torch::Tensor> ref_params = Clone(a_params);
  auto a = MustCreate(options(), a_params);
  auto ref = MakeReference(options(), ref_params);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(a->Step(MakeGrads(a_params, step)).ok());
    ReferenceStep(*ref, ref_params, MakeGrads(a_params, step));
  }
  absl::StatusOr<std::string> saved = a->SaveState();
  ASSERT_TRUE(saved.ok()) << saved.status();

  std::vector<torch::Tensor> b_params = Clone(a_params);
  auto b = MustCreate(options(), b_params);
  ASSERT_TRUE(b->LoadState(*saved).ok());
  EXPECT_EQ(b->steps_taken(), 3);
  for (int step = 3; step < 5; ++step) {
    const auto grads = MakeGrads(a_params, step);
    ASSERT_TRUE(a->Step(grads).ok());
    ASSERT_TRUE(b->Step(grads).ok());
    ReferenceStep(*ref, ref_params, grads);
  }
  for (size_t i = 0; i < a_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(a_params[i], b_params[i])) << "parameter " << i;
  }
  ExpectClose(b_params, ref_params, Tolerance(dtype()), "after reload");
  // Saving again gives the same bytes on both.
  EXPECT_EQ(*a->SaveState(), *b->SaveState());
}

TEST_P(MatchesLibTorch, FailedLoadsLeaveStateUnchanged) {
  std::vector<torch::Tensor> params = MakeParams(dtype());
  std::vector<torch::Tensor> ref_params = Clone(params);
  auto opt = MustCreate(options(), params);
  auto ref = MakeReference(options(), ref_params);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(opt->Step(MakeGrads(params, step)).ok());
    ReferenceStep(*ref, ref_params, MakeGrads(params, step));
  }
  const std::string saved = *opt->SaveState();
  // Every strict prefix, a trailing byte, and garbage are DATA_LOSS.
  for (size_t n = 0; n < saved.size(); ++n) {
    EXPECT_EQ(opt->LoadState(absl::string_view(saved).substr(0, n)).code(),
              absl::StatusCode::kDataLoss)
        << "prefix of " << n << " bytes";
  }
  EXPECT_EQ(opt->LoadState(saved + "x").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(opt->LoadState("not an optimizer state").code(), absl::StatusCode::kDataLoss);
  // A state of another optimizer: other params, other kind.
  auto other =
      MustCreate(options(), MakeParams(dtype() == torch::kFloat ? torch::kDouble : torch::kFloat));
  EXPECT_EQ(opt->LoadState(*other->SaveState()).code(), absl::StatusCode::kInvalidArgument);
  OptimizerOptions other_kind = options().kind == OptimizerKind::kAdam
                                    ? OptimizerOptions::SGD(0.1)
                                    : OptimizerOptions::Adam(0.1);
  EXPECT_EQ(opt->LoadState(*MustCreate(other_kind, Clone(params))->SaveState()).code(),
            absl::StatusCode::kInvalidArgument);

  for (int step = 3; step < 5; ++step) {
    ASSERT_TRUE(opt->Step(MakeGrads(params, step)).ok());
    ReferenceStep(*ref, ref_params, MakeGrads(params, step));
  }
  ExpectClose(params, ref_params, Tolerance(dtype()), "after failed loads");
  EXPECT_EQ(opt->steps_taken(), 5);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, MatchesLibTorch,
                         ::testing::Combine(::testing::ValuesIn(AllCases()),
                                            ::testing::Values(torch::kFloat, torch::kDouble)),
                         [](const ::testing::TestParamInfo<MatchesLibTorch::ParamType>& info) {
                           return std::get<0>(info.param).name +
                                  (std::get<1>(info.param) == torch::kFloat ? "_Float" : "_Double");
                         });

TEST(FunctionalOptimizer, UndefinedGradientLeavesParameterAlone) {
  std::vector<torch::Tensor> params = MakeParams(torch::kFloat);
  const std::vector<torch::Tensor> before = Clone(params);
  auto opt = MustCreate(OptimizerOptions::Adam(0.1), params);
  std::vector<torch::Tensor> grads = MakeGrads(params, 1);
  grads[1] = torch::Tensor();
  ASSERT_TRUE(opt->Step(grads).ok());
  EXPECT_TRUE(torch::equal(params[1], before[1]));
  EXPECT_FALSE(torch::equal(params[0], before[0]));
  // All gradients undefined: nothing moves, but the call counts.
  const std::vector<torch::Tensor> now = Clone(params);
  ASSERT_TRUE(opt->Step(std::vector<torch::Tensor>(params.size())).ok());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], now[i]));
  EXPECT_EQ(opt->steps_taken(), 2);
}

TEST(FunctionalOptimizer, MismatchedGradientsChangeNothing) {
  OptimizerOptions o = OptimizerOptions::Adam(0.1);
  std::vector<torch::Tensor> params = MakeParams(torch::kFloat);
  std::vector<torch::Tensor> ref_params = Clone(params);
  auto opt = MustCreate(o, params);
  auto ref = MakeReference(o, ref_params);

  std::vector<torch::Tensor> grads = MakeGrads(params, 0);
  grads.pop_back();
  absl::Status s = opt->Step(grads);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("3 gradients for 4 parameters"));

  grads = MakeGrads(params, 1);
  grads[2] = torch::randn({3, 4});  // Parameter 2 is [2, 3, 2].
  s = opt->Step(grads);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("gradient 2 is Float[3, 4]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("parameter 2 is Float[2, 3, 2]"));

  grads = MakeGrads(params, 1);
  grads[1] = grads[1].to(torch::kDouble);
  s = opt->Step(grads);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("gradient 1 is Double[3, 4]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("parameter 1 is Float[3, 4]"));

  grads = MakeGrads(params, 1);
  grads[0] = grads[0].to_sparse();
  EXPECT_EQ(opt->Step(grads).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(opt->steps_taken(), 0);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], ref_params[i]));
  // The state did not advance either: the next steps match a fresh Adam.
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(opt->Step(MakeGrads(params, step)).ok());
    ReferenceStep(*ref, ref_params, MakeGrads(params, step));
  }
  ExpectClose(params, ref_params, 1e-6, "after rejected steps");
}

TEST(FunctionalOptimizer, CreateRejectsBadParametersAndOptions) {
  std::vector<torch::Tensor> params = MakeParams(torch::kFloat);
  params[1] = torch::Tensor();
  auto opt = FunctionalOptimizer::Create(OptimizerOptions::SGD(0.1), params);
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(opt.status().message()), HasSubstr("parameter 1"));

  params[1] = torch::ones({2}, torch::kLong);
  opt = FunctionalOptimizer::Create(OptimizerOptions::SGD(0.1), params);
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(opt.status().message()), HasSubstr("Long"));

  opt = FunctionalOptimizer::Create(OptimizerOptions::Adam(-1), MakeParams(torch::kFloat));
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(opt.status().message()), HasSubstr("lr = -1"));
}

TEST(OptimizerOptions, ValidateNamesTheBadField) {
  struct Bad {
    OptimizerOptions options;
    std::string field;
  };
  std::vector<Bad> bad;
  auto with = [](OptimizerOptions o, auto mutate) {
    mutate(o);
    return o;
  };
  bad.push_back({OptimizerOptions::SGD(-0.1), "lr = -0.1"});
  bad.push_back({with(OptimizerOptions::SGD(0.1), [](auto& o) { o.momentum = -1; }), "momentum"});
  bad.push_back({with(OptimizerOptions::SGD(0.1), [](auto& o) { o.nesterov = true; }), "nesterov"});
  bad.push_back({with(OptimizerOptions::SGD(0.1),
                      [](auto& o) {
                        o.nesterov = true;
                        o.momentum = 0.9;
                        o.dampening = 0.1;
                      }),
                 "dampening = 0.1"});
  bad.push_back({with(OptimizerOptions::Adam(0.1), [](auto& o) { o.beta1 = 1; }), "beta1 = 1"});
  bad.push_back(
      {with(OptimizerOptions::AdamW(0.1), [](auto& o) { o.beta2 = -0.5; }), "beta2 = -0.5"});
  bad.push_back({with(OptimizerOptions::Adam(0.1), [](auto& o) { o.eps = -1; }), "eps"});
  bad.push_back({with(OptimizerOptions::Adam(0.1), [](auto& o) { o.weight_decay = std::nan(""); }),
                 "weight_decay"});
  bad.push_back(
      {with(OptimizerOptions::Adagrad(0.1), [](auto& o) { o.lr_decay = -1; }), "lr_decay"});
  bad.push_back(
      {with(OptimizerOptions::Adagrad(0.1), [](auto& o) { o.initial_accumulator_value = -1; }),
       "initial_accumulator_value"});
  bad.push_back({with(OptimizerOptions::RMSprop(0.1), [](auto& o) { o.alpha = -1; }), "alpha"});
  bad.push_back(
      {with(OptimizerOptions::RMSprop(0.1), [](auto& o) { o.momentum = -1; }), "momentum"});
  bad.push_back(
      {with(OptimizerOptions::SGD(0.1), [](auto& o) { o.kind = static_cast<OptimizerKind>(42); }),
       "kind"});
  for (const Bad& b : bad) {
    absl::Status s = ValidateOptions(b.options);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.options.DebugString();
    EXPECT_THAT(std::string(s.message()), HasSubstr(b.field));
  }
  for (const Case& c : AllCases()) EXPECT_TRUE(ValidateOptions(c.options).ok()) << c.name;
}

TEST(OptimizerOptions, FactoriesUseLibTorchDefaults) {
  EXPECT_EQ(OptimizerOptions::AdamW(1).weight_decay, torch::optim::AdamWOptions().weight_decay());
  EXPECT_EQ(OptimizerOptions::Adam(1).weight_decay, torch::optim::AdamOptions().weight_decay());
  EXPECT_EQ(OptimizerOptions::Adam(1).beta2, std::get<1>(torch::optim::AdamOptions().betas()));
  EXPECT_EQ(OptimizerOptions::Adagrad(1).eps, torch::optim::AdagradOptions().eps());
  EXPECT_EQ(OptimizerOptions::RMSprop(1).eps, torch::optim::RMSpropOptions().eps());
  EXPECT_EQ(OptimizerOptions::RMSprop(1).alpha, torch::optim::RMSpropOptions().alpha());
  EXPECT_EQ(OptimizerOptions::RMSprop(1).kind, OptimizerKind::kRMSprop);
  EXPECT_EQ(OptimizerOptions::Adam(0.5).DebugString(),
            "Adam{lr=0.5, beta1=0.9, beta2=0.999, eps=1e-08, amsgrad=false, weight_decay=0}");
  EXPECT_STREQ(KindName(OptimizerKind::kAdagrad), "Adagrad");
}

TEST(OptimizerOptions, WireRoundTripAndGarbage) {
  for (const Case& c : AllCases()) {
    absl::StatusOr<OptimizerOptions> back = DecodeOptions(EncodeOptions(c.options));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, c.options) << c.name;
  }
  const std::string good = EncodeOptions(OptimizerOptions::RMSprop(0.1));
  std::vector<std::string> garbage = {"", "x", good.substr(1), good + std::string(1, '\0')};
  std::string bad_version = good, bad_kind = good, bad_flags = good;
  bad_version[0] = 7;
  bad_kind[1] = 42;
  bad_flags.back() = static_cast<char>(0x80);
  garbage.insert(garbage.end(), {bad_version, bad_kind, bad_flags});
  for (const std::string& g : garbage) {
    EXPECT_EQ(DecodeOptions(g).status().code(), absl::StatusCode::kDataLoss);
  }
  // Random bytes of every length up to twice the encoding never crash.
  std::mt19937 rng(7);
  for (size_t n = 0; n < 2 * good.size(); ++n) {
    std::string bytes(n, '\0');
    for (char& ch : bytes) ch = static_cast<char>(rng());
    (void)DecodeOptions(bytes);
  }
}

TEST(FunctionalOptimizer, LoadStateRejectsOtherShapesAndBuffers) {
  OptimizerOptions amsgrad = OptimizerOptions::Adam(0.1);
  amsgrad.amsgrad = true;
  auto opt = MustCreate(OptimizerOptions::Adam(0.1), MakeParams(torch::kFloat));
  // amsgrad adds a buffer: same kind, shapes and dtypes, other buffers.
  absl::Status s = opt->LoadState(*MustCreate(amsgrad, MakeParams(torch::kFloat))->SaveState());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_exp_avg_sq"));
  // Another shape.
  std::vector<torch::Tensor> reshaped = MakeParams(torch::kFloat);
  reshaped[1] = torch::zeros({4, 3});
  s = opt->LoadState(*MustCreate(OptimizerOptions::Adam(0.1), reshaped)->SaveState());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("parameter 1"));
  // Another number of parameters.
  std::vector<torch::Tensor> fewer = MakeParams(torch::kFloat);
  fewer.pop_back();
  s = opt->LoadState(*MustCreate(OptimizerOptions::Adam(0.1), fewer)->SaveState());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // Flipping any single byte of a saved state never crashes.
  const std::string saved = *opt->SaveState();
  for (size_t i = 0; i < saved.size(); ++i) {
    std::string flipped = saved;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
    auto victim = MustCreate(OptimizerOptions::Adam(0.1), MakeParams(torch::kFloat));
    (void)victim->LoadState(flipped);
  }
}

// HogWild: concurrent Step calls on one instance must not corrupt it.
TEST(FunctionalOptimizer, ConcurrentStepsAreMemorySafe) {
  OptimizerOptions o = OptimizerOptions::SGD(0.01);
  o.momentum = 0.9;
  std::vector<torch::Tensor> params = MakeParams(torch::kFloat);
  auto opt = MustCreate(o, params);
  const auto grads = MakeGrads(params, 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) EXPECT_TRUE(opt->Step(grads).ok());
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(opt->steps_taken(), 200);
  for (const auto& p : params) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
}

}  // namespace
}  // namespace baton::dist_optim
