// allreduce_bench: baton's answer to ../shared/peer/torch_allreduce_bench.py.
// The same work, the same metric names, JSON lines on stdout:
//   allreduce_{4,1024,16384,65536}KB_algbw  (float32 SUM, 2 ranks, GB/s)
//   ddp_step_mlp_784_1024_1024_10           (us per step, batch 64 per rank)
//
//   bazel-bin/comm/bench/allreduce_bench [--ranks 2]
//
// Without RANK in the environment it is the launcher: it starts `ranks`
// copies of itself on loopback (a free port for the store) and reaps them;
// rank 0 prints the results.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "comm/ddp.h"
#include "comm/gloo_backend.h"
#include "comm/process_group.h"
#include "store/store_client.h"
#include "store/store_server.h"
#include "testing/ports.h"

extern char** environ;

namespace {

using baton::comm::DistributedDataParallel;
using baton::comm::ProcessGroup;

void Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "allreduce_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

void Report(const std::string& metric, double value, const std::string& unit,
            const std::string& extra) {
  std::printf(
      "{\"system\": \"baton\", \"backend\": \"gloo\", \"version\": \"%s\", "
      "\"metric\": \"%s\", \"value\": %.6g, \"unit\": \"%s\"%s}\n",
      TORCH_VERSION, metric.c_str(), value, unit.c_str(), extra.c_str());
  std::fflush(stdout);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int RunRank(int rank, int world, const std::string& address) {
  at::set_num_threads(1);
  std::unique_ptr<baton::store::StoreServer> server;
  if (rank == 0) {
    auto s = baton::store::StoreServer::Start({address, ""});
    if (!s.ok()) Fail("store server", s.status());
    server = *std::move(s);
  }
  baton::store::StoreClientOptions so;
  so.address = address;
  auto store = std::make_shared<baton::store::StoreClient>(so);
  auto pg = ProcessGroup::Create(store, rank, world, baton::comm::GlooBackendFactory());
  if (!pg.ok()) Fail("process group", pg.status());
  const absl::Duration wait = absl::Minutes(2);
  for (int64_t nbytes :
       {int64_t{4} << 10, int64_t{1} << 20, int64_t{16} << 20, int64_t{64} << 20}) {
    at::Tensor t = at::ones({nbytes / 4});
    const int reps = static_cast<int>(
        std::max<int64_t>(3, std::min<int64_t>(200, (int64_t{256} << 20) / nbytes)));
    absl::Status s = pg->AllReduce({t})->Wait(wait);
    if (s.ok()) s = pg->Barrier()->Wait(wait);
    if (!s.ok()) Fail("warm-up", s);
    const double t0 = Now();
    for (int i = 0; i < reps; ++i) {
      s = pg->AllReduce({t})->Wait(wait);
      if (!s.ok()) Fail("all_reduce", s);
    }
    const double dt = (Now() - t0) / reps;
    if (rank == 0) {
      Report(absl::StrCat("allreduce_", nbytes >> 10, "KB_algbw"), nbytes / dt / 1e9, "GB/s",
             absl::StrFormat(", \"ranks\": %d, \"latency_us\": %.6g", world, dt * 1e6));
    }
  }
  torch::manual_seed(0);
  auto model = std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(784, 1024), torch::nn::ReLU(), torch::nn::Linear(1024, 1024),
      torch::nn::ReLU(), torch::nn::Linear(1024, 10));
  auto ddp = DistributedDataParallel::Create(model, *pg);
  if (!ddp.ok()) Fail("ddp", ddp.status());
  torch::optim::SGD opt(model->parameters(), 0.01);
  at::Tensor x = torch::randn({64, 784});
  at::Tensor y = torch::randint(0, 10, {64});
  const int steps = 30;
  double t0 = 0;
  for (int i = 0; i < steps + 5; ++i) {
    if (i == 5) t0 = Now();
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    opt.step();
  }
  if (rank == 0) {
    Report("ddp_step_mlp_784_1024_1024_10", (Now() - t0) / steps * 1e6, "us/step",
           absl::StrFormat(", \"ranks\": %d, \"batch_per_rank\": 64", world));
  }
  (void)pg->Destroy();
  // Rank 0 serves the store: leave only after everyone is done with it.
  absl::Status done = baton::store::Barrier(*store, "bench/done", rank, world, absl::Minutes(1));
  if (!done.ok()) Fail("final barrier", done);
  if (rank != 0) {
    (void)store->Set(absl::StrCat("bench/left/", rank), "1");
  } else {
    std::vector<std::string> keys;
    for (int r = 1; r < world; ++r) keys.push_back(absl::StrCat("bench/left/", r));
    (void)store->Wait(keys, absl::Minutes(1));
  }
  return 0;
}

// Starts `world` ranks and reaps them all, killing the rest if one fails or
// the whole run exceeds 10 minutes.
int Launch(int world) {
  const int port = baton::testing::FreePort();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    env.push_back(absl::StrCat("RANK=", rank));
    env.push_back(absl::StrCat("WORLD_SIZE=", world));
    env.push_back(absl::StrCat("MASTER_ADDR=127.0.0.1"));
    env.push_back(absl::StrCat("MASTER_PORT=", port));
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string self = "/proc/self/exe";
    char* argv[] = {self.data(), nullptr};
    pid_t pid = -1;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) {
      std::fprintf(stderr, "allreduce_bench: cannot start rank %d\n", rank);
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      return 1;
    }
    pids.push_back(pid);
  }
  const absl::Time deadline = absl::Now() + absl::Minutes(10);
  int failures = 0;
  size_t remaining = pids.size();
  while (remaining > 0) {
    for (pid_t& p : pids) {
      if (p <= 0) continue;
      int status = 0;
      if (waitpid(p, &status, WNOHANG) == p) {
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
        p = -1;
        --remaining;
      }
    }
    if (remaining > 0 && (failures > 0 || absl::Now() > deadline)) {
      for (pid_t p : pids) {
        if (p > 0) kill(p, SIGKILL);
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) {
      ranks = std::atoi(argv[++i]);
    }
  }
  const char* rank = std::getenv("RANK");
  if (rank == nullptr) {
    if (ranks < 1) {
      std::fprintf(stderr, "allreduce_bench: --ranks must be >= 1\n");
      return 2;
    }
    return Launch(ranks);
  }
  const char* world = std::getenv("WORLD_SIZE");
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (world == nullptr || addr == nullptr || port == nullptr) {
    std::fprintf(stderr,
                 "allreduce_bench: RANK needs WORLD_SIZE, MASTER_ADDR "
                 "and MASTER_PORT\n");
    return 2;
  }
  return RunRank(std::atoi(rank), std::atoi(world), absl::StrCat(addr, ":", port));
}
