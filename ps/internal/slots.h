// The storage of one server's tables, shared by server_shard.cc and
// server_shard_checkpoint.cc. Internal to //ps; ServerShard's mutex guards
// every object here.
//
// Thread-safety: not thread-safe.
#ifndef BATON_PS_INTERNAL_SLOTS_H_
#define BATON_PS_INTERNAL_SLOTS_H_

#include <memory>

#include <ATen/core/Tensor.h>

#include "dist_optim/functional_optimizer.h"
#include "ps/internal/rows.h"
#include "ps/sharding.h"

namespace baton::ps {
namespace internal {

struct DenseSlot {
  DenseChunk chunk;
  at::Tensor value;                                      // flat [chunk.size()]
  std::unique_ptr<dist_optim::FunctionalOptimizer> opt;  // null: not trainable
  bool initialized = false;
  // An immutable copy of `value` that pull replies share (sent without a
  // copy), made at the first pull after a change: in kSync one copy per
  // clock instead of one per trainer. Undefined when stale.
  at::Tensor published;
  const at::Tensor& Published() {
    if (!published.defined()) published = value.clone();
    return published;
  }
};

struct EmbeddingSlot {
  explicit EmbeddingSlot(const TableSpec& spec, int server, int num_servers)
      : store(spec, server, num_servers) {}
  RowStore store;
};

}  // namespace internal

// The first bytes of every checkpoint.
inline constexpr char kCheckpointMagic[] = "BATONPS1";

}  // namespace baton::ps

#endif  // BATON_PS_INTERNAL_SLOTS_H_
