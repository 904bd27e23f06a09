// Model parallelism with remote objects: a two-layer network whose layers
// live on two other workers, trained with distributed autograd and the
// distributed optimizer (the C++ counterpart of PyTorch's "RNN with
// distributed autograd and RRefs" tutorial).
//
// Rank 1 holds layer 1 (2 -> 32, tanh) and rank 2 holds layer 2 (32 -> 1),
// each a RemoteLayer created with rref::remote<RemoteLayer>(). Rank 0, the
// trainer, owns the data: a synthetic regression task
// y = sin(3 x1) + x2^2 + noise. Each step it sends a minibatch through both
// layers by RRef method calls inside a dist_autograd::Context, computes the
// MSE loss locally, runs the backward pass across all three workers, and
// steps a DistributedOptimizer over RRefs to the layers' parameters (each
// owner updates its parameters in place). At the end it checks that the loss
// on the whole data set fell well below its initial value and that no
// distributed-autograd context is left on any worker, prints
// "RESULT OK ..." or "RESULT FAILED ...", and exits 0 or 1.
//
// Run with the launcher (exactly three processes):
//   bazel-bin/launcher/baton-run --standalone --nproc_per_node 3
//       bazel-bin/examples/train_remote_layers [--steps 200]
//       [--optimizer adam|sgd] [--lr X]
// Defaults: 200 steps of Adam with lr 0.05 (sgd: lr 0.1, momentum 0.9); a run
// takes a couple of seconds.
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/modules/linear.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "rpc/agent.h"
#include "rref/rref.h"

namespace {

using baton::rpc::CallContext;
using baton::rpc::Function;
using baton::rpc::RpcAgent;
using baton::rref::RRef;
namespace dist_autograd = baton::dist_autograd;
namespace dist_optim = baton::dist_optim;
namespace rref = baton::rref;

constexpr int64_t kSamples = 512, kBatch = 64, kHidden = 32;
constexpr double kNoise = 0.05;         // noise floor of the MSE: 0.0025
constexpr double kMaxFinalLoss = 0.05;  // the data's variance is about 0.6

// A linear layer with an optional tanh, held by its owner as a remote object.
// forward only reads the parameters, so concurrent calls are safe; the
// optimizer updates them between steps, never during one (one trainer).
class RemoteLayer {
 public:
  RemoteLayer(int64_t in, int64_t out, bool tanh, int64_t seed) : tanh_(tanh) {
    static std::mutex seed_mu;  // the seed is process-global
    std::lock_guard<std::mutex> lock(seed_mu);
    torch::manual_seed(static_cast<uint64_t>(seed));
    linear_ = torch::nn::Linear(in, out);
  }
  at::Tensor forward(at::Tensor x) {
    at::Tensor y = linear_->forward(x);
    return tanh_ ? at::tanh(y) : y;
  }
  std::vector<at::Tensor> parameters() const { return linear_->parameters(); }

 private:
  const bool tanh_;
  torch::nn::Linear linear_{nullptr};
};

// Runs on the layer's owner: RRefs to the layer's parameters, for the optimizer.
const Function<std::vector<RRef<at::Tensor>>(RRef<RemoteLayer>)> param_rrefs_fn(
    "train_remote_layers.parameter_rrefs");
// The distributed-autograd contexts a worker still holds (leak check).
const Function<int64_t()> live_contexts_fn("train_remote_layers.live_contexts");

absl::Status Setup(baton::rpc::FunctionRegistry& registry,
                   std::shared_ptr<rref::RRefService>* rrefs) {
  *rrefs = rref::RRefService::Install(registry);
  absl::Status s = dist_autograd::Install(registry);
  if (!s.ok()) return s;
  dist_optim::Install(**rrefs);
  rref::RegisterClass<RemoteLayer>(**rrefs, "RemoteLayer")
      .Constructor<int64_t, int64_t, bool, int64_t>()
      .Method("forward", &RemoteLayer::forward);
  s = registry.Register(
      param_rrefs_fn,
      [](const CallContext& ctx,
         RRef<RemoteLayer> layer) -> absl::StatusOr<std::vector<RRef<at::Tensor>>> {
        if (!layer.is_owner()) {
          return absl::FailedPreconditionError("parameter_rrefs must run on the layer's owner");
        }
        std::vector<RRef<at::Tensor>> out;
        for (const at::Tensor& p : layer.local_value()->parameters()) {
          out.push_back(rref::MakeOwned(*ctx.agent, p));  // the same tensor, shared
        }
        return out;
      });
  if (!s.ok()) return s;
  return registry.Register(live_contexts_fn, [](const CallContext& ctx) {
    return static_cast<int64_t>(dist_autograd::LiveContexts(*ctx.agent).size());
  });
}

struct Flags {
  int steps = 200;
  std::string optimizer = "adam";
  double lr = -1;  // <= 0: the optimizer's default below
};

// MSE of the model on the whole data set, through the remote layers, with no
// autograd context (nothing is recorded for a backward pass).
double Evaluate(const RRef<RemoteLayer>& l1, const RRef<RemoteLayer>& l2, const at::Tensor& x,
                const at::Tensor& y) {
  at::Tensor out = l2.rpc_sync(&RemoteLayer::forward, l1.rpc_sync(&RemoteLayer::forward, x));
  at::NoGradGuard no_grad;
  return at::mse_loss(out, y).item<double>();
}

int Train(RpcAgent& agent, const Flags& flags) {
  // The data set, deterministic: x uniform in [-1, 1]^2.
  at::manual_seed(2024);
  const at::Tensor x = at::rand({kSamples, 2}) * 2 - 1;
  const at::Tensor x1 = x.select(1, 0).unsqueeze(1), x2 = x.select(1, 1).unsqueeze(1);
  const at::Tensor y = at::sin(3 * x1) + x2 * x2 + kNoise * at::randn({kSamples, 1});

  auto l1 = rref::remote<RemoteLayer>(agent, 1, int64_t{2}, kHidden, true, int64_t{1});
  auto l2 = rref::remote<RemoteLayer>(agent, 2, kHidden, int64_t{1}, false, int64_t{2});
  std::vector<RRef<at::Tensor>> params = agent.rpc_sync(1, param_rrefs_fn, l1);
  for (auto& p : agent.rpc_sync(2, param_rrefs_fn, l2)) params.push_back(p);

  const bool adam = flags.optimizer == "adam";
  auto options = adam ? dist_optim::OptimizerOptions::Adam(flags.lr > 0 ? flags.lr : 0.05)
                      : dist_optim::OptimizerOptions::SGD(flags.lr > 0 ? flags.lr : 0.1);
  if (!adam) options.momentum = 0.9;
  auto opt = dist_optim::DistributedOptimizer::Create(agent, options, params);
  if (!opt.ok()) {
    std::printf("RESULT FAILED creating the distributed optimizer: %s\n",
                opt.status().ToString().c_str());
    return 1;
  }
  std::printf("training %lld parameter tensors on %s with %s\n",
              static_cast<long long>(params.size()), absl::StrJoin((*opt)->owners(), ", ").c_str(),
              options.DebugString().c_str());

  const double initial_loss = Evaluate(l1, l2, x, y);
  std::printf("initial loss (full data set) %.5f\n", initial_loss);
  at::Tensor order = at::randperm(kSamples);
  for (int step = 0; step < flags.steps; ++step) {
    const int64_t batch = step % (kSamples / kBatch);
    if (batch == 0 && step > 0) order = at::randperm(kSamples);  // a new epoch
    const at::Tensor idx = order.slice(0, batch * kBatch, (batch + 1) * kBatch);
    const at::Tensor bx = x.index_select(0, idx), by = y.index_select(0, idx);

    dist_autograd::Context ctx(agent);
    at::Tensor h = l1.rpc_sync(&RemoteLayer::forward, bx);
    at::Tensor out = l2.rpc_sync(&RemoteLayer::forward, h);
    at::Tensor loss = at::mse_loss(out, by);
    absl::Status s = dist_autograd::Backward(agent, ctx.id(), {loss});
    if (s.ok()) s = (*opt)->Step(ctx.id());
    if (!s.ok()) {
      std::printf("RESULT FAILED at step %d: %s\n", step, s.ToString().c_str());
      return 1;
    }
    if (step % 20 == 0 || step == flags.steps - 1) {
      std::printf("step %4d  minibatch loss %.5f\n", step, loss.item<double>());
      std::fflush(stdout);
    }
  }
  const double final_loss = Evaluate(l1, l2, x, y);
  std::printf("final loss (full data set) %.5f\n", final_loss);

  // Every context was released on every worker (releases travel
  // asynchronously to the other workers: poll them for a while).
  std::string leaks;
  if (size_t n = dist_autograd::LiveContexts(agent).size(); n != 0) {
    leaks = absl::StrCat(" worker0:", n);
  }
  for (int r = 1; r < agent.options().world_size; ++r) {
    int64_t n = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while ((n = agent.rpc_sync(r, live_contexts_fn)) != 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (n != 0) absl::StrAppend(&leaks, " worker", r, ":", n);
  }

  const bool converged = final_loss < kMaxFinalLoss && final_loss <= 0.3 * initial_loss;
  if (converged && leaks.empty()) {
    std::printf("RESULT OK initial_loss=%.5f final_loss=%.5f\n", initial_loss, final_loss);
    return 0;
  }
  if (!leaks.empty()) leaks = absl::StrCat(" live contexts left:", leaks);
  std::printf("RESULT FAILED initial_loss=%.5f final_loss=%.5f%s%s\n", initial_loss, final_loss,
              converged ? "" : " (did not converge: need final < 0.05 and <= 30% of initial)",
              leaks.c_str());
  return 1;
}

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* value = argv[i + 1];
    if (std::strcmp(argv[i], "--steps") == 0) {
      if (!absl::SimpleAtoi(value, &flags->steps) || flags->steps < 1) return false;
    } else if (std::strcmp(argv[i], "--optimizer") == 0) {
      flags->optimizer = value;
      if (flags->optimizer != "adam" && flags->optimizer != "sgd") return false;
    } else if (std::strcmp(argv[i], "--lr") == 0) {
      if (!absl::SimpleAtod(value, &flags->lr) || !(flags->lr > 0)) return false;
    } else {
      return false;
    }
  }
  return argc % 2 == 1;  // every flag has its value
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr, "usage: %s [--steps N] [--optimizer adam|sgd] [--lr X]\n", argv[0]);
    return 2;
  }
  at::set_num_threads(1);
  auto options = baton::rpc::AgentOptions::FromEnv("worker");
  if (!options.ok()) {
    std::fprintf(stderr, "reading the launcher environment: %s\n",
                 options.status().ToString().c_str());
    return 2;
  }
  if (options->world_size != 3) {
    std::fprintf(stderr,
                 "train_remote_layers needs exactly 3 processes (trainer, 2 layers), "
                 "got %d\n",
                 options->world_size);
    return 2;
  }
  // The layer owners enter Shutdown() at once and wait there for the trainer.
  if (options->rank != 0) options->timeouts.shutdown = absl::Minutes(10);

  auto registry = std::make_shared<baton::rpc::FunctionRegistry>();
  std::shared_ptr<rref::RRefService> rrefs;
  absl::Status s;
  try {
    s = Setup(*registry, &rrefs);
  } catch (const baton::Error& e) {  // RegisterClass reports by throwing
    s = e.status();
  }
  if (!s.ok()) {
    std::fprintf(stderr, "registering the remote functions: %s\n", s.ToString().c_str());
    return 1;
  }
  auto agent = RpcAgent::Create(*options, registry);
  if (!agent.ok()) {
    std::fprintf(stderr, "starting the RPC agent: %s\n", agent.status().ToString().c_str());
    return 1;
  }
  rrefs->Attach(agent->get());

  int code = 0;
  if (options->rank == 0) {
    try {
      code = Train(**agent, flags);
    } catch (const baton::Error& e) {  // failed RPCs, remote() or method calls
      std::printf("RESULT FAILED: %s\n", e.what());
      code = 1;
    } catch (const std::exception& e) {  // e.g. c10::Error from a local tensor op
      std::printf("RESULT FAILED: %s\n", e.what());
      code = 1;
    }
    std::fflush(stdout);
  }
  s = (*agent)->Shutdown();
  if (!s.ok()) {
    std::fprintf(stderr, "shutdown of worker %d: %s\n", options->rank, s.ToString().c_str());
    return code != 0 ? code : 1;
  }
  return code;
}
