// What a distributed autograd context holds on this worker, as torch's
// context API shows it (Python's dist_autograd._retrieve_context and the
// context's _send_functions(), _recv_functions(), _known_worker_ids()). Apart
// from dist_autograd.h because it names autograd's graph nodes, whose header
// costs every includer seconds of parsing.
//
// Thread-safety: DescribeContext may be called from any thread; the graph
// it returns is a copy (the nodes are shared with the context).
#ifndef BATON_DIST_AUTOGRAD_CONTEXT_GRAPH_H_
#define BATON_DIST_AUTOGRAD_CONTEXT_GRAPH_H_

#include <cstdint>
#include <typeinfo>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/torch_compat.h"
#include "rpc/agent.h"

namespace baton::dist_autograd {

// What a context holds on this worker, as torch's context API shows it
// (Python's dist_autograd._retrieve_context): the workers it exchanged
// messages with, its send functions (their gradient edges) by message id,
// and its recv functions by the sender's message id. NOT_FOUND for an
// unknown context ("Could not find autograd context with id: N").
struct ContextGraph {
  int64_t id = 0;
  std::vector<int> known_workers;
  std::vector<std::pair<int64_t, std::vector<torch::autograd::Edge>>> sends;
  std::vector<std::pair<int64_t, torch_compat::NodePtr<>>> recvs;
};
absl::StatusOr<ContextGraph> DescribeContext(rpc::RpcAgent& agent, int64_t context_id);
// The C++ type of the recv function nodes (for a binding that gives them a
// Python type).
const std::type_info& RecvFunctionType();

}  // namespace baton::dist_autograd

#endif  // BATON_DIST_AUTOGRAD_CONTEXT_GRAPH_H_
