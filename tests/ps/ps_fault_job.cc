// A parameter-server job for the fault-tolerance tests (ps_fault_test.sh),
// run through baton-run with roles ps and trainer:
//   baton-run --standalone --role ps:2 --role trainer:2 ps_fault_job --checkpoint_dir D
// Synchronous training of a small MLP on a synthetic 10-class problem whose
// batch for (trainer, step) is fixed, so a trainer that restarts and resumes
// at the servers' clock sees the data it would have seen. Servers checkpoint
// every --checkpoint_every clocks and restore on restart. Each process prints
// its pid once, and trainers print "step N" lines, for the test script to
// pick a victim. With --hold_at=N --release_file=F, each trainer stops after
// step N, prints "holding at step N" and waits until F exists (bounded), so
// the script kills its victim mid-training however loaded the machine is:
// a process that restarts after F exists does not hold again. Trainer 0 ends by checking every
// table is present and finite, and the accuracy on fresh data, then prints RESULT OK.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "env/env.h"
#include "ps/client.h"
#include "ps/module_binding.h"
#include "ps/server.h"
#include "rpc/agent.h"
#include "testing/eventually.h"

namespace {

using namespace baton;

struct Flags {
  std::string checkpoint_dir;
  int64_t checkpoint_every = 20;
  int64_t steps = 300;
  int64_t step_delay_ms = 10;  // the training's pace
  int64_t hold_at = -1;        // < 0: never hold
  std::string release_file;
};

// Waits until `path` exists, up to `deadline` (the script creates it once it
// killed its victim).
absl::Status WaitForFile(const std::string& path, absl::Duration deadline) {
  if (baton::testing::Eventually([&] { return ::access(path.c_str(), F_OK) == 0; }, deadline)) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(absl::StrCat("release file ", path, " did not appear within ",
                                                  absl::FormatDuration(deadline)));
}

torch::nn::Sequential MakeModel() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(64, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 10));
}

std::pair<torch::Tensor, torch::Tensor> Batch(int64_t seed) {
  auto centers = torch::randn({10, 64}, at::make_generator<at::CPUGeneratorImpl>(77));
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto y = torch::randint(0, 10, {32}, g, torch::kLong);
  auto x = centers.index_select(0, y) + 0.7 * torch::randn({32, 64}, g);
  return {x, y};
}

int Fail(const std::string& who, const absl::Status& s) {
  std::fprintf(stderr, "[%s] error: %s\n", who.c_str(), s.ToString().c_str());
  return 1;
}

int Run(const Flags& flags) {
  torch::set_num_threads(1);
  auto env = ReadLaunchEnv();
  if (!env.ok()) return Fail("?", env.status());
  const bool is_server = env->role == "ps";
  const std::string me = absl::StrCat(env->role, env->role_rank);
  const int servers = is_server ? env->role_world_size : env->world_size - env->role_world_size;
  const int trainers = env->world_size - servers;
  std::printf("[%s] pid %d restart %d\n", me.c_str(), ::getpid(), env->restart_count);
  std::fflush(stdout);

  auto model = MakeModel();
  ps::PsSpec spec;
  dist_optim::OptimizerOptions sgd = dist_optim::OptimizerOptions::SGD(0.1);
  sgd.momentum = 0.9;
  spec.tables = ps::ModuleBinding::Tables(*model, "mlp", sgd);
  spec.consistency = ps::Consistency::Sync();
  spec.num_trainers = trainers;
  spec.trainer_timeout = absl::Seconds(20);

  auto registry = std::make_shared<rpc::FunctionRegistry>();
  std::unique_ptr<ps::PsServer> server;
  if (is_server) {
    ps::ServerOptions so;
    so.server = env->role_rank;
    so.num_servers = servers;
    so.checkpoint_dir = flags.checkpoint_dir;
    so.checkpoint_every_clocks = flags.checkpoint_every;
    auto s = ps::PsServer::Create(spec, so, *registry);
    if (!s.ok()) return Fail(me, s.status());
    server = *std::move(s);
    std::printf("[%s] restored clock %lld\n", me.c_str(),
                static_cast<long long>(server->restored_clock()));
    std::fflush(stdout);
  }
  auto options = rpc::AgentOptions::FromEnv();
  if (!options.ok()) return Fail(me, options.status());
  options->timeouts.shutdown = absl::Seconds(60);
  auto agent = rpc::RpcAgent::Create(*options, registry);
  if (!agent.ok()) return Fail(me, agent.status());

  if (is_server) {
    // Serve until the trainers finished every step (bounded), then shut down
    // together with them.
    (void)baton::testing::Eventually(
        [&] { return server->shard().Stats().applied_clock >= flags.steps; }, absl::Minutes(5));
    absl::Status s = (*agent)->Shutdown();
    std::printf("[%s] %s\n", me.c_str(), server->shard().Stats().DebugString().c_str());
    if (absl::Status st = server->Stop(); !st.ok()) return Fail(me, st);
    return s.ok() ? 0 : Fail(me, s);
  }

  ps::PsClient::Options co;
  co.trainer = env->role_rank;
  for (int s = 0; s < servers; ++s) co.servers.push_back(absl::StrCat("ps", s));
  co.timeout = absl::Seconds(60);
  auto client = ps::PsClient::Create(**agent, spec, co);
  if (!client.ok()) return Fail(me, client.status());
  auto binding = ps::ModuleBinding::Create(**client, *model, "mlp");
  if (!binding.ok()) return Fail(me, binding.status());
  const int64_t start = (*client)->clock();
  std::printf("[%s] resuming at step %lld\n", me.c_str(), static_cast<long long>(start));
  torch::Tensor loss;
  bool held = false;
  for (int64_t step = start; step < flags.steps; step = (*client)->clock()) {
    if (absl::Status s = binding->Pull(); !s.ok()) return Fail(me, s);
    auto [x, y] = Batch(1000 * env->role_rank + step);
    model->zero_grad();
    loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    binding->Push();
    if (step % 10 == 0) {
      std::printf("[%s] step %lld loss %.4f\n", me.c_str(), static_cast<long long>(step),
                  loss.item<double>());
      std::fflush(stdout);
    }
    if (!held && flags.hold_at >= 0 && step >= flags.hold_at &&
        ::access(flags.release_file.c_str(), F_OK) != 0) {
      held = true;
      std::printf("[%s] holding at step %lld\n", me.c_str(), static_cast<long long>(step));
      std::fflush(stdout);
      if (absl::Status s = WaitForFile(flags.release_file, absl::Minutes(2)); !s.ok()) {
        return Fail(me, s);
      }
    }
    absl::SleepFor(absl::Milliseconds(flags.step_delay_ms));  // the training's pace (a flag)
  }
  if (absl::Status s = binding->Pull(); !s.ok()) return Fail(me, s);
  int code = 0;
  if (env->role_rank == 0) {
    // Every table present, of its declared size, finite.
    for (const auto& t : spec.tables) {
      auto v = (*client)->Pull(t.name).result();
      if (!v.ok()) return Fail(me, v.status());
      if (v->numel() != t.numel() || !torch::isfinite(*v).all().item<bool>()) {
        std::printf("[%s] table %s is missing or not finite\n", me.c_str(), t.name.c_str());
        code = 1;
      }
    }
    torch::NoGradGuard ng;
    auto [x, y] = Batch(999999);
    const double acc = model->forward(x).argmax(1).eq(y).to(torch::kDouble).mean().item<double>();
    auto stats = (*client)->Stats();
    if (stats.ok()) {
      for (const auto& st : *stats) std::printf("[%s] %s\n", me.c_str(), st.DebugString().c_str());
    }
    std::printf("[%s] final accuracy %.3f (threshold 0.9)\n", me.c_str(), acc);
    if (acc < 0.9) code = 1;
    if (code == 0) std::printf("RESULT OK\n");
    std::fflush(stdout);
  }
  absl::Status s = (*agent)->Shutdown();
  if (!s.ok()) return Fail(me, s);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return a.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("checkpoint_dir")) {
      flags.checkpoint_dir = v;
    } else if (const char* v = value("checkpoint_every")) {
      (void)absl::SimpleAtoi(v, &flags.checkpoint_every);
    } else if (const char* v = value("steps")) {
      (void)absl::SimpleAtoi(v, &flags.steps);
    } else if (const char* v = value("step_delay_ms")) {
      (void)absl::SimpleAtoi(v, &flags.step_delay_ms);
    } else if (const char* v = value("hold_at")) {
      (void)absl::SimpleAtoi(v, &flags.hold_at);
    } else if (const char* v = value("release_file")) {
      flags.release_file = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (flags.hold_at >= 0 && flags.release_file.empty()) {
    std::fprintf(stderr, "--hold_at needs --release_file\n");
    return 2;
  }
  return Run(flags);
}
