#include "python/src/autograd_context.h"

#include <memory>
#include <utility>

#include <torch/csrc/autograd/python_cpp_function.h>

#include "dist_autograd/dist_autograd.h"

namespace baton::python {

namespace py = pybind11;

namespace {

// The macros name torch's functions unqualified.
using namespace torch::autograd;  // NOLINT(build/namespaces)

PyTypeObject recv_type;
PyGetSetDef recv_properties[] = {THP_FUNCTION_DEFAULT_PROPERTIES, {nullptr}};
PyMethodDef recv_methods[] = {THP_FUNCTION_DEFAULT_METHODS, {nullptr}};

py::object NodeObject(const std::shared_ptr<torch::autograd::Node>& node) {
  if (node == nullptr) return py::none();
  PyObject* obj = torch::autograd::functionToPyObject(node);
  if (obj == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(obj);
}

}  // namespace

void BindAutogradNodes(py::module_& m) {
  (void)m;
  torch::autograd::_initFunctionPyTypeObject(recv_type, "RecvRpcBackward", recv_properties,
                                             recv_methods);
  torch::autograd::registerCppFunction(dist_autograd::RecvFunctionType(), &recv_type);
}

absl::StatusOr<py::tuple> DescribeAutogradContext(rpc::RpcAgent& agent, int64_t context_id) {
  absl::StatusOr<dist_autograd::ContextGraph> graph;
  {
    py::gil_scoped_release nogil;
    graph = dist_autograd::DescribeContext(agent, context_id);
  }
  if (!graph.ok()) return graph.status();
  py::list workers;
  for (int w : graph->known_workers) workers.append(w);
  py::list sends;
  for (const auto& [message_id, edges] : graph->sends) {
    py::list next;
    for (const auto& edge : edges) {
      next.append(py::make_tuple(NodeObject(edge.function), edge.input_nr));
    }
    sends.append(py::make_tuple(message_id, next));
  }
  py::list recvs;
  for (const auto& [message_id, node] : graph->recvs) {
    recvs.append(py::make_tuple(message_id, NodeObject(node)));
  }
  return py::make_tuple(graph->id, workers, sends, recvs);
}

}  // namespace baton::python
