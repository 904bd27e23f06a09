#include "ps/sharding.h"

#include <algorithm>

#include <c10/core/ScalarType.h>

namespace baton::ps {

ShardPlan ShardPlan::Make(const PsSpec& spec, int num_servers) {
  ShardPlan plan;
  plan.num_servers_ = num_servers;
  plan.chunks_.resize(spec.tables.size());
  // Total bytes of the dense tables, laid end to end.
  double total = 0;
  for (const auto& t : spec.tables) {
    if (t.kind == TableKind::kDense) total += double(t.numel()) * c10::elementSize(t.dtype);
  }
  double offset = 0;
  for (size_t i = 0; i < spec.tables.size(); ++i) {
    const TableSpec& t = spec.tables[i];
    if (t.kind != TableKind::kDense) continue;
    const int64_t n = t.numel();
    const double es = c10::elementSize(t.dtype);
    // cut[s] is where server s's chunk starts; cut[S] = n.
    std::vector<int64_t> cut(num_servers + 1, 0);
    cut[num_servers] = n;
    for (int s = 1; s < num_servers; ++s) {
      const double boundary = total * s / num_servers;  // global byte offset
      const double elems = (boundary - offset) / es;
      int64_t c = static_cast<int64_t>(elems / kAlign + 0.5) * kAlign;
      c = std::clamp<int64_t>(c, 0, n);
      cut[s] = std::max(c, cut[s - 1]);
    }
    for (int s = 0; s < num_servers; ++s) {
      if (cut[s + 1] > cut[s]) plan.chunks_[i].push_back(DenseChunk{s, cut[s], cut[s + 1]});
    }
    offset += double(n) * es;
  }
  return plan;
}

DenseChunk ShardPlan::ChunkOf(int table, int server) const {
  for (const auto& c : chunks_[table]) {
    if (c.server == server) return c;
  }
  return DenseChunk{server, 0, 0};
}

}  // namespace baton::ps
