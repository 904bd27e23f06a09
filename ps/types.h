// Value types of the parameter server that trainers and servers share and
// that need neither a server nor a connection: the counters a server keeps
// (TableStats, ShardStats), as PsClient::Stats() returns them and
// ServerShard::Stats() computes them. The job declaration is in ps/spec.h,
// the sharding plan in ps/sharding.h.
//
// Contract:
// - Plain values, copied out at one instant (under the shard's lock). The
//   counters are cumulative over the server process's life; a server that
//   restored a checkpoint (PS8) continues its clocks and applied_pushes
//   from it, and the other counters from 0.
// - Between processes they travel as the protocol buffers of proto/ps.proto;
//   a counter added here is added there too (see that file).
//
// Thread-safety: value types; distinct objects may be used from any thread.
#ifndef BATON_PS_TYPES_H_
#define BATON_PS_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace baton::ps {

// Counters of one table on one server.
struct TableStats {
  std::string table;
  int64_t pulls = 0;
  int64_t pushes = 0;           // push requests that touched this table
  int64_t bytes_pulled = 0;     // parameter bytes sent to trainers
  int64_t bytes_pushed = 0;     // gradient bytes received
  int64_t applied_updates = 0;  // optimizer applications (kSync: one per clock)
  int64_t rows = 0;             // embedding rows that exist on this server
};

// One server's counters and clocks (guarantee labels: ps/server_shard.h).
struct ShardStats {
  int server = 0;
  std::vector<TableStats> tables;
  int64_t applied_clock = 0;     // kSync: clocks fully applied
  int64_t min_clock = 0;         // slowest live trainer's finished clock
  int64_t max_clock = 0;         // fastest trainer's finished clock
  int64_t max_staleness = 0;     // largest staleness a pull returned with
  int64_t applied_pushes = 0;    // push requests applied (PS3; kSync: when their clock applied)
  int64_t stale_pushes = 0;      // kSync pushes for clocks already applied
  int64_t duplicate_pushes = 0;  // repeats of a push id, not applied (PS9)
  int64_t live_trainers = 0;
  int64_t dropped_trainers = 0;  // drops so far (PS5)
  int64_t parked_pulls = 0;
  std::string DebugString() const;
};

}  // namespace baton::ps

#endif  // BATON_PS_TYPES_H_
