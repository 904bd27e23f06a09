// The binding functions of baton._C's subsystem files, one file per
// subsystem as PyTorch's torch/csrc/distributed/rpc/init.cpp and
// autograd/init.cpp are (futures and the agent are bound by py_future.h's
// BindFutures and py_agent.h's BindAgent; torch's futures, autograd nodes
// and profiler by their own headers). module.cc calls each once at import,
// futures and the agent first: the others refer to their classes.
//
// Thread-safety: called once, under the GIL, while the module is imported.
#ifndef BATON_PYTHON_SRC_BINDINGS_H_
#define BATON_PYTHON_SRC_BINDINGS_H_

#include <string>

#include <pybind11/pybind11.h>

#include "absl/status/statusor.h"
#include "dist_optim/optimizer_options.h"
#include "python/src/py_agent.h"

namespace baton::python {

// init_autograd.cc: AutogradContext and the Agent's distributed autograd
// methods (contexts, backward, gradients).
void BindAutograd(pybind11::module_& m, AgentClass& agent);

// init_optim.cc: FunctionalOptimizer and HostedOptimizer (the
// DistributedOptimizer's fast path).
void BindOptimizers(pybind11::module_& m);

// torch.optim's name and keyword arguments ({"lr": 0.1, "momentum": 0.9})
// as baton's optimizer options; INVALID_ARGUMENT names what baton does not
// support.
absl::StatusOr<dist_optim::OptimizerOptions> OptimizerOptionsFrom(const std::string& kind,
                                                                  const pybind11::dict& kwargs);

// init_ps.cc: PsServerHost and PsClient (baton.ps).
void BindPs(pybind11::module_& m);

// init_rl.cc: CartPole (baton.rl's environment).
void BindRl(pybind11::module_& m);

}  // namespace baton::python

#endif  // BATON_PYTHON_SRC_BINDINGS_H_
