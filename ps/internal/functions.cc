#include "ps/internal/functions.h"

namespace baton::ps::internal {

proto::ShardStats ToProto(const ShardStats& stats) {
  proto::ShardStats out;
  out.set_server(stats.server);
  for (const TableStats& t : stats.tables) {
    proto::TableStats* p = out.add_tables();
    p->set_table(t.table);
    p->set_pulls(t.pulls);
    p->set_pushes(t.pushes);
    p->set_bytes_pulled(t.bytes_pulled);
    p->set_bytes_pushed(t.bytes_pushed);
    p->set_applied_updates(t.applied_updates);
    p->set_rows(t.rows);
  }
  out.set_applied_clock(stats.applied_clock);
  out.set_min_clock(stats.min_clock);
  out.set_max_clock(stats.max_clock);
  out.set_max_staleness(stats.max_staleness);
  out.set_applied_pushes(stats.applied_pushes);
  out.set_stale_pushes(stats.stale_pushes);
  out.set_duplicate_pushes(stats.duplicate_pushes);
  out.set_live_trainers(stats.live_trainers);
  out.set_dropped_trainers(stats.dropped_trainers);
  out.set_parked_pulls(stats.parked_pulls);
  return out;
}

ShardStats FromProto(const proto::ShardStats& stats) {
  ShardStats out;
  out.server = stats.server();
  for (const proto::TableStats& p : stats.tables()) {
    TableStats& t = out.tables.emplace_back();
    t.table = p.table();
    t.pulls = p.pulls();
    t.pushes = p.pushes();
    t.bytes_pulled = p.bytes_pulled();
    t.bytes_pushed = p.bytes_pushed();
    t.applied_updates = p.applied_updates();
    t.rows = p.rows();
  }
  out.applied_clock = stats.applied_clock();
  out.min_clock = stats.min_clock();
  out.max_clock = stats.max_clock();
  out.max_staleness = stats.max_staleness();
  out.applied_pushes = stats.applied_pushes();
  out.stale_pushes = stats.stale_pushes();
  out.duplicate_pushes = stats.duplicate_pushes();
  out.live_trainers = stats.live_trainers();
  out.dropped_trainers = stats.dropped_trainers();
  out.parked_pulls = stats.parked_pulls();
  return out;
}

}  // namespace baton::ps::internal
