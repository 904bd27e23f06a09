// ServerShard's checkpoints (PS8 in ps/server_shard.h): the byte format and
// its parsing, which checks everything before changing anything.
//
// Format (little-endian): "BATONPS1" | u64 n, the spec's fingerprint (n
// bytes) | i64 server | i64 num_servers | i64 applied clock | per trainer:
// i64 finished clock, u8 live | i64 applied pushes | per table, in spec
// order: dense: u8 initialized, the chunk's raw bytes, u64 n, the
// optimizer state (n bytes, FunctionalOptimizer::SaveState); embedding:
// u64 rows, then per row: i64 id, the row's bytes, its optimizer state.
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/byte_io.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "ps/internal/slots.h"
#include "ps/server_shard.h"

namespace baton::ps {

absl::StatusOr<std::string> ServerShard::Serialize() const {
  absl::MutexLock lock(&mu_);
  ByteWriter w;
  w.Raw(kCheckpointMagic, 8);
  const std::string fp = spec_.Fingerprint();
  w.U64(fp.size());
  w.Raw(fp.data(), fp.size());
  w.I64(options_.server);
  w.I64(options_.num_servers);
  w.I64(applied_clock_);
  for (int t = 0; t < spec_.num_trainers; ++t) {
    w.I64(finished_[t]);
    w.U8(live_[t] ? 1 : 0);
  }
  w.I64(applied_pushes_);
  for (size_t i = 0; i < spec_.tables.size(); ++i) {
    if (dense_[i] != nullptr) {
      const auto& d = *dense_[i];
      w.U8(d.initialized ? 1 : 0);
      w.Raw(d.value.data_ptr(), d.value.nbytes());
      std::string state;
      if (d.opt != nullptr) {
        ASSIGN_OR_RETURN(state, d.opt->SaveState());
      }
      w.U64(state.size());
      w.Raw(state.data(), state.size());
      continue;
    }
    const auto& store = embedding_[i]->store;
    const std::vector<int64_t> ids = store.Ids();
    w.U64(ids.size());
    const size_t row_bytes = store.dim() * store.element_size();
    const size_t state_bytes = store.state_width() * store.element_size();
    for (size_t k = 0; k < ids.size(); ++k) {
      const int64_t slot = store.lazy() ? static_cast<int64_t>(k) : store.Find(ids[k]);
      w.I64(ids[k]);
      w.Raw(store.Row(slot), row_bytes);
      w.Raw(store.State(slot), state_bytes);
    }
  }
  return w.Release();
}

absl::Status ServerShard::Restore(const std::string& bytes) {
  auto corrupt = [](const std::string& what) {
    return absl::DataLossError(absl::StrCat("ps checkpoint: ", what));
  };
  ByteReader r(bytes);
  absl::string_view magic, fp;
  uint64_t fp_size = 0;
  if (!r.Raw(8, &magic) || magic != absl::string_view(kCheckpointMagic, 8)) {
    return corrupt("not a baton parameter-server checkpoint (bad magic)");
  }
  if (!r.U64(&fp_size) || !r.Raw(fp_size, &fp)) return corrupt("truncated header");
  if (fp != spec_.Fingerprint()) {
    return absl::FailedPreconditionError(
        "ps checkpoint: written for another job spec (tables, optimizers or consistency differ)");
  }
  int64_t server = 0, servers = 0, applied = 0, applied_pushes = 0;
  if (!r.I64(&server) || !r.I64(&servers) || !r.I64(&applied)) return corrupt("truncated header");
  if (server != options_.server || servers != options_.num_servers) {
    return absl::FailedPreconditionError(
        absl::StrCat("ps checkpoint: written by server ", server, " of ", servers, ", not server ",
                     options_.server, " of ", options_.num_servers));
  }
  std::vector<int64_t> finished(spec_.num_trainers);
  std::vector<bool> live(spec_.num_trainers);
  for (int t = 0; t < spec_.num_trainers; ++t) {
    uint8_t l = 0;
    if (!r.I64(&finished[t]) || !r.U8(&l)) return corrupt("truncated clocks");
    live[t] = l != 0;
  }
  if (!r.I64(&applied_pushes)) return corrupt("truncated counters");
  // Parse everything before changing anything.
  struct DenseData {
    bool initialized;
    absl::string_view value, state;
  };
  struct RowData {
    std::vector<int64_t> ids;
    std::vector<absl::string_view> rows, states;
  };
  absl::MutexLock lock(&mu_);
  std::vector<DenseData> dense(spec_.tables.size());
  std::vector<RowData> rows(spec_.tables.size());
  for (size_t i = 0; i < spec_.tables.size(); ++i) {
    const TableSpec& t = spec_.tables[i];
    if (dense_[i] != nullptr) {
      uint8_t init = 0;
      uint64_t n = 0;
      if (!r.U8(&init) || !r.Raw(dense_[i]->value.nbytes(), &dense[i].value) || !r.U64(&n) ||
          !r.Raw(n, &dense[i].state)) {
        return corrupt(absl::StrCat("truncated table '", t.name, "'"));
      }
      dense[i].initialized = init != 0;
      continue;
    }
    const auto& store = embedding_[i]->store;
    uint64_t n = 0;
    if (!r.U64(&n) || n > static_cast<uint64_t>(t.rows)) {
      return corrupt(absl::StrCat("bad row count in table '", t.name, "'"));
    }
    const size_t row_bytes = store.dim() * store.element_size();
    const size_t state_bytes = store.state_width() * store.element_size();
    for (uint64_t k = 0; k < n; ++k) {
      int64_t id = 0;
      absl::string_view row, st;
      if (!r.I64(&id) || !r.Raw(row_bytes, &row) || !r.Raw(state_bytes, &st)) {
        return corrupt(absl::StrCat("truncated rows of table '", t.name, "'"));
      }
      if (id < 0 || id >= t.rows ||
          ShardPlan::RowOwner(id, options_.num_servers) != options_.server) {
        return corrupt(
            absl::StrCat("row id ", id, " of table '", t.name, "' is not this server's"));
      }
      rows[i].ids.push_back(id);
      rows[i].rows.push_back(row);
      rows[i].states.push_back(st);
    }
  }
  if (r.remaining() != 0) return corrupt("trailing bytes");
  for (size_t i = 0; i < spec_.tables.size(); ++i) {
    if (dense_[i] != nullptr && dense_[i]->opt != nullptr) {
      // Validate the optimizer state before touching anything.
      ASSIGN_OR_RETURN(auto probe, dist_optim::FunctionalOptimizer::Create(
                                       spec_.tables[i].optimizer, {dense_[i]->value.clone()}));
      if (absl::Status s = (probe)->LoadState(dense[i].state); !s.ok()) {
        return Annotate(s, absl::StrCat("ps checkpoint: table '", spec_.tables[i].name, "'"));
      }
    }
  }
  // Apply.
  for (size_t i = 0; i < spec_.tables.size(); ++i) {
    if (dense_[i] != nullptr) {
      auto& d = *dense_[i];
      std::memcpy(d.value.data_ptr(), dense[i].value.data(), dense[i].value.size());
      d.initialized = dense[i].initialized;
      d.published = at::Tensor();
      DenseChangedLocked();
      if (d.opt != nullptr) (void)d.opt->LoadState(dense[i].state);
      continue;
    }
    auto& store = embedding_[i]->store;
    store.Clear();
    store.Create(rows[i].ids);
    for (size_t k = 0; k < rows[i].ids.size(); ++k) {
      const int64_t slot = store.Find(rows[i].ids[k]);
      std::memcpy(store.Row(slot), rows[i].rows[k].data(), rows[i].rows[k].size());
      std::memcpy(store.State(slot), rows[i].states[k].data(), rows[i].states[k].size());
    }
    stats_[i].rows = store.size();
  }
  finished_ = std::move(finished);
  live_ = std::move(live);
  applied_clock_ = applied;
  applied_pushes_ = applied_pushes;
  pending_.clear();
  return absl::OkStatus();
}

}  // namespace baton::ps
