// baton._C.Agent: a worker of baton.rpc (init_rpc's agent) as the Python
// front end sees it, with the RPC functions every Python call goes
// through, and baton._C.RRef.
//
// Contract:
// - Create() reads what AgentConfig leaves unset from the environment
//   (MASTER_ADDR, RANK, ...; rpc::AgentOptions::FromEnv), installs the
//   front end's remote functions (Python calls, RRefs, distributed
//   autograd, hosted optimizers, TorchScript's agent in drop-in mode) and
//   the config's installers, then starts the agent with the GIL released.
// - Calls release the GIL before they may block; Python run for other
//   workers takes the GIL on the executor thread that runs it.
// - agent() raises FAILED_PRECONDITION once the agent shut down.
//
// Thread-safety: methods are called under the GIL, from any thread.
#ifndef BATON_PYTHON_SRC_PY_AGENT_H_
#define BATON_PYTHON_SRC_PY_AGENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "python/src/agent_options.h"
#include "python/src/binding.h"
#include "python/src/py_future.h"
#include "python/src/py_value.h"
#include "python/src/torch_agent.h"
#include "rpc/agent.h"
#include "rpc/function.h"
#include "rref/rref_service.h"

namespace baton::group {
class Supervisor;
}  // namespace baton::group

namespace baton::python {

// The waits for the GIL of the Python functions a worker runs for others,
// while profiling is on (torch's GIL profiling).
struct GilProfile {
  std::atomic<bool> enabled{false};
  std::atomic<int64_t> waits{0};
  std::atomic<int64_t> total_us{0};
  void Record(absl::Duration wait) {
    total_us.fetch_add(absl::ToInt64Microseconds(wait), std::memory_order_relaxed);
    waits.fetch_add(1, std::memory_order_relaxed);
  }
  int64_t AverageMicros() const {
    const int64_t n = waits.load();
    return n == 0 ? 0 : total_us.load() / n;
  }
};

class PyAgent {
 public:
  // dumps(obj) -> (bytes, [Tensor], [RRef]); run(bytes, tensors, rrefs,
  // caller) -> (is_async, value or Future).
  static std::shared_ptr<PyAgent> Create(const AgentConfig& config, py::function dumps,
                                         py::function run);

  ~PyAgent();

  // Drop-in mode: torch's current RPC agent becomes this agent's (what
  // TorchScript's RPC operators call; python/src/torch_agent.h).
  void StartTorchAgent(double rpc_timeout_s);

  TorchAgentHost& torch_host() const { return *torch_; }

  rpc::RpcAgent& agent() const;
  // What the binding uses beyond the user's calls (rpc/runtime.h).
  rpc::Runtime& runtime() const { return agent().runtime(); }

  // `label`: the Python function, naming the call in metrics, hang reports
  // and the timeline (rpc::CallOptions::label).
  std::shared_ptr<PyFuture> Call(const py::object& to, py::bytes pickle,
                                 const std::vector<at::Tensor>& tensors,
                                 const std::vector<PyRRef>& rrefs, std::optional<double> timeout,
                                 std::string label);

  PyRRef Remote(const py::object& to, py::bytes pickle, const std::vector<at::Tensor>& tensors,
                const std::vector<PyRRef>& rrefs, std::optional<double> timeout, std::string label);

  // A group call (group/group.h) of the pickled call to every worker of
  // `members` (names or ids), through a tree of `fanout`: one future per
  // member, in order. `discard_values`: each member's future completes
  // with None (a broadcast; only outcomes travel back). `supervisor`
  // (may be null) watches its entries (group/supervisor.h, SV2).
  std::vector<std::shared_ptr<PyFuture>> GroupCall(const std::vector<py::object>& members,
                                                   py::bytes pickle,
                                                   const std::vector<at::Tensor>& tensors,
                                                   const std::vector<PyRRef>& rrefs,
                                                   std::optional<double> timeout, int fanout,
                                                   bool discard_values, std::string label,
                                                   const group::Supervisor* supervisor);
  // A reduce through the same tree: every member's result, a tensor, summed
  // on the way up (`mean`: divided by the contributors). The future's value
  // is (tensor or None, [contributor names], [(name, code, message)]).
  std::shared_ptr<PyFuture> GroupReduce(const std::vector<py::object>& members, py::bytes pickle,
                                        const std::vector<at::Tensor>& tensors,
                                        std::optional<double> timeout, int fanout, bool mean,
                                        std::string label, const group::Supervisor* supervisor);

  // A function registered in C++ (rpc/function.h), called by name with its
  // signature ("(Tensor,int64)->Tensor"); see python/src/cpp_call.h.
  std::shared_ptr<PyFuture> CallCpp(const py::object& to, const std::string& function,
                                    const std::string& signature, const py::object& args,
                                    std::optional<double> timeout);

  PyRRef MakeOwned(py::object value);

  py::tuple Self() const;
  py::tuple Worker(const py::object& to) const;
  py::list Workers() const;
  // The names of the workers that run baton's Python front end (a mixed
  // job's C++ workers do not).
  py::list PythonWorkers() const;
  int64_t Incarnation() const { return runtime().incarnation(); }

  void Shutdown(bool graceful);

  // Shutdown's agreement on its own (Runtime::EnterShutdown).
  void EnterShutdown();

  // What every owner table holds (tests).
  py::dict RRefState() const;
  // torch's _rref_context_get_debug_info() counts: owned RRefs that some
  // other worker holds (a local RRef(value) never sent is not counted, as
  // in torch), the forks of them that this owner knows, user RRefs forked
  // on from here and not yet confirmed by their owner, and ids seen before
  // their creation message.
  py::dict RRefDebugCounts() const;
  // The user RRefs this worker still holds, as (RRef id, fork id, owner):
  // shutdown's leak check, after the step that releases them.
  py::list HeldRRefs() const;
  // Releases every user RRef this worker holds and waits (up to `timeout`
  // seconds) until their owners confirmed (G6); what a graceful shutdown
  // does after every worker arrived.
  void SettleRRefs(double timeout) const;
  void WaitRRefsEmpty(double timeout) const;
  // torch's enable_gil_profiling: time each wait for the GIL of the
  // Python functions this worker runs for others (Stats'
  // gil_average_wait_time_us while on).
  void EnableGilProfiling(bool on) { gil_profile_->enabled.store(on); }

  py::dict Stats() const;

 private:
  PyAgent() = default;

  std::shared_ptr<rpc::FunctionRegistry> registry_;
  std::vector<std::shared_ptr<RegistryInstaller>> installers_;
  std::shared_ptr<rref::RRefService> rrefs_;
  std::shared_ptr<TorchAgentHost> torch_;
  std::shared_ptr<GilProfile> gil_profile_ = std::make_shared<GilProfile>();
  std::unique_ptr<rpc::RpcAgent> agent_;
};

using AgentClass = pybind11::class_<PyAgent, std::shared_ptr<PyAgent>>;

// Binds group/supervisor.h as baton._C.Supervisor (init_group.cc).
void BindGroup(pybind11::module_& m);

// Binds RRef, AgentConfig, RegistryInstaller and Agent (the other binding
// files add their subsystem's methods to the Agent class it returns).
AgentClass BindAgent(pybind11::module_& m);

}  // namespace baton::python

#endif  // BATON_PYTHON_SRC_PY_AGENT_H_
