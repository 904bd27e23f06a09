// The peer's torch_pipeline_bench.py workload on baton's pipeline/: the
// same model, data, loss, optimizer, stage split, micro-batches and metric
// names (see the peer's docstring).
//
//   bazel-bin/bench/pipeline_bench [--quick] [--steps 30] [--warmup 3] [--stages 2,4]
//                                  [--micro 1,4,8] [--batch 128] [--schedule 1f1b]
//                                  [--trace-dir DIR] [--device cpu|cuda|cuda:N]
//
// Processes: one driver ("driver", rank 0) and max(stages) stage workers
// ("stage1".."stageP"), one LibTorch thread each, as the peer. The driver
// first measures, in its own process, the single-process baselines (the
// whole batch; gradients accumulated over m micro-batches; two threads),
// then runs the pipeline for every (p, m) with the schedule --schedule
// (1F1B by default; m = 1 is a plain sequential step) on stage1..stagep.
//
// Metrics (JSON lines, "system": "baton"): the peer's
//   single_process_train_samples_per_s, single_process_train_samples_per_s_threads2,
//   single_process_final_loss, single_process_microbatch_train_samples_per_s_m{m},
//   pipeline_train_samples_per_s_p{p}_m{m}, pipeline_final_loss_p{p}_m{m}
// (the loss lines carry loss_curve and max_rel_diff_vs_single_process), and
//   pipeline_bound_fraction_p{p}_m{m}: throughput / (p x the micro-batched
//       single-process throughput at m x m / (m + p - 1)), both from this run;
//   pipeline_bubble_p{p}_m{m}: the mean measured bubble of the timed steps,
//       with the schedule's theoretical one.
// --trace-dir writes each (p, m)'s last step as pipeline_p{p}_m{m}.json
// (Chrome trace) and .svg (timeline).
// --device cuda: the single-process baselines and every stage compute on
// the GPU (pipeline/stage.h, PP9; the stage processes share it). Stage
// workers map their device to each other's (AgentOptions::devices.maps) and,
// in a CUDA build (BATON_BENCH_CUDA_IPC, CMakeLists.txt), send activations
// and gradients through CUDA IPC; the driver sends host batches, as the
// single-process baseline moves its host batches onto the GPU.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/worker_procs.h"
#include "examples/device_flag.h"
#include "pipeline/pipeline.h"
#include "pipeline/schedule.h"
#include "pipeline/trace.h"
#include "rpc/agent.h"
#include "testing/models.h"

#ifdef BATON_BENCH_CUDA_IPC
#include "rpc/cuda/ipc_channel.h"
#endif

namespace baton {
namespace {

constexpr int kWidth = 1024, kBlocks = 4, kClasses = 10;
constexpr double kLr = 0.2;

torch::nn::Sequential MakeModel() {
  testing::MlpSpec spec;
  spec.inputs = kWidth;
  spec.width = kWidth;
  spec.blocks = kBlocks;
  spec.outputs = kClasses;
  spec.seed = 0;
  return testing::MakeMlp(spec);
}

struct Batch {
  torch::Tensor x, y;
};

// The peer's make_batches: one generator seeded 1234 for centres, labels, noise.
std::vector<Batch> MakeBatches(int n, int64_t batch) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(1234);
  torch::Tensor centers = at::randn({kClasses, kWidth}, g) * 0.5;
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) {
    torch::Tensor y = at::randint(0, kClasses, {batch}, g);
    torch::Tensor x = centers.index_select(0, y) + at::randn({batch, kWidth}, g);
    out.push_back({x, y});
  }
  return out;
}

struct Config {
  int steps = 30, warmup = 3;
  int64_t batch = 128;
  std::vector<int> stages{2, 4};
  std::vector<int> micro{1, 4, 8};
  std::string schedule = "1f1b";
  std::string trace_dir;
  std::string device = "cpu";
};

bench::JsonLine Line(const Config& c, const std::string& metric, double value,
                     const std::string& unit) {
  bench::JsonLine j;
  j.Add("system", "baton").Add("version", "0.1.0").Add("metric", metric).Add("value", value);
  j.Add("unit", unit).Add("model", "4x[Linear(1024,1024)+ReLU]+Linear(1024,10)");
  j.Add("optimizer", "SGD lr=0.2").Add("loss", "cross_entropy").Add("threads_per_process", 1);
  j.Add("cores", static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))).Add("batch", c.batch);
  j.Add("steps", c.steps).Add("timed_steps", c.steps - c.warmup).Add("device", c.device);
  return j;
}

std::string Curve(const std::vector<double>& v) {
  std::vector<std::string> parts;
  for (double x : v) parts.push_back(absl::StrFormat("%.6f", x));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

double MaxRelDiff(const std::vector<double>& a, const std::vector<double>& ref) {
  double d = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    d = std::max(d, std::abs(a[i] - ref[i]) / std::abs(ref[i]));
  }
  return d;
}

// One process, m = 1: the whole batch; m > 1: gradients accumulated over m
// micro-batches (the peer's train_local). Returns samples/s and the losses.
std::pair<double, std::vector<double>> TrainLocal(const Config& c, const std::vector<Batch>& data,
                                                  int m) {
  const torch::Device device(c.device);
  torch::nn::Sequential model = MakeModel();
  model->to(device);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  std::vector<double> losses;
  double t0 = 0;
  for (int i = 0; i < c.steps; ++i) {
    if (i == c.warmup) t0 = bench::Now();
    opt.zero_grad();
    double loss = 0;
    const torch::Tensor x = data[i].x.to(device), y = data[i].y.to(device);
    if (m == 1) {
      torch::Tensor l = torch::nn::functional::cross_entropy(model->forward(x), y);
      l.backward();
      loss = l.item<double>();
    } else {
      auto xs = x.split(c.batch / m), ys = y.split(c.batch / m);
      for (int k = 0; k < m; ++k) {
        torch::Tensor part =
            torch::nn::functional::cross_entropy(
                model->forward(xs[k]), ys[k],
                torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
            static_cast<double>(c.batch);
        part.backward();
        loss += part.item<double>();
      }
    }
    opt.step();
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
    losses.push_back(loss);
  }
  return {(c.steps - c.warmup) * c.batch / (bench::Now() - t0), losses};
}

absl::Status RunDriver(const Config& c, bench::WorkerChannel& ch) {
  const std::vector<Batch> data = MakeBatches(c.steps, c.batch);
  torch::set_num_threads(1);
  auto [single, curve] = TrainLocal(c, data, 1);
  Line(c, "single_process_train_samples_per_s", single, "samples/s").Print();
  Line(c, "single_process_final_loss", curve.back(), "cross-entropy")
      .Add("loss_curve", Curve(curve))
      .Print();
  std::map<int, double> mb_rate{{1, single}};
  for (int m : c.micro) {
    if (m == 1) continue;
    auto [rate, losses] = TrainLocal(c, data, m);
    mb_rate[m] = rate;
    Line(c, absl::StrCat("single_process_microbatch_train_samples_per_s_m", m), rate, "samples/s")
        .Add("micro_batches", m)
        .Add("final_loss", losses.back())
        .Print();
  }
  torch::set_num_threads(2);
  Line(c, "single_process_train_samples_per_s_threads2", TrainLocal(c, data, 1).first, "samples/s")
      .Print();
  torch::set_num_threads(1);

  auto opts = rpc::AgentOptions::FromEnv();
  if (!opts.ok()) return opts.status();
  auto agent = rpc::RpcAgent::Create(*opts, std::make_shared<rpc::FunctionRegistry>());
  if (!agent.ok()) return agent.status();
  for (int p : c.stages) {
    for (int m : c.micro) {
      pipeline::ScheduleSpec spec{p, m, 1};
      auto schedule = c.schedule == "gpipe" ? pipeline::GPipe(spec) : pipeline::OneFOneB(spec);
      if (!schedule.ok()) return schedule.status();
      pipeline::PipelineOptions po;
      for (int k = 1; k <= p; ++k) po.stage_workers.push_back(absl::StrCat("stage", k));
      po.schedule = *schedule;
      po.model = MakeModel;
      // The peer's split: blocks (Linear + ReLU) evenly, the head on the last stage.
      std::vector<int> cuts;
      for (int k = 0; k < p; ++k) cuts.push_back(k * 2 * (kBlocks / p));
      cuts.push_back(2 * kBlocks + 1);
      po.split = pipeline::Split::Layers(cuts);
      po.batch_size = c.batch;
      po.optimizer = dist_optim::OptimizerOptions::SGD(kLr);
      po.step_timeout = absl::Seconds(120);
      auto pipe = pipeline::Pipeline::Create(**agent, po);
      if (!pipe.ok()) return pipe.status();
      std::vector<double> losses;
      double t0 = 0, bubble = 0;
      absl::StatusOr<pipeline::StepResult> r;
      for (int i = 0; i < c.steps; ++i) {
        if (i == c.warmup) t0 = bench::Now();
        r = (*pipe)->Step(data[i].x, data[i].y);
        if (!r.ok()) return r.status();
        losses.push_back(r->loss);
        if (i >= c.warmup) bubble += r->bubble;
      }
      const double rate = (c.steps - c.warmup) * c.batch / (bench::Now() - t0);
      const double bound = p * mb_rate[m] * m / (m + p - 1.0);
      Line(c, absl::StrCat("pipeline_train_samples_per_s_p", p, "_m", m), rate, "samples/s")
          .Add("stages", p)
          .Add("micro_batches", m)
          .Add("processes", p + 1)
          .Add("schedule", schedule->name)
          .Print();
      Line(c, absl::StrCat("pipeline_final_loss_p", p, "_m", m), losses.back(), "cross-entropy")
          .Add("loss_curve", Curve(losses))
          .Add("max_rel_diff_vs_single_process", MaxRelDiff(losses, curve))
          .Print();
      Line(c, absl::StrCat("pipeline_bound_fraction_p", p, "_m", m), rate / bound, "fraction")
          .Add("bound_samples_per_s", bound)
          .Add("microbatch_single_process_samples_per_s", mb_rate[m])
          .Print();
      Line(c, absl::StrCat("pipeline_bubble_p", p, "_m", m), bubble / (c.steps - c.warmup),
           "fraction")
          .Add("theoretical", r->theoretical_bubble)
          .Print();
      if (!c.trace_dir.empty()) {
        const std::string base = absl::StrCat(c.trace_dir, "/pipeline_p", p, "_m", m);
        if (absl::Status s = (*pipe)->WriteTrace(base + ".json", *r); !s.ok()) return s;
        std::ofstream(base + ".svg") << pipeline::TimelineSvg(po.schedule, r->events);
      }
    }
  }
  // The main process then releases the stage workers into their shutdown.
  ch.Send("done");
  return (*agent)->Shutdown();
}

// A stage worker: serves its stages until the main process releases it.
absl::Status RunStage(const Config& c, int max_p, bench::WorkerChannel& ch) {
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  pipeline::StageServerOptions so{MakeModel};
  so.device = torch::Device(c.device);
  auto server = pipeline::StageServer::Create(*registry, so);
  if (!server.ok()) return server.status();
  auto opts = rpc::AgentOptions::FromEnv();
  if (!opts.ok()) return opts.status();
  rpc::AgentCollaborators collaborators;
#ifdef BATON_BENCH_CUDA_IPC
  std::shared_ptr<rpc::cuda::CudaIpcChannel> ipc;
#endif
  if (so.device.is_cuda()) {
    // Every stage worker shares this GPU: activations and gradients go
    // device to device between them.
    const int d = so.device.has_index() ? so.device.index() : 0;
    for (int k = 1; k <= max_p; ++k) {
      const std::string peer = absl::StrCat("stage", k);
      if (peer != opts->name) opts->devices.maps[peer] = {{d, d}};
    }
#ifdef BATON_BENCH_CUDA_IPC
    ipc = rpc::cuda::CudaIpcChannel::Install(*registry);
    collaborators.cuda_channel = ipc;
#endif
  }
  auto agent = rpc::RpcAgent::Create(*opts, registry, std::move(collaborators));
  if (!agent.ok()) return agent.status();
#ifdef BATON_BENCH_CUDA_IPC
  if (ipc != nullptr) ipc->Attach(agent->get());
#endif
  ch.Send("ready");
  if (!ch.WaitRelease()) {
    return absl::AbortedError("the main process ended before it released this worker");
  }
  return (*agent)->Shutdown();
}

}  // namespace

int Main(int argc, char** argv) {
  const std::vector<std::string> args = bench::ForwardedArgs(argc, argv);
  bench::Flags flags(
      {"steps", "warmup", "stages", "micro", "batch", "schedule", "trace-dir", "device"},
      {"quick"});
  if (!flags.Parse(args)) return 2;
  const bool quick = flags.Bool("quick");
  Config c;
  c.steps = static_cast<int>(flags.Int("steps", quick ? 8 : 30));
  c.warmup = static_cast<int>(flags.Int("warmup", quick ? 2 : 3));
  c.batch = flags.Int("batch", 128);
  c.schedule = flags.Str("schedule", "1f1b");
  c.trace_dir = flags.Str("trace-dir", "");
  c.device = flags.Str("device", "cpu");
  if (auto d = examples::ParseDeviceFlag(c.device); !d.ok()) {
    std::fprintf(stderr, "%s\n", std::string(d.status().message()).c_str());
    return 2;
  }
  auto ints = [](const std::string& text, std::vector<int>* out) {
    out->clear();
    for (absl::string_view v : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
      int n;
      if (!absl::SimpleAtoi(v, &n) || n < 1) return false;
      out->push_back(n);
    }
    return !out->empty();
  };
  if (!ints(flags.Str("stages", quick ? "2" : "2,4"), &c.stages) ||
      !ints(flags.Str("micro", "1,4,8"), &c.micro) || c.warmup < 0 || c.warmup >= c.steps ||
      (c.schedule != "1f1b" && c.schedule != "gpipe")) {
    std::fprintf(stderr, "bad --stages, --micro, --steps/--warmup or --schedule (1f1b, gpipe)\n");
    return 2;
  }
  for (int p : c.stages) {
    if (kBlocks % p != 0) {
      std::fprintf(stderr, "--stages: %d does not divide the 4 blocks\n", p);
      return 2;
    }
  }
  for (int m : c.micro) {
    if (c.batch % m != 0) {
      std::fprintf(stderr, "--micro: %d does not divide the batch %lld\n", m,
                   static_cast<long long>(c.batch));
      return 2;
    }
  }
  const int max_p = *std::max_element(c.stages.begin(), c.stages.end());
  const int worker = bench::WorkerIndex(argc, argv);
  if (worker >= 0) {
    torch::set_num_threads(1);
    bench::WorkerChannel ch = bench::WorkerChannel::Open();
    absl::Status s;
    try {
      if (worker == 0) {
        s = RunDriver(c, ch);
      } else {
        s = RunStage(c, max_p, ch);
      }
    } catch (const std::exception& e) {
      s = absl::InternalError(e.what());
    }
    if (!s.ok()) {
      std::fprintf(stderr, "pipeline_bench worker %d: %s\n", worker, s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  std::vector<bench::WorkerSpec> specs = {{"driver", 0}};
  for (int k = 1; k <= max_p; ++k) specs.push_back({absl::StrCat("stage", k), k});
  const char* port_env = std::getenv("MASTER_PORT");
  int port = 0;
  if (port_env == nullptr || !absl::SimpleAtoi(port_env, &port)) port = 20000 + getpid() % 20000;
  auto group = bench::WorkerGroup::Spawn(specs, args, port);
  if (!group.ok()) {
    std::fprintf(stderr, "%s\n", group.status().ToString().c_str());
    return 1;
  }
  absl::Status s =
      (*group)->Wait(absl::Seconds(1800), absl::Seconds(20), [&](int w, const std::string& line) {
        if (w == 0 && line == "done") (*group)->ReleaseAll();
      });
  if (!s.ok()) {
    std::fprintf(stderr, "pipeline_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
