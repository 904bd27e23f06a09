// nccl_latency_bench: the NCCL backend's latency at world size 1 on one GPU,
// beside comm/bench/nccl_latency_peer.py (torch.distributed's NCCL group).
// The same work and metric names, JSON lines on stdout:
//   op_wait_us           median of (all_reduce of 1024 float32 + wait for it)
//   queued_us_per_op     1000 all_reduces issued back to back, then waited
//                        for: total / 1000
//   plain_step_us        median step of an MLP 784-1024-1024-10, batch 64
//                        (forward, backward, SGD step, device synchronize)
//   ddp_step_us          the same step under DDP over the NCCL group
//   ddp_overhead         ddp_step_us / plain_step_us
//   dp_step_us           the same step through DataParallel over every GPU
//                        this process sees (comm/data_parallel.h)
//   dp_overhead          dp_step_us / plain_step_us
//   gpus                 how many GPUs that is: with one, DataParallel runs
//                        the module on it directly, so dp_overhead shows only
//                        the wrapper's per-step cost, not its scaling
//
//   nccl_latency_bench [--iters 2000]
//
// Built by CMakeLists.txt with BATON_CUDA=ON; run by
// tools/gpu/build_and_test.sh, which prints it beside the peer.
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/data_parallel.h"
#include "comm/ddp.h"
#include "comm/nccl_backend.h"
#include "comm/process_group.h"
#include "store/memory_store.h"

namespace {

using baton::comm::DataParallel;
using baton::comm::DistributedDataParallel;
using baton::comm::ProcessGroup;
using baton::comm::WorkPtr;

void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "nccl_latency_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

double NowUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Report(const std::string& metric, double value, const std::string& unit) {
  std::printf(
      "{\"system\": \"baton\", \"torch\": \"%s\", \"metric\": \"%s\", "
      "\"value\": %.6g, \"unit\": \"%s\"}\n",
      TORCH_VERSION, metric.c_str(), value, unit.c_str());
  std::fflush(stdout);
}

// Cloneable: DataParallel replicates it onto each GPU.
struct Mlp : torch::nn::Cloneable<Mlp> {
  Mlp() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(784, 1024));
    fc2 = register_module("fc2", torch::nn::Linear(1024, 1024));
    fc3 = register_module("fc3", torch::nn::Linear(1024, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3->forward(torch::relu(fc2->forward(torch::relu(fc1->forward(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

// Median step time of `model` through `forward` (the DDP wrapper, if any,
// hooks its backward).
template <typename Forward>
double StepUs(Mlp& model, int iters, Forward forward) {
  torch::optim::SGD opt(model.parameters(), 0.01);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::Tensor x = torch::randn({64, 784}, cuda);
  torch::Tensor y = torch::randint(0, 10, {64}, cuda.dtype(torch::kLong));
  std::vector<double> times;
  for (int i = 0; i < iters + 20; ++i) {
    const double t0 = NowUs();
    opt.zero_grad();
    torch::nn::functional::cross_entropy(forward(x), y).backward();
    opt.step();
    cudaDeviceSynchronize();
    if (i >= 20) times.push_back(NowUs() - t0);
  }
  return Median(times);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 2000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
  }
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "nccl_latency_bench: no CUDA device\n");
    return 1;
  }
  auto store = std::make_shared<baton::store::MemoryStore>();
  absl::StatusOr<ProcessGroup> pg =
      ProcessGroup::Create(store, 0, 1, baton::comm::NcclBackendFactory());
  Check(pg.status(), "creating the group");
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);

  // op + wait.
  torch::Tensor small = torch::ones({1024}, cuda);
  std::vector<double> times;
  for (int i = 0; i < iters + 200; ++i) {
    const double t0 = NowUs();
    Check(pg->AllReduce({small})->Wait(absl::Seconds(30)), "all_reduce");
    if (i >= 200) times.push_back(NowUs() - t0);
  }
  Report("op_wait_us", Median(times), "us");

  // Queued ops.
  const int queued = 1000;
  std::vector<double> per_op;
  for (int round = 0; round < 5; ++round) {
    std::vector<WorkPtr> works;
    works.reserve(queued);
    const double t0 = NowUs();
    for (int i = 0; i < queued; ++i) works.push_back(pg->AllReduce({small}));
    for (const WorkPtr& w : works) Check(w->Wait(absl::Seconds(60)), "queued");
    per_op.push_back((NowUs() - t0) / queued);
  }
  Report("queued_us_per_op", Median(per_op), "us");

  // DDP step over a plain step, the same model and data.
  torch::manual_seed(0);
  auto plain = std::make_shared<Mlp>();
  plain->to(torch::kCUDA);
  const double plain_us =
      StepUs(*plain, iters / 4, [&](const torch::Tensor& x) { return plain->forward(x); });
  torch::manual_seed(0);
  auto wrapped = std::make_shared<Mlp>();
  wrapped->to(torch::kCUDA);
  auto ddp = DistributedDataParallel::Create(wrapped, *pg);
  Check(ddp.status(), "DDP");
  const double ddp_us =
      StepUs(*wrapped, iters / 4, [&](const torch::Tensor& x) { return wrapped->forward(x); });
  Report("plain_step_us", plain_us, "us");
  Report("ddp_step_us", ddp_us, "us");
  Report("ddp_overhead", ddp_us / plain_us, "x");

  // DataParallel over every GPU of this process, the same model and data.
  torch::manual_seed(0);
  auto replicated = std::make_shared<Mlp>();
  baton::comm::DataParallelOptions dp_options;
  for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i) {
    dp_options.devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
  }
  auto dp = DataParallel<Mlp>::Create(replicated, dp_options);
  Check(dp.status(), "DataParallel");
  const double dp_us =
      StepUs(*replicated, iters / 4, [&](const torch::Tensor& x) { return (*dp)->Forward(x); });
  Report("gpus", static_cast<double>(dp_options.devices.size()), "");
  Report("dp_step_us", dp_us, "us");
  Report("dp_overhead", dp_us / plain_us, "x");
  ddp->reset();
  Check(pg->Destroy(), "destroy");
  return 0;
}
