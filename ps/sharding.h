// ShardPlan: which server holds which part of every table.
//
// Contract:
// - Dense tables: all dense tables, in declaration order, are laid end to
//   end as one byte range, which is cut into num_servers contiguous ranges
//   of (nearly) equal bytes. Each table is thus split into contiguous chunks
//   of its flattened elements, and one large tensor never sits on one server.
//   Cuts fall on multiples of kAlign elements, so every element is updated by
//   the same vector or scalar code path whatever the number of servers: this
//   is what makes synchronous training bit-identical on 1, 2 or 3 servers
//   (guarantee PS2 in ps/server_shard.h).
// - Embedding rows go by id modulo num_servers (owner = id % S, local row =
//   id / S). Modulo rather than ranges because ids are commonly assigned in
//   frequency order (id 0 the most frequent): ranges would put every hot row
//   on server 0, modulo spreads any contiguous block of ids evenly. Hashing
//   by anything stronger buys nothing for ids that are already scattered and
//   costs a lookup table for the local row.
// - The plan is a pure function of the spec and the server count; servers
//   and trainers compute it independently and agree.
//
// Thread-safety: immutable after Make(); safe for concurrent reads.
#ifndef BATON_PS_SHARDING_H_
#define BATON_PS_SHARDING_H_

#include <cstdint>
#include <vector>

#include "ps/spec.h"

namespace baton::ps {

struct DenseChunk {
  int server = 0;
  int64_t begin = 0;  // flat element offsets in the table, [begin, end)
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

class ShardPlan {
 public:
  static constexpr int64_t kAlign = 64;

  // REQUIRES: ValidateSpec(spec) is OK and num_servers >= 1.
  static ShardPlan Make(const PsSpec& spec, int num_servers);

  int num_servers() const { return num_servers_; }
  // Non-empty chunks of dense table `table` (index into spec.tables), in
  // element order; empty vector for embedding tables.
  const std::vector<DenseChunk>& chunks(int table) const { return chunks_[table]; }
  // The chunk of `table` held by `server` (size 0 if none).
  DenseChunk ChunkOf(int table, int server) const;

  static int RowOwner(int64_t id, int num_servers) { return static_cast<int>(id % num_servers); }
  static int64_t LocalRow(int64_t id, int num_servers) { return id / num_servers; }
  // How many of ids 0..rows-1 server `server` owns.
  static int64_t LocalRows(int64_t rows, int num_servers, int server) {
    return rows > server ? (rows - server + num_servers - 1) / num_servers : 0;
  }

 private:
  int num_servers_ = 1;
  std::vector<std::vector<DenseChunk>> chunks_;
};

}  // namespace baton::ps

#endif  // BATON_PS_SHARDING_H_
