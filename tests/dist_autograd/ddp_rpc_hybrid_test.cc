// The DDP+RPC hybrid across real processes: two trainers run a local module
// under DDP (a 2-rank Gloo group) on top of a layer that lives on a third
// worker (a remote object). Backward is distributed autograd; DDP averages the
// local module's gradients inside the context (dist_autograd/ddp_gradients.h);
// a DistributedOptimizer steps the remote layer and the local modules. The
// result equals single-process training of the same computation.
#include <cstdio>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "comm/ddp.h"
#include "comm/gloo_backend.h"
#include "comm/process_group.h"
#include "dist_autograd/ddp_gradients.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "rpc/agent.h"
#include "rref/rref.h"
#include "testing/multiprocess.h"

namespace baton {
namespace {

using rpc::CallContext;
using rpc::Function;
using rref::RRef;

constexpr int kTrainers = 2;
constexpr int kBatch = 4;  // per trainer
constexpr int kSteps = 4;
constexpr double kLr = 0.1;

// The layer on the third worker.
class RemoteLayer {
 public:
  explicit RemoteLayer(int64_t seed) {
    torch::manual_seed(seed);
    w_ = torch::randn({6, 5}, torch::kDouble).requires_grad_(true);
  }
  at::Tensor forward(at::Tensor x) { return torch::tanh(x.mm(w_)); }
  at::Tensor weight() { return w_.detach().clone(); }
  const at::Tensor& param() const { return w_; }

 private:
  at::Tensor w_;
};
using LayerRef = RRef<RemoteLayer>;
const Function<std::vector<RRef<at::Tensor>>(LayerRef)> layer_params_fn("layer_params");
const Function<LayerRef()> get_layer_fn("get_layer");
LayerRef g_layer;  // trainer 0's handle, handed to trainer 1

struct Head : torch::nn::Module {
  Head() { fc = register_module("fc", torch::nn::Linear(5, 3)); }
  torch::Tensor forward(const torch::Tensor& h) { return fc->forward(h); }
  torch::nn::Linear fc{nullptr};
};

std::shared_ptr<Head> MakeHead() {
  torch::manual_seed(7);
  auto head = std::make_shared<Head>();
  head->to(torch::kDouble);
  return head;
}

// Step k's batch of trainer t (identical wherever it is computed).
std::pair<at::Tensor, at::Tensor> Batch(int k, int t) {
  torch::manual_seed(100 + 10 * k + t);
  return {torch::randn({kBatch, 6}, torch::kDouble), torch::randn({kBatch, 3}, torch::kDouble)};
}

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

BATON_SCENARIO(hybrid) {
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  WCHECK_OK(dist_autograd::Install(*registry));
  auto rrefs = rref::RRefService::Install(*registry);
  dist_optim::Install(*rrefs);
  rref::RegisterClass<RemoteLayer>(*rrefs, "RemoteLayer")
      .Constructor<int64_t>()
      .Method("forward", &RemoteLayer::forward)
      .Method("weight", &RemoteLayer::weight);
  (void)registry->Register(layer_params_fn, [](const CallContext& ctx, LayerRef l) {
    return std::vector<RRef<at::Tensor>>{rref::MakeOwned(*ctx.agent, l.local_value()->param())};
  });
  (void)registry->Register(get_layer_fn, [] { return g_layer; });
  auto opts = rpc::AgentOptions::FromEnv("w");
  WCHECK_OK(opts.status());
  auto made = rpc::RpcAgent::Create(*opts, registry);
  WCHECK_OK(made.status());
  rpc::RpcAgent& agent = **made;
  rrefs->Attach(&agent);
  const int rank = agent.self().id;

  if (rank < kTrainers) {
    // The trainers' group, rendezvousing through the agent's store.
    std::shared_ptr<store::Store> store(std::shared_ptr<void>(), &agent.runtime().store());
    comm::GroupOptions gopts;
    gopts.name = "trainers";
    auto pg = comm::ProcessGroup::Create(store, rank, kTrainers, comm::GlooBackendFactory(), gopts);
    WCHECK_OK(pg.status());
    std::shared_ptr<Head> head = MakeHead();
    auto grads = std::make_shared<dist_autograd::ContextGradients>(agent);
    comm::DdpOptions dopts;
    dopts.gradient_source = grads;
    auto ddp = comm::DistributedDataParallel::Create(head, *pg, dopts);
    WCHECK_OK(ddp.status());
    // Trainer 0 creates the remote layer; both use it through an RRef.
    LayerRef layer;
    if (rank == 0) layer = rref::remote<RemoteLayer>(agent, 2, int64_t{3});
    std::vector<RRef<at::Tensor>> params;
    if (rank == 0) {
      params = agent.rpc_sync(2, layer_params_fn, layer);
      g_layer = layer;
      WCHECK_OK(agent.runtime().store().Set("hybrid.ready", "1"));
    }
    // Trainer 1 gets its own handles from the owner through the same function.
    // (RRefs are values: they could also be passed from trainer 0.)
    if (rank == 1) {
      WCHECK(agent.runtime().store().Get("hybrid.ready", absl::Seconds(30)).ok());
      layer = agent.rpc_sync(0, get_layer_fn);
      params = agent.rpc_sync(2, layer_params_fn, layer);
    }
    for (const auto& p : head->parameters()) params.push_back(rref::MakeOwned(agent, p));
    auto opt = dist_optim::DistributedOptimizer::Create(
        agent, dist_optim::OptimizerOptions::SGD(kLr), params);
    WCHECK_OK(opt.status());
    for (int k = 0; k < kSteps; ++k) {
      auto [x, y] = Batch(k, rank);
      dist_autograd::Context ctx(agent);
      at::Tensor h = layer.rpc_sync(&RemoteLayer::forward, x);
      at::Tensor loss = torch::mse_loss((*ddp)->module().as<Head>()->forward(h), y);
      WCHECK_OK(dist_autograd::Backward(agent, ctx.id(), {loss}));
      // Before DDP: this trainer's own gradients; after: the mean over both.
      std::vector<at::Tensor> mine;
      for (const auto& p : head->parameters()) {
        mine.push_back(dist_autograd::GetGradient(agent, ctx.id(), p).value());
        WCHECK(mine.back().defined() && !p.grad().defined());
      }
      WCHECK_OK(grads->Use(ctx.id()));
      WCHECK_OK((*ddp)->SyncGradients());
      for (size_t i = 0; i < mine.size(); ++i) {
        std::vector<at::Tensor> all = {torch::empty_like(mine[i]), torch::empty_like(mine[i])};
        WCHECK_OK(pg->AllGather(all, mine[i])->Wait(absl::Seconds(30)));
        const at::Tensor avg =
            dist_autograd::GetGradient(agent, ctx.id(), head->parameters()[i]).value();
        WCHECK(MaxDiff(avg, (all[0] + all[1]) / 2) < 1e-12);
      }
      // Both trainers computed with the same remote weights; now both step.
      WCHECK_OK(pg->Barrier()->Wait(absl::Seconds(30)));
      WCHECK_OK((*opt)->Step(ctx.id()));
      WCHECK_OK(pg->Barrier()->Wait(absl::Seconds(30)));
    }
    // The reference: the same computation in one process. The remote layer
    // takes both trainers' gradients; the head takes their average.
    if (rank == 0) {
      std::shared_ptr<Head> ref_head = MakeHead();
      torch::manual_seed(3);
      at::Tensor ref_w = torch::randn({6, 5}, torch::kDouble).requires_grad_(true);
      for (int k = 0; k < kSteps; ++k) {
        std::vector<at::Tensor> gw, gh[kTrainers];
        for (int t = 0; t < kTrainers; ++t) {
          auto [x, y] = Batch(k, t);
          at::Tensor loss = torch::mse_loss(ref_head->forward(torch::tanh(x.mm(ref_w))), y);
          std::vector<at::Tensor> leaves = {ref_w};
          for (const auto& p : ref_head->parameters()) leaves.push_back(p);
          auto g = torch::autograd::grad({loss}, leaves);
          gw.push_back(g[0]);
          gh[t].assign(g.begin() + 1, g.end());
        }
        torch::NoGradGuard no_grad;
        ref_w -= kLr * (gw[0] + gw[1]);
        auto ps = ref_head->parameters();
        for (size_t i = 0; i < ps.size(); ++i) ps[i] -= kLr * (gh[0][i] + gh[1][i]) / 2;
      }
      WCHECK(MaxDiff(layer.rpc_sync(&RemoteLayer::weight), ref_w.detach()) < 1e-12);
      auto ps = head->parameters(), rs = ref_head->parameters();
      for (size_t i = 0; i < ps.size(); ++i) WCHECK(MaxDiff(ps[i], rs[i]) < 1e-12);
    }
    WCHECK_OK(pg->Barrier()->Wait(absl::Seconds(30)));
    g_layer = LayerRef();
  }
  WCHECK_OK(agent.Shutdown());
  return 0;
}

TEST(DdpRpcHybrid, DdpAveragesContextGradientsAndMatchesOneProcess) {
  auto results = baton::testing::RunWorkers("hybrid", 3, absl::Seconds(180));
  for (const auto& r : results) {
    EXPECT_TRUE(r.exit_code == 0 && r.signal == 0 && !r.timed_out)
        << baton::testing::Describe(results);
  }
}

}  // namespace
}  // namespace baton
