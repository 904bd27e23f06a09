// baton's sparse (embedding-table) parameter-server benchmark: the CTR
// workload, metric names and JSON lines of the peer script
// shared/peer/torch_ps_sparse_bench.py (its docstring's WORKLOAD DEFINITION,
// re-implemented in //examples/ctr:workload), so both can be set side by side
// (bench/compare_ps.sh).
//
//   ps_sparse_bench [--quick] [--mode ps|local] [--servers 2] [--trainers 2]
//                   [--steps 1500 (--quick: 300)] [--warmup 10] [--rows 1000000]
//                   [--dim 64] [--batch 512] [--seed 0] [--emb-lr 0.05]
//                   [--tower-lr 0.1] [--shard mod] [--lazy-rows] [--timeout 1200]
//
// Processes (all on loopback, torch::set_num_threads(1) in each): servers
// ps0..ps{S-1} (ranks 0..S-1), each a ps::PsServer holding its rows of the
// one N x D float32 table (owner = id mod S), created eagerly at start like
// the peer's (--lazy-rows: on first pull), trained with row-wise Adagrad
// (ps::RowOptimizer::RowWiseAdagrad(lr_emb, 1e-8)) as each push arrives
// (ps::Consistency::Async()); trainers trainer0..trainer{T-1} (ranks
// S..S+T-1). One trainer step, as the peer's:
//   1. u = the batch's distinct ids, ascending; inv maps ids into u.
//   2. PullRows(u): one call per server, all in flight at once (PsClient).
//   3-4. forward through the tower, BCE-with-logits loss, backward.
//   5. PushRows(u, dloss/drows), one call per server in flight at once, with
//      end_step (the trainer's clock moves; pulls never wait in async mode).
//   6. the tower's local SGD step (lr_tower) overlaps the pushes; then the
//      trainer waits for the acks, so its next pull sees its own pushes.
// --mode local: the compute-only bound: T processes, started together, each
// with a private full table (S ps::ServerShard objects in-process, the same
// row-wise Adagrad) and direct calls instead of RPC; metrics ps_sparse_local_*.
//
// Metrics (the peer's names and timing): ps_sparse_train_throughput =
// T*K*B / the slowest trainer's wall over its K timed steps;
// ps_sparse_pull_latency_p50_us (issue of the pull -> all rows in hand, per
// timed step, all trainers); ps_sparse_push_latency_p50_us (issue of the push
// -> the last server's ack, stamped in a callback so the overlapped tower
// step is not counted); ps_sparse_unique_ids_per_batch (mean |u|);
// ps_sparse_initial_loss / ps_sparse_final_loss (mean loss over each
// trainer's first / last min(20, W+K) steps, averaged over trainers).
//
// The binary is its own driver: it starts the servers and trainers as worker
// processes of itself (bench/worker_procs.h), which send their results back
// through a pipe; the driver prints the JSON lines.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "bench/worker_procs.h"
#include "examples/ctr/workload.h"
#include "ps/client.h"
#include "ps/server.h"
#include "ps/server_shard.h"
#include "ps/spec.h"
#include "rpc/agent.h"
#include "rpc/future.h"

namespace {

namespace bench = baton::bench;
namespace ctr = baton::examples::ctr;
namespace ps = baton::ps;
namespace rpc = baton::rpc;
using baton::rpc::AgentOptions;
using baton::rpc::FunctionRegistry;
using baton::rpc::RpcAgent;

constexpr double kEps = 1e-8;
constexpr char kTable[] = "emb";

struct Config {
  std::string mode = "ps";  // ps | local
  int servers = 2;
  int trainers = 2;
  int64_t steps = 1500;
  int64_t warmup = 10;
  int64_t rows = 1000000;
  int64_t dim = 64;
  int64_t batch = 512;
  uint64_t seed = 0;
  double emb_lr = 0.05;
  double tower_lr = 0.1;
  bool lazy_rows = false;
  int64_t timeout_s = 1200;
  int master_port = 29614;

  ctr::WorkloadConfig Workload() const { return {rows, dim, batch, seed}; }
};

// The job: one embedding table whose rows start as the workload defines.
ps::PsSpec MakeSpec(const Config& cfg, const ctr::Workload& wl, int num_trainers) {
  ps::RowInit init = ps::RowInit::Custom(absl::StrCat("ctr_workload_seed", cfg.seed),
                                         [wl](absl::Span<const int64_t> ids, at::Tensor& out) {
                                           const at::Tensor t = torch::from_blob(
                                               const_cast<int64_t*>(ids.data()),
                                               {static_cast<int64_t>(ids.size())}, torch::kInt64);
                                           out.copy_(wl.InitRows(t));
                                         });
  ps::TableSpec table =
      ps::TableSpec::Embedding(kTable, cfg.rows, cfg.dim, std::move(init),
                               ps::RowOptimizer::RowWiseAdagrad(cfg.emb_lr, kEps));
  table.lazy_rows = cfg.lazy_rows;
  ps::PsSpec spec;
  spec.tables = {std::move(table)};
  spec.consistency = ps::Consistency::Async();
  spec.num_trainers = num_trainers;
  spec.trainer_timeout = absl::Seconds(120);
  spec.straggler_policy = ps::StragglerPolicy::kFail;
  return spec;
}

// Where a trainer's rows live: the servers, or private shards in-process.
class RowTable {
 public:
  virtual ~RowTable() = default;
  // Untimed preparation of a step's pull and push of `uniq` (the peer splits
  // the ids among the servers before it starts the pull's clock).
  virtual void Prepare(const at::Tensor& /*uniq*/) {}
  // The rows of `uniq` (int64, ascending, distinct): [u, dim].
  // REQUIRES: Prepare(uniq) was called.
  virtual absl::StatusOr<at::Tensor> Pull(const at::Tensor& uniq) = 0;
  // Pushes the rows' gradients; the future holds the time (Now()) the last
  // server acknowledged. REQUIRES: `grad` unchanged until it completes.
  virtual rpc::Future<double> Push(const at::Tensor& uniq, const at::Tensor& grad) = 0;
};

class RemoteTable : public RowTable {
 public:
  explicit RemoteTable(std::unique_ptr<ps::PsClient> client) : client_(std::move(client)) {}
  // PsClient splits the ids by server inside PullRows/PushRows (timed).
  absl::StatusOr<at::Tensor> Pull(const at::Tensor& uniq) override {
    return client_->PullRows(kTable, uniq).result();
  }
  rpc::Future<double> Push(const at::Tensor& uniq, const at::Tensor& grad) override {
    rpc::Promise<double> stamped;
    client_->PushRows(kTable, uniq, grad, /*end_step=*/true).OnReady([stamped](const auto& r) {
      if (r.ok()) {
        stamped.SetValue(bench::Now());
      } else {
        stamped.SetError(r.status());
      }
    });
    return stamped.future();
  }

 private:
  std::unique_ptr<ps::PsClient> client_;
};

// --mode local: the peer's local EmbeddingShard objects, as ServerShards
// (the servers' own update code), called directly.
class LocalTable : public RowTable {
 public:
  static absl::StatusOr<std::unique_ptr<LocalTable>> Create(const ps::PsSpec& spec, int servers) {
    std::unique_ptr<LocalTable> t(new LocalTable());
    for (int s = 0; s < servers; ++s) {
      auto shard = ps::ServerShard::Create(spec, {s, servers});
      if (!shard.ok()) return shard.status();
      t->shards_.push_back(*std::move(shard));
    }
    return t;
  }

  // The peer's split: owner = id mod S; pos[s] = where server s's ids are.
  void Prepare(const at::Tensor& uniq) override {
    const int S = static_cast<int>(shards_.size());
    const at::Tensor owner = uniq.remainder(S);
    pos_.clear();
    part_.clear();
    for (int s = 0; s < S; ++s) {
      pos_.push_back(owner.eq(s).nonzero().squeeze(1));
      part_.push_back(uniq.index_select(0, pos_[s]));
    }
  }

  absl::StatusOr<at::Tensor> Pull(const at::Tensor& uniq) override {
    at::Tensor rows;
    for (size_t s = 0; s < shards_.size(); ++s) {
      absl::StatusOr<ps::PullResult> got = absl::UnknownError("pull not answered");
      shards_[s]->Pull(0, clock_, {ps::TableRequest{kTable, part_[s], {}}}, absl::InfiniteFuture(),
                       [&got](absl::StatusOr<ps::PullResult> r) { got = std::move(r); });
      if (!got.ok()) return got.status();
      if (!rows.defined()) rows = at::empty({uniq.numel(), got->values[0].size(1)});
      rows.index_copy_(0, pos_[s], got->values[0]);
    }
    return rows;
  }

  // The split of `uniq` is Prepare's (pos_, part_).
  rpc::Future<double> Push(const at::Tensor& /*uniq*/, const at::Tensor& grad) override {
    int64_t clock = clock_;
    for (size_t s = 0; s < shards_.size(); ++s) {
      ps::TableRequest req{kTable, part_[s], grad.index_select(0, pos_[s])};
      auto r = shards_[s]->Push(0, clock_, /*end_clock=*/true, {std::move(req)});
      if (!r.ok()) return rpc::MakeErrorFuture<double>(r.status());
      clock = std::max(clock, *r);
    }
    clock_ = clock;
    return rpc::MakeReadyFuture<double>(bench::Now());
  }

 private:
  LocalTable() = default;
  std::vector<std::unique_ptr<ps::ServerShard>> shards_;
  int64_t clock_ = 0;
  // The split of the ids of the current step (Prepare).
  std::vector<at::Tensor> pos_, part_;
};

struct TrainerResult {
  double samples = 0, wall = 0;
  std::vector<double> losses, pull_us, push_us, uniq;
};

// The peer's train(): trainer t's warmup + steps steps against `table`.
absl::StatusOr<TrainerResult> Train(const Config& cfg, const ctr::Workload& wl, int t,
                                    RowTable& table) {
  torch::nn::Sequential tower = wl.MakeTower();
  torch::optim::SGD opt(tower->parameters(), torch::optim::SGDOptions(cfg.tower_lr));
  const int64_t B = cfg.batch, D = cfg.dim;
  TrainerResult res;
  double t0 = bench::Now();
  for (int64_t k = 0; k < cfg.warmup + cfg.steps; ++k) {
    if (k == cfg.warmup) t0 = bench::Now();
    ctr::Batch batch = wl.MakeBatch(t, k);
    auto [uniq, inv, counts] = at::_unique2(batch.ids, /*sorted=*/true, /*return_inverse=*/true,
                                            /*return_counts=*/false);
    table.Prepare(uniq);
    double tp = bench::Now();
    absl::StatusOr<at::Tensor> pulled = table.Pull(uniq);
    if (!pulled.ok()) return pulled.status();
    tp = bench::Now() - tp;
    at::Tensor rows = *pulled;
    rows.requires_grad_(true);
    at::Tensor input = at::cat({rows.index({inv}).view({B, ctr::kFields * D}), batch.dense}, 1);
    at::Tensor logit = tower->forward(input).squeeze(1);
    at::Tensor loss = torch::nn::functional::binary_cross_entropy_with_logits(logit, batch.labels);
    opt.zero_grad();
    loss.backward();
    const at::Tensor grad = rows.grad();
    double tq = bench::Now();
    rpc::Future<double> acked = table.Push(uniq, grad);
    opt.step();  // overlaps the pushes
    const auto& a = acked.result();
    if (!a.ok()) return a.status();
    tq = *a - tq;
    res.losses.push_back(loss.item<double>());
    if (k >= cfg.warmup) {
      res.pull_us.push_back(tp * 1e6);
      res.push_us.push_back(tq * 1e6);
      res.uniq.push_back(static_cast<double>(uniq.numel()));
    }
  }
  res.wall = bench::Now() - t0;
  res.samples = static_cast<double>(cfg.steps * B);
  return res;
}

void SendResult(bench::WorkerChannel& ch, const TrainerResult& r) {
  ch.Send("samples " + bench::Numbers({r.samples}));
  ch.Send("wall " + bench::Numbers({r.wall}));
  ch.Send("losses " + bench::Numbers(r.losses));
  ch.Send("pull_us " + bench::Numbers(r.pull_us));
  ch.Send("push_us " + bench::Numbers(r.push_us));
  ch.Send("uniq " + bench::Numbers(r.uniq));
  ch.Send("done");
}

absl::StatusOr<std::unique_ptr<RpcAgent>> MakeAgent(std::shared_ptr<FunctionRegistry> registry) {
  auto opts = AgentOptions::FromEnv();
  if (!opts.ok()) return opts.status();
  opts->timeouts.rpc = absl::Seconds(120);
  opts->timeouts.init = absl::Seconds(300);  // servers build their tables first
  opts->timeouts.shutdown = absl::Seconds(60);
  return RpcAgent::Create(*opts, std::move(registry));
}

absl::Status RunServer(const Config& cfg, const ctr::Workload& wl, int s,
                       bench::WorkerChannel& ch) {
  auto registry = std::make_shared<FunctionRegistry>();
  ps::ServerOptions o;
  o.server = s;
  o.num_servers = cfg.servers;
  auto server = ps::PsServer::Create(MakeSpec(cfg, wl, cfg.trainers), o, *registry);
  if (!server.ok()) return server.status();
  auto agent = MakeAgent(registry);
  if (!agent.ok()) return agent.status();
  const bool released = ch.WaitRelease();  // every trainer is done
  ch.Send(absl::StrCat("pushes ", (*server)->shard().Stats().applied_pushes));
  absl::Status stopped = (*server)->Stop(false);
  absl::Status shut = (*agent)->Shutdown(released);
  if (!released) return absl::AbortedError("the driver gave up");
  return stopped.ok() ? shut : stopped;
}

absl::Status RunTrainer(const Config& cfg, const ctr::Workload& wl, int t,
                        bench::WorkerChannel& ch) {
  auto agent = MakeAgent(std::make_shared<FunctionRegistry>());
  if (!agent.ok()) return agent.status();
  ps::PsClient::Options o;
  o.trainer = t;
  for (int s = 0; s < cfg.servers; ++s) o.servers.push_back(absl::StrCat("ps", s));
  o.timeout = absl::Seconds(120);
  auto client = ps::PsClient::Create(**agent, MakeSpec(cfg, wl, cfg.trainers), o);
  if (!client.ok()) {
    (void)(*agent)->Shutdown(false);
    return client.status();
  }
  RemoteTable table(*std::move(client));
  auto r = Train(cfg, wl, t, table);
  if (!r.ok()) {
    (void)(*agent)->Shutdown(false);
    return r.status();
  }
  SendResult(ch, *r);
  // Shut down together (a graceful shutdown is a barrier of all workers).
  const bool released = ch.WaitRelease();
  absl::Status s = (*agent)->Shutdown(released);
  return released ? s : absl::AbortedError("the driver gave up");
}

absl::Status RunLocalTrainer(const Config& cfg, const ctr::Workload& wl, int t,
                             bench::WorkerChannel& ch) {
  auto table = LocalTable::Create(MakeSpec(cfg, wl, 1), cfg.servers);
  if (!table.ok()) return table.status();
  ch.Send("ready");
  if (!ch.WaitRelease()) return absl::AbortedError("the driver gave up");  // start together
  auto r = Train(cfg, wl, t, **table);
  if (!r.ok()) return r.status();
  SendResult(ch, *r);
  return absl::OkStatus();
}

int RunWorker(const Config& cfg, int index) {
  torch::set_num_threads(1);
  bench::WorkerChannel ch = bench::WorkerChannel::Open();
  const bool local = cfg.mode == "local";
  const bool server = !local && index < cfg.servers;
  const int t = local ? index : index - cfg.servers;
  const std::string who = server ? absl::StrCat("ps", index) : absl::StrCat("trainer", t);
  absl::Status s;
  try {
    auto wl = ctr::Workload::Create(cfg.Workload());
    if (!wl.ok()) {
      s = wl.status();
    } else if (local) {
      s = RunLocalTrainer(cfg, *wl, t, ch);
    } else {
      s = server ? RunServer(cfg, *wl, index, ch) : RunTrainer(cfg, *wl, t, ch);
    }
  } catch (const std::exception& e) {
    s = absl::InternalError(absl::StrCat("exception: ", e.what()));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "ps_sparse_bench %s: %s\n", who.c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}

class Reporter {
 public:
  explicit Reporter(const Config& cfg) : cfg_(cfg) {}
  // The peer's meta fields, then the metric.
  bench::JsonLine Line(const std::string& metric, double value, const std::string& unit) const {
    bench::JsonLine j;
    j.Add("system", "baton").Add("version", "0.1.0").Add("mode", cfg_.mode);
    j.Add("servers", cfg_.servers).Add("trainers", cfg_.trainers).Add("rows", cfg_.rows);
    j.Add("dim", cfg_.dim).Add("batch", cfg_.batch).Add("fields", ctr::kFields);
    j.Add("steps", cfg_.steps).Add("warmup", cfg_.warmup).Add("shard", "mod");
    j.Add("optimizer", "rowwise_adagrad").Add("emb_lr", cfg_.emb_lr);
    j.Add("tower_lr", cfg_.tower_lr).Add("seed", static_cast<int64_t>(cfg_.seed));
    j.Add("lazy_rows", static_cast<int>(cfg_.lazy_rows));
    j.Add("metric", metric).Add("value", value).Add("unit", unit);
    return j;
  }

 private:
  const Config& cfg_;
};

int Drive(const Config& cfg, const std::vector<std::string>& args) {
  const bool local = cfg.mode == "local";
  std::vector<bench::WorkerSpec> specs;
  if (!local) {
    for (int s = 0; s < cfg.servers; ++s) specs.push_back({absl::StrCat("ps", s), s});
  }
  for (int t = 0; t < cfg.trainers; ++t) {
    specs.push_back({absl::StrCat("trainer", t), static_cast<int>(specs.size())});
  }
  const int first_trainer = local ? 0 : cfg.servers;
  // Per trainer: "samples", "wall", "losses", ... -> numbers.
  std::vector<std::map<std::string, std::vector<double>>> got(cfg.trainers);
  int64_t pushes = 0;
  int done = 0;
  auto group = bench::WorkerGroup::Spawn(specs, args, cfg.master_port);
  absl::Status s = group.status();
  if (s.ok()) {
    int ready = 0;
    s = (*group)->Wait(
        absl::Seconds(cfg.timeout_s), absl::Seconds(20), [&](int w, const std::string& line) {
          if (w < first_trainer) {  // a server
            if (absl::StartsWith(line, "pushes ")) pushes += std::atoll(line.c_str() + 7);
            return;
          }
          if (line == "ready" && ++ready == cfg.trainers) (*group)->ReleaseAll();
          if (line == "done" && ++done == cfg.trainers && !local) (*group)->ReleaseAll();
          const size_t sp = line.find(' ');
          if (sp != std::string::npos) {
            got[w - first_trainer][line.substr(0, sp)] = bench::ParseNumbers(line.substr(sp + 1));
          }
        });
  }
  if (s.ok() && done != cfg.trainers) {
    s = absl::InternalError(absl::StrCat(done, " of ", cfg.trainers, " trainers sent a result"));
  }
  Reporter rep(cfg);
  if (!s.ok()) {
    rep.Line("ps_sparse_train_failed", 1, "error").Add("error", s.ToString()).Print();
    return 1;
  }
  double samples = 0, wall = 0, initial = 0, final_loss = 0;
  std::vector<double> pull_us, push_us, uniq;
  const int64_t n = std::min<int64_t>(20, cfg.warmup + cfg.steps);
  for (auto& r : got) {
    samples += r["samples"].at(0);
    wall = std::max(wall, r["wall"].at(0));
    pull_us.insert(pull_us.end(), r["pull_us"].begin(), r["pull_us"].end());
    push_us.insert(push_us.end(), r["push_us"].begin(), r["push_us"].end());
    uniq.insert(uniq.end(), r["uniq"].begin(), r["uniq"].end());
    const std::vector<double>& l = r["losses"];
    if (static_cast<int64_t>(l.size()) < n) {
      rep.Line("ps_sparse_train_failed", 1, "error").Add("error", "short loss record").Print();
      return 1;
    }
    initial += bench::Mean({l.begin(), l.begin() + n}) / cfg.trainers;
    final_loss += bench::Mean({l.end() - n, l.end()}) / cfg.trainers;
  }
  const std::string m = local ? "ps_sparse_local" : "ps_sparse";
  rep.Line(m + "_train_throughput", samples / wall, "samples/s").Print();
  rep.Line(m + "_pull_latency_p50_us", bench::Median(pull_us), "us")
      .Add("note", "per step: all servers' pulls in flight")
      .Print();
  bench::JsonLine push = rep.Line(m + "_push_latency_p50_us", bench::Median(push_us), "us");
  push.Add("note", "per step: all servers' pushes in flight");
  if (!local) push.Add("pushes_applied", pushes);
  push.Print();
  rep.Line(m + "_unique_ids_per_batch", bench::Mean(uniq), "ids")
      .Add("ids_per_batch", cfg.batch * ctr::kFields)
      .Print();
  rep.Line(m + "_initial_loss", initial, "logistic loss")
      .Add("note", absl::StrCat("mean over each trainer's first ", n, " steps"))
      .Print();
  rep.Line(m + "_final_loss", final_loss, "logistic loss")
      .Add("note", absl::StrCat("mean over each trainer's last ", n, " steps"))
      .Print();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = bench::ForwardedArgs(argc, argv);
  bench::Flags flags({"mode", "servers", "trainers", "steps", "warmup", "rows", "dim", "batch",
                      "seed", "emb-lr", "tower-lr", "shard", "timeout"},
                     {"quick", "lazy-rows"});
  if (!flags.Parse(args)) return 2;
  Config cfg;
  cfg.mode = flags.Str("mode", cfg.mode);
  cfg.servers = static_cast<int>(flags.Int("servers", cfg.servers));
  cfg.trainers = static_cast<int>(flags.Int("trainers", cfg.trainers));
  cfg.steps = flags.Int("steps", flags.Bool("quick") ? 300 : cfg.steps);
  cfg.warmup = flags.Int("warmup", cfg.warmup);
  cfg.rows = flags.Int("rows", cfg.rows);
  cfg.dim = flags.Int("dim", cfg.dim);
  cfg.batch = flags.Int("batch", cfg.batch);
  cfg.seed = static_cast<uint64_t>(flags.Int("seed", 0));
  cfg.emb_lr = flags.Double("emb-lr", cfg.emb_lr);
  cfg.tower_lr = flags.Double("tower-lr", cfg.tower_lr);
  cfg.lazy_rows = flags.Bool("lazy-rows");
  cfg.timeout_s = flags.Int("timeout", cfg.timeout_s);
  if (const char* p = std::getenv("MASTER_PORT"); p != nullptr && *p != '\0') {
    cfg.master_port = std::atoi(p);
  }
  if (cfg.mode != "ps" && cfg.mode != "local") {
    std::fprintf(stderr, "--mode must be ps or local (got '%s')\n", cfg.mode.c_str());
    return 2;
  }
  if (flags.Str("shard", "mod") != "mod") {
    // ps::ShardPlan places rows by id mod S; row-wise updates make the
    // results independent of the placement anyway.
    std::fprintf(stderr, "--shard: only 'mod' (ps::ShardPlan's placement) is supported\n");
    return 2;
  }
  if (cfg.servers < 1 || cfg.trainers < 1 || cfg.steps < 1 || cfg.warmup < 0 ||
      cfg.servers + cfg.trainers > 1024) {
    std::fprintf(stderr, "need --servers >= 1, --trainers >= 1, --steps >= 1, --warmup >= 0\n");
    return 2;
  }
  const int worker = bench::WorkerIndex(argc, argv);
  if (worker >= 0) return RunWorker(cfg, worker);
  if (auto wl = ctr::Workload::Create(cfg.Workload()); !wl.ok()) {  // bad sizes, before spawning
    std::fprintf(stderr, "%s\n", wl.status().ToString().c_str());
    return 2;
  }
  return Drive(cfg, args);
}
