// baton's dense parameter-server benchmark: the workload, metric names and
// JSON lines of the peer script shared/peer/torch_ps_bench.py, so both can be
// set side by side (bench/compare_ps.sh).
//
//   ps_bench [--mode sync|async|local] [--trainers 4] [--steps 200] [--batch 64]
//            [--warmup 10] [--quick] [--timeout 900] [--device cpu|cuda|cuda:N]
//            [--same_host_shm 1|0] [--timeline DIR]
//
// --same_host_shm 0: dense pulls and pushes carry their values in the
// messages, as between hosts; 1 (the default): they go through the server's
// parameter board and the trainers' gradient boxes (ps/client.h).
// --timeline DIR: each trainer writes DIR/trainer<t>.tsv, one line per timed
// step: the step's start, the end of its pull, of its compute and of its
// push, in seconds on the machine's monotonic clock (bench::Now), so that
// how many trainers computed at once, and when, can be read afterwards.
//
// --device: where the trainers (and --mode local) compute; the server keeps
// the parameters in host memory, and each trainer's ModuleBinding copies
// them onto the device on a pull and the gradients off it on a push. So
// `--mode local --device cuda` is the single-process GPU figure that
// `--mode sync|async --device cuda` is set beside.
//
// Workload (the peer's): a 784-256-10 MLP created after torch::manual_seed(0),
// SGD lr 0.05; trainer ranks r = 1..N each draw their own synthetic batches
// (centers = randn(10, 784) * 0.5 from a generator seeded 1234; per trainer a
// generator seeded 100 + r; y = randint(0, 10, (batch,)), x = centers[y] +
// randn(batch, 784)). Every process runs torch::set_num_threads(1).
//   sync : one ps::PsServer ("ps0", rank 0) holds the model as dense tables
//          (ps::ModuleBinding); trainers pull, compute gradients, push; the
//          server averages the N trainers' gradients per step and steps SGD
//          (ps::Consistency::Sync()).
//   async: the same, each push applied at once (ps::Consistency::Async()).
//   local: the compute-only bound: N trainer processes, started together,
//          each training a private copy with torch::optim::SGD, no server.
// Each trainer runs warmup + steps steps and times the last `steps`; a step
// is forward/backward plus the exchange with the server, the model after the
// step back in hand (the peer's push returns the new model).
// Metrics, as the peer prints them: ps_{mode}_train_throughput = all
// trainers' timed samples / the slowest trainer's timed wall, and
// ps_{mode}_final_loss = mean of the trainers' last losses.
// baton's own, the per-step split that says where a step's time goes (means
// over the trainers' timed steps; issue 28's "distance to the bound"):
//   ps_{mode}_step_{compute,pull,push}_ms: a trainer's wall time per step in
//     forward/backward, in Pull() (waiting for the previous push, the pull
//     and the copy into the module) and in Push() (handing the gradients
//     over);
//   ps_{mode}_trainer_cpu_ms_per_step: a trainer process's CPU per step, all
//     its threads (getrusage);
//   ps_{mode}_server_cpu_ms_per_step: the server process's CPU from its
//     agent's start to its end, per trainer step (pushes / trainers);
//   ps_{mode}_cpu_busy: every process's CPU over the timed wall times the
//     machine's cores (1: every core busy all the time);
//   ps_{mode}_board_pull_fraction, ps_{mode}_box_push_fraction: of the
//     trainers' dense pulls and pushes, those that went through shared
//     memory; ps_{mode}_shared_memory_bytes: the shared memory that costs
//     (the server's parameter board and the trainers' gradient boxes);
//   ps_{mode}_wall_with_{k}_computing, k = 0..trainers: the fraction of the
//     timed wall during which exactly k trainers were in forward/backward
//     (from the per-step timestamps of --timeline, kept in a temporary
//     directory when it is not given): on 2 cores, the time with fewer than
//     2 computing is where cores idle or serve the exchange.
//
// The binary is its own driver: it starts the server and trainers as worker
// processes of itself (bench/worker_procs.h), which send their results back
// through a pipe; the driver prints the JSON lines.
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "bench/worker_procs.h"
#include "ps/client.h"
#include "ps/module_binding.h"
#include "ps/server.h"
#include "ps/spec.h"
#include "rpc/agent.h"

namespace {

namespace bench = baton::bench;
namespace ps = baton::ps;
using baton::rpc::AgentOptions;
using baton::rpc::FunctionRegistry;
using baton::rpc::RpcAgent;

constexpr double kLr = 0.05;
constexpr int kWorldSizeLimit = 1024;

struct Config {
  std::string mode = "sync";  // sync | async | local
  int trainers = 4;
  int64_t steps = 200;
  int64_t batch = 64;
  int64_t warmup = 10;
  int64_t timeout_s = 900;
  int master_port = 29612;
  std::string device = "cpu";  // where trainers (and --mode local) compute
  bool same_host_shm = true;
  std::string timeline;  // directory for per-step timestamps; empty: none
};

torch::nn::Sequential MakeModel() {
  torch::manual_seed(0);
  // One statement per layer: the order of a call's arguments is unspecified
  // (GCC builds them last to first), and the layers draw from the generator.
  torch::nn::Linear first(784, 256);
  torch::nn::Linear second(256, 10);
  return torch::nn::Sequential(first, torch::nn::ReLU(), second);
}

// The peer's batches(rank, batch), drawn from LibTorch's CPU generator as
// torch.Generator().manual_seed(...) draws them.
class Batches {
 public:
  Batches(int rank, int64_t batch)
      : batch_(batch), gen_(at::make_generator<at::CPUGeneratorImpl>(100 + rank)) {
    at::Generator centers_gen = at::make_generator<at::CPUGeneratorImpl>(1234);
    centers_ = at::randn({10, 784}, centers_gen) * 0.5;
  }
  std::pair<at::Tensor, at::Tensor> Next() {
    at::Tensor y = at::randint(0, 10, {batch_}, gen_);
    at::Tensor x = centers_.index({y}) + at::randn({batch_, 784}, gen_);
    return {x, y};
  }

 private:
  int64_t batch_;
  at::Generator gen_;
  at::Tensor centers_;
};

ps::PsSpec MakeSpec(const Config& cfg) {
  torch::nn::Sequential model = MakeModel();
  ps::PsSpec spec;
  spec.tables =
      ps::ModuleBinding::Tables(*model, "mlp", baton::dist_optim::OptimizerOptions::SGD(kLr));
  spec.consistency = cfg.mode == "sync" ? ps::Consistency::Sync() : ps::Consistency::Async();
  spec.num_trainers = cfg.trainers;
  // A benchmark must not quietly drop a slow trainer (that changes what the
  // sync run computes): fail loudly instead, after a long wait.
  spec.trainer_timeout = absl::Seconds(120);
  spec.straggler_policy = ps::StragglerPolicy::kFail;
  return spec;
}

struct Result {
  double samples = 0;
  double wall = 0;
  double loss = 0;
  // Seconds over the timed steps: wall in each part of a step, and the
  // process's CPU.
  double compute = 0, pull = 0, push = 0, cpu = 0;
  // Dense pulls and pushes through shared memory, of `steps` each; bytes
  // this trainer mapped for them.
  double board_pulls = 0, box_pushes = 0, steps = 0, shm_bytes = 0;
  std::string Line() const {
    return "result " + bench::Numbers({samples, wall, loss, compute, pull, push, cpu, board_pulls,
                                       box_pushes, steps, shm_bytes});
  }
};

absl::StatusOr<std::unique_ptr<RpcAgent>> MakeAgent(std::shared_ptr<FunctionRegistry> registry) {
  auto opts = AgentOptions::FromEnv();
  if (!opts.ok()) return opts.status();
  opts->timeouts.rpc = absl::Seconds(120);
  opts->timeouts.init = absl::Seconds(120);
  opts->timeouts.shutdown = absl::Seconds(60);
  return RpcAgent::Create(*opts, std::move(registry));
}

// Trainer t (data rank t + 1) against the server.
absl::StatusOr<Result> TrainPs(RpcAgent& agent, const Config& cfg, int t) {
  torch::nn::Sequential model = MakeModel();
  const at::Device device(cfg.device);
  model->to(device);  // the servers hold host tensors (ps/module_binding.h)
  ps::PsClient::Options o;
  o.trainer = t;
  o.servers = {"ps0"};
  o.timeout = absl::Seconds(120);
  o.same_host_shm = cfg.same_host_shm;
  auto client = ps::PsClient::Create(agent, MakeSpec(cfg), o);
  if (!client.ok()) return client.status();
  auto binding = ps::ModuleBinding::Create(**client, *model, "mlp");
  if (!binding.ok()) return binding.status();
  Batches data(t + 1, cfg.batch);
  Result r;
  std::vector<std::array<double, 4>> marks;  // --timeline
  marks.reserve(cfg.steps);
  double t0 = bench::Now(), cpu0 = bench::ProcessCpuSeconds();
  for (int64_t step = 0; step < cfg.warmup + cfg.steps; ++step) {
    const bool timed = step >= cfg.warmup;
    if (step == cfg.warmup) {
      t0 = bench::Now();
      cpu0 = bench::ProcessCpuSeconds();
    }
    // The model after the previous step (Create() pulled the first).
    double at = bench::Now();
    std::array<double, 4> mark{at, 0, 0, 0};
    if (step > 0) {
      if (absl::Status s = binding->Pull(); !s.ok()) return s;
    }
    double now = bench::Now();
    mark[1] = now;
    if (timed) r.pull += now - at;
    at = now;
    auto [x, y] = data.Next();
    model->zero_grad();
    at::Tensor l = torch::nn::functional::cross_entropy(model->forward(x.to(device)), y.to(device));
    l.backward();
    r.loss = l.item<double>();
    now = bench::Now();
    mark[2] = now;
    if (timed) r.compute += now - at;
    at = now;
    binding->Push();
    mark[3] = bench::Now();
    if (timed) r.push += mark[3] - at;
    if (timed) marks.push_back(mark);
  }
  if (!cfg.timeline.empty()) {
    std::string lines;
    for (const auto& m : marks) {
      absl::StrAppend(&lines, absl::StrFormat("%.6f\t%.6f\t%.6f\t%.6f\n", m[0], m[1], m[2], m[3]));
    }
    const std::string path = absl::StrCat(cfg.timeline, "/trainer", t, ".tsv");
    if (FILE* f = std::fopen(path.c_str(), "w"); f != nullptr) {
      std::fputs(lines.c_str(), f);
      std::fclose(f);
    }
  }
  // The model after the last step, as the peer's last push returns it.
  const double at = bench::Now();
  if (absl::Status s = binding->Pull(); !s.ok()) return s;
  r.pull += bench::Now() - at;
  r.samples = static_cast<double>(cfg.steps * cfg.batch);
  r.wall = bench::Now() - t0;
  r.cpu = bench::ProcessCpuSeconds() - cpu0;
  const ps::PsClient::SameHostStats shm = (*client)->SameHost();
  r.board_pulls = static_cast<double>(shm.board_reads);
  r.box_pushes = static_cast<double>(shm.box_pushes);
  r.steps = static_cast<double>(cfg.warmup + cfg.steps);
  r.shm_bytes = static_cast<double>(shm.bytes);
  return r;
}

// --mode local: the peer's train_local.
Result TrainLocal(const Config& cfg, int rank) {
  torch::nn::Sequential model = MakeModel();
  const at::Device device(cfg.device);
  model->to(device);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  Batches data(rank, cfg.batch);
  Result r;
  double t0 = bench::Now(), cpu0 = bench::ProcessCpuSeconds();
  for (int64_t step = 0; step < cfg.warmup + cfg.steps; ++step) {
    if (step == cfg.warmup) {
      t0 = bench::Now();
      cpu0 = bench::ProcessCpuSeconds();
    }
    auto [x, y] = data.Next();
    opt.zero_grad();
    at::Tensor l = torch::nn::functional::cross_entropy(model->forward(x.to(device)), y.to(device));
    l.backward();
    opt.step();
    r.loss = l.item<double>();
  }
  r.samples = static_cast<double>(cfg.steps * cfg.batch);
  r.wall = bench::Now() - t0;
  r.compute = r.wall;
  r.cpu = bench::ProcessCpuSeconds() - cpu0;
  return r;
}

absl::Status RunServer(const Config& cfg, bench::WorkerChannel& ch) {
  auto registry = std::make_shared<FunctionRegistry>();
  ps::ServerOptions so;
  so.same_host_shm = cfg.same_host_shm;
  auto server = ps::PsServer::Create(MakeSpec(cfg), so, *registry);
  if (!server.ok()) return server.status();
  const double cpu0 = bench::ProcessCpuSeconds();
  auto agent = MakeAgent(registry);
  if (!agent.ok()) return agent.status();
  // Serve until the driver says every trainer is done.
  const bool released = ch.WaitRelease();
  ch.Send(absl::StrCat("pushes ", (*server)->shard().Stats().applied_pushes, " ",
                       bench::ProcessCpuSeconds() - cpu0, " ", (*server)->shared_memory_bytes()));
  absl::Status stopped = (*server)->Stop(false);
  absl::Status s = (*agent)->Shutdown(released);
  if (!released) return absl::AbortedError("the driver gave up");
  return stopped.ok() ? s : stopped;
}

absl::Status RunTrainer(const Config& cfg, int t, bench::WorkerChannel& ch) {
  auto agent = MakeAgent(std::make_shared<FunctionRegistry>());
  if (!agent.ok()) return agent.status();
  auto r = TrainPs(**agent, cfg, t);
  if (!r.ok()) {
    (void)(*agent)->Shutdown(false);
    return r.status();
  }
  ch.Send(r->Line());
  ch.Send("done");
  // Shut down together (a graceful shutdown is a barrier of all workers).
  const bool released = ch.WaitRelease();
  absl::Status s = (*agent)->Shutdown(released);
  return released ? s : absl::AbortedError("the driver gave up");
}

absl::Status RunLocalTrainer(const Config& cfg, int t, bench::WorkerChannel& ch) {
  ch.Send("ready");
  if (!ch.WaitRelease()) return absl::AbortedError("the driver gave up");  // start together
  ch.Send(TrainLocal(cfg, t + 1).Line());
  ch.Send("done");
  return absl::OkStatus();
}

int RunWorker(const Config& cfg, int index) {
  torch::set_num_threads(1);
  bench::WorkerChannel ch = bench::WorkerChannel::Open();
  const bool local = cfg.mode == "local";
  // Local: workers are trainers 0..N-1; otherwise worker 0 is the server.
  const int t = local ? index : index - 1;
  const std::string who = index == 0 && !local ? "ps0" : absl::StrCat("trainer", t);
  absl::Status s;
  try {
    s = local ? RunLocalTrainer(cfg, t, ch) : t < 0 ? RunServer(cfg, ch) : RunTrainer(cfg, t, ch);
  } catch (const std::exception& e) {
    s = absl::InternalError(absl::StrCat("exception: ", e.what()));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "ps_bench %s: %s\n", who.c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}

void Report(const Config& cfg, const std::string& metric, double value, const std::string& unit,
            const std::string& error = "") {
  bench::JsonLine j;
  j.Add("system", "baton").Add("version", "0.1.0").Add("mode", cfg.mode);
  j.Add("device", cfg.device);
  j.Add("trainers", cfg.trainers).Add("batch", cfg.batch).Add("steps", cfg.steps);
  j.Add("metric", metric).Add("value", value).Add("unit", unit);
  if (!error.empty()) j.Add("error", error);
  j.Print();
}

// --timeline: the fraction of the timed wall (the first timed step's start
// to the last one's end, over all trainers) with exactly k trainers
// computing, k = 0..trainers; empty if a file is missing.
std::vector<double> ComputeConcurrency(const std::string& dir, int trainers) {
  std::vector<std::pair<double, int>> events;  // (time, +1 compute starts / -1 ends)
  double begin = 1e300, end = 0;
  for (int t = 0; t < trainers; ++t) {
    FILE* f = std::fopen(absl::StrCat(dir, "/trainer", t, ".tsv").c_str(), "r");
    if (f == nullptr) return {};
    double start, pulled, computed, pushed;
    while (std::fscanf(f, "%lf %lf %lf %lf", &start, &pulled, &computed, &pushed) == 4) {
      events.push_back({pulled, 1});
      events.push_back({computed, -1});
      begin = std::min(begin, start);
      end = std::max(end, pushed);
    }
    std::fclose(f);
  }
  if (events.empty() || end <= begin) return {};
  std::sort(events.begin(), events.end());
  std::vector<double> with(trainers + 1, 0);
  int now = 0;
  double last = begin;
  for (const auto& [at, delta] : events) {
    with[std::clamp(now, 0, trainers)] += at - last;
    now += delta;
    last = at;
  }
  with[std::clamp(now, 0, trainers)] += end - last;
  for (double& w : with) w /= end - begin;
  return with;
}

int Drive(const Config& cfg, const std::vector<std::string>& in_args) {
  const bool local = cfg.mode == "local";
  // The trainers' per-step timestamps: where --timeline says, else in a
  // temporary directory removed at the end.
  std::vector<std::string> args = in_args;
  std::string timeline = cfg.timeline;
  std::string own_dir;
  if (!local && timeline.empty()) {
    char dir[] = "/tmp/ps_bench_timeline.XXXXXX";
    if (::mkdtemp(dir) != nullptr) {
      own_dir = timeline = dir;
      args.push_back("--timeline");
      args.push_back(timeline);
    }
  }
  absl::Cleanup remove_own_dir = [&own_dir, &cfg] {
    if (own_dir.empty()) return;
    for (int t = 0; t < cfg.trainers; ++t) {
      std::remove(absl::StrCat(own_dir, "/trainer", t, ".tsv").c_str());
    }
    ::rmdir(own_dir.c_str());
  };
  std::vector<bench::WorkerSpec> specs;
  if (!local) specs.push_back({"ps0", 0});
  for (int t = 0; t < cfg.trainers; ++t) {
    specs.push_back({absl::StrCat("trainer", t), static_cast<int>(specs.size())});
  }
  const int first_trainer = local ? 0 : 1;
  auto group = bench::WorkerGroup::Spawn(specs, args, cfg.master_port);
  absl::Status s = group.status();
  std::vector<Result> results;
  int64_t pushes = -1;
  double server_cpu = 0, server_shm = 0;
  if (s.ok()) {
    int ready = 0, done = 0;
    s = (*group)->Wait(
        absl::Seconds(cfg.timeout_s), absl::Seconds(20), [&](int w, const std::string& line) {
          if (line == "ready" && ++ready == cfg.trainers) (*group)->ReleaseAll();
          if (line == "done" && w >= first_trainer && ++done == cfg.trainers && !local) {
            (*group)->ReleaseAll();  // the server and trainers shut down together
          }
          if (absl::StartsWith(line, "result ")) {
            std::vector<double> v = bench::ParseNumbers(line.substr(7));
            if (v.size() == 11) {
              results.push_back(
                  Result{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10]});
            }
          }
          if (absl::StartsWith(line, "pushes ")) {
            std::vector<double> v = bench::ParseNumbers(line.substr(7));
            if (v.size() == 3) {
              pushes = static_cast<int64_t>(v[0]);
              server_cpu = v[1];
              server_shm = v[2];
            }
          }
        });
  }
  if (s.ok() && static_cast<int>(results.size()) != cfg.trainers) {
    s = absl::InternalError(
        absl::StrCat(results.size(), " of ", cfg.trainers, " trainers sent a result"));
  }
  if (!s.ok()) {
    Report(cfg, "ps_train_failed", 1, "error", s.ToString());
    return 1;
  }
  double samples = 0, wall = 0, loss = 0;
  double compute = 0, pull = 0, push = 0, cpu = 0, trainer_cpu = 0;
  for (const Result& r : results) {
    samples += r.samples;
    wall = std::max(wall, r.wall);
    loss += r.loss / results.size();
    compute += r.compute / results.size();
    pull += r.pull / results.size();
    push += r.push / results.size();
    cpu += r.cpu / results.size();
    trainer_cpu += r.cpu;
  }
  if (pushes >= 0)
    std::fprintf(stderr, "ps_bench: the server applied %lld pushes\n",
                 static_cast<long long>(pushes));
  Report(cfg, absl::StrCat("ps_", cfg.mode, "_train_throughput"), samples / wall, "samples/s");
  Report(cfg, absl::StrCat("ps_", cfg.mode, "_final_loss"), loss, "cross-entropy");
  // The per-step split (ms per timed step, means over the trainers).
  const double per_step = 1000.0 / static_cast<double>(cfg.steps);
  const std::string p = absl::StrCat("ps_", cfg.mode, "_");
  Report(cfg, p + "step_compute_ms", compute * per_step, "ms");
  if (!local) {
    Report(cfg, p + "step_pull_ms", pull * per_step, "ms");
    Report(cfg, p + "step_push_ms", push * per_step, "ms");
  }
  Report(cfg, p + "trainer_cpu_ms_per_step", cpu * per_step, "ms");
  double all_cpu = trainer_cpu;
  if (!local && pushes > 0) {
    const double server_steps = static_cast<double>(pushes) / cfg.trainers;
    Report(cfg, p + "server_cpu_ms_per_step", server_cpu * 1000.0 / server_steps, "ms");
    // The server's CPU of the timed window: its share of the pushes.
    all_cpu += server_cpu * static_cast<double>(cfg.steps) / server_steps;
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  Report(cfg, p + "cpu_busy", all_cpu / (wall * cores), "fraction");
  if (!local) {
    double board = 0, box = 0, steps = 0, shm = server_shm;
    for (const Result& r : results) {
      board += r.board_pulls;
      box += r.box_pushes;
      steps += r.steps;
      shm += r.shm_bytes;
    }
    // Create() pulls once more than the steps (the first model).
    Report(cfg, p + "board_pull_fraction", steps > 0 ? board / (steps + cfg.trainers) : 0,
           "fraction");
    Report(cfg, p + "box_push_fraction", steps > 0 ? box / steps : 0, "fraction");
    Report(cfg, p + "shared_memory_bytes", shm, "bytes");
    if (!timeline.empty()) {
      const std::vector<double> with = ComputeConcurrency(timeline, cfg.trainers);
      for (size_t k = 0; k < with.size(); ++k) {
        Report(cfg, absl::StrCat(p, "wall_with_", k, "_computing"), with[k], "fraction");
      }
    }
  }

  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = bench::ForwardedArgs(argc, argv);
  bench::Flags flags({"mode", "trainers", "steps", "batch", "warmup", "timeout", "device",
                      "same_host_shm", "timeline"},
                     {"quick"});
  if (!flags.Parse(args)) return 2;
  Config cfg;
  cfg.mode = flags.Str("mode", cfg.mode);
  cfg.trainers = static_cast<int>(flags.Int("trainers", cfg.trainers));
  cfg.steps = flags.Int("steps", flags.Bool("quick") ? 50 : cfg.steps);
  cfg.batch = flags.Int("batch", cfg.batch);
  cfg.warmup = flags.Int("warmup", cfg.warmup);
  cfg.timeout_s = flags.Int("timeout", cfg.timeout_s);
  cfg.device = flags.Str("device", cfg.device);
  cfg.same_host_shm = flags.Int("same_host_shm", 1) != 0;
  cfg.timeline = flags.Str("timeline", "");
  if (const char* p = std::getenv("MASTER_PORT"); p != nullptr && *p != '\0') {
    cfg.master_port = std::atoi(p);
  }
  if (cfg.mode != "sync" && cfg.mode != "async" && cfg.mode != "local") {
    std::fprintf(stderr, "--mode must be sync, async or local (got '%s')\n", cfg.mode.c_str());
    return 2;
  }
  try {
    const at::Device d(cfg.device);
    if (d.is_cuda() && !torch::cuda::is_available()) {
      std::fprintf(stderr, "--device %s: this process sees no CUDA device\n", cfg.device.c_str());
      return 2;
    }
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "--device: '%s' is not a device name: %s\n", cfg.device.c_str(),
                 e.what_without_backtrace());
    return 2;
  }
  if (cfg.trainers < 1 || cfg.trainers >= kWorldSizeLimit || cfg.steps < 1 || cfg.batch < 1 ||
      cfg.warmup < 0) {
    std::fprintf(stderr, "need --trainers in [1, %d), --steps >= 1, --batch >= 1, --warmup >= 0\n",
                 kWorldSizeLimit);
    return 2;
  }
  const int worker = bench::WorkerIndex(argc, argv);
  return worker >= 0 ? RunWorker(cfg, worker) : Drive(cfg, args);
}
