// The main job: parameter-server training of an MLP on Fashion-MNIST.
//
//   bazel-bin/launcher/baton-run --standalone --role ps:2 --role trainer:2
//       bazel-bin/examples/ps_fashion_mnist [flags]
//
// One binary; BATON_ROLE (set by baton-run's --role) picks the behaviour:
// - ps<k>: serves its shard of every table (ps::PsServer, ps/server.h) until
//   every trainer reported that it finished, writes a final checkpoint if
//   --checkpoint_dir is set, and prints its counters.
// - trainer<r>: trains the MLP 784-256-128-10 on its disjoint shard of the
//   60,000 training images (DistributedSampler: rank r of the trainers,
//   reshuffled every epoch). Each step pulls the parameters, computes the
//   cross-entropy gradient of one batch and pushes it; the servers apply it
//   with SGD (momentum 0.9). Every --log_every steps it prints the loss and
//   accuracy over those steps, its samples/s and the largest staleness a pull
//   returned with. At the end trainer0 waits for the other trainers, pulls
//   the final parameters, evaluates them on the 10,000 test images and prints
//   `RESULT OK` (exit 0) if the accuracy reaches --min_accuracy, else why
//   (exit 1).
// Every worker builds the same PsSpec from the same seeded model; the servers
// reject a trainer whose spec differs. Workers tell each other that they are
// done through the job's store; every wait is bounded (--job_timeout, the
// client's timeout, the agent's shutdown timeout).
//
// Flags (the same for every role):
//   --consistency sync|async|ssp:K  default ssp:2 (see kDefaultConsistency)
//   --lr X (0.01)  --batch_size N (64)  --epochs N (2)  --steps N (0: epochs)
//   --seed N (0)   --log_every N (100)  --min_accuracy X (0.84)
//   --trainer_timeout S (30): a trainer that keeps a pull waiting this long is
//       dropped from the clock (PS5 in ps/server_shard.h)
//   --job_timeout S (1800): the longest any worker waits for the trainers
//   --device cpu|cuda|cuda:N (cpu): where the trainers compute; the servers
//       always hold the parameters in host memory (ps/module_binding.h)
//   --checkpoint_dir DIR, --checkpoint_every N (clocks): server checkpoints;
//       a restarted job resumes from them (trainers continue at the clock the
//       servers give them). Trainers may also be restarted alone
//       (baton-run --restart_policy trainer=role --max_restarts N): they
//       rejoin and continue at their clock.
// Data: $BATON_FASHION_MNIST_DIR, else /usr/share/datasets/fashion-mnist
// (Debian's dataset-fashion-mnist).
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "comm/sampler.h"
#include "data/fashion_mnist.h"
#include "env/env.h"
#include "examples/device_flag.h"
#include "examples/flags.h"
#include "ps/client.h"
#include "ps/module_binding.h"
#include "ps/server.h"
#include "rpc/agent.h"

namespace {

using namespace baton;  // NOLINT: an example, kept short

// Bounded staleness 2: a trainer runs freely while it is at most two steps
// ahead of the slowest (sync makes both wait at every step, so one
// descheduled trainer stalls the job), and no pull misses more than two steps
// of the other trainer's updates, which async does not bound (in async runs
// here one trainer got up to 120 steps ahead). Test accuracy after 2 epochs,
// several runs: ssp:2 0.857-0.864, async 0.860-0.863, sync 0.851 (sync averages
// the two gradients of a step: half as many updates at the same lr).
constexpr char kDefaultConsistency[] = "ssp:2";

struct Flags {
  std::string consistency = kDefaultConsistency;
  double lr = 0.01;
  int64_t batch_size = 64;
  int64_t epochs = 2;
  int64_t steps = 0;
  int64_t seed = 0;
  int64_t log_every = 100;
  double min_accuracy = 0.84;
  double trainer_timeout = 30;
  double job_timeout = 1800;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  std::string device = "cpu";
};

absl::StatusOr<ps::Consistency> ParseConsistency(const std::string& text) {
  if (text == "sync") return ps::Consistency::Sync();
  if (text == "async") return ps::Consistency::Async();
  int64_t s = -1;
  if (text.rfind("ssp:", 0) == 0 && absl::SimpleAtoi(text.substr(4), &s) && s >= 0) {
    return ps::Consistency::BoundedStaleness(s);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--consistency: '", text, "' is not sync, async or ssp:K (K >= 0)"));
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  examples::FlagSet flags("ps_fashion_mnist");
  flags.String("consistency", &f.consistency, "");
  flags.String("checkpoint_dir", &f.checkpoint_dir, "");
  flags.String("device", &f.device, "");
  flags.Int("batch_size", &f.batch_size, "");
  flags.Int("epochs", &f.epochs, "");
  flags.Int("steps", &f.steps, "");
  flags.Int("seed", &f.seed, "");
  flags.Int("log_every", &f.log_every, "");
  flags.Int("checkpoint_every", &f.checkpoint_every, "");
  flags.Double("lr", &f.lr, "");
  flags.Double("min_accuracy", &f.min_accuracy, "");
  flags.Double("trainer_timeout", &f.trainer_timeout, "");
  flags.Double("job_timeout", &f.job_timeout, "");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return s;
  if (f.batch_size < 1 || f.epochs < 1 || f.steps < 0 || f.log_every < 1 || f.lr <= 0 ||
      f.trainer_timeout <= 0 || f.job_timeout <= 0 || f.checkpoint_every < 0) {
    return absl::InvalidArgumentError(
        "--batch_size, --epochs, --log_every, --lr, --trainer_timeout and --job_timeout must be "
        "positive; --steps and --checkpoint_every non-negative");
  }
  if (auto c = ParseConsistency(f.consistency); !c.ok()) return c.status();
  if (auto d = examples::ParseDeviceFlag(f.device); !d.ok()) return d.status();
  return f;
}

torch::nn::Sequential MakeModel(int64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(784, 256), torch::nn::ReLU(),
                               torch::nn::Linear(256, 128), torch::nn::ReLU(),
                               torch::nn::Linear(128, 10));
}

// The same on every worker: the servers compare its fingerprint.
absl::StatusOr<ps::PsSpec> MakeSpec(const torch::nn::Module& model, const Flags& flags,
                                    int num_trainers) {
  auto consistency = ParseConsistency(flags.consistency);
  if (!consistency.ok()) return consistency.status();
  auto sgd = dist_optim::OptimizerOptions::SGD(flags.lr);
  sgd.momentum = 0.9;
  ps::PsSpec spec;
  spec.tables = ps::ModuleBinding::Tables(model, "mlp", sgd);
  spec.consistency = *consistency;
  spec.num_trainers = num_trainers;
  spec.trainer_timeout = absl::Seconds(flags.trainer_timeout);
  return spec;
}

// Prints the error with its context and leaves it for baton-run to report.
int Fail(const std::string& who, const std::string& context, const absl::Status& status) {
  const std::string msg = absl::StrCat(context, ": ", status.ToString());
  std::fprintf(stderr, "[%s] %s\n", who.c_str(), msg.c_str());
  (void)WriteErrorFile(ErrorReport{msg, "absl::Status", ""});  // only under baton-run
  return 1;
}

// A trainer's "finished" key holds "<samples> <seconds>" of its training.
std::string DoneKey(const rpc::RpcAgent& agent, int trainer) {
  return absl::StrCat(agent.runtime().store_namespace(), "ps_fashion_mnist/done/", trainer);
}

double Rate(double samples, double seconds) { return seconds > 0 ? samples / seconds : 0; }

// The samples/s in a trainer's "finished" key (0 if unreadable).
double RateOf(const absl::StatusOr<std::string>& done) {
  std::vector<std::string> parts = absl::StrSplit(done.ok() ? *done : "", ' ');
  double samples = 0, seconds = 0;
  if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &samples) ||
      !absl::SimpleAtod(parts[1], &seconds)) {
    return 0;
  }
  return Rate(samples, seconds);
}

absl::Status WaitForTrainers(rpc::RpcAgent& agent, int from, int to, absl::Duration timeout) {
  std::vector<std::string> keys;
  for (int t = from; t < to; ++t) keys.push_back(DoneKey(agent, t));
  if (keys.empty()) return absl::OkStatus();
  return Annotate(agent.runtime().store().Wait(keys, timeout),
                  absl::StrCat("waiting for trainers ", from, "..", to - 1, " to finish"));
}

int RunServer(const Flags& flags, const LaunchEnv& env, rpc::AgentOptions options) {
  const std::string who = options.name;
  const int num_trainers = env.world_size - env.role_world_size;
  auto model = MakeModel(flags.seed);
  auto spec = MakeSpec(*model, flags, num_trainers);
  if (!spec.ok()) return Fail(who, "building the job's spec", spec.status());
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  ps::ServerOptions so;
  so.server = env.role_rank;
  so.num_servers = env.role_world_size;
  so.checkpoint_dir = flags.checkpoint_dir;
  so.checkpoint_every_clocks = flags.checkpoint_every;
  auto server = ps::PsServer::Create(*spec, so, *registry);
  if (!server.ok()) return Fail(who, "creating the parameter server", server.status());
  if ((*server)->restored_clock() >= 0) {
    std::printf("[%s] restored checkpoint at clock %lld\n", who.c_str(),
                static_cast<long long>((*server)->restored_clock()));
  }
  auto agent = rpc::RpcAgent::Create(options, registry);
  if (!agent.ok()) return Fail(who, "starting the RPC agent", agent.status());
  std::printf("[%s] serving shard %d of %d for %d trainers, %s\n", who.c_str(), so.server,
              so.num_servers, num_trainers, spec->consistency.DebugString().c_str());
  absl::Status s = WaitForTrainers(**agent, 0, num_trainers, absl::Seconds(flags.job_timeout));
  if (!s.ok()) return Fail(who, "serving", s);
  if (s = (*server)->Stop(); !s.ok()) return Fail(who, "final checkpoint", s);
  std::printf("[%s] %s\n", who.c_str(), (*server)->shard().Stats().DebugString().c_str());
  if (s = (*agent)->Shutdown(); !s.ok()) return Fail(who, "shutdown", s);
  return 0;
}

// Accuracy of `model` on the whole split, in one forward pass.
double Evaluate(torch::nn::Sequential& model, const data::Split& split, torch::Device device) {
  torch::NoGradGuard no_grad;
  torch::Tensor pred = model->forward(split.images.to(device)).argmax(1);
  return pred.eq(split.labels.to(device)).sum().item<double>() /
         static_cast<double>(split.labels.size(0));
}

// Trains for the job's steps; returns this trainer's samples and seconds.
// `train` is on the trainers' device.
absl::StatusOr<std::pair<int64_t, double>> Train(const Flags& flags, const std::string& who,
                                                 int rank, int num_trainers,
                                                 const data::Split& train,
                                                 torch::nn::Sequential& model, ps::PsClient& client,
                                                 ps::ModuleBinding& binding) {
  comm::SamplerOptions so;
  so.seed = 1000;  // shuffle: a new permutation every epoch, the same on every trainer
  auto sampler = comm::DistributedSampler::Create(train.labels.size(0), num_trainers, rank, so);
  if (!sampler.ok()) return sampler.status();
  const int64_t per_epoch = (sampler->num_samples() + flags.batch_size - 1) / flags.batch_size;
  const int64_t total = flags.steps > 0 ? flags.steps : flags.epochs * per_epoch;
  const int64_t start = client.clock();  // > 0 when the servers restored a checkpoint
  if (start > 0) {
    std::printf("[%s] resuming at step %lld\n", who.c_str(), static_cast<long long>(start));
  }
  torch::Tensor indices;
  int64_t samples = 0, window_samples = 0, window_correct = 0, window_steps = 0;
  double window_loss = 0;
  const absl::Time begin = absl::Now();
  absl::Time window_begin = begin;
  for (int64_t step = start; step < total; ++step) {
    const int64_t epoch = step / per_epoch, b = step % per_epoch;
    if (b == 0 || step == start) {
      sampler->SetEpoch(epoch);
      indices = torch::tensor(sampler->Indices(), torch::kLong).to(train.images.device());
    }
    torch::Tensor idx = indices.slice(0, b * flags.batch_size, (b + 1) * flags.batch_size);
    torch::Tensor x = train.images.index_select(0, idx), y = train.labels.index_select(0, idx);
    if (absl::Status s = binding.Pull(); !s.ok()) {
      return Annotate(s, absl::StrCat("step ", step, ": pulling the parameters"));
    }
    model->zero_grad();  // in place: the last push finished (Pull waited for it)
    torch::Tensor logits = model->forward(x);
    torch::Tensor loss = torch::nn::functional::cross_entropy(logits, y);
    loss.backward();
    binding.Push();  // an error surfaces at the next Pull or WaitPushed
    window_loss += loss.item<double>();
    window_correct += logits.argmax(1).eq(y).sum().item<int64_t>();
    window_samples += y.size(0);
    ++window_steps;
    if ((step + 1) % flags.log_every == 0 || step + 1 == total) {
      const absl::Time now = absl::Now();
      std::printf("[%s] step %lld loss %.3f acc %.2f samples/s %.0f staleness %lld\n", who.c_str(),
                  static_cast<long long>(step + 1), window_loss / window_steps,
                  static_cast<double>(window_correct) / window_samples,
                  window_samples / absl::ToDoubleSeconds(now - window_begin),
                  static_cast<long long>(client.max_staleness()));
      samples += window_samples;
      window_samples = window_correct = window_steps = 0;
      window_loss = 0;
      window_begin = now;
    }
  }
  if (absl::Status s = binding.WaitPushed(); !s.ok()) return Annotate(s, "the last push");
  return std::make_pair(samples, absl::ToDoubleSeconds(absl::Now() - begin));
}

int RunTrainer(const Flags& flags, const LaunchEnv& env, rpc::AgentOptions options) {
  const std::string who = options.name;
  const int rank = env.role_rank, num_trainers = env.role_world_size;
  const int num_servers = env.world_size - env.role_world_size;
  if (num_servers < 1) {
    return Fail(who, "starting", absl::InvalidArgumentError("the job has no ps role workers"));
  }
  const std::string dir = data::FashionMnistDir();
  const std::string hint =
      " (install Debian's dataset-fashion-mnist, or set "
      "BATON_FASHION_MNIST_DIR to a directory with the four .gz files)";
  auto train = data::LoadFashionMnist(dir, /*train=*/true);
  if (!train.ok()) return Fail(who, "loading the training split" + hint, train.status());
  absl::StatusOr<data::Split> test;
  if (rank == 0) {
    test = data::LoadFashionMnist(dir, /*train=*/false);
    if (!test.ok()) return Fail(who, "loading the test split" + hint, test.status());
  }
  auto model = MakeModel(flags.seed);
  auto spec = MakeSpec(*model, flags, num_trainers);
  if (!spec.ok()) return Fail(who, "building the job's spec", spec.status());
  const torch::Device device = *examples::ParseDeviceFlag(flags.device);  // checked by ParseFlags
  if (!device.is_cpu()) {
    // The same seeded values, moved: the spec's fingerprint does not change.
    model->to(device);
    train->images = train->images.to(device);
    train->labels = train->labels.to(device);
  }
  auto agent = rpc::RpcAgent::Create(options, std::make_shared<rpc::FunctionRegistry>());
  if (!agent.ok()) return Fail(who, "starting the RPC agent", agent.status());
  ps::PsClient::Options co;
  co.trainer = rank;
  for (int k = 0; k < num_servers; ++k) co.servers.push_back(absl::StrCat("ps", k));
  // A pull may wait for the slowest trainer up to trainer_timeout (then it
  // is dropped and the pull served): the client must wait longer than that.
  co.timeout = std::max(absl::Seconds(60), 2 * spec->trainer_timeout);
  auto client = ps::PsClient::Create(**agent, *spec, co);
  if (!client.ok()) return Fail(who, "joining the parameter servers", client.status());
  auto binding = ps::ModuleBinding::Create(**client, *model, "mlp");
  if (!binding.ok()) return Fail(who, "binding the model to the servers", binding.status());
  std::printf("[%s] %lld training images, %d trainers, %d servers, %s, lr %g, batch %lld, %s\n",
              who.c_str(), static_cast<long long>(train->labels.size(0)), num_trainers, num_servers,
              spec->consistency.DebugString().c_str(), flags.lr,
              static_cast<long long>(flags.batch_size), device.str().c_str());

  auto trained = Train(flags, who, rank, num_trainers, *train, model, **client, *binding);
  if (!trained.ok()) return Fail(who, "training", trained.status());
  const auto [samples, seconds] = *trained;
  std::printf("[%s] trained %lld samples in %.1f s (%.0f samples/s)\n", who.c_str(),
              static_cast<long long>(samples), seconds, Rate(samples, seconds));
  rpc::RpcAgent& a = **agent;
  const absl::Duration job_timeout = absl::Seconds(flags.job_timeout);
  int code = 0;
  if (rank == 0) {
    // The final model is the one after every trainer's last push.
    absl::Status s = WaitForTrainers(a, 1, num_trainers, job_timeout);
    if (!s.ok()) return Fail(who, "before the evaluation", s);
    double job_rate = Rate(samples, seconds);
    for (int t = 1; t < num_trainers; ++t) {
      job_rate += RateOf(a.runtime().store().Get(DoneKey(a, t), absl::Seconds(10)));
    }
    if (s = binding->Pull(); !s.ok()) return Fail(who, "pulling the final parameters", s);
    const double accuracy = Evaluate(model, *test, device);
    auto stats = (*client)->Stats();
    if (!stats.ok()) return Fail(who, "reading the servers' stats", stats.status());
    for (const ps::ShardStats& st : *stats) {
      std::printf("[%s] %s\n", who.c_str(), st.DebugString().c_str());
    }
    std::printf(
        "[%s] test accuracy %.4f on %lld images; %.0f samples/s over all trainers; "
        "max staleness %lld\n",
        who.c_str(), accuracy, static_cast<long long>(test->labels.size(0)), job_rate,
        static_cast<long long>((*client)->max_staleness()));
    if (accuracy >= flags.min_accuracy) {
      std::printf("RESULT OK: test accuracy %.4f >= %.4f\n", accuracy, flags.min_accuracy);
    } else {
      std::printf("RESULT FAILED: test accuracy %.4f < --min_accuracy %.4f\n", accuracy,
                  flags.min_accuracy);
      code = 1;
    }
  }
  absl::Status s = a.runtime().store().Set(DoneKey(a, rank), absl::StrCat(samples, " ", seconds));
  if (!s.ok()) return Fail(who, "reporting that it finished", s);
  // Trainer 0 may still be evaluating: shut down together, once all are done.
  s = WaitForTrainers(a, 0, num_trainers, job_timeout);
  if (!s.ok()) return Fail(who, "finishing", s);
  if (s = a.Shutdown(); !s.ok()) return Fail(who, "shutdown", s);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = absl::StrCat(
      "usage: baton-run --standalone --role ps:2 --role trainer:2 ", argv[0],
      " [flags]\n(the flags are described at the top of examples/ps_fashion_mnist.cc)");
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "%s\n%s\n", std::string(flags.status().message()).c_str(), usage.c_str());
    return 2;
  }
  auto env = ReadLaunchEnv();
  auto options = rpc::AgentOptions::FromEnv();
  absl::Status bad = !env.ok() ? env.status() : options.status();
  if (bad.ok() && env->role != "ps" && env->role != "trainer") {
    bad = absl::InvalidArgumentError(
        absl::StrCat("BATON_ROLE is '", env->role, "'; the job's roles are ps and trainer"));
  }
  if (!bad.ok()) {
    std::fprintf(stderr, "%s\n%s\n", bad.ToString().c_str(), usage.c_str());
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines reach baton-run at once
  torch::set_num_threads(1);
  try {
    return env->role == "ps" ? RunServer(*flags, *env, *options)
                             : RunTrainer(*flags, *env, *options);
  } catch (const std::exception& e) {  // LibTorch errors, baton::Error
    return Fail(options->name, "unexpected exception", absl::InternalError(e.what()));
  }
}
