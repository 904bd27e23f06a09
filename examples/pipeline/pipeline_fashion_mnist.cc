// Pipeline-parallel training of a deep MLP on Fashion-MNIST (pipeline/).
//
//   bazel-bin/launcher/baton-run --standalone --role driver:1 --role stage:2
//       bazel-bin/examples/pipeline/pipeline_fashion_mnist --schedule 1f1b --microbatches 8
//
// One binary; BATON_ROLE picks the behaviour:
// - stage<k>: serves its stages (pipeline::StageServer) until the driver
//   finishes.
// - driver0 (rank 0): splits the model over the stage workers (balanced by
//   parameter count), runs the training steps (pipeline::Pipeline), prints a
//   progress line every --log_every steps (step, loss, test accuracy on the
//   first 1000 test images, samples/s, measured and theoretical bubble),
//   evaluates the whole test set at the end and prints
//   "RESULT OK: test accuracy A >= --min_accuracy" (else RESULT FAIL, exit 1).
//
// Model: 784 -> --hidden_layers x [Linear(--width), ReLU] -> Linear(10),
// PyTorch's default init with seed --seed; SGD with momentum 0.9; the loss is
// cross-entropy, the mean over each batch of --batch_size. Batches come from
// a per-epoch shuffle seeded by --seed and the epoch, so step k always sees
// the same batch, also after a restart.
//
// Checkpoints: with --checkpoint_dir DIR and --checkpoint_every N the stages
// save their parameters and optimizer state every N steps. A driver that
// starts while DIR holds a checkpoint resumes from it, so under
// `baton-run --max_restarts K` a killed stage worker leads to a restart that
// continues from the last checkpoint, with the same result as an
// uninterrupted run.
//
// --trace FILE writes the Chrome trace (chrome://tracing, Perfetto) of step
// --trace_step (default: the last step); --svg FILE draws it as an image.
//
// --device cuda|cuda:N: the stages compute on that GPU (pipeline/stage.h,
// PP9); stage workers on one GPU map it to each other's, so activations and
// gradients go device to device. A device a process cannot use is refused
// at start, naming the flag.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include <ATen/Parallel.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data/fashion_mnist.h"
#include "env/env.h"
#include "examples/device_flag.h"
#include "examples/flags.h"
#include "pipeline/pipeline.h"
#include "pipeline/schedule.h"
#include "pipeline/trace.h"
#include "rpc/agent.h"

namespace {

using namespace baton;  // NOLINT: an example, kept short

struct Flags {
  std::string schedule = "1f1b";
  int64_t microbatches = 8;
  int64_t chunks = 1;
  int64_t batch_size = 128;
  int64_t width = 1024;
  int64_t hidden_layers = 4;
  double lr = 0.02;
  int64_t epochs = 1;
  int64_t steps = 0;
  int64_t seed = 0;
  int64_t log_every = 50;
  double min_accuracy = 0.84;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  std::string trace;
  std::string svg;
  int64_t trace_step = -1;
  double step_timeout = 60;
  double job_timeout = 1800;
  std::string device = "cpu";
};

int Fail(const std::string& who, const std::string& what, const absl::Status& s) {
  std::printf("[%s] RESULT FAIL: %s: %s\n", who.c_str(), what.c_str(), s.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

torch::nn::Sequential MakeModel(const Flags& f) {
  torch::manual_seed(f.seed);
  torch::nn::Sequential m;
  int64_t in = data::kFashionMnistRows * data::kFashionMnistCols;
  for (int64_t i = 0; i < f.hidden_layers; ++i) {
    m->push_back(torch::nn::Linear(in, f.width));
    m->push_back(torch::nn::ReLU());
    in = f.width;
  }
  m->push_back(torch::nn::Linear(in, data::kFashionMnistClasses));
  return m;
}

// The batch of step k: epoch k / steps_per_epoch, shuffled by (seed, epoch).
class Batches {
 public:
  Batches(data::Split train, int64_t batch, int64_t seed)
      : train_(std::move(train)), batch_(batch), seed_(seed) {}
  int64_t steps_per_epoch() const { return train_.images.size(0) / batch_; }
  std::pair<torch::Tensor, torch::Tensor> Get(int64_t step) {
    const int64_t epoch = step / steps_per_epoch(), i = step % steps_per_epoch();
    if (epoch != epoch_) {
      torch::manual_seed(static_cast<uint64_t>(seed_ * 1000 + epoch));
      order_ = torch::randperm(train_.images.size(0), torch::kLong);
      epoch_ = epoch;
    }
    torch::Tensor idx = order_.slice(0, i * batch_, (i + 1) * batch_);
    return {train_.images.index_select(0, idx), train_.labels.index_select(0, idx)};
  }

 private:
  data::Split train_;
  int64_t batch_, seed_, epoch_ = -1;
  torch::Tensor order_;
};

double Accuracy(torch::nn::Sequential& model, const data::Split& test, int64_t n) {
  torch::NoGradGuard no_grad;
  n = std::min<int64_t>(n, test.images.size(0));
  int64_t correct = 0;
  for (int64_t i = 0; i < n; i += 1000) {
    const int64_t e = std::min<int64_t>(n, i + 1000);
    torch::Tensor pred = model->forward(test.images.slice(0, i, e)).argmax(1);
    correct += pred.eq(test.labels.slice(0, i, e)).sum().item<int64_t>();
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

absl::Status LoadParameters(pipeline::Pipeline& pipe, torch::nn::Sequential& model) {
  auto params = pipe.Parameters();
  if (!params.ok()) return params.status();
  auto mine = model->parameters();
  if (mine.size() != params->size()) return absl::InternalError("parameter count differs");
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < mine.size(); ++i) mine[i].copy_((*params)[i]);
  return absl::OkStatus();
}

int RunStage(const Flags& flags, const LaunchEnv& env, rpc::AgentOptions options) {
  const std::string who = options.name;
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  pipeline::StageServerOptions so{[flags] { return MakeModel(flags); }};
  so.device = *examples::ParseDeviceFlag(flags.device);  // checked in main()
  if (so.device.is_cuda()) {
    // Activations and gradients go device to device between the stages
    // (pipeline/stage_server.h); the driver's batches come from the host.
    const int d = so.device.has_index() ? so.device.index() : 0;
    for (int k = 0; k < env.world_size - 1; ++k) {
      const std::string peer = absl::StrCat("stage", k);
      if (peer != options.name) options.devices.maps[peer] = {{d, d}};
    }
  }
  auto server = pipeline::StageServer::Create(*registry, so);
  if (!server.ok()) return Fail(who, "starting the stage server", server.status());
  auto agent = rpc::RpcAgent::Create(options, registry);
  if (!agent.ok()) return Fail(who, "joining the job", agent.status());
  std::printf("[%s] pid %d, serving (restart %d)\n", who.c_str(), static_cast<int>(getpid()),
              env.restart_count);
  absl::Status s = (*server)->WaitForFinish(absl::Seconds(flags.job_timeout));
  if (!s.ok()) return Fail(who, "waiting for the driver", s);
  std::printf("[%s] done after %lld steps\n", who.c_str(),
              static_cast<long long>((*server)->steps_taken()));
  if (s = (*agent)->Shutdown(); !s.ok()) return Fail(who, "shutdown", s);
  return 0;
}

int RunDriver(const Flags& flags, const LaunchEnv& env, rpc::AgentOptions options) {
  const std::string who = options.name;
  const int stages = env.world_size - env.role_world_size;
  if (stages < 1) {
    return Fail(who, "starting", absl::InvalidArgumentError("the job has no stage workers"));
  }
  const std::string dir = data::FashionMnistDir();
  auto train = data::LoadFashionMnist(dir, true);
  if (!train.ok()) return Fail(who, "loading the training set", train.status());
  auto test = data::LoadFashionMnist(dir, false);
  if (!test.ok()) return Fail(who, "loading the test set", test.status());
  auto agent = rpc::RpcAgent::Create(options, std::make_shared<rpc::FunctionRegistry>());
  if (!agent.ok()) return Fail(who, "joining the job", agent.status());

  pipeline::ScheduleSpec spec{stages, static_cast<int>(flags.microbatches),
                              static_cast<int>(flags.chunks)};
  absl::StatusOr<pipeline::Schedule> schedule =
      flags.schedule == "gpipe"  ? pipeline::GPipe(spec)
      : flags.schedule == "1f1b" ? pipeline::OneFOneB(spec)
      : flags.schedule == "interleaved"
          ? pipeline::Interleaved1F1B(spec)
          : absl::InvalidArgumentError(
                absl::StrCat("--schedule '", flags.schedule, "': gpipe, 1f1b or interleaved"));
  if (!schedule.ok()) return Fail(who, "building the schedule", schedule.status());
  pipeline::PipelineOptions po;
  for (int k = 0; k < stages; ++k) po.stage_workers.push_back(absl::StrCat("stage", k));
  po.schedule = *schedule;
  po.model = [flags] { return MakeModel(flags); };
  po.batch_size = flags.batch_size;
  po.optimizer = dist_optim::OptimizerOptions::SGD(flags.lr);
  po.optimizer.momentum = 0.9;
  po.step_timeout = absl::Seconds(flags.step_timeout);
  po.checkpoint_dir = flags.checkpoint_dir;
  auto pipe = pipeline::Pipeline::Create(**agent, po);
  if (!pipe.ok()) return Fail(who, "creating the pipeline", pipe.status());

  Batches batches(*std::move(train), flags.batch_size, flags.seed);
  const int64_t total = flags.steps > 0 ? flags.steps : flags.epochs * batches.steps_per_epoch();
  const int64_t trace_step = flags.trace_step >= 0 ? flags.trace_step : total - 1;
  std::printf(
      "[%s] %s on %d stage workers, %lld micro-batches of %lld, cuts %s, %lld steps, "
      "SGD lr %g momentum 0.9%s\n",
      who.c_str(), schedule->name.c_str(), stages, static_cast<long long>(flags.microbatches),
      static_cast<long long>(flags.batch_size / flags.microbatches),
      absl::StrJoin((*pipe)->cuts(), ",").c_str(), static_cast<long long>(total), flags.lr,
      (*pipe)->restored_step() >= 0
          ? absl::StrCat(", resumed from the checkpoint of step ", (*pipe)->restored_step()).c_str()
          : "");
  torch::nn::Sequential eval_model = MakeModel(flags);
  double window_loss = 0, window_bubble = 0, window_s = 0;
  int window = 0;
  double last_loss = 0;
  for (int64_t step = (*pipe)->steps_done(); step < total; ++step) {
    auto [x, y] = batches.Get(step);
    const absl::Time t0 = absl::Now();
    auto r = (*pipe)->Step(x, y);
    if (!r.ok()) return Fail(who, absl::StrCat("step ", step), r.status());
    window_s += absl::ToDoubleSeconds(absl::Now() - t0);
    window_loss += r->loss;
    window_bubble += r->bubble;
    last_loss = r->loss;
    ++window;
    if (step == trace_step) {
      std::printf("[%s] step %lld: %s\n", who.c_str(), static_cast<long long>(step),
                  (*pipe)->Summary(*r).c_str());
      if (!flags.trace.empty()) {
        absl::Status s = (*pipe)->WriteTrace(flags.trace, *r);
        if (!s.ok()) return Fail(who, "writing the trace", s);
        std::printf("[%s] wrote the trace of step %lld to %s\n", who.c_str(),
                    static_cast<long long>(step), flags.trace.c_str());
      }
      if (!flags.svg.empty()) {
        std::ofstream out(flags.svg);
        out << pipeline::TimelineSvg(po.schedule, r->events);
        if (!out) return Fail(who, "writing the SVG", absl::UnavailableError(flags.svg));
      }
    }
    if ((step + 1) % flags.log_every == 0 || step + 1 == total) {
      absl::Status s = LoadParameters(**pipe, eval_model);
      if (!s.ok()) return Fail(who, "reading the parameters", s);
      std::printf(
          "[%s] step %lld loss %.4f test accuracy %.3f (1000 images) samples/s %.0f "
          "bubble %.3f measured / %.3f theoretical\n",
          who.c_str(), static_cast<long long>(step + 1), window_loss / window,
          Accuracy(eval_model, *test, 1000), window * flags.batch_size / window_s,
          window_bubble / window, r->theoretical_bubble);
      window_loss = window_bubble = window_s = 0;
      window = 0;
    }
    if (flags.checkpoint_every > 0 && (step + 1) % flags.checkpoint_every == 0) {
      absl::Status s = (*pipe)->SaveCheckpoint();
      if (!s.ok()) return Fail(who, "checkpoint", s);
      std::printf("[%s] checkpoint at step %lld\n", who.c_str(), static_cast<long long>(step + 1));
    }
  }
  absl::Status s = LoadParameters(**pipe, eval_model);
  if (!s.ok()) return Fail(who, "reading the parameters", s);
  const double accuracy = Accuracy(eval_model, *test, test->images.size(0));
  std::printf("[%s] final loss %.6f, test accuracy %.4f on %lld images\n", who.c_str(), last_loss,
              accuracy, static_cast<long long>(test->images.size(0)));
  if (s = (*pipe)->Finish(); !s.ok()) return Fail(who, "finishing", s);
  (void)(*agent)->Shutdown();
  if (accuracy < flags.min_accuracy) {
    std::printf("[%s] RESULT FAIL: test accuracy %.4f < %.4f\n", who.c_str(), accuracy,
                flags.min_accuracy);
    return 1;
  }
  std::printf("[%s] RESULT OK: test accuracy %.4f >= %.4f\n", who.c_str(), accuracy,
              flags.min_accuracy);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  baton::examples::FlagSet flags("pipeline_fashion_mnist");
  flags.String("schedule", &f.schedule, "gpipe, 1f1b or interleaved");
  flags.Int("microbatches", &f.microbatches, "micro-batches per step (m)");
  flags.Int("chunks", &f.chunks, "model chunks per stage worker (interleaved: v)");
  flags.Int("batch_size", &f.batch_size, "rows per step");
  flags.Int("width", &f.width, "hidden layer width");
  flags.Int("hidden_layers", &f.hidden_layers, "hidden layers");
  flags.Double("lr", &f.lr, "SGD learning rate (momentum 0.9)");
  flags.Int("epochs", &f.epochs, "epochs (when --steps is 0)");
  flags.Int("steps", &f.steps, "training steps (0: --epochs)");
  flags.Int("seed", &f.seed, "model init and shuffle seed");
  flags.Int("log_every", &f.log_every, "steps between progress lines");
  flags.Double("min_accuracy", &f.min_accuracy, "final test accuracy needed for RESULT OK");
  flags.String("checkpoint_dir", &f.checkpoint_dir, "checkpoints (resumed from when present)");
  flags.Int("checkpoint_every", &f.checkpoint_every, "steps between checkpoints (0: none)");
  flags.String("trace", &f.trace, "Chrome trace JSON of one step");
  flags.String("svg", &f.svg, "SVG timeline of the same step");
  flags.Int("trace_step", &f.trace_step, "the traced step (-1: the last)");
  flags.Double("step_timeout", &f.step_timeout, "seconds before a step fails");
  flags.Double("job_timeout", &f.job_timeout, "seconds a stage waits for the driver");
  flags.String("device", &f.device, "where the stages compute: cpu, cuda or cuda:N");
  absl::Status parsed = flags.Parse(argc, argv);
  if (parsed.ok() && (f.microbatches < 1 || f.batch_size % f.microbatches != 0 || f.chunks < 1 ||
                      f.width < 1 || f.hidden_layers < 1 || f.lr <= 0 || f.log_every < 1 ||
                      f.step_timeout <= 0 || f.job_timeout <= 0 || f.checkpoint_every < 0 ||
                      (f.checkpoint_every > 0 && f.checkpoint_dir.empty()))) {
    parsed = absl::InvalidArgumentError(
        "--batch_size must be a multiple of --microbatches; --chunks, --width, --hidden_layers, "
        "--lr, --log_every and the timeouts must be positive; --checkpoint_every needs "
        "--checkpoint_dir");
  }
  if (parsed.ok()) {
    if (auto d = baton::examples::ParseDeviceFlag(f.device); !d.ok()) parsed = d.status();
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n%s", std::string(parsed.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  auto env = baton::ReadLaunchEnv();
  auto options = baton::rpc::AgentOptions::FromEnv();
  absl::Status bad = !env.ok() ? env.status() : options.status();
  if (bad.ok() && env->role != "driver" && env->role != "stage") {
    bad = absl::InvalidArgumentError(
        absl::StrCat("BATON_ROLE is '", env->role, "'; the job's roles are driver and stage"));
  }
  if (bad.ok() && env->role == "driver" && (env->rank != 0 || env->role_world_size != 1)) {
    bad = absl::InvalidArgumentError("one driver, rank 0: give --role driver:1 first");
  }
  if (!bad.ok()) {
    std::fprintf(stderr, "%s\n%s", bad.ToString().c_str(), flags.Usage().c_str());
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  torch::set_num_threads(1);
  try {
    return env->role == "driver" ? RunDriver(f, *env, *options) : RunStage(f, *env, *options);
  } catch (const std::exception& e) {
    return Fail(options->name, "unexpected exception", absl::InternalError(e.what()));
  }
}
