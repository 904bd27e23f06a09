// ProcessGroup: the collective data plane. A group of `size` processes that
// run collectives (all_reduce, broadcast, ...) and point-to-point send/recv
// on tensors, through a backend (Gloo for CPU tensors, NCCL for CUDA).
//
//   auto store = std::make_shared<store::StoreClient>(...);
//   auto pg = ProcessGroup::Create(store, rank, world, GlooBackendFactory());
//   BATON_CHECK_OK(pg->AllReduce({t})->Wait());        // synchronous form
//   auto half = pg->NewGroup({0, 1});                   // every rank calls it
//
// Contract:
//  - Every rank of a group issues the same collectives in the same order with
//    matching dtypes and shapes. With GroupOptions::check_fingerprints (or
//    BATON_COMM_DEBUG=1) a mismatch fails on every rank with
//    FAILED_PRECONDITION saying which rank called what.
//  - Every op returns a Work at once; bad arguments give a Work that is
//    already failed with INVALID_ARGUMENT naming the op, the group and the
//    offending tensor. Nothing here throws or crashes on bad input.
//  - Tensors must be dense, contiguous and on the backend's device type; ops
//    write results in place. The caller keeps tensors alive and untouched
//    until the Work completes (the Work also holds references).
//  - A collective that misses its deadline (GroupOptions::timeout) fails with
//    DEADLINE_EXCEEDED naming the op, the group and the ranks that never
//    arrived; the group is then aborted and later ops fail fast.
//  - A default-constructed ProcessGroup, a destroyed one, and a subgroup
//    handle on a rank outside the subgroup fail every op with
//    FAILED_PRECONDITION saying so.
//
// Thread-safety: a ProcessGroup is a cheap handle (shared_ptr to the group);
// copies share the group. Ops may be issued from several threads, but the
// order of collectives must be the same on every rank, so in practice one
// thread issues them. Destroy is safe to call concurrently with ops.
#ifndef BATON_COMM_PROCESS_GROUP_H_
#define BATON_COMM_PROCESS_GROUP_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/backend.h"
#include "comm/types.h"
#include "comm/work.h"
#include "store/store.h"

namespace baton::comm {

namespace internal {
class GroupState;
}  // namespace internal

class ProcessGroup {
 public:
  // Joins the group `options.name` of `world_size` ranks through `store`
  // (every rank calls this with the same name). Blocks for the rendezvous,
  // at most options.timeout; the error names the ranks that did not join.
  static absl::StatusOr<ProcessGroup> Create(std::shared_ptr<store::Store> store, int rank,
                                             int world_size, BackendFactory backend,
                                             GroupOptions options = {});

  // A handle to no group: every op fails with FAILED_PRECONDITION.
  ProcessGroup();
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&);
  ProcessGroup& operator=(const ProcessGroup&);
  ProcessGroup(ProcessGroup&&) noexcept;
  ProcessGroup& operator=(ProcessGroup&&) noexcept;

  // False for a default-constructed handle and for a subgroup this rank is
  // not a member of.
  bool is_member() const;
  // This process's rank in the group and the group size; -1 when not a
  // member.
  int rank() const;
  int size() const;
  std::string name() const;
  // "gloo", "nccl"; "none" for a handle to no group.
  std::string backend_name() const;
  absl::Duration timeout() const;

  // Collectives. Tensors are modified in place.
  // A list holds one tensor per device (the *_multigpu pattern); Gloo
  // reduces a list of CPU tensors too.
  WorkPtr AllReduce(std::vector<at::Tensor> tensors, ReduceOp op = ReduceOp::kSum);
  WorkPtr Broadcast(std::vector<at::Tensor> tensors, int root);
  // Result in tensors[0] on `root`; other tensors are left unspecified.
  WorkPtr Reduce(std::vector<at::Tensor> tensors, int root, ReduceOp op = ReduceOp::kSum);
  // outputs: `size()` tensors shaped like `input`.
  WorkPtr AllGather(std::vector<at::Tensor> outputs, at::Tensor input);
  // outputs: `size()` tensors on root, empty on the others.
  WorkPtr Gather(std::vector<at::Tensor> outputs, at::Tensor input, int root);
  // inputs: `size()` tensors on root, empty on the others.
  WorkPtr Scatter(at::Tensor output, std::vector<at::Tensor> inputs, int root);
  // inputs: `size()` tensors shaped like `output`.
  WorkPtr ReduceScatter(at::Tensor output, std::vector<at::Tensor> inputs,
                        ReduceOp op = ReduceOp::kSum);
  // Equal split along dim 0 (size(0) divisible by size()).
  WorkPtr AllToAll(at::Tensor output, at::Tensor input);
  WorkPtr Barrier();

  // Point to point. Not ordered against collectives; matched by (peer, tag).
  WorkPtr Send(at::Tensor tensor, int dst, uint32_t tag = 0);
  WorkPtr Recv(at::Tensor tensor, int src, uint32_t tag = 0);

  // Creates a subgroup of the given ranks of this group (sorted, unique). Every
  // rank of this group must call it, in the same order relative to other
  // NewGroup calls; ranks outside `ranks` get a handle with is_member() ==
  // false whose ops fail with FAILED_PRECONDITION.
  absl::StatusOr<ProcessGroup> NewGroup(std::vector<int> ranks, absl::string_view name = "");

  // Finishes queued ops (at most `timeout`), aborts the rest, and releases the
  // backend. Later ops on any copy of this handle fail with
  // FAILED_PRECONDITION. Idempotent.
  absl::Status Destroy(absl::Duration timeout = absl::Seconds(30));

 private:
  friend class internal::GroupState;
  explicit ProcessGroup(std::shared_ptr<internal::GroupState> state);
  static ProcessGroup FromState(std::shared_ptr<internal::GroupState> state);
  std::shared_ptr<internal::GroupState> state_;
};

}  // namespace baton::comm

#endif  // BATON_COMM_PROCESS_GROUP_H_
