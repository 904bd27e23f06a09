// Distributed autograd from Python: baton._C.AutogradContext and the
// Agent's autograd methods (bindings.h).
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "dist_autograd/dist_autograd.h"
#include "python/src/autograd_context.h"
#include "python/src/binding.h"
#include "python/src/bindings.h"
#include "python/src/py_agent.h"
#include "python/src/torch_agent.h"

namespace baton::python {
namespace {

// ---- Distributed autograd ----

class PyAutogradContext {
 public:
  explicit PyAutogradContext(std::shared_ptr<PyAgent> agent)
      : agent_(std::move(agent)),
        context_(std::make_unique<dist_autograd::Context>(agent_->agent())),
        torch_mirror_(agent_->torch_host().MirrorContext(context_->id())) {}
  int64_t id() const { return context_->id(); }
  void Release() {
    py::gil_scoped_release nogil;
    torch_mirror_.reset();
    context_.reset();
  }

 private:
  std::shared_ptr<PyAgent> agent_;
  std::unique_ptr<dist_autograd::Context> context_;
  // TorchScript's view of the context in drop-in mode (torch_agent.h).
  std::unique_ptr<TorchContextMirror> torch_mirror_;
};

}  // namespace

void BindAutograd(py::module_& m, AgentClass& agent) {
  agent
      .def("autograd_context",
           [](std::shared_ptr<PyAgent> a) {
             return std::shared_ptr<PyAutogradContext>(new PyAutogradContext(std::move(a)),
                                                       ReleaseGilDelete<PyAutogradContext>());
           })
      .def("backward",
           [](PyAgent& a, int64_t context_id, const std::vector<at::Tensor>& roots,
              bool retain_graph, std::optional<double> timeout) {
             baton::rpc::RpcAgent& agent = a.agent();
             absl::Status s;
             {
               py::gil_scoped_release nogil;
               s = baton::dist_autograd::Backward(agent, context_id, roots, retain_graph,
                                                  Seconds(timeout, absl::ZeroDuration()));
             }
             Check(s);
           })
      .def("get_gradients",
           [](PyAgent& a, int64_t context_id) {
             auto g = baton::dist_autograd::GetGradients(a.agent(), context_id);
             Check(g.status());
             return g->items();
           })
      .def("live_autograd_contexts",
           [](PyAgent& a) { return baton::dist_autograd::LiveContexts(a.agent()); })
      .def("backward_passes_running",
           [](PyAgent& a) { return baton::dist_autograd::BackwardPassesRunning(a.agent()); })
      .def("describe_autograd_context",
           [](PyAgent& a, int64_t context_id) {
             auto described = DescribeAutogradContext(a.agent(), context_id);
             Check(described.status());
             return *std::move(described);
           })
      .def("current_context_id",
           [](PyAgent& a) { return baton::dist_autograd::CurrentContextId(a.agent()); });

  py::class_<PyAutogradContext, std::shared_ptr<PyAutogradContext>>(m, "AutogradContext")
      .def("id", &PyAutogradContext::id)
      .def("release", &PyAutogradContext::Release);
}

}  // namespace baton::python
