#include "python/src/autograd_context.h"

#include <memory>
#include <utility>

#include <torch/csrc/autograd/python_cpp_function.h>

#include "base/torch_compat.h"
#include "dist_autograd/context_graph.h"
#include "dist_autograd/dist_autograd.h"

namespace baton::python {

namespace py = pybind11;

namespace {

// The macros name torch's functions unqualified.
using namespace torch::autograd;  // NOLINT(build/namespaces)

PyTypeObject recv_type;
PyGetSetDef recv_properties[] = {THP_FUNCTION_DEFAULT_PROPERTIES, {nullptr}};
// THP_FUNCTION_DEFAULT_METHODS's entries that every supported torch has:
// torch 2.15's macro also names THPCppFunction_set_sequence_nr, which its
// headers do not declare.
PyMethodDef recv_methods[] = {
    {(char*)"_register_hook_dict", THPCppFunction_register_hook_dict, METH_O, nullptr},
    {(char*)"register_hook", THPCppFunction_register_hook, METH_O, nullptr},
    {(char*)"register_prehook", THPCppFunction_register_prehook, METH_O, nullptr},
    {(char*)"name", THPCppFunction_name, METH_NOARGS, nullptr},
    {nullptr}};

py::object NodeObject(const torch_compat::NodePtr<>& node) {
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
