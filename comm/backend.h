// Backend: the interface each collective library (Gloo, NCCL) implements
// beneath ProcessGroup.
//
// Contract: ProcessGroup validates every argument (membership, devices,
// dtypes, shapes, roots, AVG on integers) before calling a backend, so a
// backend may assume well-formed input. Ops are called in the same order on
// every rank of the group (ProcessGroup's caller guarantees it; the debug
// fingerprint checks it). Each op returns at once with a Work that completes
// when the op is done; an op's own deadline is BackendContext::timeout. A
// backend that hits a timeout or a transport error aborts itself: later ops
// fail fast with FAILED_PRECONDITION.
//
// Thread-safety: ops are issued from ProcessGroup under its issue lock (one at
// a time, in order); Shutdown may be called once from any thread.
#ifndef BATON_COMM_BACKEND_H_
#define BATON_COMM_BACKEND_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/types.h"
#include "comm/work.h"
#include "store/store.h"

namespace baton::comm {

// What a backend needs to join its group.
struct BackendContext {
  // Shared with the ProcessGroup; keys this group writes start with `prefix`.
  std::shared_ptr<store::Store> store;
  std::string prefix;
  std::string group_name;
  int rank = 0;  // rank in this group
  int size = 1;
  // global_ranks[i] is group rank i's rank in the world group.
  std::vector<int> global_ranks;
  absl::Duration timeout = absl::Minutes(5);
};

// Identifies one op for errors: kind, per-group sequence number (collectives
// only; -1 for send/recv) and a printable description.
struct OpInfo {
  OpKind kind = OpKind::kBarrier;
  int64_t seq = -1;
  std::string description;  // "all_reduce #3 on group 'default'"
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  // The device type of tensors this backend takes (kCPU for Gloo, kCUDA for
  // NCCL).
  virtual c10::DeviceType device_type() const = 0;

  // In place on every tensor of the list (one per device).
  virtual WorkPtr AllReduce(const OpInfo& info, std::vector<at::Tensor> tensors, ReduceOp op) = 0;
  // tensors[0] of `root` is the source; every tensor of every rank receives.
  virtual WorkPtr Broadcast(const OpInfo& info, std::vector<at::Tensor> tensors, int root) = 0;
  // The reduction of every tensor of every rank lands in tensors[0] of root.
  virtual WorkPtr Reduce(const OpInfo& info, std::vector<at::Tensor> tensors, int root,
                         ReduceOp op) = 0;
  // outputs.size() == group size.
  virtual WorkPtr AllGather(const OpInfo& info, std::vector<at::Tensor> outputs,
                            at::Tensor input) = 0;
  // outputs.size() == group size on root, empty elsewhere.
  virtual WorkPtr Gather(const OpInfo& info, std::vector<at::Tensor> outputs, at::Tensor input,
                         int root) = 0;
  // inputs.size() == group size on root, empty elsewhere.
  virtual WorkPtr Scatter(const OpInfo& info, at::Tensor output, std::vector<at::Tensor> inputs,
                          int root) = 0;
  // inputs.size() == group size; output = reduction of inputs[rank].
  virtual WorkPtr ReduceScatter(const OpInfo& info, at::Tensor output,
                                std::vector<at::Tensor> inputs, ReduceOp op) = 0;
  // Equal split along dim 0: chunk i of `input` goes to rank i, chunk j of
  // `output` comes from rank j.
  virtual WorkPtr AllToAll(const OpInfo& info, at::Tensor output, at::Tensor input) = 0;
  virtual WorkPtr Barrier(const OpInfo& info) = 0;
  virtual WorkPtr Send(const OpInfo& info, at::Tensor tensor, int dst, uint32_t tag) = 0;
  virtual WorkPtr Recv(const OpInfo& info, at::Tensor tensor, int src, uint32_t tag) = 0;

  // Stops taking ops, lets queued ops finish for at most `timeout`, then
  // aborts what is left (those fail with CANCELLED) and joins its threads.
  virtual absl::Status Shutdown(absl::Duration timeout) = 0;
};

// Creates and connects a backend for one group (blocking rendezvous bounded
// by context.timeout). A factory is how a ProcessGroup picks its backend; it
// is reused for subgroups.
using BackendFactory =
    std::function<absl::StatusOr<std::unique_ptr<Backend>>(const BackendContext& context)>;

}  // namespace baton::comm

#endif  // BATON_COMM_BACKEND_H_
