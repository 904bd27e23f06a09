// Distributed autograd's context as Python sees it (torch's
// dist_autograd._retrieve_context()): the graph a context recorded on this
// worker, with its autograd nodes as torch's Python node objects
// (next_functions, name(), hooks), baton's RecvRpcBackward included.
//
// Thread-safety: call with the GIL held.
#ifndef BATON_PYTHON_SRC_AUTOGRAD_CONTEXT_H_
#define BATON_PYTHON_SRC_AUTOGRAD_CONTEXT_H_

#include <cstdint>

#include <pybind11/pybind11.h>

#include "absl/status/statusor.h"
#include "rpc/agent.h"

namespace baton::python {

// Registers RecvRpcBackward's Python node type (once per process).
void BindAutogradNodes(pybind11::module_& m);

// (context id, [known worker ids], [(message id, [(node, input_nr)])] of
// the send functions, [(message id, node)] of the recv functions), or
// NOT_FOUND for a context unknown here.
absl::StatusOr<pybind11::tuple> DescribeAutogradContext(rpc::RpcAgent& agent, int64_t context_id);

}  // namespace baton::python

#endif  // BATON_PYTHON_SRC_AUTOGRAD_CONTEXT_H_
