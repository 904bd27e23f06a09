// The distributed optimizer between real worker processes: one step on every
// owner equals torch::optim on the same gradients, concurrent trainers on
// shared parameters (locked and HogWild), state save/load, and errors.
#include <cstdio>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/strings/match.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "rpc/agent.h"
#include "rref/rref.h"
#include "testing/multiprocess.h"
#include "testing/multiprocess_gtest.h"

namespace baton::dist_optim {
namespace {

using baton::testing::Describe;
using baton::testing::ExpectAllSucceeded;
using baton::testing::RunWorkers;
using rpc::CallContext;
using rpc::Function;
using rpc::RpcAgent;
using rref::RRef;

// Parameters held on their owner, like a remote module's.
class ParamHolder {
 public:
  ParamHolder(int64_t seed, int64_t n) {
    at::manual_seed(seed);
    ps_ = {at::randn({n}, at::kDouble).requires_grad_(true),
           at::randn({2, n}, at::kDouble).requires_grad_(true)};
  }
  std::vector<at::Tensor> values() {
    std::vector<at::Tensor> out;
    for (const auto& p : ps_) out.push_back(p.detach().clone());
    return out;
  }
  bool set(std::vector<at::Tensor> v) {
    at::NoGradGuard g;
    for (size_t i = 0; i < ps_.size(); ++i) ps_[i].copy_(v[i]);
    return true;
  }
  std::vector<at::Tensor>& params() { return ps_; }

 private:
  std::vector<at::Tensor> ps_;
};

// The part of the loss that a holder's parameters contribute.
at::Tensor Part(const std::vector<at::Tensor>& ps, const at::Tensor& x) {
  return (ps[0] * x).sin().sum() + (ps[1] * ps[1]).sum() * 0.5 + (ps[1] * x).cos().sum();
}

using Holder = RRef<ParamHolder>;
using ParamRefs = std::vector<RRef<at::Tensor>>;
const Function<at::Tensor(Holder, at::Tensor)> part_fn("part");
const Function<ParamRefs(Holder)> params_fn("params");
const Function<at::Tensor(Holder)> first_fn("first");
const Function<at::Tensor(Holder)> sum_first_fn("sum_first");
const Function<at::Tensor(int64_t)> ints_fn("ints");

struct Worker {
  std::shared_ptr<rpc::FunctionRegistry> registry;
  std::shared_ptr<rref::RRefService> rrefs;
  std::unique_ptr<RpcAgent> agent;
};

Worker Start() {
  Worker w;
  w.registry = std::make_shared<rpc::FunctionRegistry>();
  auto& r = *w.registry;
  WCHECK_OK(dist_autograd::Install(r));
  w.rrefs = rref::RRefService::Install(r);
  Install(*w.rrefs);
  rref::RegisterClass<ParamHolder>(*w.rrefs, "ParamHolder")
      .Constructor<int64_t, int64_t>()
      .Method("values", &ParamHolder::values)
      .Method("set", &ParamHolder::set);
  (void)r.Register(part_fn,
                   [](Holder h, at::Tensor x) { return Part(h.local_value()->params(), x); });
  (void)r.Register(params_fn, [](const CallContext& ctx, Holder h) {
    ParamRefs out;
    for (const auto& p : h.local_value()->params()) out.push_back(rref::MakeOwned(*ctx.agent, p));
    return out;
  });
  (void)r.Register(first_fn,
                   [](Holder h) { return h.local_value()->params()[0].detach().clone(); });
  (void)r.Register(sum_first_fn, [](Holder h) { return h.local_value()->params()[0].sum(); });
  (void)r.Register(ints_fn, [](int64_t n) { return at::arange(n); });
  auto opts = rpc::AgentOptions::FromEnv("w");
  WCHECK_OK(opts.status());
  auto agent = rpc::RpcAgent::Create(*opts, w.registry);
  WCHECK_OK(agent.status());
  w.agent = *std::move(agent);
  w.rrefs->Attach(w.agent.get());
  return w;
}

void ExpectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const double err = (got - want).abs().max().item<double>();
  if (!(err <= 1e-12 * std::max(1.0, want.abs().max().item<double>()))) {
    std::fprintf(stderr, "%s: max error %.3g\n", what.c_str(), err);
    std::_Exit(1);
  }
}

std::unique_ptr<torch::optim::Optimizer> Reference(const OptimizerOptions& o,
                                                   std::vector<at::Tensor> ps) {
  using namespace torch::optim;  // NOLINT
  switch (o.kind) {
    case OptimizerKind::kSGD:
      return std::make_unique<SGD>(ps, SGDOptions(o.lr)
                                           .momentum(o.momentum)
                                           .nesterov(o.nesterov)
                                           .dampening(o.dampening)
                                           .weight_decay(o.weight_decay));
    case OptimizerKind::kAdam:
      return std::make_unique<Adam>(
          ps, AdamOptions(o.lr).weight_decay(o.weight_decay).amsgrad(o.amsgrad));
    case OptimizerKind::kAdamW:
      return std::make_unique<AdamW>(
          ps, AdamWOptions(o.lr).weight_decay(o.weight_decay).amsgrad(o.amsgrad));
    case OptimizerKind::kAdagrad:
      return std::make_unique<Adagrad>(
          ps, AdagradOptions(o.lr).lr_decay(o.lr_decay).weight_decay(o.weight_decay));
    case OptimizerKind::kRMSprop:
      return std::make_unique<RMSprop>(ps, RMSpropOptions(o.lr)
                                               .momentum(o.momentum)
                                               .centered(o.centered)
                                               .weight_decay(o.weight_decay));
  }
  return nullptr;
}

std::vector<OptimizerOptions> AllKinds() {
  OptimizerOptions sgd = OptimizerOptions::SGD(0.1);
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  sgd.weight_decay = 0.01;
  OptimizerOptions adam = OptimizerOptions::Adam(0.05);
  adam.amsgrad = true;
  OptimizerOptions adamw = OptimizerOptions::AdamW(0.05);
  OptimizerOptions adagrad = OptimizerOptions::Adagrad(0.1);
  adagrad.lr_decay = 0.01;
  OptimizerOptions rms = OptimizerOptions::RMSprop(0.01);
  rms.momentum = 0.5;
  rms.centered = true;
  return {sgd, adam, adamw, adagrad, rms};
}

// Parameters on w1 and w2; three steps of each kind, each step in its own
// context, compared after every step with torch::optim on a local copy.
BATON_SCENARIO(matches_torch_optim) {
  Worker w = Start();
  auto& agent = *w.agent;
  if (agent.self().id == 0) {
    int seed = 10;
    for (const OptimizerOptions& o : AllKinds()) {
      Holder a = rref::remote<ParamHolder>(agent, 1, int64_t{seed++}, int64_t{5});
      Holder b = rref::remote<ParamHolder>(agent, 2, int64_t{seed++}, int64_t{5});
      ParamRefs params = agent.rpc_sync(1, params_fn, a);
      ParamRefs pb = agent.rpc_sync(2, params_fn, b);
      params.insert(params.end(), pb.begin(), pb.end());
      auto opt = DistributedOptimizer::Create(agent, o, params);
      WCHECK_OK(opt.status());
      WCHECK(((*opt)->owners() == std::vector<std::string>{"w1", "w2"}));
      std::vector<at::Tensor> ref;
      for (auto& t : a.rpc_sync(&ParamHolder::values)) ref.push_back(t.requires_grad_(true));
      for (auto& t : b.rpc_sync(&ParamHolder::values)) ref.push_back(t.requires_grad_(true));
      auto reference = Reference(o, ref);
      for (int step = 0; step < 3; ++step) {
        const at::Tensor x = at::randn({5}, at::kDouble);
        {
          dist_autograd::Context ctx(agent);
          at::Tensor loss = agent.rpc_sync(1, part_fn, a, x) * agent.rpc_sync(2, part_fn, b, x);
          WCHECK_OK(dist_autograd::Backward(agent, ctx.id(), {loss}));
          WCHECK_OK((*opt)->Step(ctx.id()));
        }
        reference->zero_grad();
        at::Tensor loss = Part({ref[0], ref[1]}, x) * Part({ref[2], ref[3]}, x);
        loss.backward();
        reference->step();
        std::vector<at::Tensor> got = a.rpc_sync(&ParamHolder::values);
        for (auto& t : b.rpc_sync(&ParamHolder::values)) got.push_back(t);
        for (size_t i = 0; i < ref.size(); ++i) {
          ExpectClose(got[i], ref[i].detach(),
                      absl::StrCat(o.DebugString(), " step ", step, " param ", i));
        }
      }
    }
  }
  WCHECK_OK(agent.Shutdown());
  return 0;
}

TEST(DistributedOptimizer, OneStepOnEveryOwnerMatchesTorchOptim) {
  ExpectAllSucceeded(RunWorkers("matches_torch_optim", 3, absl::Seconds(120)));
}

// Four trainers (threads, each with its own optimizer) step a parameter on
// w1 concurrently. Locked: every update lands, so the result is exact.
// HogWild: no lock; updates may be lost, values stay finite.
BATON_SCENARIO(concurrent_trainers) {
  Worker w = Start();
  auto& agent = *w.agent;
  if (agent.self().id == 0) {
    for (auto mode : {DistributedOptimizer::Mode::kLocked, DistributedOptimizer::Mode::kHogwild}) {
      Holder h = rref::remote<ParamHolder>(agent, 1, int64_t{1}, int64_t{64});
      ParamRefs params = agent.rpc_sync(1, params_fn, h);
      const at::Tensor before = agent.rpc_sync(1, first_fn, h);
      std::vector<std::thread> trainers;
      for (int t = 0; t < 4; ++t) {
        trainers.emplace_back([&agent, &params, &h, mode] {
          DistributedOptimizer::Settings settings;
          settings.mode = mode;
          auto opt = DistributedOptimizer::Create(agent, OptimizerOptions::SGD(1.0), {params[0]},
                                                  settings);
          WCHECK_OK(opt.status());
          for (int i = 0; i < 25; ++i) {
            dist_autograd::Context ctx(agent);
            // d sum(p0) / d p0 = 1: each step subtracts exactly 1.
            at::Tensor y = agent.rpc_sync(1, sum_first_fn, h);
            WCHECK_OK(dist_autograd::Backward(agent, ctx.id(), {y}));
            WCHECK_OK((*opt)->Step(ctx.id()));
          }
        });
      }
      for (auto& t : trainers) t.join();
      const at::Tensor after = agent.rpc_sync(1, first_fn, h);
      if (mode == DistributedOptimizer::Mode::kLocked) {
        ExpectClose(after, before - 100, "locked concurrent steps");
      } else {
        WCHECK(after.isfinite().all().item<bool>());
        WCHECK((after < before).all().item<bool>());
      }
    }
  }
  WCHECK_OK(agent.Shutdown());
  return 0;
}

TEST(DistributedOptimizer, ConcurrentTrainersLockedAreExactAndHogwildRuns) {
  ExpectAllSucceeded(RunWorkers("concurrent_trainers", 2, absl::Seconds(120)));
}

// Optimizer state lives on the owners and can be saved and loaded: an Adam
// optimizer restored from another's state takes the same next step.
BATON_SCENARIO(save_and_load) {
  Worker w = Start();
  auto& agent = *w.agent;
  if (agent.self().id == 0) {
    Holder a = rref::remote<ParamHolder>(agent, 1, int64_t{3}, int64_t{4});
    Holder b = rref::remote<ParamHolder>(agent, 1, int64_t{4}, int64_t{4});
    auto opt_a = DistributedOptimizer::Create(agent, OptimizerOptions::Adam(0.1),
                                              agent.rpc_sync(1, params_fn, a));
    WCHECK_OK(opt_a.status());
    const at::Tensor x = at::randn({4}, at::kDouble);
    auto step = [&](DistributedOptimizer& opt, Holder& h) {
      dist_autograd::Context ctx(agent);
      at::Tensor loss = agent.rpc_sync(1, part_fn, h, x);
      WCHECK_OK(dist_autograd::Backward(agent, ctx.id(), {loss}));
      WCHECK_OK(opt.Step(ctx.id()));
    };
    for (int i = 0; i < 3; ++i) step(**opt_a, a);
    auto saved = (*opt_a)->SaveState();
    WCHECK_OK(saved.status());
    WCHECK(saved->size() == 1 && saved->count("w1") == 1);
    // b gets a's parameters and a fresh optimizer with a's state.
    WCHECK(b.rpc_sync(&ParamHolder::set, a.rpc_sync(&ParamHolder::values)));
    auto opt_b = DistributedOptimizer::Create(agent, OptimizerOptions::Adam(0.1),
                                              agent.rpc_sync(1, params_fn, b));
    WCHECK_OK(opt_b.status());
    WCHECK_OK((*opt_b)->LoadState(*saved));
    step(**opt_a, a);
    step(**opt_b, b);
    auto va = a.rpc_sync(&ParamHolder::values), vb = b.rpc_sync(&ParamHolder::values);
    for (size_t i = 0; i < va.size(); ++i) ExpectClose(vb[i], va[i], "restored state");
    // Errors name what is wrong and where.
    absl::Status s = (*opt_b)->LoadState({});
    WCHECK(s.code() == absl::StatusCode::kInvalidArgument && absl::StrContains(s.message(), "w1"));
    s = (*opt_b)->LoadState({{"w1", "garbage"}});
    WCHECK(s.code() == absl::StatusCode::kDataLoss && absl::StrContains(s.message(), "'w1'"));
    OptimizerOptions bad = OptimizerOptions::SGD(-1);
    WCHECK(
        DistributedOptimizer::Create(agent, bad, agent.rpc_sync(1, params_fn, b)).status().code() ==
        absl::StatusCode::kInvalidArgument);
    WCHECK(DistributedOptimizer::Create(agent, OptimizerOptions::SGD(0.1), {}).status().code() ==
           absl::StatusCode::kInvalidArgument);
    // An integer "parameter" fails on its owner, naming it.
    RRef<at::Tensor> ints = rref::remote(agent, 1, ints_fn, int64_t{3});
    auto r = DistributedOptimizer::Create(agent, OptimizerOptions::SGD(0.1), {ints});
    WCHECK(!r.ok() && absl::StrContains(r.status().message(), "'w1'"));
  }
  WCHECK_OK(agent.Shutdown());
  return 0;
}

TEST(DistributedOptimizer, StateSavedAndLoadedOnTheOwners) {
  ExpectAllSucceeded(RunWorkers("save_and_load", 2, absl::Seconds(120)));
}

}  // namespace
}  // namespace baton::dist_optim
