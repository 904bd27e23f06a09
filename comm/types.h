// Value types shared by every part of comm/: reduce ops, op kinds and the
// per-group options.
//
// Thread-safety: plain values; safe to copy between threads.
#ifndef BATON_COMM_TYPES_H_
#define BATON_COMM_TYPES_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace baton::comm {

// Element-wise reductions. AVG is SUM divided by the group size; it is
// defined for floating-point tensors only, and integer tensors are rejected
// with INVALID_ARGUMENT (an integer mean is not exact).
enum class ReduceOp { kSum, kProduct, kMin, kMax, kAvg };

// "sum", "product", "min", "max", "avg".
absl::string_view ReduceOpName(ReduceOp op);

// Every operation a group offers; used in error messages and fingerprints.
enum class OpKind {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kGather,
  kScatter,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kSend,
  kRecv,
};

// "all_reduce", "broadcast", ... (the names users know from torch).
absl::string_view OpName(OpKind kind);

struct GroupOptions {
  // Name used in keys and errors. Subgroups derive "<parent>/sub<N>".
  std::string name = "default";
  // Deadline of every operation and of the rendezvous. A collective that
  // does not finish in time fails with DEADLINE_EXCEEDED naming the op, the
  // group and the ranks that never arrived, and the group is then aborted.
  absl::Duration timeout = absl::Minutes(5);
  // Exchange an op fingerprint (kind, dtype, shapes, root, reduce op)
  // through the store before every collective and fail with
  // FAILED_PRECONDITION naming the rank that disagreed. Costs store round
  // trips per op: a debugging aid. The environment variable
  // BATON_COMM_DEBUG=1 turns it on for every group (see DebugFromEnv).
  bool check_fingerprints = false;
};

// True when BATON_COMM_DEBUG is "1", "true" or "detail".
bool DebugFromEnv();

}  // namespace baton::comm

#endif  // BATON_COMM_TYPES_H_
