#include "ps/server_shard.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/floor_divide.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/byte_io.h"
#include "base/log.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "dist_optim/functional_optimizer.h"
#include "ps/internal/rows.h"
#include "ps/internal/shared_tables.h"
#include "ps/internal/slots.h"

namespace baton::ps {

namespace {

std::string Shape(const at::Tensor& t) {
  return absl::StrCat(c10::toString(t.scalar_type()), "[", absl::StrJoin(t.sizes(), ","), "]");
}

absl::Status Bad(const std::string& table, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("ps table '", table, "': ", what));
}

// Sorted unique ids of `ids` and, per unique id, the sum of its rows of `g`
// (added in the order the ids appear), as contiguous [u, dim] rows.
void MergeRows(const std::vector<const int64_t*>& id_parts, const std::vector<int64_t>& counts,
               const std::vector<const char*>& grad_parts, int64_t dim, c10::ScalarType dtype,
               std::vector<int64_t>* uniq, std::vector<char>* merged) {
  std::vector<std::pair<int64_t, int64_t>> order;  // (id, global position)
  std::vector<const char*> rows;
  const size_t row_bytes = dim * c10::elementSize(dtype);
  for (size_t p = 0; p < id_parts.size(); ++p) {
    for (int64_t i = 0; i < counts[p]; ++i) {
      order.emplace_back(id_parts[p][i], static_cast<int64_t>(rows.size()));
      rows.push_back(grad_parts[p] + i * row_bytes);
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  uniq->clear();
  merged->clear();
  for (size_t i = 0; i < order.size(); ++i) {
    const char* src = rows[order[i].second];
    if (uniq->empty() || uniq->back() != order[i].first) {
      uniq->push_back(order[i].first);
      merged->insert(merged->end(), src, src + row_bytes);
      continue;
    }
    char* dst = merged->data() + (uniq->size() - 1) * row_bytes;
    if (dtype == c10::ScalarType::Double) {
      auto* d = reinterpret_cast<double*>(dst);
      auto* s = reinterpret_cast<const double*>(src);
      for (int64_t k = 0; k < dim; ++k) d[k] += s[k];
    } else {
      auto* d = reinterpret_cast<float*>(dst);
      auto* s = reinterpret_cast<const float*>(src);
      for (int64_t k = 0; k < dim; ++k) d[k] += s[k];
    }
  }
}

}  // namespace

ServerShard::ServerShard(PsSpec spec, Options options)
    : spec_(std::move(spec)),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &real_clock_),
      plan_(ShardPlan::Make(spec_, options_.num_servers)),
      sync_(spec_.consistency.mode == ConsistencyMode::kSync) {}

ServerShard::~ServerShard() {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    waiters.swap(waiters_);
  }
  for (auto& w : waiters) {
    w.done(absl::CancelledError("ps server: shutting down with the pull still parked"));
  }
}

absl::StatusOr<std::unique_ptr<ServerShard>> ServerShard::Create(PsSpec spec, Options options) {
  RETURN_IF_ERROR(ValidateSpec(spec));
  if (options.num_servers < 1 || options.server < 0 || options.server >= options.num_servers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ps server index ", options.server, " out of range for ", options.num_servers, " servers"));
  }
  std::unique_ptr<ServerShard> shard(new ServerShard(std::move(spec), std::move(options)));
  RETURN_IF_ERROR(shard->Init());
  return shard;
}

absl::Status ServerShard::Init() {
  absl::MutexLock lock(&mu_);
  const int n = static_cast<int>(spec_.tables.size());
  dense_.resize(n);
  embedding_.resize(n);
  stats_.resize(n);
  for (int i = 0; i < n; ++i) {
    const TableSpec& t = spec_.tables[i];
    stats_[i].table = t.name;
    if (t.kind == TableKind::kDense) {
      auto slot = std::make_unique<internal::DenseSlot>();
      slot->chunk = plan_.ChunkOf(i, options_.server);
      slot->value = at::zeros({slot->chunk.size()}, at::TensorOptions().dtype(t.dtype));
      if (c10::isFloatingType(t.dtype)) {
        auto opt = dist_optim::FunctionalOptimizer::Create(t.optimizer, {slot->value});
        if (!opt.ok()) return Annotate(opt.status(), absl::StrCat("ps table '", t.name, "'"));
        slot->opt = *std::move(opt);
      }
      // An empty chunk has nothing to wait for.
      slot->initialized = slot->chunk.size() == 0;
      dense_[i] = std::move(slot);
    } else {
      embedding_[i] =
          std::make_unique<internal::EmbeddingSlot>(t, options_.server, options_.num_servers);
      stats_[i].rows = embedding_[i]->store.size();
    }
  }
  finished_.assign(spec_.num_trainers, 0);
  live_.assign(spec_.num_trainers, true);
  session_.assign(spec_.num_trainers, 0);
  push_ids_.assign(spec_.num_trainers, {});
  push_order_.assign(spec_.num_trainers, {});
  return absl::OkStatus();
}

void ServerShard::LogLocked(std::string line, Deferred* after) {
  log_.push_back(std::move(line));
  after->logged = true;
}

void ServerShard::Log(const std::string& line) {
  {
    absl::MutexLock lock(&mu_);
    log_.push_back(absl::StrCat("ps server ", options_.server, ": ", line));
  }
  EmitLog();
}

void ServerShard::EmitLog() {
  absl::MutexLock lock(&mu_);
  // One thread hands lines over at a time, so the callback sees them in the
  // order they were queued; a thread that finds another one at it leaves its
  // lines to it (the emitter looks for new lines each time it relocks).
  if (emitting_) return;
  emitting_ = true;
  while (!log_.empty()) {
    std::vector<std::string> lines;
    lines.swap(log_);
    mu_.Unlock();
    for (const std::string& line : lines) {
      if (options_.log) {
        options_.log(line);
      } else {
        baton::Logger().Info(line);
      }
    }
    mu_.Lock();
  }
  emitting_ = false;
}

void ServerShard::RunDeferred(Deferred after) {
  if (after.logged) EmitLog();
  for (auto& [w, r] : after.ready) w.done(std::move(r));
}

int ServerShard::TableIndex(const std::string& name) const {
  for (size_t i = 0; i < spec_.tables.size(); ++i) {
    if (spec_.tables[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

absl::Status ServerShard::CheckTrainer(int trainer) const {
  if (trainer < 0 || trainer >= spec_.num_trainers) {
    return absl::InvalidArgumentError(absl::StrCat("ps: trainer id ", trainer,
                                                   " out of range; the job has ",
                                                   spec_.num_trainers, " trainers"));
  }
  return absl::OkStatus();
}

absl::Status ServerShard::CheckSession(int trainer, int64_t session) const {
  if (session == kAnySession || session == session_[trainer]) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat("ps server ", options_.server,
                                         ": request from a superseded incarnation of trainer ",
                                         trainer, " (session ", session, "; the current one is ",
                                         session_[trainer], "): a restarted trainer joined since"));
}

absl::StatusOr<JoinReply> ServerShard::Join(int trainer, const std::string& fingerprint) {
  RETURN_IF_ERROR(CheckTrainer(trainer));
  const std::string mine = spec_.Fingerprint();
  if (fingerprint != mine) {
    std::vector<std::string> a = absl::StrSplit(fingerprint, '\n');
    std::vector<std::string> b = absl::StrSplit(mine, '\n');
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    return absl::FailedPreconditionError(
        absl::StrCat("ps: trainer ", trainer, " declares another job than server ", options_.server,
                     ": trainer has '", i < a.size() ? a[i] : "(nothing)", "', server has '",
                     i < b.size() ? b[i] : "(nothing)", "'"));
  }
  Deferred after;
  JoinReply reply;
  {
    absl::MutexLock lock(&mu_);
    reply.session = ++session_[trainer];
    // PS9: push ids count per session.
    push_ids_[trainer].clear();
    push_order_[trainer].clear();
    RejoinLocked(trainer, &after);
    if (sync_) {
      // It redoes the clock being aggregated: drop what it pushed for it.
      auto it = pending_.find(applied_clock_);
      if (it != pending_.end()) {
        auto& v = it->second;
        v.erase(std::remove_if(v.begin(), v.end(),
                               [&](const Contribution& c) { return c.trainer == trainer; }),
                v.end());
      }
      finished_[trainer] = applied_clock_;
    }
    reply.clock = finished_[trainer];
    CollectReadyLocked(&after.ready);
  }
  RunDeferred(std::move(after));
  return reply;
}

void ServerShard::RejoinLocked(int trainer, Deferred* after) {
  if (live_[trainer]) return;
  live_[trainer] = true;
  // Join at the slowest live trainer's clock (kSync: the clock being
  // aggregated), so it neither blocks the others nor runs ahead.
  int64_t clock = sync_ ? applied_clock_ : finished_[trainer];
  if (!sync_) {
    int64_t min_other = -1;
    for (int t = 0; t < spec_.num_trainers; ++t) {
      if (t != trainer && live_[t]) {
        min_other = min_other < 0 ? finished_[t] : std::min(min_other, finished_[t]);
      }
    }
    if (min_other >= 0) clock = std::max(clock, min_other);
  }
  finished_[trainer] = clock;
  LogLocked(absl::StrCat("ps server ", options_.server, ": trainer ", trainer,
                         " rejoined the clock at clock ", clock),
            after);
}

absl::StatusOr<int> ServerShard::InitDense(int trainer, const std::vector<TableRequest>& values) {
  RETURN_IF_ERROR(CheckTrainer(trainer));
  Deferred after;
  int set = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& v : values) {
      const int i = TableIndex(v.table);
      if (i < 0 || spec_.tables[i].kind != TableKind::kDense) {
        return Bad(v.table, "no such dense table");
      }
      const auto& slot = *dense_[i];
      if (!v.grad.defined() || v.grad.dim() != 1 || v.grad.numel() != slot.chunk.size() ||
          v.grad.scalar_type() != spec_.tables[i].dtype) {
        return Bad(v.table, absl::StrCat("initial value chunk must be ",
                                         c10::toString(spec_.tables[i].dtype), "[",
                                         slot.chunk.size(), "] on server ", options_.server,
                                         " (got ", v.grad.defined() ? Shape(v.grad) : "none", ")"));
      }
    }
    for (const auto& v : values) {
      auto& slot = *dense_[TableIndex(v.table)];
      if (slot.initialized) continue;
      slot.value.copy_(v.grad);
      slot.published = at::Tensor();
      DenseChangedLocked();
      slot.initialized = true;
      ++set;
    }
    CollectReadyLocked(&after.ready);
  }
  RunDeferred(std::move(after));
  return set;
}

absl::Status ServerShard::ValidatePull(const std::vector<TableRequest>& tables) const {
  for (const auto& r : tables) {
    const int i = TableIndex(r.table);
    if (i < 0) return Bad(r.table, "no such table");
    const TableSpec& t = spec_.tables[i];
    if (t.kind == TableKind::kDense) continue;
    if (!r.ids.defined() || r.ids.scalar_type() != at::kLong || r.ids.dim() != 1) {
      return Bad(r.table, absl::StrCat("row ids must be int64[n] (got ",
                                       r.ids.defined() ? Shape(r.ids) : "none", ")"));
    }
    const int64_t* ids = r.ids.data_ptr<int64_t>();
    for (int64_t k = 0; k < r.ids.numel(); ++k) {
      if (ids[k] < 0 || ids[k] >= t.rows) {
        return Bad(r.table, absl::StrCat("row id ", ids[k], " out of range [0, ", t.rows, ")"));
      }
      if (ShardPlan::RowOwner(ids[k], options_.num_servers) != options_.server) {
        return Bad(r.table, absl::StrCat("row id ", ids[k], " belongs to server ",
                                         ShardPlan::RowOwner(ids[k], options_.num_servers),
                                         ", not server ", options_.server));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ServerShard::ValidatePush(const std::vector<TableRequest>& grads) const {
  RETURN_IF_ERROR(ValidatePull(grads));
  for (const auto& r : grads) {
    const int i = TableIndex(r.table);
    const TableSpec& t = spec_.tables[i];
    if (!r.grad.defined()) return Bad(r.table, "push without a gradient");
    if (r.grad.scalar_type() != t.dtype) {
      return Bad(r.table, absl::StrCat("gradient dtype ", c10::toString(r.grad.scalar_type()),
                                       " does not match the table's ", c10::toString(t.dtype)));
    }
    if (t.kind == TableKind::kDense) {
      const auto& slot = *dense_[i];
      if (slot.opt == nullptr) {
        return Bad(r.table, absl::StrCat("a ", c10::toString(t.dtype), " table is not trainable"));
      }
      if (r.grad.dim() != 1 || r.grad.numel() != slot.chunk.size()) {
        return Bad(r.table, absl::StrCat("gradient chunk ", Shape(r.grad), " does not match ",
                                         c10::toString(t.dtype), "[", slot.chunk.size(),
                                         "] held by server ", options_.server));
      }
      if (!slot.initialized) {
        return absl::FailedPreconditionError(absl::StrCat(
            "ps table '", r.table, "': pushed before any trainer initialized it (InitDense)"));
      }
      continue;
    }
    if (r.grad.dim() != 2 || r.grad.size(0) != r.ids.numel() || r.grad.size(1) != t.dim) {
      return Bad(r.table, absl::StrCat("row gradients ", Shape(r.grad), " do not match ",
                                       r.ids.numel(), " ids x dim ", t.dim));
    }
    const auto& store = embedding_[i]->store;
    const int64_t* ids = r.ids.data_ptr<int64_t>();
    for (int64_t k = 0; k < r.ids.numel(); ++k) {
      if (store.Find(ids[k]) < 0) {
        return Bad(r.table, absl::StrCat("push for row ", ids[k],
                                         ", which no trainer has pulled (it does not exist yet)"));
      }
    }
  }
  return absl::OkStatus();
}

int64_t ServerShard::MinLiveClockLocked() const {
  int64_t m = -1;
  for (int t = 0; t < spec_.num_trainers; ++t) {
    if (live_[t]) m = m < 0 ? finished_[t] : std::min(m, finished_[t]);
  }
  return m < 0 ? applied_clock_ : m;
}

bool ServerShard::PullReadyLocked(int64_t clock) const {
  switch (spec_.consistency.mode) {
    case ConsistencyMode::kAsync: return true;
    case ConsistencyMode::kSync: return applied_clock_ >= clock;
    case ConsistencyMode::kBoundedStaleness:
      return MinLiveClockLocked() >= clock - spec_.consistency.staleness;
  }
  return true;
}

std::vector<int> ServerShard::BlockersLocked(int64_t clock) const {
  std::vector<int> out;
  const int64_t need =
      sync_ ? std::min(clock, applied_clock_ + 1) : clock - spec_.consistency.staleness;
  for (int t = 0; t < spec_.num_trainers; ++t) {
    if (live_[t] && finished_[t] < need) out.push_back(t);
  }
  return out;
}

void ServerShard::PublishLocked() {
  if (options_.board == nullptr || options_.board->version() == dense_version_) return;
  std::vector<at::Tensor> chunks(spec_.tables.size());
  for (size_t i = 0; i < spec_.tables.size(); ++i) {
    if (dense_[i] != nullptr && dense_[i]->initialized) chunks[i] = dense_[i]->value;
  }
  options_.board->Publish(dense_version_, chunks);
}

int64_t ServerShard::BoardVersionFor(int64_t clock) {
  if (options_.board == nullptr) return -1;
  absl::MutexLock lock(&mu_);
  if (!PullReadyLocked(clock)) return -1;
  for (const auto& d : dense_) {
    if (d != nullptr && !d->initialized) return -1;
  }
  PublishLocked();
  return dense_version_;
}

PullResult ServerShard::ReadLocked(int64_t clock, const std::vector<TableRequest>& tables,
                                   bool from_board) {
  PullResult out;
  out.staleness = std::max<int64_t>(0, clock - MinLiveClockLocked());
  max_staleness_ = std::max(max_staleness_, out.staleness);
  from_board = from_board && options_.board != nullptr;
  if (from_board) {
    PublishLocked();  // SD2: on the board before the reply names the version
    out.board_version = dense_version_;
  }
  for (const auto& r : tables) {
    const int i = TableIndex(r.table);
    TableStats& st = stats_[i];
    ++st.pulls;
    if (spec_.tables[i].kind == TableKind::kDense && from_board) {
      st.bytes_pulled += dense_[i]->value.nbytes();
      out.values.emplace_back();
      continue;
    }
    if (spec_.tables[i].kind == TableKind::kDense) {
      const at::Tensor& v = dense_[i]->Published();
      st.bytes_pulled += v.nbytes();
      out.values.push_back(v);
      continue;
    }
    auto& store = embedding_[i]->store;
    const int64_t n = r.ids.numel();
    if (at::Tensor all = store.EagerValues(); all.defined()) {
      at::Tensor v = all.index_select(0, at::floor_divide(r.ids, options_.num_servers));
      st.bytes_pulled += v.nbytes();
      out.values.push_back(std::move(v));
      continue;
    }
    const int64_t* ids = r.ids.data_ptr<int64_t>();
    store.Create(absl::MakeConstSpan(ids, n));
    st.rows = store.size();
    at::Tensor v = at::empty({n, store.dim()}, at::TensorOptions().dtype(spec_.tables[i].dtype));
    char* dst = static_cast<char*>(v.data_ptr());
    const size_t row_bytes = store.dim() * store.element_size();
    for (int64_t k = 0; k < n; ++k) {
      std::memcpy(dst + k * row_bytes, store.Row(store.Find(ids[k])), row_bytes);
    }
    st.bytes_pulled += v.nbytes();
    out.values.push_back(std::move(v));
  }
  return out;
}

void ServerShard::Pull(int trainer, int64_t clock, std::vector<TableRequest> tables,
                       absl::Time deadline, std::function<void(absl::StatusOr<PullResult>)> done,
                       int64_t session, bool from_board) {
  if (absl::Status s = CheckTrainer(trainer); !s.ok()) return done(s);
  const absl::Time now = clock_->Now();  // user code: not under mu_
  Deferred after;
  absl::StatusOr<PullResult> result;
  bool parked = false;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckSession(trainer, session); !s.ok()) {
      result = s;
    } else if (absl::Status s = ValidatePull(tables); !s.ok()) {
      result = s;
    } else {
      RejoinLocked(trainer, &after);
      bool initialized = true;
      for (const auto& r : tables) {
        const int i = TableIndex(r.table);
        if (dense_[i] != nullptr && !dense_[i]->initialized) initialized = false;
      }
      if (!initialized || !PullReadyLocked(clock)) {
        waiters_.push_back(
            Waiter{trainer, clock, std::move(tables), now, deadline, std::move(done), from_board});
        parked = true;
      } else {
        result = ReadLocked(clock, tables, from_board);
      }
    }
  }
  RunDeferred(std::move(after));
  if (!parked) done(std::move(result));
}

void ServerShard::ApplyLocked(int table, const at::Tensor& ids, const at::Tensor& grad) {
  const TableSpec& t = spec_.tables[table];
  ++stats_[table].applied_updates;
  if (t.kind == TableKind::kDense) {
    (void)dense_[table]->opt->Step({grad});  // validated: cannot fail
    dense_[table]->published = at::Tensor();
    DenseChangedLocked();
    return;
  }
  std::vector<int64_t> uniq;
  std::vector<char> merged;
  MergeRows({ids.data_ptr<int64_t>()}, {ids.numel()}, {static_cast<const char*>(grad.data_ptr())},
            t.dim, t.dtype, &uniq, &merged);
  auto& store = embedding_[table]->store;
  const size_t row_bytes = t.dim * c10::elementSize(t.dtype);
  for (size_t k = 0; k < uniq.size(); ++k) {
    const int64_t slot = store.Find(uniq[k]);
    internal::ApplyRowUpdate(t.row_optimizer, t.dtype, t.dim, store.Row(slot), store.State(slot),
                             merged.data() + k * row_bytes);
  }
}

absl::StatusOr<int64_t> ServerShard::Push(int trainer, int64_t clock, bool end_clock,
                                          std::vector<TableRequest> grads, int64_t session,
                                          uint64_t push_id) {
  RETURN_IF_ERROR(CheckTrainer(trainer));
  Deferred after;
  int64_t at_clock;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckSession(trainer, session));
    RETURN_IF_ERROR(ValidatePush(grads));
    if (push_id > 0) {
      // PS9: a repeat changes nothing.
      if (!push_ids_[trainer].insert(push_id).second) {
        ++duplicate_pushes_;
        return sync_ ? std::max(finished_[trainer], applied_clock_) : finished_[trainer];
      }
      push_order_[trainer].push_back(push_id);
      if (push_order_[trainer].size() > kRememberedPushes) {
        push_ids_[trainer].erase(push_order_[trainer].front());
        push_order_[trainer].pop_front();
      }
    }
    RejoinLocked(trainer, &after);
    for (const auto& g : grads) {
      const int i = TableIndex(g.table);
      ++stats_[i].pushes;
      stats_[i].bytes_pushed += g.grad.nbytes();
    }
    if (sync_) {
      if (clock < applied_clock_) {
        ++stale_pushes_;  // PS6: that clock is applied already
      } else {
        auto& contribs = pending_[clock];
        // One entry per request, even an empty one, so applied_pushes
        // counts requests in every mode (table -1: nothing to apply).
        contribs.push_back(Contribution{trainer, -1, {}, {}});
        for (auto& g : grads) {
          contribs.push_back(Contribution{trainer, TableIndex(g.table), g.ids, g.grad});
        }
        if (end_clock) finished_[trainer] = std::max(finished_[trainer], clock + 1);
        AdvanceSyncLocked();
      }
      at_clock = std::max(finished_[trainer], applied_clock_);
    } else {
      for (const auto& g : grads) ApplyLocked(TableIndex(g.table), g.ids, g.grad);
      ++applied_pushes_;
      if (end_clock) finished_[trainer] = std::max(finished_[trainer], clock + 1);
      at_clock = finished_[trainer];
    }
    CollectReadyLocked(&after.ready);
  }
  RunDeferred(std::move(after));
  return at_clock;
}

void ServerShard::AdvanceSyncLocked() {
  while (true) {
    bool any_live = false, complete = true;
    for (int t = 0; t < spec_.num_trainers; ++t) {
      if (!live_[t]) continue;
      any_live = true;
      if (finished_[t] <= applied_clock_) complete = false;
    }
    if (!any_live || !complete) return;
    ApplySyncClockLocked(applied_clock_);
    ++applied_clock_;
  }
}

void ServerShard::ApplySyncClockLocked(int64_t clock) {
  std::vector<Contribution> contribs;
  if (auto it = pending_.find(clock); it != pending_.end()) {
    contribs = std::move(it->second);
    pending_.erase(it);
  }
  // Contributors: live trainers that finished this clock. Pushes of others
  // (dropped in the middle of it) are discarded.
  std::vector<bool> counted(spec_.num_trainers, false);
  int n = 0;
  for (int t = 0; t < spec_.num_trainers; ++t) {
    if (live_[t] && finished_[t] > clock) {
      counted[t] = true;
      ++n;
    }
  }
  std::stable_sort(
      contribs.begin(), contribs.end(),
      [](const Contribution& a, const Contribution& b) { return a.trainer < b.trainer; });
  applied_pushes_ += static_cast<int64_t>(
      std::count_if(contribs.begin(), contribs.end(),
                    [&](const Contribution& c) { return c.table < 0 && counted[c.trainer]; }));
  for (size_t i = 0; i < spec_.tables.size(); ++i) {
    const TableSpec& t = spec_.tables[i];
    std::vector<const Contribution*> mine;
    for (const auto& c : contribs) {
      if (c.table == static_cast<int>(i) && counted[c.trainer]) mine.push_back(&c);
    }
    if (mine.empty()) continue;
    if (t.kind == TableKind::kDense) {
      at::Tensor sum = mine[0]->grad.clone();
      for (size_t k = 1; k < mine.size(); ++k) sum.add_(mine[k]->grad);
      sum.div_(n);
      ApplyLocked(static_cast<int>(i), at::Tensor(), sum);
      continue;
    }
    std::vector<const int64_t*> id_parts;
    std::vector<int64_t> counts;
    std::vector<const char*> grad_parts;
    for (const auto* c : mine) {
      id_parts.push_back(c->ids.data_ptr<int64_t>());
      counts.push_back(c->ids.numel());
      grad_parts.push_back(static_cast<const char*>(c->grad.data_ptr()));
    }
    std::vector<int64_t> uniq;
    std::vector<char> merged;
    MergeRows(id_parts, counts, grad_parts, t.dim, t.dtype, &uniq, &merged);
    at::Tensor g = at::from_blob(merged.data(), {static_cast<int64_t>(uniq.size()), t.dim},
                                 at::TensorOptions().dtype(t.dtype));
    g.div_(n);
    at::Tensor ids = at::from_blob(uniq.data(), {static_cast<int64_t>(uniq.size())}, at::kLong);
    ApplyLocked(static_cast<int>(i), ids, g);
  }
}

void ServerShard::CollectReadyLocked(Ready* ready) {
  for (size_t k = 0; k < waiters_.size();) {
    Waiter& w = waiters_[k];
    bool initialized = true;
    for (const auto& r : w.tables) {
      const int i = TableIndex(r.table);
      if (dense_[i] != nullptr && !dense_[i]->initialized) initialized = false;
    }
    if (initialized && PullReadyLocked(w.clock)) {
      PullResult r = ReadLocked(w.clock, w.tables, w.from_board);
      ready->emplace_back(std::move(w), std::move(r));
      waiters_.erase(waiters_.begin() + k);
    } else {
      ++k;
    }
  }
}

void ServerShard::CheckWaits() {
  const absl::Time now = clock_->Now();  // user code: not under mu_
  Deferred after;
  Ready& ready = after.ready;
  {
    absl::MutexLock lock(&mu_);
    // Calls past their deadline.
    for (size_t k = 0; k < waiters_.size();) {
      if (now >= waiters_[k].deadline) {
        ready.emplace_back(std::move(waiters_[k]),
                           absl::DeadlineExceededError(absl::StrCat(
                               "ps server ", options_.server, ": pull at clock ", waiters_[k].clock,
                               " by trainer ", waiters_[k].trainer,
                               " reached its deadline while waiting for trainers ",
                               absl::StrJoin(BlockersLocked(waiters_[k].clock), ", "))));
        waiters_.erase(waiters_.begin() + k);
      } else {
        ++k;
      }
    }
    // Stragglers (PS5).
    std::vector<int> drop;
    for (size_t k = 0; k < waiters_.size();) {
      Waiter& w = waiters_[k];
      if (now - w.since < spec_.trainer_timeout) {
        ++k;
        continue;
      }
      std::vector<int> blockers = BlockersLocked(w.clock);
      if (spec_.straggler_policy == StragglerPolicy::kFail && !blockers.empty()) {
        std::vector<std::string> names;
        for (int t : blockers) {
          names.push_back(absl::StrCat("trainer ", t, " (at clock ", finished_[t], ")"));
        }
        ready.emplace_back(
            std::move(w),
            absl::DeadlineExceededError(absl::StrCat(
                "ps server ", options_.server, ": ", absl::StrJoin(names, ", "),
                " kept the pull at clock ", w.clock, " waiting longer than the trainer timeout of ",
                DurationText(spec_.trainer_timeout))));
        waiters_.erase(waiters_.begin() + k);
        continue;
      }
      drop.insert(drop.end(), blockers.begin(), blockers.end());
      ++k;
    }
    std::sort(drop.begin(), drop.end());
    drop.erase(std::unique(drop.begin(), drop.end()), drop.end());
    for (int t : drop) {
      if (!live_[t]) continue;
      live_[t] = false;
      ++dropped_;
      LogLocked(
          absl::StrCat("ps server ", options_.server, ": dropped trainer ", t,
                       " from the clock at clock ", finished_[t], " (others at ", applied_clock_,
                       "): no progress for ", DurationText(spec_.trainer_timeout),
                       "; it rejoins when it calls again"),
          &after);
    }
    if (!drop.empty() && sync_) AdvanceSyncLocked();
    CollectReadyLocked(&ready);
  }
  RunDeferred(std::move(after));
}

ShardStats ServerShard::Stats() const {
  absl::MutexLock lock(&mu_);
  ShardStats s;
  s.server = options_.server;
  s.tables = stats_;
  s.applied_clock = applied_clock_;
  s.min_clock = MinLiveClockLocked();
  s.max_clock = finished_.empty() ? 0 : *std::max_element(finished_.begin(), finished_.end());
  s.max_staleness = max_staleness_;
  s.applied_pushes = applied_pushes_;
  s.stale_pushes = stale_pushes_;
  s.duplicate_pushes = duplicate_pushes_;
  s.live_trainers = std::count(live_.begin(), live_.end(), true);
  s.dropped_trainers = dropped_;
  s.parked_pulls = static_cast<int64_t>(waiters_.size());
  return s;
}

ServerShard::Waits ServerShard::CurrentWaits() const {
  absl::MutexLock lock(&mu_);
  Waits w;
  w.finished = finished_;
  w.live = live_;
  for (const Waiter& p : waiters_) {
    w.parked.push_back({p.trainer, p.clock, p.since, BlockersLocked(p.clock)});
  }
  return w;
}

absl::StatusOr<at::Tensor> ServerShard::Peek(const std::string& table,
                                             const at::Tensor& ids) const {
  absl::MutexLock lock(&mu_);
  const int i = TableIndex(table);
  if (i < 0) return Bad(table, "no such table");
  if (dense_[i] != nullptr) return dense_[i]->value.clone();
  const auto& store = embedding_[i]->store;
  const int64_t n = ids.numel();
  at::Tensor v = at::empty({n, store.dim()}, at::TensorOptions().dtype(spec_.tables[i].dtype));
  const size_t row_bytes = store.dim() * store.element_size();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t id = ids.data_ptr<int64_t>()[k];
    const int64_t slot = store.Find(id);
    if (slot < 0) return Bad(table, absl::StrCat("row ", id, " does not exist"));
    std::memcpy(static_cast<char*>(v.data_ptr()) + k * row_bytes, store.Row(slot), row_bytes);
  }
  return v;
}

}  // namespace baton::ps
