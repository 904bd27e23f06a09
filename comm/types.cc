#include "comm/types.h"

#include <cstdlib>

#include "absl/strings/ascii.h"

namespace baton::comm {

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
  }
  return "unknown";
}

absl::string_view OpName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kReduce: return "reduce";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllToAll: return "all_to_all";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kSend: return "send";
    case OpKind::kRecv: return "recv";
  }
  return "unknown";
}

bool DebugFromEnv() {
  const char* v = std::getenv("BATON_COMM_DEBUG");
  if (v == nullptr) return false;
  const std::string s = absl::AsciiStrToLower(v);
  return s == "1" || s == "true" || s == "detail";
}

}  // namespace baton::comm
