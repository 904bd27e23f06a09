// The extension module baton._C: a thin binding of baton's public C++ API
// (rpc/agent.h, rref/rref.h, dist_autograd/dist_autograd.h,
// dist_optim/functional_optimizer.h, ps/client.h and ps/server.h,
// rl/cartpole.h; calls of C++ functions by signature in cpp_call.h) for the
// Python package in python/baton/. Python semantics (torch.distributed.rpc's API, pickling,
// exception classes) live in the Python modules; this file only moves
// values across and manages the GIL:
// - every call that may block (a wait, a call that may meet a full flow
//   control window, start-up, shutdown, backward) releases the GIL;
// - Python code run by the runtime (user functions, future callbacks)
//   takes the GIL on the executor thread that runs it, and only for as long
//   as Python runs.
// Errors cross as baton._C.StatusError(code, message), code being the
// absl::StatusCode number; baton/_errors.py maps them to exception classes.
//
// The module is assembled from one binding file per subsystem
// (bindings.h): futures (py_future.cc), the agent and RRefs (py_agent.cc),
// distributed autograd (init_autograd.cc, autograd_context.cc), optimizers
// (init_optim.cc), group supervision (init_group.cc), the parameter server
// (init_ps.cc), RL (init_rl.cc),
// torch's futures and profiler (torch_future.cc, profiler.cc) and
// drop-in mode's TorchScript agent (torch_agent.cc).
#include <string>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "python/src/autograd_context.h"
#include "python/src/binding.h"
#include "python/src/bindings.h"
#include "python/src/cpp_call.h"
#include "python/src/profiler.h"
#include "python/src/py_agent.h"
#include "python/src/py_future.h"
#include "python/src/py_value.h"
#include "python/src/torch_agent.h"
#include "python/src/torch_future.h"

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  using namespace baton::python;  // NOLINT
  m.doc() = "baton's C++ runtime (see baton.rpc for the API)";

  static py::exception<std::runtime_error> status_error(m, "StatusError");
  SetStatusErrorType(status_error.ptr());
  BindTorchFuture(m);
  BindAutogradNodes(m);
  BindProfiler(m);
  BindFutures(m);
  AgentClass agent = BindAgent(m);
  BindAutograd(m, agent);
  BindOptimizers(m);
  BindGroup(m);
  BindPs(m);
  BindRl(m);

  m.attr("PYTHON_ERROR_PREFIX") = kPythonErrorPrefix;
  // Drop-in mode: baton's RRefs in TorchScript (torch_agent.h).
  m.def("install_torch_rref_conversion", &InstallRRefConversion);
  m.def("torch_owner_rref", &TorchOwnerRRef, py::arg("value"), py::arg("type_hint") = py::none(),
        py::arg("value_type") = "");
  m.def("torch_fork_for_user", &TorchForkForUser, py::arg("owner"));
  m.def("torch_user_rref", &TorchUserRRef);
  m.def("canonical_signature", [](const std::string& text) {
    auto sig = Signature::Parse(text);
    Check(sig.status());
    return sig->text;
  });
}
