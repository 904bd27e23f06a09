// CUDA tensors through RPC (docs/cuda.md): device maps checked by every
// worker at init (in process, on any machine), and on a GPU, between two
// worker processes
// sharing it: an echo of CUDA tensors of several dtypes and views, replies
// that come back through the inverse of the caller's map, the errors of a
// missing map, distributed autograd whose gradients come back to the CUDA
// tensors that were sent, and a remote CUDA layer trained with the
// distributed optimizer that matches local training on the GPU.
//
// With BATON_TEST_WITH_CUDA_IPC (the CUDA build) the echo and autograd
// cases run again over CUDA IPC (rpc/cuda/ipc_channel.h, I1-I5), and a
// receiver killed while the sender holds its export leaves no device memory
// held on the sender. The GPU cases skip where this process sees no CUDA
// device, saying so.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "rpc/agent.h"
#include "rref/rref.h"
#include "testing/eventually.h"
#include "testing/multiprocess.h"
#include "testing/multiprocess_gtest.h"
#include "testing/rpc/loopback_job.h"

#ifdef BATON_TEST_WITH_CUDA_IPC
#include <signal.h>
#include <unistd.h>

#include <c10/cuda/CUDACachingAllocator.h>

#include "rpc/cuda/ipc_channel.h"
#endif

namespace baton::rpc {
namespace {

using baton::testing::Describe;
using baton::testing::ExpectAllSucceeded;
using baton::testing::RunWorkers;
using rref::RRef;

int CudaDevices() { return static_cast<int>(torch::cuda::device_count()); }

#define SKIP_WITHOUT_GPU() \
  if (CudaDevices() == 0) GTEST_SKIP() << "skipped: needs a CUDA device, found 0"

// ---- Device maps checked by every worker at init (any machine) ----

// Starts a job of two workers with the maps `configure` sets, and checks
// that every worker's init failed alike, as torch's init_rpc does: INVALID_
// ARGUMENT with `want`, which names the worker at fault (rpc/internal/
// device_maps.h).
void StartWithMaps(std::function<void(int, AgentOptions&)> configure, const std::string& want) {
  testing::LoopbackJobOptions o;
  o.world_size = 2;
  o.init_timeout = absl::Seconds(10);
  o.configure = std::move(configure);
  std::vector<absl::Status> results;
  o.start_results = &results;
  EXPECT_FALSE(testing::LoopbackJob::Start(o).ok());
  EXPECT_EQ(results.size(), 2u);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kInvalidArgument)
        << "w" << r << ": " << results[r];
    EXPECT_TRUE(absl::StrContains(results[r].message(), want)) << "w" << r << ": " << results[r];
  }
}

TEST(DeviceMaps, AWorkerNotInTheJobFailsEveryWorkersInit) {
  // An empty map: nothing this worker could check alone.
  StartWithMaps(
      [](int rank, AgentOptions& o) {
        if (rank == 1) o.devices.maps["w9"] = {};
      },
      "Node w1 has invalid target node names in its device maps: 'w9' is not a worker "
      "of this job");
}

TEST(DeviceMaps, ADeviceThisWorkerDoesNotHaveIsReportedForTheFirstWorkerAtFault) {
  const int n = CudaDevices();
  StartWithMaps(
      [n](int rank, AgentOptions& o) {
        o.devices.maps[rank == 0 ? "w1" : "w0"] = {{n, 0}};
      },
      absl::StrCat("Node w0 has source devices with invalid indices in its device map for w1: "
                   "cuda:",
                   n, ", but w0 has ", n, " CUDA device(s)"));
}

TEST(DeviceMaps, AMapToItselfIsRefused) {
  StartWithMaps(
      [](int rank, AgentOptions& o) {
        o.devices.maps[absl::StrCat("w", rank)] = {{0, 0}};
      },
      "Node w0 has a device map for itself");
}

TEST(DeviceMaps, ADeviceThePeerDoesNotHaveIsRefused) {
  // The host's tensors to a GPU index the peer does not have: checkable on
  // any machine (the host is always there).
  const int n = CudaDevices();
  StartWithMaps(
      [n](int rank, AgentOptions& o) {
        if (rank == 1) o.devices.maps["w0"] = {{kCpuDevice, n}};
      },
      absl::StrCat("Node w1 has target devices with invalid indices in its device map for w0: "
                   "cpu to cuda:",
                   n, ", but w0 has ", n, " CUDA device(s)"));
}

TEST(DeviceMaps, TwoDevicesMappedToOneAreRefused) {
  StartWithMaps(
      [](int rank, AgentOptions& o) {
        if (rank == 0) o.devices.maps["w1"] = {{kCpuDevice, 0}, {0, 0}};
      },
      "Node w0 has duplicated target devices in its device map for w1: cuda:0 is the target of "
      "both cpu and cuda:0");
}

// A map of the host to the host changes nothing, and is accepted on any
// machine.
TEST(DeviceMaps, AHostToHostMapIsAccepted) {
  testing::LoopbackJobOptions o;
  const Function<at::Tensor(at::Tensor)> echo("echo");
  o.install = [&echo](int, FunctionRegistry& r) {
    (void)r.Register(echo, [](at::Tensor t) { return t * 2; });
  };
  o.configure = [](int rank, AgentOptions& options) {
    if (rank == 0) options.devices.maps["w1"] = {{kCpuDevice, kCpuDevice}};
  };
  auto job = testing::LoopbackJob::Start(o);
  ASSERT_TRUE(job.ok()) << job.status();
  for (int from : {0, 1}) {
    at::Tensor back = (*job)->agent(from).rpc_sync(1 - from, echo, at::arange(5.0));
    EXPECT_TRUE(back.device().is_cpu());
    EXPECT_TRUE(back.equal(at::arange(5.0) * 2));
  }
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

// Without a GPU, a CUDA tensor never exists here; what the other end may
// still send is refused with the count of devices this worker has.
TEST(DeviceMaps, WithoutAMapNothingChangesForCpuTensors) {
  testing::LoopbackJobOptions o;
  const Function<at::Tensor(at::Tensor)> echo("echo");
  o.install = [&echo](int, FunctionRegistry& r) {
    (void)r.Register(echo, [](at::Tensor t) { return t * 2; });
  };
  auto job = testing::LoopbackJob::Start(o);
  ASSERT_TRUE(job.ok()) << job.status();
  at::Tensor back = (*job)->agent(0).rpc_sync(1, echo, at::arange(5.0));
  EXPECT_TRUE(back.device().is_cpu());
  EXPECT_TRUE(back.equal(at::arange(5.0) * 2));
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

// ---- Two processes on one GPU ----

const Function<at::Tensor(at::Tensor)> echo_fn("echo");
const Function<std::string(at::Tensor)> where_fn("where");
const Function<at::Tensor(int64_t)> make_cuda_fn("make_cuda");
const Function<at::Tensor(at::Tensor, at::Tensor)> mm_fn("mm");

// Parameters on their owner's GPU, like a remote module's.
class CudaLayer {
 public:
  CudaLayer(int64_t seed, int64_t in, int64_t out) {
    at::manual_seed(seed);
    const auto opts = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA, 0);
    w_ = at::randn({in, out}, opts).requires_grad_(true);
    b_ = at::randn({out}, opts).requires_grad_(true);
  }
  at::Tensor forward(at::Tensor x) { return at::tanh(x.mm(w_) + b_); }
  std::vector<at::Tensor> values() { return {w_.detach().clone(), b_.detach().clone()}; }
  std::vector<at::Tensor>& params() { return ps_ = {w_, b_}; }

 private:
  at::Tensor w_, b_;
  std::vector<at::Tensor> ps_;
};
using Layer = RRef<CudaLayer>;
const Function<std::vector<RRef<at::Tensor>>(Layer)> params_fn("params");

const Function<int64_t()> pid_fn("pid");
// I6: queue a sum of `t` behind long GPU work, drop `t`; then take the sum.
const Function<void(at::Tensor)> sum_later_fn("sum_later");
const Function<void(at::Tensor)> receive_fn("receive");
const Function<double()> the_sum_fn("the_sum");

absl::Mutex sum_mu;
at::Tensor* pending_sum = nullptr;  // guarded by sum_mu; one per worker process

struct Worker {
  std::shared_ptr<FunctionRegistry> registry;
  std::shared_ptr<rref::RRefService> rrefs;
  std::unique_ptr<RpcAgent> agent;
#ifdef BATON_TEST_WITH_CUDA_IPC
  std::shared_ptr<cuda::CudaIpcChannel> ipc;
#endif
};

#ifdef BATON_TEST_WITH_CUDA_IPC
// Whether this run's scenario moves CUDA tensors through CUDA IPC
// (BATON_TEST_CUDA_IPC=1 in the workers' environment).
bool UseIpc() {
  const char* v = std::getenv("BATON_TEST_CUDA_IPC");
  return v != nullptr && std::string(v) == "1";
}
#endif

const std::map<int, int> kGpuToGpu = {{0, 0}};

// w0 maps its devices to w1's by `map` (none where empty); w1 sets no map
// and answers through the inverse of w0's.
Worker Start(const std::map<int, int>& map) {
  Worker w;
  w.registry = std::make_shared<FunctionRegistry>();
  auto& r = *w.registry;
  WCHECK_OK(dist_autograd::Install(r));
  w.rrefs = rref::RRefService::Install(r);
  dist_optim::Install(*w.rrefs);
  rref::RegisterClass<CudaLayer>(*w.rrefs, "CudaLayer")
      .Constructor<int64_t, int64_t, int64_t>()
      .Method("forward", &CudaLayer::forward)
      .Method("values", &CudaLayer::values);
  (void)r.Register(echo_fn, [](at::Tensor t) { return t; });
  (void)r.Register(where_fn, [](at::Tensor t) {
    return absl::StrCat(t.device().str(), " ", c10::toString(t.scalar_type()));
  });
  (void)r.Register(make_cuda_fn, [](int64_t n) {
    return at::arange(n, at::TensorOptions().dtype(at::kLong).device(at::kCUDA, 0));
  });
  (void)r.Register(mm_fn, [](at::Tensor a, at::Tensor b) { return a.mm(b); });
  (void)r.Register(pid_fn, [] { return static_cast<int64_t>(getpid()); });
  (void)r.Register(sum_later_fn, [](at::Tensor t) {
    // About 0.1 s of matrix products on this thread's current stream, then
    // the sum, queued behind them in stream order; the host returns at once
    // and frees `t`. (Each product is scaled to norm 1, so nothing
    // overflows; the products' values are not used.)
    at::Tensor a = at::randn({4096, 4096}, t.options());
    for (int i = 0; i < 40; ++i) {
      a = a.mm(a);
      a.div_(a.norm());
    }
    at::Tensor sum = t.sum();
    t = at::Tensor();
    absl::MutexLock lock(&sum_mu);
    delete pending_sum;
    pending_sum = new at::Tensor(std::move(sum));
  });
  (void)r.Register(receive_fn, [](at::Tensor) {});
  (void)r.Register(the_sum_fn, [] {
    absl::MutexLock lock(&sum_mu);
    return pending_sum != nullptr ? pending_sum->item<double>() : -1.0;
  });
  (void)r.Register(params_fn, [](const CallContext& ctx, Layer l) {
    std::vector<RRef<at::Tensor>> out;
    for (const auto& p : l.local_value()->params()) out.push_back(rref::MakeOwned(*ctx.agent, p));
    return out;
  });
  auto opts = AgentOptions::FromEnv("w");
  WCHECK_OK(opts.status());
  if (!map.empty() && opts->rank == 0) opts->devices.maps["w1"] = map;
  AgentCollaborators collaborators;
#ifdef BATON_TEST_WITH_CUDA_IPC
  if (UseIpc()) {
    w.ipc = cuda::CudaIpcChannel::Install(r);
    collaborators.cuda_channel = w.ipc;
  }
#endif
  auto agent = RpcAgent::Create(*opts, w.registry, std::move(collaborators));
  WCHECK_OK(agent.status());
  w.agent = *std::move(agent);
  w.rrefs->Attach(w.agent.get());
#ifdef BATON_TEST_WITH_CUDA_IPC
  if (w.ipc != nullptr) w.ipc->Attach(w.agent.get());
#endif
  return w;
}

void CheckSame(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const bool ok = got.defined() && got.device() == want.device() &&
                  got.scalar_type() == want.scalar_type() && got.sizes() == want.sizes() &&
                  got.cpu().equal(want.cpu());
  if (!ok) {
    std::fprintf(stderr, "%s: got %s %s%s, want %s %s%s\n", what.c_str(),
                 got.defined() ? got.device().str().c_str() : "undefined",
                 got.defined() ? c10::toString(got.scalar_type()) : "",
                 got.defined() ? c10::str(got.sizes()).c_str() : "", want.device().str().c_str(),
                 c10::toString(want.scalar_type()), c10::str(want.sizes()).c_str());
    baton::testing::ExitWorker(1);
  }
}

BATON_SCENARIO(cuda_echo) {
  Worker w = Start(kGpuToGpu);
  RpcAgent& agent = *w.agent;
  if (agent.self().id == 0) {
    const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
    for (at::ScalarType type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong,
                                at::kInt, at::kByte, at::kBool}) {
      at::Tensor t = (at::arange(24, cuda.dtype(at::kLong)).reshape({4, 6}) % 7).to(type);
      const std::string name = c10::toString(type);
      const std::string arrived = agent.rpc_sync(1, where_fn, t);
      WCHECK(arrived == absl::StrCat("cuda:0 ", name));
      CheckSame(agent.rpc_sync(1, echo_fn, t), t, absl::StrCat("echo of ", name));
    }
    at::Tensor base = at::randn({6, 8}, cuda);
    const std::vector<std::pair<std::string, at::Tensor>> views = {
        {"transposed", base.t()},
        {"rows 2-4", base.narrow(0, 2, 3)},
        {"one row", base[5]},
        {"strided columns", base.slice(1, 0, 8, 3)},
        {"no elements", base.narrow(0, 0, 0)},
        {"a scalar", base[1][2]},
    };
    for (const auto& [what, v] : views) {
      at::Tensor back = agent.rpc_sync(1, echo_fn, v);
      CheckSame(back, v.contiguous(), absl::StrCat("echo of ", what));
    }
    // 64 MiB: the bulk path.
    at::Tensor big = at::randn({16 << 20}, cuda);
    CheckSame(agent.rpc_sync(1, echo_fn, big), big, "echo of 64 MiB");
    // CPU tensors are untouched by the map.
    at::Tensor cpu = at::arange(5.0);
    WCHECK(agent.rpc_sync(1, where_fn, cpu) == "cpu Float");
    CheckSame(agent.rpc_sync(1, echo_fn, cpu), cpu, "echo of a CPU tensor");
    // A tensor the callee makes on its GPU comes back through the inverse
    // of this worker's map.
    CheckSame(agent.rpc_sync(1, make_cuda_fn, int64_t{10}), at::arange(10, cuda.dtype(at::kLong)),
              "a CUDA result");
  }
#ifdef BATON_TEST_WITH_CUDA_IPC
  // I3: every export was released by its receiver.
  if (w.ipc != nullptr) {
    WCHECK(baton::testing::Eventually([&] { return w.ipc->held() == 0; }));
    WCHECK(w.ipc->held_bytes() == 0);
  }
#endif
  WCHECK_OK(agent.Shutdown());
  return 0;
}

// torch's set_device_map("w1", {"cpu": 0, 0: "cpu"}): w0's CPU tensors
// arrive on w1's cuda:0 and its cuda:0 tensors in w1's host memory; w1's
// replies come back through the inverse.
BATON_SCENARIO(cuda_host_map) {
  Worker w = Start({{kCpuDevice, 0}, {0, kCpuDevice}});
  RpcAgent& agent = *w.agent;
  if (agent.self().id == 0) {
    const at::Tensor cpu = at::arange(6.0).reshape({2, 3});
    const at::Tensor cuda = cpu.to(at::Device(at::kCUDA, 0));
    WCHECK(agent.rpc_sync(1, where_fn, cpu) == "cuda:0 Float");
    WCHECK(agent.rpc_sync(1, where_fn, cpu.t()) == "cuda:0 Float");
    WCHECK(agent.rpc_sync(1, where_fn, cuda) == "cpu Float");
    CheckSame(agent.rpc_sync(1, echo_fn, cpu), cpu, "echo of a CPU tensor");
    CheckSame(agent.rpc_sync(1, echo_fn, cuda), cuda, "echo of a CUDA tensor");
    CheckSame(agent.rpc_sync(1, make_cuda_fn, int64_t{4}), at::arange(4, at::kLong),
              "a CUDA result, back in host memory");
  }
  WCHECK_OK(agent.Shutdown());
  return 0;
}

BATON_SCENARIO(cuda_without_map) {
  Worker w = Start({});
  RpcAgent& agent = *w.agent;
  if (agent.self().id == 0) {
    at::Tensor t = at::ones({3}, at::TensorOptions().device(at::kCUDA, 0));
    absl::Status s = agent.rpc_async(1, echo_fn, t).Wait(absl::Seconds(30));
    WCHECK(s.code() == absl::StatusCode::kInvalidArgument);
    WCHECK(absl::StrContains(s.message(),
                             "cannot send a tensor on device cuda:0 to worker 'w1': no device map "
                             "applies"));
    // The callee cannot answer with a CUDA tensor either; the caller is told why.
    s = agent.rpc_async(1, make_cuda_fn, int64_t{4}).Wait(absl::Seconds(30));
    WCHECK(s.code() == absl::StatusCode::kInvalidArgument);
    WCHECK(absl::StrContains(s.message(), "cannot send a tensor on device cuda:0 to worker 'w0'"));
    // The agent still works.
    WCHECK(agent.rpc_sync(1, where_fn, at::ones({1})) == "cpu Float");
  }
  WCHECK_OK(agent.Shutdown());
  return 0;
}

void ExpectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  WCHECK(got.defined());
  if (got.device() != want.device()) {
    std::fprintf(stderr, "%s: on %s, want %s\n", what.c_str(), got.device().str().c_str(),
                 want.device().str().c_str());
    baton::testing::ExitWorker(1);
  }
  const double tol = want.scalar_type() == at::kDouble ? 1e-12 : 1e-5;
  const double err = (got - want).abs().max().item<double>();
  if (!(err <= tol * std::max(1.0, want.abs().max().item<double>()))) {
    std::fprintf(stderr, "%s: max error %.3g\n", what.c_str(), err);
    baton::testing::ExitWorker(1);
  }
}

BATON_SCENARIO(cuda_autograd) {
  Worker w = Start(kGpuToGpu);
  RpcAgent& agent = *w.agent;
  if (agent.self().id == 0) {
    const auto cuda = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA, 0);
    // Gradients come back to the CUDA tensors that were sent.
    at::manual_seed(3);
    at::Tensor x = at::randn({3, 4}, cuda).requires_grad_(true);
    at::Tensor m = at::randn({4, 5}, cuda).requires_grad_(true);
    {
      dist_autograd::Context ctx(agent);
      at::Tensor loss = agent.rpc_sync(1, mm_fn, x, m).tanh().sum();
      WCHECK_OK(dist_autograd::Backward(agent, ctx.id(), {loss}));
      auto g = dist_autograd::GetGradients(agent, ctx.id());
      WCHECK_OK(g.status());
      auto want = torch::autograd::grad({x.mm(m).tanh().sum()}, {x, m});
      ExpectClose(g->Get(x), want[0], "gradient of x");
      ExpectClose(g->Get(m), want[1], "gradient of m");
    }
    // A layer on w1's GPU trained by the distributed optimizer, against the
    // same layer trained here with torch::optim.
    Layer layer = rref::remote<CudaLayer>(agent, 1, int64_t{7}, int64_t{4}, int64_t{3});
    std::vector<RRef<at::Tensor>> params = agent.rpc_sync(1, params_fn, layer);
    auto opt = dist_optim::DistributedOptimizer::Create(
        agent, dist_optim::OptimizerOptions::SGD(0.1), params);
    WCHECK_OK(opt.status());
    std::vector<at::Tensor> ref;
    for (auto& t : layer.rpc_sync(&CudaLayer::values)) ref.push_back(t.requires_grad_(true));
    WCHECK(ref[0].device() == at::Device(at::kCUDA, 0));
    torch::optim::SGD reference(ref, torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      at::Tensor input = at::randn({5, 4}, cuda);
      {
        dist_autograd::Context ctx(agent);
        at::Tensor out = layer.rpc_sync(&CudaLayer::forward, input);
        WCHECK(out.device() == at::Device(at::kCUDA, 0));
        WCHECK_OK(dist_autograd::Backward(agent, ctx.id(), {(out * out).sum()}));
        WCHECK_OK((*opt)->Step(ctx.id()));
      }
      reference.zero_grad();
      at::Tensor out = at::tanh(input.mm(ref[0]) + ref[1]);
      (out * out).sum().backward();
      reference.step();
      std::vector<at::Tensor> got = layer.rpc_sync(&CudaLayer::values);
      for (size_t i = 0; i < ref.size(); ++i) {
        ExpectClose(got[i], ref[i].detach(), absl::StrCat("step ", step, " param ", i));
      }
    }
  }
  WCHECK_OK(agent.Shutdown());
  return 0;
}

TEST(CudaRpc, EchoOfDtypesAndViewsArrivesOnTheMappedDevice) {
  SKIP_WITHOUT_GPU();
  ExpectAllSucceeded(RunWorkers("cuda_echo", 2, absl::Seconds(120)));
}

TEST(CudaRpc, AMapOfTheHostMovesTensorsBetweenTheHostAndTheGpu) {
  SKIP_WITHOUT_GPU();
  ExpectAllSucceeded(RunWorkers("cuda_host_map", 2, absl::Seconds(120)));
}

TEST(CudaRpc, WithoutAMapTheCallFailsNamingTheDeviceAndTheWorker) {
  SKIP_WITHOUT_GPU();
  ExpectAllSucceeded(RunWorkers("cuda_without_map", 2, absl::Seconds(120)));
}

TEST(CudaRpc, DistributedAutogradAndOptimizerMatchLocalTrainingOnTheGpu) {
  SKIP_WITHOUT_GPU();
  ExpectAllSucceeded(RunWorkers("cuda_autograd", 2, absl::Seconds(180)));
}

#ifdef BATON_TEST_WITH_CUDA_IPC
const std::map<std::string, std::string> kIpc = {{"BATON_TEST_CUDA_IPC", "1"}};

TEST(CudaIpc, I1_I3_EchoOfDtypesAndViewsWithEveryExportReleased) {
  SKIP_WITHOUT_GPU();
  ExpectAllSucceeded(RunWorkers("cuda_echo", 2, absl::Seconds(120), kIpc));
}

TEST(CudaIpc, I2_DistributedAutogradAndOptimizerMatchLocalTraining) {
  SKIP_WITHOUT_GPU();
  ExpectAllSucceeded(RunWorkers("cuda_autograd", 2, absl::Seconds(180), kIpc));
}

// Bytes LibTorch's caching allocator holds allocated on cuda:0. Index 0 is
// StatType::AGGREGATE, whose namespace moved between LibTorch 1.13 and 2.x.
int64_t AllocatedBytes() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
}

// I4: w0 exports 256 MiB to w1, which is stopped and cannot release it, then
// killed. Once w0 finds w1 dead, the export is dropped and the memory is
// back in w0's allocator: measured with the allocator's own count.
BATON_SCENARIO(cuda_ipc_receiver_dies) {
  Worker w = Start(kGpuToGpu);
  RpcAgent& agent = *w.agent;
  if (agent.self().id == 1) {
    // Stopped, then killed, by w0; it never returns from here.
    absl::Notification never;
    never.WaitForNotificationWithTimeout(absl::Seconds(120));
    return 1;
  }
  const pid_t victim = static_cast<pid_t>(agent.rpc_sync(1, pid_fn));
  (void)at::empty({1}, at::TensorOptions().device(at::kCUDA, 0));  // the allocator starts
  const int64_t before = AllocatedBytes();
  {
    at::Tensor big = at::ones({64 << 20}, at::TensorOptions().device(at::kCUDA, 0));
    WCHECK(kill(victim, SIGSTOP) == 0);
    (void)agent.rpc_async(CallOptions{absl::Seconds(60)}, 1, echo_fn, big);
  }
  // The export holds the memory: the tensor itself is gone here.
  WCHECK(baton::testing::Eventually([&] { return w.ipc->held() == 1; }));
  WCHECK(w.ipc->held_bytes() == (int64_t{256} << 20));
  const int64_t holding = AllocatedBytes();
  WCHECK(holding - before >= (int64_t{256} << 20));
  WCHECK(kill(victim, SIGKILL) == 0);
  WCHECK(baton::testing::Eventually([&] { return w.ipc->held() == 0; }, absl::Seconds(60)));
  const int64_t after = AllocatedBytes();
  std::printf("allocated on w0: %ld bytes before, %ld while exported, %ld after w1 died\n",
              static_cast<long>(before), static_cast<long>(holding), static_cast<long>(after));
  WCHECK(after == before);
  WCHECK_OK(agent.Shutdown(/*graceful=*/false));
  return 0;
}

// I6: w1 imports a tensor of ones, queues its sum behind 0.1 s of GPU work
// and frees it; the caching allocator hands the same memory to the import
// of a tensor of twos that arrives next. The sum must still see ones: the
// second copy waits for the work queued on the memory's stream.
BATON_SCENARIO(cuda_ipc_reuse) {
  Worker w = Start(kGpuToGpu);
  RpcAgent& agent = *w.agent;
  if (agent.self().id == 0) {
    const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
    const int64_t n = int64_t{1} << 20;
    agent.rpc_sync(1, sum_later_fn, at::ones({n}, cuda));
    agent.rpc_sync(1, receive_fn, at::full({n}, 2.0, cuda));
    const double sum = agent.rpc_sync(1, the_sum_fn);
    std::printf("sum of the first tensor: %.0f (ones: %ld)\n", sum, static_cast<long>(n));
    WCHECK(sum == static_cast<double>(n));
  }
  WCHECK_OK(agent.Shutdown());
  return 0;
}

TEST(CudaIpc, I6_MemoryReusedAfterAnImportIsNotOverwrittenUnderQueuedWork) {
  SKIP_WITHOUT_GPU();
  ExpectAllSucceeded(RunWorkers("cuda_ipc_reuse", 2, absl::Seconds(120), kIpc));
}

TEST(CudaIpc, I4_AKilledReceiverLeavesNoDeviceMemoryHeldOnTheSender) {
  SKIP_WITHOUT_GPU();
  const auto results = RunWorkers("cuda_ipc_receiver_dies", 2, absl::Seconds(120), kIpc);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results[0].exit_code == 0 && results[0].signal == 0) << Describe(results);
  EXPECT_EQ(results[1].signal, SIGKILL) << Describe(results);
  std::printf("%s", results[0].output.c_str());
}
#endif

}  // namespace
}  // namespace baton::rpc
