#include "ps/server.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <initializer_list>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/byte_io.h"
#include "base/file_io.h"
#include "base/log.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "obs/state.h"
#include "ps/internal/functions.h"
#include "ps/internal/shared_tables.h"
#include "rpc/agent.h"

namespace baton::ps {
namespace {

using internal::Names;
using internal::Tensors;

uint64_t Checksum(absl::string_view bytes) {  // FNV-1a, 64 bit
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string ServerDir(const std::string& dir, int server, int num_servers) {
  return absl::StrCat(dir, "/server", server, "-of-", num_servers);
}

// Checkpoint files in `dir`, newest first (names sort by clock, then seq).
std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    if (absl::StartsWith(e->d_name, "ckpt-")) names.push_back(e->d_name);
  }
  ::closedir(d);
  std::sort(names.rbegin(), names.rend());
  return names;
}

absl::Status WriteAtomically(const std::string& dir, const std::string& name,
                             const std::string& bytes) {
  ByteWriter footer;
  footer.U64(Checksum(bytes));
  const std::string tail = footer.Release();
  return Annotate(WriteFileAtomically(absl::StrCat(dir, "/", name), {bytes, tail}),
                  "ps checkpoint");
}

absl::StatusOr<std::string> ReadChecked(const std::string& path) {
  absl::StatusOr<std::string> read = ReadFile(path);
  if (!read.ok()) return Annotate(read.status(), "ps checkpoint");
  std::string bytes = *std::move(read);
  if (bytes.size() < 8) return absl::DataLossError(absl::StrCat(path, ": truncated"));
  ByteReader r(absl::string_view(bytes).substr(bytes.size() - 8));
  uint64_t sum = 0;
  r.U64(&sum);
  bytes.resize(bytes.size() - 8);
  if (Checksum(bytes) != sum) {
    return absl::DataLossError(absl::StrCat(path, ": checksum mismatch (torn or corrupt file)"));
  }
  return bytes;
}

std::vector<TableRequest> Requests(Names& tables, Tensors& ids, Tensors* grads) {
  std::vector<TableRequest> out(tables.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    out[i].table = std::move(tables[i]);
    out[i].ids = std::move(ids[i]);
    if (grads != nullptr) out[i].grad = std::move((*grads)[i]);
  }
  return out;
}

// INVALID_ARGUMENT unless a request's parallel lists (one entry per table)
// have the length of its `tables`.
absl::Status CheckLengths(const char* request, size_t tables,
                          std::initializer_list<std::pair<const char*, size_t>> lists) {
  for (const auto& [name, n] : lists) {
    if (n != tables) {
      return absl::InvalidArgumentError(
          absl::StrCat("ps ", request, ": ", tables, " tables but ", n, " ", name));
    }
  }
  return absl::OkStatus();
}

// The clock checkpoints follow: kSync's applied clock, else the slowest live
// trainer's.
int64_t ProgressClockOf(const ServerShard& shard) {
  const ShardStats st = shard.Stats();
  return shard.spec().consistency.mode == ConsistencyMode::kSync ? st.applied_clock : st.min_clock;
}

// Which worker each trainer id is (learned when it joins, restarts included),
// so that the hang report names ranks.
class TrainerRanks {
 public:
  void Note(int trainer, const rpc::CallContext& ctx) {
    if (trainer < 0 || trainer > (1 << 20) || ctx.caller == nullptr) return;
    absl::MutexLock lock(&mu_);
    if (static_cast<size_t>(trainer) >= rank_.size()) rank_.resize(trainer + 1, -1);
    rank_[trainer] = ctx.caller->id;
  }
  int Of(int trainer) const {
    absl::MutexLock lock(&mu_);
    return trainer >= 0 && static_cast<size_t>(trainer) < rank_.size() ? rank_[trainer] : -1;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<int> rank_ ABSL_GUARDED_BY(mu_);
};

// Same-host dense tables (ps/internal/shared_tables.h): the board this
// server publishes on, and the gradient box each trainer of its host
// announced at its last Join.
class SameHost {
 public:
  SameHost(std::shared_ptr<internal::ParameterBoard> board, internal::DenseLayout layout)
      : board_(std::move(board)), layout_(std::move(layout)) {}

  bool enabled() const { return board_ != nullptr; }

  // A trainer (re)joined as `session`: maps the box it announced (or forgets
  // its old one) and announces the board.
  void Join(const internal::JoinRequest& req, int64_t session, internal::JoinReply* reply,
            ServerShard& shard) {
    std::shared_ptr<internal::GradientBox> box;
    if (board_ != nullptr && !req.box.empty()) {
      auto opened = internal::GradientBox::Open({req.box, req.box_nonce, req.box_bytes}, layout_);
      if (opened.ok()) {
        box = *std::move(opened);
      } else {
        // SD4: another host's trainer (or a box of another layout): its
        // gradients come in its messages.
        shard.Log(absl::StrCat("trainer ", req.trainer,
                               "'s gradient box is not mapped: ", opened.status().ToString()));
      }
    }
    {
      absl::MutexLock lock(&mu_);
      if (box != nullptr) {
        boxes_[req.trainer] = {session, box};
      } else {
        boxes_.erase(req.trainer);
      }
    }
    reply->box_mapped = box != nullptr;
    if (board_ != nullptr) {
      reply->board = board_->announced().name;
      reply->board_nonce = board_->announced().nonce;
      reply->board_bytes = board_->announced().bytes;
    }
  }

  // A push whose dense gradients are in the trainer's box (SD3): fills them
  // in with views of the box. ABORTED for a push of an older session (its
  // box is gone: PS6); FAILED_PRECONDITION when no box is mapped.
  absl::Status FillGradients(const PsSpec& spec, internal::PushRequest& req) {
    std::shared_ptr<internal::GradientBox> box;
    {
      absl::MutexLock lock(&mu_);
      auto it = boxes_.find(req.trainer);
      if (it == boxes_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("ps push: trainer ", req.trainer,
                         " sent its gradients through a gradient box this server has not mapped"));
      }
      if (it->second.first != req.session) {
        return absl::AbortedError(absl::StrCat("ps push: trainer ", req.trainer, "'s session ",
                                               req.session, " has ended (its box went with it)"));
      }
      box = it->second.second;
    }
    std::vector<int> tables;
    std::vector<size_t> where;
    for (size_t i = 0; i < req.tables.size(); ++i) {
      if (req.gradients[i].defined()) continue;
      int index = -1;
      for (size_t t = 0; t < spec.tables.size(); ++t) {
        if (spec.tables[t].name == req.tables[i]) index = static_cast<int>(t);
      }
      if (index < 0 || spec.tables[index].kind != TableKind::kDense) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ps table '", req.tables[i], "': no such dense table (no gradient was sent for it)"));
      }
      tables.push_back(index);
      where.push_back(i);
    }
    auto views = internal::GradientBox::Views(box, req.box_generation, tables, spec);
    if (!views.ok()) return Annotate(views.status(), "ps push");
    for (size_t k = 0; k < where.size(); ++k) req.gradients[where[k]] = (*views)[k];
    box_pushes_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  uint64_t board_nonce() const { return board_ != nullptr ? board_->announced().nonce : 0; }
  void CountBoardPull() { board_pulls_.fetch_add(1, std::memory_order_relaxed); }
  int64_t board_pulls() const { return board_pulls_.load(std::memory_order_relaxed); }
  int64_t box_pushes() const { return box_pushes_.load(std::memory_order_relaxed); }
  // Shared memory this server created: its board (the boxes are the
  // trainers', PsClient::SameHostStats::bytes).
  int64_t bytes() const { return board_ != nullptr ? static_cast<int64_t>(board_->bytes()) : 0; }

 private:
  const std::shared_ptr<internal::ParameterBoard> board_;
  const internal::DenseLayout layout_;
  mutable absl::Mutex mu_;
  // trainer -> (session of its Join, its box)
  std::map<int, std::pair<int64_t, std::shared_ptr<internal::GradientBox>>> boxes_
      ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> board_pulls_{0};
  std::atomic<int64_t> box_pushes_{0};
};

// The shard of this server, and what same-host trainers share with it: the
// parameter board when asked for and possible (otherwise dense pulls carry
// their values, and the shard's log says why).
absl::StatusOr<std::pair<std::shared_ptr<ServerShard>, std::shared_ptr<SameHost>>> MakeShard(
    PsSpec spec, const ServerOptions& options) {
  ServerShard::Options so;
  so.server = options.server;
  so.num_servers = options.num_servers;
  so.log = options.log;
  internal::DenseLayout layout;
  if (ValidateSpec(spec).ok() && options.server >= 0 && options.server < options.num_servers) {
    layout =
        internal::MakeDenseLayout(spec, ShardPlan::Make(spec, options.num_servers), options.server);
  }
  absl::Status no_board;
  if (options.same_host_shm && !layout.empty()) {
    auto board = internal::ParameterBoard::Create(layout, options.server);
    if (board.ok()) {
      so.board = *std::move(board);
    } else {
      no_board = board.status();
    }
  }
  auto same_host = std::make_shared<SameHost>(so.board, layout);
  ASSIGN_OR_RETURN(std::shared_ptr<ServerShard> shard, ServerShard::Create(std::move(spec), so));
  if (!no_board.ok()) {
    shard->Log(
        absl::StrCat("no parameter board (dense pulls carry their values): ", no_board.ToString()));
  }
  return std::make_pair(std::move(shard), std::move(same_host));
}

// The server's Prometheus families: per-table traffic, the clocks, and the
// same-host paths.
void AddMetrics(rpc::FunctionRegistry& registry, std::weak_ptr<ServerShard> weak,
                std::shared_ptr<SameHost> same_host, int server_id) {
  registry.AddMetricsCollector([weak](obs::MetricsWriter& w) {
    auto sh = weak.lock();
    if (sh == nullptr) return;
    const ShardStats st = sh->Stats();
    const std::string server = absl::StrCat(st.server);
    auto per_table = [&](const char* name, const char* help, int64_t TableStats::*field) {
      w.Family(name, help, "counter");
      for (const TableStats& t : st.tables) {
        w.Sample({{"server", server}, {"table", t.table}}, static_cast<double>(t.*field));
      }
    };
    per_table("baton_ps_pulls_total", "Pulls served, per table.", &TableStats::pulls);
    per_table("baton_ps_pushes_total", "Pushes that touched the table.", &TableStats::pushes);
    per_table("baton_ps_bytes_pulled_total", "Parameter bytes sent to trainers.",
              &TableStats::bytes_pulled);
    per_table("baton_ps_bytes_pushed_total", "Gradient bytes received.", &TableStats::bytes_pushed);
    const obs::MetricsWriter::Labels me = {{"server", server}};
    w.Gauge("baton_ps_applied_clock", "Clocks fully applied (sync).",
            static_cast<double>(st.applied_clock), me);
    w.Gauge("baton_ps_min_clock", "The slowest live trainer's finished clock.",
            static_cast<double>(st.min_clock), me);
    w.Gauge("baton_ps_max_clock", "The fastest trainer's finished clock.",
            static_cast<double>(st.max_clock), me);
    w.Gauge("baton_ps_max_staleness", "The largest staleness a pull returned with.",
            static_cast<double>(st.max_staleness), me);
    w.Gauge("baton_ps_live_trainers", "Trainers the shard counts as live.",
            static_cast<double>(st.live_trainers), me);
    w.Gauge("baton_ps_parked_pulls", "Pulls waiting for slower trainers.",
            static_cast<double>(st.parked_pulls), me);
  });
  registry.AddMetricsCollector([same_host, server_id](obs::MetricsWriter& w) {
    const obs::MetricsWriter::Labels me = {{"server", absl::StrCat(server_id)}};
    w.Family("baton_ps_board_pulls_total",
             "Pulls whose dense values trainers read from the parameter board.", "counter");
    w.Sample(me, static_cast<double>(same_host->board_pulls()));
    w.Family("baton_ps_box_pushes_total",
             "Pushes whose dense gradients the server read from a trainer's gradient box.",
             "counter");
    w.Sample(me, static_cast<double>(same_host->box_pushes()));
    w.Gauge("baton_ps_shared_memory_bytes",
            "Shared memory of the server's parameter board (same-host dense tables).",
            static_cast<double>(same_host->bytes()), me);
  });
}

void AddHangReport(rpc::FunctionRegistry& registry, std::weak_ptr<ServerShard> weak,
                   std::shared_ptr<TrainerRanks> ranks) {
  // The hang report: clocks, and each parked pull as a wait of this server
  // on the trainers that keep it parked.
  registry.AddStateCollector([weak, ranks](obs::StateWriter& w) {
    auto sh = weak.lock();
    if (sh == nullptr) return;
    const ShardStats st = sh->Stats();
    const ServerShard::Waits waits = sh->CurrentWaits();
    auto rank_text = [&](int trainer) {
      const int r = ranks->Of(trainer);
      return r >= 0 ? absl::StrCat("trainer ", trainer, " (rank ", r, ")")
                    : absl::StrCat("trainer ", trainer);
    };
    auto section = w.AddSection(absl::StrCat("ps server ", st.server));
    section.Field("applied_clock", st.applied_clock)
        .Field("min_clock", st.min_clock)
        .Field("max_clock", st.max_clock)
        .Field("live_trainers", st.live_trainers)
        .Field("parked_pulls", st.parked_pulls);
    for (size_t t = 0; t < waits.finished.size(); ++t) {
      section.Line(absl::StrCat(rank_text(static_cast<int>(t)), ": finished clock ",
                                waits.finished[t], waits.live[t] ? "" : ", dropped"));
    }
    for (const auto& p : waits.parked) {
      std::vector<std::string> names;
      for (int b : p.blockers) names.push_back(rank_text(b));
      section.Line(absl::StrCat("pull of ", rank_text(p.trainer), " at clock ", p.clock,
                                " parked, waiting for ", absl::StrJoin(names, ", ")));
      for (int b : p.blockers) {
        const int r = ranks->Of(b);
        if (r < 0) continue;
        w.AddWait(r, "ps",
                  absl::StrCat("pull of ", rank_text(p.trainer), " at clock ", p.clock,
                               " parked: trainer ", b, " finished only clock ", waits.finished[b]),
                  p.since);
      }
    }
    int64_t pulls = 0, pushes = 0;
    for (const TableStats& t : st.tables) {
      pulls += t.pulls;
      pushes += t.pushes;
    }
    w.AddProgress(absl::StrCat("ps_server_", st.server, "_pulls"), pulls);
    w.AddProgress(absl::StrCat("ps_server_", st.server, "_pushes"), pushes);
  });
}

// The trainers' functions that need only the shard: join, init, pull.
absl::Status RegisterShardFunctions(rpc::FunctionRegistry& registry,
                                    std::shared_ptr<ServerShard> shard,
                                    std::shared_ptr<TrainerRanks> ranks,
                                    std::shared_ptr<SameHost> same_host) {
  absl::Status s = registry.Register(
      internal::kJoinFn,
      [shard, ranks, same_host](const rpc::CallContext& ctx,
                                internal::JoinRequest req) -> absl::StatusOr<internal::JoinReply> {
        ranks->Note(req.trainer, ctx);
        auto r = shard->Join(req.trainer, req.fingerprint);
        if (!r.ok()) return r.status();
        internal::JoinReply reply;
        reply.clock = r->clock;
        reply.session = r->session;
        same_host->Join(req, r->session, &reply, *shard);
        return reply;
      });
  if (s.ok()) {
    s = registry.Register(
        internal::kInitFn,
        [shard](internal::InitRequest req) -> absl::StatusOr<internal::InitReply> {
          if (absl::Status c =
                  CheckLengths("InitRequest", req.tables.size(), {{"values", req.values.size()}});
              !c.ok()) {
            return c;
          }
          std::vector<TableRequest> values(req.tables.size());
          for (size_t i = 0; i < req.tables.size(); ++i) {
            values[i].table = std::move(req.tables[i]);
            values[i].grad = std::move(req.values[i]);
          }
          auto n = shard->InitDense(req.trainer, values);
          if (!n.ok()) return n.status();
          internal::InitReply reply;
          reply.initialized = *n;
          return reply;
        });
  }
  if (s.ok()) {
    s = registry.Register(
        internal::kPullFn,
        [shard, same_host](const rpc::CallContext& ctx,
                           internal::PullRequest req) -> rpc::Future<internal::PullReply> {
          using Reply = internal::PullReply;
          if (absl::Status c =
                  CheckLengths("PullRequest", req.tables.size(), {{"ids", req.ids.size()}});
              !c.ok()) {
            return rpc::MakeErrorFuture<Reply>(c);
          }
          rpc::Promise<Reply> promise;
          const bool from_board = req.from_board && same_host->enabled();
          shard->Pull(
              req.trainer, req.clock, Requests(req.tables, req.ids, nullptr), ctx.deadline,
              [promise, same_host](absl::StatusOr<PullResult> r) {
                if (!r.ok()) {
                  promise.SetError(r.status());
                  return;
                }
                Reply reply;
                reply.staleness = r->staleness;
                reply.values = std::move(r->values);
                reply.board_version = r->board_version;
                if (r->board_version >= 0) {
                  reply.board_nonce = same_host->board_nonce();
                  same_host->CountBoardPull();
                }
                promise.SetValue(std::move(reply));
              },
              req.session, from_board);
          return promise.future();
        });
  }
  return s;
}

}  // namespace

PsServer::PsServer(std::shared_ptr<ServerShard> shard, ServerOptions options)
    : shard_(std::move(shard)), options_(std::move(options)) {
  last_checkpoint_time_ = absl::Now();
}

// Continues the checkpoint sequence of this server's directory and loads its
// latest checkpoint, if any (Create's step; the maintenance thread has not
// started).
absl::Status PsServer::RestoreLatestCheckpoint() {
  if (options_.checkpoint_dir.empty()) return absl::OkStatus();
  // Names sort by (clock, sequence); the sequence continues across
  // restarts, so a restarted server's checkpoint at the same clock sorts
  // after its predecessor's.
  int64_t seq = 0;
  for (const std::string& name :
       ListCheckpoints(ServerDir(options_.checkpoint_dir, options_.server, options_.num_servers))) {
    std::vector<std::string> parts = absl::StrSplit(name, '-');
    int64_t v = 0;
    if (parts.size() >= 3 && absl::SimpleAtoi(parts[2], &v)) seq = std::max(seq, v);
  }
  {
    absl::MutexLock lock(&mu_);
    checkpoint_seq_ = seq;
  }
  auto bytes = LoadLatest(options_.checkpoint_dir, options_.server, options_.num_servers);
  if (absl::IsNotFound(bytes.status())) return absl::OkStatus();
  RETURN_IF_ERROR(bytes.status());
  RETURN_IF_ERROR(shard_->Restore(*bytes));
  const ShardStats st = shard_->Stats();
  restored_clock_ =
      shard_->spec().consistency.mode == ConsistencyMode::kSync ? st.applied_clock : st.min_clock;
  if (options_.checkpoint_every_clocks > 0) {
    handle_->boundary = restored_clock_ / options_.checkpoint_every_clocks;
  }
  absl::MutexLock lock(&mu_);
  last_checkpoint_clock_ = restored_clock_;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Create(PsSpec spec, ServerOptions options,
                                                           rpc::FunctionRegistry& registry) {
  ASSIGN_OR_RETURN(auto made, MakeShard(std::move(spec), options));
  std::shared_ptr<ServerShard> shard = std::move(made.first);
  std::shared_ptr<SameHost> same_host = std::move(made.second);
  std::unique_ptr<PsServer> server(new PsServer(shard, options));
  server->shared_bytes_ = [same_host] { return same_host->bytes(); };
  RETURN_IF_ERROR(server->RestoreLatestCheckpoint());
  std::weak_ptr<ServerShard> weak = shard;
  AddMetrics(registry, weak, same_host, options.server);
  auto ranks = std::make_shared<TrainerRanks>();
  AddHangReport(registry, weak, ranks);
  absl::Status s = RegisterShardFunctions(registry, shard, ranks, same_host);
  if (s.ok()) {
    s = registry.Register(
        internal::kPushFn,
        [shard, same_host, handle = server->handle_, every = options.checkpoint_every_clocks,
         dir = !options.checkpoint_dir.empty()](
            internal::PushRequest req) -> absl::StatusOr<internal::PushReply> {
          if (absl::Status c =
                  CheckLengths("PushRequest", req.tables.size(),
                               {{"ids", req.ids.size()}, {"gradients", req.gradients.size()}});
              !c.ok()) {
            return c;
          }
          if (req.box_generation > 0) {
            RETURN_IF_ERROR(same_host->FillGradients(shard->spec(), req));
          }
          auto clock =
              shard->Push(req.trainer, req.clock, req.end_clock,
                          Requests(req.tables, req.ids, &req.gradients), req.session, req.push_id);
          if (!clock.ok()) return clock.status();
          if (dir && every > 0 && req.end_clock) {
            // A new multiple of checkpoint_every_clocks: checkpoint now, not
            // at the next check_interval (by then training may be far on).
            const int64_t b = ProgressClockOf(*shard) / every;
            int64_t seen = handle->boundary.load(std::memory_order_relaxed);
            if (b > seen && handle->boundary.compare_exchange_strong(seen, b)) {
              absl::MutexLock lock(&handle->mu);
              if (handle->server != nullptr) handle->server->WakeForCheckpoint();
            }
          }
          internal::PushReply reply;
          reply.clock = *clock;
          // A trainer of this host (its gradients came in its box) may read
          // its next pull from the board; others pull with messages.
          if (same_host->enabled() && req.box_generation > 0) {
            reply.board_version = shard->BoardVersionFor(*clock);
            reply.board_nonce = same_host->board_nonce();
          }
          return reply;
        });
  }
  if (s.ok()) {
    s = registry.Register(internal::kStatsFn,
                          [shard]() { return internal::ToProto(shard->Stats()); });
  }
  PsServer* raw = server.get();
  {
    absl::MutexLock lock(&server->handle_->mu);
    server->handle_->server = raw;
  }
  if (s.ok()) {
    s = registry.Register(
        internal::kCheckpointFn,
        [handle = server->handle_]() -> absl::StatusOr<internal::CheckpointReply> {
          absl::MutexLock lock(&handle->mu);
          if (handle->server == nullptr) {
            return absl::FailedPreconditionError("ps server: destroyed");
          }
          auto path = handle->server->CheckpointNow();
          if (!path.ok()) return path.status();
          internal::CheckpointReply reply;
          reply.path = *std::move(path);
          return reply;
        });
  }
  if (!s.ok()) return Annotate(s, "ps server: registering its functions");
  server->thread_ = std::thread([raw] { raw->Maintain(); });
  return server;
}

PsServer::~PsServer() {
  {
    absl::MutexLock lock(&handle_->mu);
    handle_->server = nullptr;
  }
  (void)Stop(false);
}

int64_t PsServer::ProgressClock() const { return ProgressClockOf(*shard_); }

void PsServer::WakeForCheckpoint() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

void PsServer::Maintain() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || wake_; };
    mu_.AwaitWithTimeout(absl::Condition(&woken), options_.check_interval);
    if (stopping_) break;
    wake_ = false;
    mu_.Unlock();
    shard_->CheckWaits();
    bool due = false;
    if (!options_.checkpoint_dir.empty()) {
      const int64_t clock = ProgressClock();
      absl::MutexLock inner(&mu_);
      // Multiples of checkpoint_every_clocks, so that the work a dead server
      // loses stays below it however fast training runs.
      due = (options_.checkpoint_every_clocks > 0 &&
             clock / options_.checkpoint_every_clocks >
                 last_checkpoint_clock_ / options_.checkpoint_every_clocks) ||
            (options_.checkpoint_every > absl::ZeroDuration() &&
             absl::Now() - last_checkpoint_time_ >= options_.checkpoint_every);
    }
    if (due) {
      auto path = CheckpointNow();
      if (!path.ok()) {
        const std::string line = absl::StrCat("ps server ", options_.server,
                                              ": checkpoint failed: ", path.status().ToString());
        if (options_.log) {
          options_.log(line);
        } else {
          Logger().Warning(line);
        }
      }
    }
    mu_.Lock();
  }
}

absl::StatusOr<std::string> PsServer::CheckpointNow() {
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError("ps server: no checkpoint directory configured");
  }
  absl::MutexLock write_lock(&write_mu_);
  ASSIGN_OR_RETURN(auto bytes, shard_->Serialize());
  const int64_t clock = ProgressClock();
  const std::string dir = ServerDir(options_.checkpoint_dir, options_.server, options_.num_servers);
  if (absl::Status s = MakeDirs(dir); !s.ok()) return Annotate(s, "ps checkpoint");
  int64_t seq;
  {
    absl::MutexLock lock(&mu_);
    seq = ++checkpoint_seq_;
  }
  const std::string name = absl::StrFormat("ckpt-%012d-%09d-%d", clock, seq, ::getpid());
  RETURN_IF_ERROR(WriteAtomically(dir, name, bytes));
  {
    absl::MutexLock lock(&mu_);
    last_checkpoint_clock_ = clock;
    last_checkpoint_time_ = absl::Now();
  }
  const std::vector<std::string> all = ListCheckpoints(dir);
  for (size_t i = 2; i < all.size(); ++i) ::unlink(absl::StrCat(dir, "/", all[i]).c_str());
  return absl::StrCat(dir, "/", name);
}

absl::StatusOr<std::string> PsServer::LoadLatest(const std::string& dir, int server,
                                                 int num_servers) {
  const std::string sdir = ServerDir(dir, server, num_servers);
  for (const std::string& name : ListCheckpoints(sdir)) {
    auto bytes = ReadChecked(absl::StrCat(sdir, "/", name));
    if (bytes.ok()) return bytes;
    Logger().Warning(
        absl::StrCat("ps server ", server, ": skipping checkpoint: ", bytes.status().ToString()));
  }
  return absl::NotFoundError(absl::StrCat("ps: no checkpoint in ", sdir));
}

absl::Status PsServer::Stop(bool final_checkpoint) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return absl::OkStatus();
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (final_checkpoint && !options_.checkpoint_dir.empty()) {
    ASSIGN_OR_RETURN(auto path, CheckpointNow());
  }
  return absl::OkStatus();
}

}  // namespace baton::ps
