// An embedding-table parameter-server job in the shape of a click-through-
// rate model: the workload of ../shared/peer/torch_ps_sparse_bench.py
// (examples/ctr/workload.h), trained asynchronously on 2 servers and 2
// trainers through baton-run:
//
//   baton-run --standalone --role ps:2 --role trainer:2 bazel-bin/examples/ctr/ps_ctr
//
// One table of --rows x --dim float32 rows, created lazily on first pull
// from the workload's initializer, updated on the servers with row-wise
// Adagrad (lr 0.05). Each trainer step: the batch's 26 categorical fields
// per sample look up the table (one PullRows of the distinct ids, one call
// per server in flight at once), a local tower (Linear, ReLU, Linear) on
// the rows and 13 dense features, binary cross-entropy, backward, PushRows
// of the rows' gradients (duplicates summed on the client) overlapped with
// the tower's own SGD step. Progress lines give the step, the mean loss of
// the last 20 steps, samples/s, pull/push latency and the server clocks.
// Trainer 0 checks that the loss fell (mean of the last 20 steps below
// --max_loss_ratio times the mean of the first 20), prints the servers'
// counters and RESULT OK; otherwise it exits 1.
//
// Flags: --steps N (300) --rows N (1000000) --dim D (64) --batch B (512)
//        --log_every N (50) --max_loss_ratio R (0.9) --job_timeout S (600)
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "env/env.h"
#include "examples/ctr/workload.h"
#include "ps/client.h"
#include "ps/server.h"
#include "rpc/agent.h"

namespace {

using namespace baton;
namespace ctr = baton::examples::ctr;

constexpr char kTable[] = "emb";

struct Flags {
  int64_t steps = 300, rows = 1000000, dim = 64, batch = 512, log_every = 50;
  double max_loss_ratio = 0.9, job_timeout = 600;
};

ps::PsSpec MakeSpec(const Flags& f, const ctr::Workload& wl, int trainers) {
  ps::RowInit init = ps::RowInit::Custom(
      "ctr_workload_seed0", [wl](absl::Span<const int64_t> ids, at::Tensor& out) {
        out.copy_(wl.InitRows(torch::from_blob(const_cast<int64_t*>(ids.data()),
                                               {static_cast<int64_t>(ids.size())}, torch::kLong)));
      });
  ps::TableSpec table = ps::TableSpec::Embedding(kTable, f.rows, f.dim, std::move(init),
                                                 ps::RowOptimizer::RowWiseAdagrad(0.05, 1e-8));
  table.lazy_rows = true;
  ps::PsSpec spec;
  spec.tables = {std::move(table)};
  spec.consistency = ps::Consistency::Async();
  spec.num_trainers = trainers;
  return spec;
}

std::string DoneKey(rpc::RpcAgent& agent, int trainer) {
  return absl::StrCat(agent.runtime().store_namespace(), "ps_ctr/done/", trainer);
}

int Fail(const std::string& who, const absl::Status& s) {
  std::fprintf(stderr, "[%s] error: %s\n", who.c_str(), s.ToString().c_str());
  // FAILED_PRECONDITION: not launched by baton-run (no BATON_ERROR_FILE).
  if (absl::Status w = WriteErrorFile(ErrorReport{s.ToString(), "absl::Status", ""});
      !w.ok() && !absl::IsFailedPrecondition(w)) {
    std::fprintf(stderr, "[%s] could not write the error file: %s\n", who.c_str(),
                 w.ToString().c_str());
  }
  return 1;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

double Mean(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return to > from ? s / (to - from) : 0;
}

int Train(const Flags& f, const LaunchEnv& env, rpc::RpcAgent& agent, const ps::PsSpec& spec,
          const ctr::Workload& wl, int servers) {
  const std::string me = absl::StrCat("trainer", env.role_rank);
  ps::PsClient::Options co;
  co.trainer = env.role_rank;
  for (int s = 0; s < servers; ++s) co.servers.push_back(absl::StrCat("ps", s));
  auto client = ps::PsClient::Create(agent, spec, co);
  if (!client.ok()) return Fail(me, client.status());
  torch::nn::Sequential tower = wl.MakeTower();
  torch::optim::SGD opt(tower->parameters(), torch::optim::SGDOptions(0.1));
  std::vector<double> losses, pull_us, push_us;
  absl::Time window = absl::Now();
  for (int64_t k = 0; k < f.steps; ++k) {
    ctr::Batch b = wl.MakeBatch(env.role_rank, k);
    auto [uniq, inv, counts] = at::_unique2(b.ids, true, true, false);
    absl::Time t = absl::Now();
    auto pulled = (*client)->PullRows(kTable, uniq).result();
    if (!pulled.ok()) return Fail(me, pulled.status());
    pull_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t));
    at::Tensor rows = pulled->requires_grad_(true);
    at::Tensor input =
        at::cat({rows.index({inv}).view({f.batch, ctr::kFields * f.dim}), b.dense}, 1);
    at::Tensor loss = torch::nn::functional::binary_cross_entropy_with_logits(
        tower->forward(input).squeeze(1), b.labels);
    opt.zero_grad();
    loss.backward();
    t = absl::Now();
    auto pushed = (*client)->PushRows(kTable, uniq, rows.grad(), /*end_step=*/true);
    opt.step();  // the tower is each trainer's own; overlaps the push
    if (absl::Status s = pushed.status(); !s.ok()) return Fail(me, s);
    push_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t));
    losses.push_back(loss.item<double>());
    if ((k + 1) % f.log_every == 0 || k + 1 == f.steps) {
      const size_t n = losses.size();
      const double secs = absl::ToDoubleSeconds(absl::Now() - window);
      std::printf(
          "[%s] step %lld loss %.4f samples/s %.0f pull p50 %.0fus push p50 %.0fus "
          "staleness %lld\n",
          me.c_str(), static_cast<long long>(k + 1), Mean(losses, n - std::min<size_t>(n, 20), n),
          f.log_every * f.batch / std::max(secs, 1e-9), Median(pull_us), Median(push_us),
          static_cast<long long>((*client)->max_staleness()));
      std::fflush(stdout);
      window = absl::Now();
    }
  }
  if (absl::Status s = agent.runtime().store().Set(DoneKey(agent, env.role_rank), "1"); !s.ok()) {
    return Fail(me, s);
  }
  int code = 0;
  if (env.role_rank == 0) {
    const size_t n = losses.size(), m = std::min<size_t>(20, n);
    const double first = Mean(losses, 0, m), last = Mean(losses, n - m, n);
    auto stats = (*client)->Stats();
    if (!stats.ok()) return Fail(me, stats.status());
    for (const auto& st : *stats) std::printf("[%s] %s\n", me.c_str(), st.DebugString().c_str());
    std::printf("[%s] loss %.4f (first %zu steps) -> %.4f (last %zu); required ratio <= %.2f\n",
                me.c_str(), first, m, last, m, f.max_loss_ratio);
    if (last <= f.max_loss_ratio * first) {
      std::printf("RESULT OK\n");
    } else {
      std::printf("RESULT FAILED: the loss did not fall enough\n");
      code = 1;
    }
    std::fflush(stdout);
  }
  return code;
}

int Run(const Flags& f) {
  torch::set_num_threads(1);
  auto env = ReadLaunchEnv();
  if (!env.ok()) return Fail("?", env.status());
  const bool is_server = env->role == "ps";
  if (!is_server && env->role != "trainer") {
    return Fail("?", absl::InvalidArgumentError(
                         "run with --role ps:S --role trainer:T (roles 'ps' and 'trainer')"));
  }
  const int servers = is_server ? env->role_world_size : env->world_size - env->role_world_size;
  const int trainers = env->world_size - servers;
  auto wl = ctr::Workload::Create({f.rows, f.dim, f.batch, 0});
  if (!wl.ok()) return Fail(env->role, wl.status());
  const ps::PsSpec spec = MakeSpec(f, *wl, trainers);
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  std::unique_ptr<ps::PsServer> server;
  const std::string me = absl::StrCat(env->role, env->role_rank);
  if (is_server) {
    ps::ServerOptions so;
    so.server = env->role_rank;
    so.num_servers = servers;
    auto s = ps::PsServer::Create(spec, so, *registry);
    if (!s.ok()) return Fail(me, s.status());
    server = *std::move(s);
  }
  auto options = rpc::AgentOptions::FromEnv();
  if (!options.ok()) return Fail(me, options.status());
  auto agent = rpc::RpcAgent::Create(*options, registry);
  if (!agent.ok()) return Fail(me, agent.status());
  int code = 0;
  if (is_server) {
    std::vector<std::string> keys;
    for (int t = 0; t < trainers; ++t) keys.push_back(DoneKey(**agent, t));
    absl::Status s = (*agent)->runtime().store().Wait(keys, absl::Seconds(f.job_timeout));
    std::printf("[%s] %s\n", me.c_str(), server->shard().Stats().DebugString().c_str());
    if (!s.ok()) code = Fail(me, s);
    (void)server->Stop(false);
  } else {
    code = Train(f, *env, **agent, spec, *wl, servers);
  }
  if (absl::Status s = (*agent)->Shutdown(); !s.ok() && code == 0) code = Fail(me, s);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq),
                      value = eq == std::string::npos ? "" : a.substr(eq + 1);
    bool ok = eq != std::string::npos;
    if (name == "--steps")
      ok = ok && absl::SimpleAtoi(value, &f.steps);
    else if (name == "--rows")
      ok = ok && absl::SimpleAtoi(value, &f.rows);
    else if (name == "--dim")
      ok = ok && absl::SimpleAtoi(value, &f.dim);
    else if (name == "--batch")
      ok = ok && absl::SimpleAtoi(value, &f.batch);
    else if (name == "--log_every")
      ok = ok && absl::SimpleAtoi(value, &f.log_every);
    else if (name == "--max_loss_ratio")
      ok = ok && absl::SimpleAtod(value, &f.max_loss_ratio);
    else if (name == "--job_timeout")
      ok = ok && absl::SimpleAtod(value, &f.job_timeout);
    else
      ok = false;
    if (!ok || f.steps <= 0 || f.log_every <= 0) {
      std::fprintf(stderr, "ps_ctr: bad flag '%s' (flags are --name=value; see the file header)\n",
                   argv[i]);
      return 2;
    }
  }
  return Run(f);
}
