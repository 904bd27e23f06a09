// The main job, for now: synchronous data-parallel training over RPC.
//
// Rank 0 owns the model (a linear regressor) and coordinates; every other
// rank holds one shard of a synthetic regression data set and computes
// gradients on it when asked. Each step rank 0 sends the current weights to
// all trainers at once (rpc_async), averages their gradients, and takes an
// SGD step. The job checks that the loss fell and that the learned weights
// match the generating ones, prints the result, and exits non-zero if not.
//
// Run with the launcher (or any way that sets RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT):
//   bazel-bin/launcher/baton-run --standalone --nproc_per_node 3
//       bazel-bin/examples/train_regression [--steps 150]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "absl/strings/str_cat.h"
#include "rpc/agent.h"

namespace {

using baton::rpc::AgentOptions;
using baton::rpc::Function;
using baton::rpc::FunctionRegistry;
using baton::rpc::Future;
using baton::rpc::RpcAgent;

constexpr int64_t kFeatures = 32;
constexpr int64_t kSamplesPerShard = 4096;
constexpr double kNoise = 0.01;

// (weights, bias) -> (grad weights, grad bias, loss, samples)
using GradResult = std::tuple<at::Tensor, at::Tensor, double, int64_t>;
const Function<GradResult(at::Tensor, at::Tensor)> grad_fn("regression.grad");

// The generating model; every rank derives it from the same seed.
std::pair<at::Tensor, at::Tensor> TrueModel() {
  at::manual_seed(1234);
  return {at::randn({kFeatures, 1}, at::kDouble), at::randn({1}, at::kDouble)};
}

struct Shard {
  at::Tensor x, y;
};

Shard MakeShard(int rank) {
  auto [w, b] = TrueModel();
  at::manual_seed(1000 + rank);
  Shard s;
  s.x = at::randn({kSamplesPerShard, kFeatures}, at::kDouble);
  s.y = at::matmul(s.x, w) + b + kNoise * at::randn({kSamplesPerShard, 1}, at::kDouble);
  return s;
}

int Coordinator(RpcAgent& agent, int steps) {
  const int world = agent.options().world_size;
  at::Tensor w = at::zeros({kFeatures, 1}, at::kDouble);
  at::Tensor b = at::zeros({1}, at::kDouble);
  const double lr = 0.1;
  double first_loss = -1, loss = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<Future<GradResult>> futures;
    for (int r = 1; r < world; ++r) futures.push_back(agent.rpc_async(r, grad_fn, w, b));
    at::Tensor gw = at::zeros_like(w), gb = at::zeros_like(b);
    double loss_sum = 0;
    int64_t n = 0;
    for (auto& f : futures) {
      auto [sw, sb, l, count] = f.value();  // throws baton::Error naming the worker
      gw += sw;
      gb += sb;
      loss_sum += l;
      n += count;
    }
    w -= lr * gw / static_cast<double>(n);
    b -= lr * gb / static_cast<double>(n);
    loss = loss_sum / static_cast<double>(n);
    if (first_loss < 0) first_loss = loss;
    if (step % 25 == 0 || step == steps - 1) {
      std::printf("step %4d  loss %.6f\n", step, loss);
      std::fflush(stdout);
    }
  }
  auto [true_w, true_b] = TrueModel();
  const double w_err = (w - true_w).abs().max().item<double>();
  const double b_err = (b - true_b).abs().max().item<double>();
  std::printf(
      "trained on %d shards of %lld samples: loss %.6f -> %.6f, max |w - w*| = %.2e, "
      "|b - b*| = %.2e\n",
      world - 1, static_cast<long long>(kSamplesPerShard), first_loss, loss, w_err, b_err);
  const bool ok = loss < first_loss * 1e-2 && loss < 1e-3 && w_err < 5e-3 && b_err < 5e-3;
  std::printf("%s\n", ok ? "RESULT OK: the model recovered the generating weights"
                         : "RESULT FAILED: training did not converge");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 150;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--steps N]\n", argv[0]);
      return 2;
    }
  }
  at::set_num_threads(1);
  auto options = AgentOptions::FromEnv("worker");
  if (!options.ok()) {
    std::fprintf(stderr, "%s\n", options.status().ToString().c_str());
    return 2;
  }
  if (options->world_size < 2) {
    std::fprintf(stderr, "train_regression needs at least 2 processes (1 coordinator, trainers)\n");
    return 2;
  }
  auto registry = std::make_shared<FunctionRegistry>();
  if (options->rank > 0) {
    auto shard = std::make_shared<Shard>(MakeShard(options->rank));
    (void)registry->Register(grad_fn, [shard](at::Tensor w, at::Tensor b) -> GradResult {
      at::Tensor err = at::matmul(shard->x, w) + b - shard->y;  // [n, 1]
      const double loss = err.pow(2).sum().item<double>();
      return {2.0 * at::matmul(shard->x.t(), err), 2.0 * err.sum({0}), loss, shard->x.size(0)};
    });
  }
  auto agent = RpcAgent::Create(*options, registry);
  if (!agent.ok()) {
    std::fprintf(stderr, "%s\n", agent.status().ToString().c_str());
    return 1;
  }
  int code = 0;
  if (options->rank == 0) {
    try {
      code = Coordinator(**agent, steps);
    } catch (const baton::Error& e) {
      std::fprintf(stderr, "training failed: %s\n", e.what());
      code = 1;
    }
  }
  absl::Status s = (*agent)->Shutdown();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return code != 0 ? code : 1;
  }
  return code;
}
