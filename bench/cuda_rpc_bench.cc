// cuda_rpc_bench: CUDA tensors through RPC between two processes on one GPU
// (docs/cuda.md), beside the limits measured in the same run. JSON lines:
//   d2d_copy_64MB_GBps     a 64 MB device-to-device copy in one process
//                          (bytes copied per second: the bound)
//   cuda_echo_64MB_GBps    a 64 MB CUDA tensor echoed (w0 -> w1 -> w0, device
//                          map cuda:0 -> cuda:0): bytes each way per second
//   small_cuda_call_us     median rpc_sync of a 4-element CUDA tensor
//   small_cpu_call_us      the same with a CPU tensor
//   cuda_over_cpu_call     small_cuda_call_us / small_cpu_call_us
// and where the time of a small CUDA call goes (the copies, the IPC export's
// calls, an event wait, a call that uses the GPU on one side only). Each
// line says the path and how the two processes share the GPU
// (BATON_BENCH_GPU_SHARING: "time-sliced", a CUDA context each, or "mps").
// tools/gpu/probe_cuda_rpc.py measures torch.distributed.rpc's figures.
//
//   cuda_rpc_bench                      host-staged
//   BATON_BENCH_CUDA_IPC=1 cuda_rpc_bench   through CUDA IPC (rpc/cuda/ipc_channel.h)
//   BATON_BENCH_CUDA_IPC_HOST_WAIT=1 as well: each receive waits for its copy
//                                       on the host (Options::stream_ordered off)
// (built by CMakeLists.txt with BATON_CUDA=ON)
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "rpc/agent.h"
#include "rpc/cuda/ipc_channel.h"
#include "testing/multiprocess.h"

namespace {

using baton::rpc::AgentOptions;
using baton::rpc::Function;
using baton::rpc::FunctionRegistry;
using baton::rpc::RpcAgent;

const Function<at::Tensor(at::Tensor)> echo_fn("echo");
const Function<at::Tensor(at::Tensor)> to_cpu_fn("to_cpu");
const Function<at::Tensor(at::Tensor)> to_cuda_fn("to_cuda");
const Function<at::Tensor(at::Tensor)> via_cuda_fn("via_cuda");

double NowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}

void Report(const char* metric, double value) {
  // Set by tools/gpu/build_and_test.sh when the processes run under MPS.
  const char* sharing = std::getenv("BATON_BENCH_GPU_SHARING");
  std::printf(
      "{\"system\": \"baton\", \"path\": \"%s\", \"gpu_sharing\": \"%s\", \"metric\": \"%s\", "
      "\"value\": %.6g}\n",
      !EnvIs("BATON_BENCH_CUDA_IPC", "1")            ? "host"
      : EnvIs("BATON_BENCH_CUDA_IPC_HOST_WAIT", "1") ? "cuda_ipc_host_wait"
                                                     : "cuda_ipc",
      sharing != nullptr ? sharing : "time-sliced", metric, value);
  std::fflush(stdout);
}

double MedianCallUs(RpcAgent& agent, const at::Tensor& t,
                    const Function<at::Tensor(at::Tensor)>& fn = echo_fn) {
  std::vector<double> times;
  for (int i = 0; i < 520; ++i) {
    const double t0 = NowS();
    (void)agent.rpc_sync(1, fn, t);
    if (i >= 20) times.push_back((NowS() - t0) * 1e6);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

BATON_SCENARIO(cuda_rpc_bench) {
  auto registry = std::make_shared<FunctionRegistry>();
  (void)registry->Register(echo_fn, [](at::Tensor t) { return t; });
  (void)registry->Register(to_cpu_fn, [](at::Tensor t) { return t.cpu(); });
  (void)registry->Register(to_cuda_fn, [](at::Tensor t) { return t.to(at::Device(at::kCUDA, 0)); });
  (void)registry->Register(via_cuda_fn,
                           [](at::Tensor t) { return t.to(at::Device(at::kCUDA, 0)).cpu(); });
  auto opts = AgentOptions::FromEnv("w");
  WCHECK_OK(opts.status());
  if (opts->rank == 0) opts->devices.maps["w1"] = {{0, 0}};
  baton::rpc::AgentCollaborators collaborators;
  std::shared_ptr<baton::rpc::cuda::CudaIpcChannel> channel;
  if (EnvIs("BATON_BENCH_CUDA_IPC", "1")) {
    baton::rpc::cuda::CudaIpcChannel::Options ipc_options;
    // The receive before stream ordering (rpc/cuda/ipc_channel.h, I2).
    ipc_options.stream_ordered = !EnvIs("BATON_BENCH_CUDA_IPC_HOST_WAIT", "1");
    channel = baton::rpc::cuda::CudaIpcChannel::Install(*registry, ipc_options);
    collaborators.cuda_channel = channel;
  }
  auto made = RpcAgent::Create(*opts, registry, std::move(collaborators));
  WCHECK_OK(made.status());
  RpcAgent& agent = **made;
  if (channel != nullptr) channel->Attach(&agent);
  if (agent.self().id == 0) {
    const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
    at::Tensor src = at::ones({16 << 20}, cuda), dst = at::empty_like(src);
    for (int i = 0; i < 5; ++i) dst.copy_(src);
    torch::cuda::synchronize();
    double t0 = NowS();
    for (int i = 0; i < 50; ++i) dst.copy_(src);
    torch::cuda::synchronize();
    Report("d2d_copy_64MB_GBps", 50 * src.nbytes() / (NowS() - t0) / 1e9);
    for (int i = 0; i < 3; ++i) (void)agent.rpc_sync(1, echo_fn, src);
    torch::cuda::synchronize();
    t0 = NowS();
    const int reps = 30;
    at::Tensor back;
    for (int i = 0; i < reps; ++i) back = agent.rpc_sync(1, echo_fn, src);
    // A stream-ordered receive hands the result on before its copy ends:
    // the time counts until the last copy has run.
    torch::cuda::synchronize();
    Report("cuda_echo_64MB_GBps", 2.0 * reps * src.nbytes() / (NowS() - t0) / 1e9);
    WCHECK(back.equal(src));
    const double cuda_us = MedianCallUs(agent, at::ones({4}, cuda));
    const double cpu_us = MedianCallUs(agent, at::ones({4}));
    Report("small_cuda_call_us", cuda_us);
    Report("small_cpu_call_us", cpu_us);
    Report("cuda_over_cpu_call", cuda_us / cpu_us);
    // Which direction costs: a CUDA argument with a CPU result, and back.
    Report("small_cuda_arg_cpu_result_us", MedianCallUs(agent, at::ones({4}, cuda), to_cpu_fn));
    Report("small_cpu_arg_cuda_result_us", MedianCallUs(agent, at::ones({4}), to_cuda_fn));
    // CPU in and out, two copies on the callee's executor thread.
    Report("small_cpu_call_via_callee_gpu_us", MedianCallUs(agent, at::ones({4}), via_cuda_fn));
    // Where a small host-staged call's time goes: its copies, alone.
    at::Tensor small = at::ones({4}, cuda), host = at::ones({4});
    auto median_us = [](auto fn) {
      std::vector<double> v;
      for (int i = 0; i < 220; ++i) {
        const double t0 = NowS();
        fn();
        if (i >= 20) v.push_back((NowS() - t0) * 1e6);
      }
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    Report("small_d2h_copy_us", median_us([&] { (void)small.to(at::kCPU); }));
    Report("small_h2d_copy_us", median_us([&] { (void)host.to(small.device()); }));
    Report("device_count_us", median_us([] { (void)torch::cuda::device_count(); }));
    // What CUDA IPC's export costs (rpc/cuda/ipc_channel.cc, I1), call by call.
    Report("ipc_mem_handle_us", median_us([&] {
             CUdeviceptr base = 0;
             size_t size = 0;
             cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(small.data_ptr()));
             cudaIpcMemHandle_t h;
             cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base));
           }));
    cudaEvent_t event = nullptr;
    cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess);
    Report("ipc_event_record_and_handle_us", median_us([&] {
             cudaEventRecord(event, c10::cuda::getCurrentCUDAStream().stream());
             cudaIpcEventHandle_t h;
             cudaIpcGetEventHandle(&h, event);
           }));
    Report("event_synchronize_us", median_us([&] {
             cudaEventRecord(event, c10::cuda::getCurrentCUDAStream().stream());
             cudaEventSynchronize(event);
           }));
    cudaEventDestroy(event);
    // The same host-to-device copy on a thread other than the first.
    double other_thread_us = 0;
    std::thread([&] {
      other_thread_us = median_us([&] { (void)host.to(small.device()); });
    }).join();
    Report("small_h2d_copy_other_thread_us", other_thread_us);
  }
  WCHECK_OK(agent.Shutdown());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int code = baton::testing::MaybeRunScenario(argc, argv);
  if (code >= 0) return code;
  auto results = baton::testing::RunWorkers("cuda_rpc_bench", 2, absl::Seconds(300));
  int status = 0;
  for (const auto& r : results) {
    if (r.rank == 0 || r.exit_code != 0 || r.signal != 0 || r.timed_out) {
      std::fputs(r.output.c_str(), stdout);
    }
    if (r.exit_code != 0 || r.signal != 0 || r.timed_out) status = 1;
  }
  return status;
}
