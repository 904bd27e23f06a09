#include "ps/client.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_unique2.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "ps/internal/functions.h"
#include "ps/internal/shared_tables.h"
#include "rpc/agent.h"

namespace baton::ps {

struct PsClient::Part {
  int server = 0;
  internal::Names tables;
  internal::Tensors ids;
  internal::Tensors grads;
  // A dense pull that may read the server's board: reads the part's values
  // into their destinations; on failure the part is pulled again with them.
  std::function<absl::Status(int64_t version, uint64_t board)> read_board;
  uint64_t box_generation = 0;  // a dense push whose gradients are in the box
};

struct PsClient::SameHostServer {
  internal::DenseLayout layout;
  std::unique_ptr<internal::ParameterBoard> board;  // null: none mapped
  std::unique_ptr<internal::GradientBox> box;       // null: none, or not mapped there
};

PsClient::~PsClient() = default;

namespace {

// Pulls and pushes go again after a partition broke their stream
// (rpc::CallOptions::idempotent): a pull reads, and a server applies a push
// id once (PS9 in ps/server_shard.h).
rpc::CallOptions Idempotent(absl::Duration timeout) {
  rpc::CallOptions o{timeout};
  o.idempotent = true;
  return o;
}

// Completes one promise when every one of n results arrived (first error
// wins). Results are kept in slot order.
template <typename T>
struct Gather {
  explicit Gather(size_t n, rpc::Executor* ex) : results(n), remaining(n), promise(ex) {}
  void Put(size_t slot, absl::StatusOr<T> r, const std::function<void(std::vector<T>&)>& finish,
           const std::string& what) {
    bool last = false;
    {
      absl::MutexLock lock(&mu);
      if (!r.ok()) {
        if (error.ok()) error = Annotate(r.status(), what);
      } else {
        results[slot] = *std::move(r);
      }
      last = --remaining == 0;
    }
    if (!last) return;
    if (!error.ok()) {
      promise.SetError(error);
      return;
    }
    finish(results);
  }
  absl::Mutex mu;
  std::vector<T> results;
  size_t remaining;
  absl::Status error;
  rpc::Promise<std::vector<T>> promise;
};

bool StrictlyIncreasing(const int64_t* p, int64_t n) {
  for (int64_t i = 1; i < n; ++i) {
    if (p[i] <= p[i - 1]) return false;
  }
  return true;
}

}  // namespace

PsClient::PsClient(rpc::RpcAgent& agent, PsSpec spec, Options options)
    : agent_(agent.runtime()),
      spec_(std::move(spec)),
      options_(std::move(options)),
      plan_(ShardPlan::Make(spec_, static_cast<int>(options_.servers.size()))) {}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(rpc::RpcAgent& agent, PsSpec spec,
                                                           Options options) {
  RETURN_IF_ERROR(ValidateSpec(spec));
  if (options.servers.empty()) return absl::InvalidArgumentError("ps client: no servers given");
  if (options.trainer < 0 || options.trainer >= spec.num_trainers) {
    return absl::InvalidArgumentError(absl::StrCat("ps client: trainer id ", options.trainer,
                                                   " out of range; the job has ", spec.num_trainers,
                                                   " trainers"));
  }
  std::unique_ptr<PsClient> c(new PsClient(agent, std::move(spec), std::move(options)));
  for (const std::string& name : c->options_.servers) {
    auto w = agent.worker(name);
    if (!w.ok()) return Annotate(w.status(), "ps client: server");
    c->server_ids_.push_back(w->id);
  }
  {
    absl::MutexLock lock(&c->mu_);
    c->clock_.assign(c->server_ids_.size(), 0);
    c->session_.assign(c->server_ids_.size(), 0);
    c->next_push_id_.assign(c->server_ids_.size(), 1);
  }
  RETURN_IF_ERROR(c->Join());
  return c;
}

absl::Status PsClient::Join() {
  internal::JoinRequest req;
  req.trainer = options_.trainer;
  req.fingerprint = spec_.Fingerprint();
  std::vector<rpc::Future<internal::JoinReply>> futs;
  same_host_.clear();
  for (size_t s = 0; s < server_ids_.size(); ++s) {
    auto host = std::make_unique<SameHostServer>();
    host->layout = internal::MakeDenseLayout(spec_, plan_, static_cast<int>(s));
    internal::JoinRequest r = req;
    // Only toward a server the agent reaches through shared memory (same
    // host, and BATON_SHM not turned off).
    if (options_.same_host_shm && agent_.uses_shm(server_ids_[s]) && !host->layout.empty()) {
      // A box the server maps if it shares this host (SD4); a failure here
      // (no room in /dev/shm) leaves the pushes in the messages.
      auto box = internal::GradientBox::Create(host->layout, options_.trainer, static_cast<int>(s));
      if (box.ok()) {
        host->box = *std::move(box);
        r.box = host->box->announced().name;
        r.box_nonce = host->box->announced().nonce;
        r.box_bytes = host->box->announced().bytes;
      }
    }
    same_host_.push_back(std::move(host));
    futs.push_back(agent_.rpc_async(rpc::CallOptions{options_.timeout}, server_ids_[s],
                                    internal::kJoinFn, std::move(r)));
  }
  absl::MutexLock lock(&mu_);
  same_host_stats_ = SameHostStats();
  board_floor_.assign(server_ids_.size(), BoardFloor());
  for (size_t s = 0; s < futs.size(); ++s) {
    const auto& r = futs[s].result();
    if (!r.ok()) return Annotate(r.status(), absl::StrCat("ps client: joining server ", s));
    clock_[s] = r->clock;
    session_[s] = r->session;
    next_push_id_[s] = 1;
    SameHostServer& host = *same_host_[s];
    if (!r->box_mapped) host.box.reset();  // another host's server: unlinked
    if (options_.same_host_shm && agent_.uses_shm(server_ids_[s]) && !r->board.empty()) {
      auto board =
          internal::ParameterBoard::Open({r->board, r->board_nonce, r->board_bytes}, host.layout);
      if (board.ok()) host.board = *std::move(board);  // else (SD4) pulls carry the values
    }
    same_host_stats_.servers_with_board += host.board != nullptr;
    same_host_stats_.servers_with_box += host.box != nullptr;
  }
  return absl::OkStatus();
}

PsClient::SameHostStats PsClient::SameHost() const {
  absl::MutexLock lock(&mu_);
  SameHostStats out = same_host_stats_;
  out.bytes = 0;
  for (const auto& host : same_host_) {
    if (host->box != nullptr) out.bytes += static_cast<int64_t>(host->box->bytes());
  }
  return out;
}

absl::Status PsClient::ReadBoard(int server, int64_t version, uint64_t board,
                                 const std::vector<std::pair<int, at::Tensor>>& into) {
  const SameHostServer& host = *same_host_[server];
  // Versions count per board: a reply naming another board (a server that
  // restarted with a new one) is not read from this one.
  absl::StatusOr<int64_t> read =
      host.board != nullptr && host.board->announced().nonce == board
          ? host.board->Read(version, into)
          : absl::StatusOr<int64_t>(absl::FailedPreconditionError("not the mapped board"));
  absl::MutexLock lock(&mu_);
  ++(read.ok() ? same_host_stats_.board_reads : same_host_stats_.board_retries);
  return read.status();
}

uint64_t PsClient::WriteBox(int server, const std::vector<std::pair<int, at::Tensor>>& grads) {
  SameHostServer& host = *same_host_[server];
  if (host.box == nullptr) return 0;
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&box_mu_);
    if (host.box->Free()) {  // only once the server released every generation written (SD3)
      absl::StatusOr<uint64_t> written = host.box->Write(grads);
      generation = written.ok() ? *written : 0;  // else the push carries them
    }
  }
  absl::MutexLock lock(&mu_);
  ++(generation > 0 ? same_host_stats_.box_pushes : same_host_stats_.box_busy);
  return generation;
}

int64_t PsClient::clock() const {
  absl::MutexLock lock(&mu_);
  return *std::min_element(clock_.begin(), clock_.end());
}

int64_t PsClient::max_staleness() const {
  absl::MutexLock lock(&mu_);
  return max_staleness_;
}

absl::StatusOr<int> PsClient::TableIndex(const std::string& table, TableKind kind) const {
  for (size_t i = 0; i < spec_.tables.size(); ++i) {
    if (spec_.tables[i].name != table) continue;
    if (spec_.tables[i].kind != kind) {
      return absl::InvalidArgumentError(
          absl::StrCat("ps table '", table, "': ",
                       kind == TableKind::kDense ? "an embedding table, use PullRows/PushRows"
                                                 : "a dense table, use Pull/Push"));
    }
    return static_cast<int>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat("ps table '", table, "': no such table"));
}

rpc::Future<std::vector<std::vector<at::Tensor>>> PsClient::SendPulls(std::vector<Part> parts,
                                                                      const std::string& what) {
  using Out = std::vector<at::Tensor>;
  auto g = std::make_shared<Gather<Out>>(parts.size(), agent_.executor());
  auto fut = g->promise.future();
  if (parts.empty()) {
    g->promise.SetValue({});
    return fut;
  }
  std::vector<int64_t> clocks, sessions;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& p : parts) {
      clocks.push_back(clock_[p.server]);
      sessions.push_back(session_[p.server]);
    }
  }
  for (size_t k = 0; k < parts.size(); ++k) {
    Part& p = parts[k];
    internal::PullRequest req;
    req.trainer = options_.trainer;
    req.session = sessions[k];
    req.clock = clocks[k];
    req.tables = std::move(p.tables);
    req.ids = std::move(p.ids);
    req.from_board = p.read_board != nullptr;
    const int server = server_ids_[p.server];
    // The same request with its values, should the board read fail.
    internal::PullRequest again;
    if (req.from_board) {
      again = req;
      again.from_board = false;
    }
    auto deliver = [this, g, k, what, server](const absl::StatusOr<internal::PullReply>& r) {
      absl::StatusOr<Out> values;
      if (r.ok()) {
        {
          absl::MutexLock lock(&mu_);
          max_staleness_ = std::max(max_staleness_, r->staleness);
        }
        values = r->values;
        // Only values read from the board (board_version >= 0, read before
        // this) may be missing from a reply.
        if (r->board_version < 0 && std::any_of(r->values.begin(), r->values.end(),
                                                [](const at::Tensor& v) { return !v.defined(); })) {
          values = absl::DataLossError(
              absl::StrCat("ps pull: worker ", server,
                           " left a value out of its reply without a board version"));
        }
      } else {
        values = r.status();
      }
      g->Put(
          k, std::move(values), [g](std::vector<Out>& all) { g->promise.SetValue(std::move(all)); },
          what);
    };
    // A pull reads: it may go again after a partition broke its connection.
    auto f =
        agent_.rpc_async(Idempotent(options_.timeout), server, internal::kPullFn, std::move(req));
    f.OnReady([this, server, deliver, read = std::move(p.read_board), timeout = options_.timeout,
               again = std::move(again)](const absl::StatusOr<internal::PullReply>& r) mutable {
      if (!r.ok() || r->board_version < 0 || read(r->board_version, r->board_nonce).ok()) {
        deliver(r);
        return;
      }
      // SD1: no whole version could be read; pull the values themselves.
      agent_.rpc_async(Idempotent(timeout), server, internal::kPullFn, std::move(again))
          .OnReady(deliver);
    });
  }
  return fut;
}

rpc::Future<void> PsClient::SendPushes(std::vector<Part> parts, bool end_step,
                                       const std::string& what) {
  auto g = std::make_shared<Gather<int64_t>>(parts.size(), agent_.executor());
  rpc::Promise<void> done(agent_.executor());
  if (parts.empty()) {
    done.SetValue();
    return done.future();
  }
  std::vector<int64_t> clocks, sessions;
  std::vector<uint64_t> push_ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& p : parts) {
      clocks.push_back(clock_[p.server]);
      sessions.push_back(session_[p.server]);
      push_ids.push_back(next_push_id_[p.server]++);
      if (end_step) ++clock_[p.server];
    }
  }
  for (size_t k = 0; k < parts.size(); ++k) {
    Part& p = parts[k];
    const int server = p.server;
    internal::PushRequest req;
    req.trainer = options_.trainer;
    req.session = sessions[k];
    req.clock = clocks[k];
    req.end_clock = end_step;
    req.tables = std::move(p.tables);
    req.ids = std::move(p.ids);
    req.gradients = std::move(p.grads);
    req.box_generation = p.box_generation;
    req.push_id = push_ids[k];
    // PS9: the server applies a push id once, so a push may go again after
    // a partition broke its connection.
    auto f = agent_.rpc_async(Idempotent(options_.timeout), server_ids_[server], internal::kPushFn,
                              std::move(req));
    f.OnReady([this, g, k, server, done, what](const absl::StatusOr<internal::PushReply>& r) {
      absl::StatusOr<int64_t> at_clock;
      if (r.ok()) {
        absl::MutexLock lock(&mu_);
        clock_[server] = std::max(clock_[server], r->clock);
        at_clock = r->clock;
        const auto* board = same_host_[server]->board.get();
        if (board != nullptr && board->announced().nonce == r->board_nonce) {
          board_floor_[server] = {r->clock, r->board_version};
        }
      } else {
        at_clock = r.status();
      }
      g->Put(
          k, std::move(at_clock), [done](std::vector<int64_t>&) { done.SetValue(); }, what);
    });
  }
  // Errors reach `done` through the gather's promise.
  g->promise.future().OnReady([done](const auto& r) {
    if (!r.ok()) done.SetError(r.status());
  });
  return done.future();
}

absl::Status PsClient::InitDense(const std::vector<std::string>& tables,
                                 const std::vector<at::Tensor>& values) {
  if (tables.size() != values.size()) {
    return absl::InvalidArgumentError("ps InitDense: tables and values differ in length");
  }
  std::vector<Part> parts(server_ids_.size());
  for (size_t s = 0; s < parts.size(); ++s) parts[s].server = static_cast<int>(s);
  for (size_t i = 0; i < tables.size(); ++i) {
    ASSIGN_OR_RETURN(auto idx, TableIndex(tables[i], TableKind::kDense));
    const TableSpec& t = spec_.tables[idx];
    if (values[i].numel() != t.numel() || values[i].scalar_type() != t.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("ps table '", t.name, "': initial value has ", values[i].numel(),
                       " elements of ", c10::toString(values[i].scalar_type()), ", the table ",
                       t.numel(), " of ", c10::toString(t.dtype)));
    }
    at::Tensor flat = values[i].reshape(-1).contiguous();
    for (const auto& c : plan_.chunks(idx)) {
      parts[c.server].tables.push_back(t.name);
      parts[c.server].grads.push_back(flat.narrow(0, c.begin, c.size()));
    }
  }
  std::vector<rpc::Future<internal::InitReply>> futs;
  for (auto& p : parts) {
    if (p.tables.empty()) continue;
    internal::InitRequest req;
    req.trainer = options_.trainer;
    req.tables = std::move(p.tables);
    req.values = std::move(p.grads);
    futs.push_back(agent_.rpc_async(rpc::CallOptions{options_.timeout}, server_ids_[p.server],
                                    internal::kInitFn, std::move(req)));
  }
  return Annotate(rpc::WaitAll(futs, options_.timeout), "ps InitDense");
}

rpc::Future<std::vector<at::Tensor>> PsClient::PullDense(const std::vector<std::string>& tables) {
  return PullDenseInto(tables, {});
}

rpc::Future<std::vector<at::Tensor>> PsClient::PullDenseInto(const std::vector<std::string>& tables,
                                                             std::vector<at::Tensor> into) {
  using Out = std::vector<at::Tensor>;
  std::vector<int> idx;
  for (const auto& name : tables) {
    auto i = TableIndex(name, TableKind::kDense);
    if (!i.ok()) return rpc::MakeErrorFuture<Out>(i.status());
    idx.push_back(*i);
  }
  if (!into.empty() && into.size() != tables.size()) {
    return rpc::MakeErrorFuture<Out>(
        absl::InvalidArgumentError("ps pull: tables and destinations differ in length"));
  }
  for (size_t j = 0; j < into.size(); ++j) {
    const TableSpec& t = spec_.tables[idx[j]];
    if (!into[j].defined() || into[j].sizes() != c10::IntArrayRef(t.shape) ||
        into[j].scalar_type() != t.dtype || !into[j].is_contiguous() || into[j].requires_grad()) {
      return rpc::MakeErrorFuture<Out>(absl::InvalidArgumentError(
          absl::StrCat("ps table '", t.name, "': a pull destination must be a contiguous ",
                       c10::toString(t.dtype), "[", absl::StrJoin(t.shape, ","),
                       "] tensor that does not require grad")));
    }
  }
  std::vector<Part> parts(server_ids_.size());
  for (size_t s = 0; s < parts.size(); ++s) parts[s].server = static_cast<int>(s);
  // Where each server's k-th value goes: (table position, chunk).
  std::vector<std::vector<std::pair<int, DenseChunk>>> where(parts.size());
  for (size_t j = 0; j < idx.size(); ++j) {
    for (const auto& c : plan_.chunks(idx[j])) {
      parts[c.server].tables.push_back(tables[j]);
      parts[c.server].ids.emplace_back();
      where[c.server].emplace_back(static_cast<int>(j), c);
    }
  }
  std::vector<at::Tensor> outs = std::move(into);
  if (outs.empty()) {
    for (int i : idx) {
      outs.push_back(
          at::empty(spec_.tables[i].shape, at::TensorOptions().dtype(spec_.tables[i].dtype)));
    }
  }
  const bool on_host =
      std::all_of(outs.begin(), outs.end(), [](const at::Tensor& t) { return t.is_cpu(); });
  // What each server's last push reply named on its board for this
  // trainer's clock, read here with no message, when every server concerned
  // named one.
  std::vector<int64_t> floors;
  if (on_host) {
    absl::MutexLock lock(&mu_);
    for (size_t s = 0; s < board_floor_.size(); ++s) {
      const BoardFloor& f = board_floor_[s];
      floors.push_back(f.clock == clock_[s] ? f.version : -1);
    }
  }
  bool local = !floors.empty();
  std::vector<Part> used;
  std::vector<std::vector<std::pair<int, DenseChunk>>> used_where;
  std::vector<std::vector<std::pair<int, at::Tensor>>> board_chunks;
  for (size_t s = 0; s < parts.size(); ++s) {
    if (parts[s].tables.empty()) continue;
    const internal::ParameterBoard* board = same_host_[s]->board.get();
    if (board != nullptr && on_host) {
      // The board's chunks go straight into their destinations (host
      // memory; a device destination gets its values through a copy_).
      std::vector<std::pair<int, at::Tensor>> into_chunks;
      for (const auto& [j, c] : where[s]) {
        into_chunks.emplace_back(idx[j], outs[j].view(-1).narrow(0, c.begin, c.size()));
      }
      parts[s].read_board = [this, s, into_chunks](int64_t version, uint64_t nonce) {
        return ReadBoard(static_cast<int>(s), version, nonce, into_chunks);
      };
      if (local && floors[s] >= 0) {
        board_chunks.push_back(std::move(into_chunks));
      } else {
        local = false;
      }
    } else {
      local = false;
    }
    used.push_back(std::move(parts[s]));
    used_where.push_back(std::move(where[s]));
  }
  if (local) {
    for (size_t k = 0; k < used.size() && local; ++k) {
      const int s = used[k].server;
      local =
          ReadBoard(s, floors[s], same_host_[s]->board->announced().nonce, board_chunks[k]).ok();
    }
    if (local) {
      {
        absl::MutexLock lock(&mu_);
        ++same_host_stats_.local_pulls;
      }
      return rpc::MakeReadyFuture<Out>(std::move(outs));
    }
    // A read found no whole version: pulled with messages, as below.
  }
  return SendPulls(std::move(used), "ps pull of dense tables")
      .Then([outs, used_where](const rpc::Future<std::vector<Out>>& f) -> absl::StatusOr<Out> {
        const auto& r = f.result();
        if (!r.ok()) return r.status();
        for (size_t k = 0; k < r->size(); ++k) {
          for (size_t v = 0; v < (*r)[k].size(); ++v) {
            const auto& [j, c] = used_where[k][v];
            const at::Tensor& got = (*r)[k][v];
            if (!got.defined()) continue;  // read from the board
            if (got.numel() != c.size()) {
              return absl::DataLossError(absl::StrCat("ps pull: server ", c.server, " sent ",
                                                      got.numel(), " elements for a chunk of ",
                                                      c.size()));
            }
            outs[j].view(-1).narrow(0, c.begin, c.size()).copy_(got);
          }
        }
        return outs;
      });
}

rpc::Future<at::Tensor> PsClient::Pull(const std::string& table) {
  return PullDense({table}).Then(
      [](const rpc::Future<std::vector<at::Tensor>>& f) -> absl::StatusOr<at::Tensor> {
        const auto& r = f.result();
        if (!r.ok()) return r.status();
        return (*r)[0];
      });
}

rpc::Future<at::Tensor> PsClient::PullRows(const std::string& table, const at::Tensor& ids) {
  auto idx = TableIndex(table, TableKind::kEmbedding);
  if (!idx.ok()) return rpc::MakeErrorFuture<at::Tensor>(idx.status());
  const TableSpec& t = spec_.tables[*idx];
  if (!ids.defined() || ids.scalar_type() != at::kLong) {
    return rpc::MakeErrorFuture<at::Tensor>(absl::InvalidArgumentError(
        absl::StrCat("ps table '", table, "': row ids must be an int64 tensor")));
  }
  at::Tensor flat = ids.reshape(-1).contiguous();
  const int64_t n = flat.numel();
  const int64_t* p = flat.data_ptr<int64_t>();
  for (int64_t k = 0; k < n; ++k) {
    if (p[k] < 0 || p[k] >= t.rows) {
      return rpc::MakeErrorFuture<at::Tensor>(absl::InvalidArgumentError(absl::StrCat(
          "ps table '", table, "': row id ", p[k], " out of range [0, ", t.rows, ")")));
    }
  }
  at::Tensor uniq = flat, inverse;
  if (!StrictlyIncreasing(p, n)) {
    std::tie(uniq, inverse, std::ignore) = at::_unique2(flat, true, true, false);
  }
  const int S = plan_.num_servers();
  const int64_t u = uniq.numel();
  const int64_t* up = uniq.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> pos(S), sids(S);
  for (int64_t k = 0; k < u; ++k) {
    const int s = ShardPlan::RowOwner(up[k], S);
    pos[s].push_back(k);
    sids[s].push_back(up[k]);
  }
  std::vector<Part> parts;
  std::vector<std::vector<int64_t>> used_pos;
  for (int s = 0; s < S; ++s) {
    if (sids[s].empty()) continue;
    Part part;
    part.server = s;
    part.tables = {table};
    part.ids = {at::tensor(sids[s], at::kLong)};
    parts.push_back(std::move(part));
    used_pos.push_back(std::move(pos[s]));
  }
  const int64_t dim = t.dim;
  const auto dtype = t.dtype;
  std::vector<int64_t> out_shape(ids.sizes().begin(), ids.sizes().end());
  out_shape.push_back(dim);
  return SendPulls(std::move(parts), absl::StrCat("ps pull of table '", table, "'"))
      .Then([u, dim, dtype, used_pos, inverse,
             out_shape](const rpc::Future<std::vector<std::vector<at::Tensor>>>& f)
                -> absl::StatusOr<at::Tensor> {
        const auto& r = f.result();
        if (!r.ok()) return r.status();
        at::Tensor rows = at::empty({u, dim}, at::TensorOptions().dtype(dtype));
        const size_t row_bytes = dim * c10::elementSize(dtype);
        char* dst = static_cast<char*>(rows.data_ptr());
        for (size_t k = 0; k < r->size(); ++k) {
          at::Tensor got = (*r)[k][0].contiguous();
          if (got.size(0) != static_cast<int64_t>(used_pos[k].size())) {
            return absl::DataLossError("ps pull: a server sent the wrong number of rows");
          }
          const char* src = static_cast<const char*>(got.data_ptr());
          for (size_t i = 0; i < used_pos[k].size(); ++i) {
            std::memcpy(dst + used_pos[k][i] * row_bytes, src + i * row_bytes, row_bytes);
          }
        }
        if (inverse.defined()) rows = rows.index_select(0, inverse);
        return rows.view(out_shape);
      });
}

rpc::Future<void> PsClient::PushDense(const std::vector<std::string>& tables,
                                      const std::vector<at::Tensor>& grads, bool end_step) {
  if (tables.size() != grads.size()) {
    return rpc::MakeErrorFuture<void>(
        absl::InvalidArgumentError("ps push: tables and gradients differ in length"));
  }
  std::vector<Part> parts(server_ids_.size());
  for (size_t s = 0; s < parts.size(); ++s) parts[s].server = static_cast<int>(s);
  for (size_t j = 0; j < tables.size(); ++j) {
    auto i = TableIndex(tables[j], TableKind::kDense);
    if (!i.ok()) return rpc::MakeErrorFuture<void>(i.status());
    const TableSpec& t = spec_.tables[*i];
    const at::Tensor& g = grads[j];
    if (!g.defined() || g.sizes() != c10::IntArrayRef(t.shape) || g.scalar_type() != t.dtype) {
      return rpc::MakeErrorFuture<void>(absl::InvalidArgumentError(
          absl::StrCat("ps table '", t.name, "': gradient ",
                       g.defined() ? absl::StrCat(c10::toString(g.scalar_type()), "[",
                                                  absl::StrJoin(g.sizes(), ","), "]")
                                   : "undefined",
                       " does not match the table's ", c10::toString(t.dtype), "[",
                       absl::StrJoin(t.shape, ","), "]")));
    }
    at::Tensor flat = g.reshape(-1).contiguous();
    for (const auto& c : plan_.chunks(*i)) {
      parts[c.server].tables.push_back(t.name);
      parts[c.server].ids.emplace_back();
      parts[c.server].grads.push_back(flat.narrow(0, c.begin, c.size()));
    }
  }
  std::vector<Part> used;
  for (auto& p : parts) {
    if (!end_step && p.tables.empty()) continue;
    if (!p.tables.empty() && same_host_[p.server]->box != nullptr) {
      std::vector<std::pair<int, at::Tensor>> grads;
      for (size_t v = 0; v < p.tables.size(); ++v) {
        grads.emplace_back(*TableIndex(p.tables[v], TableKind::kDense), p.grads[v]);
      }
      if (const uint64_t generation = WriteBox(p.server, grads); generation > 0) {
        p.box_generation = generation;
        for (auto& g : p.grads) g = at::Tensor();  // in the box
      }
    }
    used.push_back(std::move(p));
  }
  return SendPushes(std::move(used), end_step, "ps push of dense tables");
}

rpc::Future<void> PsClient::Push(const std::string& table, const at::Tensor& grad, bool end_step) {
  return PushDense({table}, {grad}, end_step);
}

rpc::Future<void> PsClient::PushRows(const std::string& table, const at::Tensor& ids,
                                     const at::Tensor& grads, bool end_step) {
  auto idx = TableIndex(table, TableKind::kEmbedding);
  if (!idx.ok()) return rpc::MakeErrorFuture<void>(idx.status());
  const TableSpec& t = spec_.tables[*idx];
  if (!ids.defined() || ids.scalar_type() != at::kLong || !grads.defined() ||
      grads.scalar_type() != t.dtype || grads.numel() != ids.numel() * t.dim ||
      (grads.dim() > 0 && grads.size(-1) != t.dim)) {
    return rpc::MakeErrorFuture<void>(absl::InvalidArgumentError(
        absl::StrCat("ps table '", table, "': PushRows needs int64 ids and ",
                     c10::toString(t.dtype), " gradients of shape ids.shape + [", t.dim, "]")));
  }
  at::Tensor flat = ids.reshape(-1).contiguous();
  at::Tensor g = grads.reshape({flat.numel(), t.dim}).contiguous();
  const int64_t n = flat.numel();
  const int64_t* p = flat.data_ptr<int64_t>();
  for (int64_t k = 0; k < n; ++k) {
    if (p[k] < 0 || p[k] >= t.rows) {
      return rpc::MakeErrorFuture<void>(absl::InvalidArgumentError(absl::StrCat(
          "ps table '", table, "': row id ", p[k], " out of range [0, ", t.rows, ")")));
    }
  }
  at::Tensor uniq = flat;
  if (!StrictlyIncreasing(p, n)) {
    at::Tensor inverse;
    std::tie(uniq, inverse, std::ignore) = at::_unique2(flat, true, true, false);
    g = at::zeros({uniq.numel(), t.dim}, g.options()).index_add_(0, inverse, g);
  }
  const int S = plan_.num_servers();
  const int64_t* up = uniq.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> pos(S), sids(S);
  for (int64_t k = 0; k < uniq.numel(); ++k) {
    const int s = ShardPlan::RowOwner(up[k], S);
    pos[s].push_back(k);
    sids[s].push_back(up[k]);
  }
  std::vector<Part> parts;
  for (int s = 0; s < S; ++s) {
    if (sids[s].empty() && !end_step) continue;
    Part part;
    part.server = s;
    if (!sids[s].empty()) {
      part.tables = {table};
      part.ids = {at::tensor(sids[s], at::kLong)};
      part.grads = {S == 1 ? g : g.index_select(0, at::tensor(pos[s], at::kLong))};
    }
    parts.push_back(std::move(part));
  }
  return SendPushes(std::move(parts), end_step, absl::StrCat("ps push of table '", table, "'"));
}

rpc::Future<void> PsClient::Step() {
  std::vector<Part> parts(server_ids_.size());
  for (size_t s = 0; s < parts.size(); ++s) parts[s].server = static_cast<int>(s);
  return SendPushes(std::move(parts), /*end_step=*/true, "ps step");
}

absl::StatusOr<std::vector<ShardStats>> PsClient::Stats() {
  std::vector<ShardStats> out;
  for (size_t s = 0; s < server_ids_.size(); ++s) {
    auto r =
        agent_.rpc_async(rpc::CallOptions{options_.timeout}, server_ids_[s], internal::kStatsFn)
            .result();
    if (!r.ok()) return Annotate(r.status(), absl::StrCat("ps stats of server ", s));
    out.push_back(internal::FromProto(*r));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> PsClient::Checkpoint() {
  std::vector<std::string> out;
  for (size_t s = 0; s < server_ids_.size(); ++s) {
    auto r =
        agent_
            .rpc_async(rpc::CallOptions{options_.timeout}, server_ids_[s], internal::kCheckpointFn)
            .result();
    if (!r.ok()) return Annotate(r.status(), absl::StrCat("ps checkpoint of server ", s));
    out.push_back(r->path);
  }
  return out;
}

}  // namespace baton::ps
