// torch's C++ RPC agent, served by baton's agent (drop-in mode).
//
// TorchScript's RPC operators do not go through Python: rpc_async, rpc_sync
// and remote called inside @torch.jit.script code, and the RRef methods of
// scripted code, build torch's Message and hand it to
// torch::distributed::rpc::RpcAgent::getCurrentRpcAgent(). In drop-in mode
// (baton.torch_rpc) that agent is a TorchAgent: it carries each request
// Message as one baton call of the function "__baton.torch.message" to the
// destination worker, whose TorchAgentHost hands it to torch's own request
// handler (torch::distributed::rpc::RequestCallbackImpl: script calls,
// torch's RRef protocol for scripted RRefs) and returns the response Message
// as the call's reply.
//
// Contract:
// - One TorchAgent per process at a time: Start() makes it torch's current
//   agent, with torch's type resolver (scripted types by qualified name);
//   Stop() stops it and clears torch's current agent. (baton.rpc's
//   init_rpc also initializes torch's distributed autograd container, which
//   scripted calls consult, for this worker's id.)
// - A request Message reaches the destination's handler with its type,
//   payload and tensors unchanged; its response (or torch's EXCEPTION
//   response, which fails the caller's future with the remote message)
//   completes the JitFuture that send() returned.
// - A call's deadline is send()'s timeout (torch's unset timeout: the agent's
//   rpc timeout; 0: none); a call that runs past it fails with torch's
//   phrase ("RPC ran for more than set timeout"), a call to a dead worker
//   with baton's UNAVAILABLE error naming it.
// - A request that arrives while no TorchAgent is started here fails with
//   UNAVAILABLE naming this worker; when the host expects one (drop-in
//   mode: it starts at the end of init_rpc, after the rendezvous that lets
//   peers call), the request first waits for it, bounded by its deadline
//   and kStartWait.
// - Distributed autograd: while a baton context is current on a thread,
//   torch's container holds a context with its id, current on that thread
//   too (TorchContextMirror), so that TorchScript carries the id into its
//   forks and continuations, and torch wraps the requests scripted code sends
//   there as FORWARD_AUTOGRAD_REQ. TorchAgent unwraps them and sends the
//   request inside baton's context of that id: baton records the call
//   (dist_autograd.h) and the reply's tensors come back with baton's recv
//   functions, so one baton backward pass covers scripted and Python calls.
//   torch's own send function for the request stays unused in torch's
//   context, which is released with the mirror. Scripted
//   dist_autograd.backward and get_gradients are baton's operators
//   (baton::dist_backward, baton::get_gradients).
// - Device maps are not carried: a Message's tensors travel as baton's codec
//   sends them, by baton's device maps (AgentOptions::devices.maps).
//
// Thread-safety: TorchAgentHost is safe for concurrent use; requests are
// served on the baton agent's executor, and futures complete there (never on
// a transport thread), so torch's callbacks may take the GIL.
#ifndef BATON_PYTHON_SRC_TORCH_AGENT_H_
#define BATON_PYTHON_SRC_TORCH_AGENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include <pybind11/pybind11.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/agent.h"
#include "rpc/function.h"

namespace baton::python {

class TorchAgent;

// While alive, torch's distributed-autograd container holds a context with
// the id of a baton context, current on this thread (restored and released
// locally at destruction). REQUIRES: destroyed on the thread that made it.
class TorchContextMirror {
 public:
  ~TorchContextMirror();
  TorchContextMirror(const TorchContextMirror&) = delete;
  TorchContextMirror& operator=(const TorchContextMirror&) = delete;

 private:
  friend class TorchAgentHost;
  TorchContextMirror(std::weak_ptr<TorchAgent> agent, int64_t id);
  std::weak_ptr<TorchAgent> agent_;  // torch's release messages go through it
  int64_t id_;
  int64_t previous_id_;
};

class TorchAgentHost {
 public:
  // Registers "__baton.torch.message" on `registry` (before or after the
  // agent starts); requests fail with UNAVAILABLE until Start().
  static absl::StatusOr<std::shared_ptr<TorchAgentHost>> Install(rpc::FunctionRegistry& registry,
                                                                 bool expect_start = false);
  // How long a request waits for the expected Start.
  static constexpr absl::Duration kStartWait = absl::Seconds(60);

  // Makes torch's current RPC agent a TorchAgent over `agent` (which must
  // outlive Stop()). FAILED_PRECONDITION if one is started already or torch
  // has a current agent of its own.
  absl::Status Start(rpc::RpcAgent* agent, absl::Duration rpc_timeout);

  // Stops the TorchAgent, clears torch's current agent and torch's RRef
  // context. Idempotent; OK when never started.
  absl::Status Stop();

  // Mirrors baton context `context_id`, just made current on this thread,
  // into torch's container; null when no TorchAgent is started (outside
  // drop-in mode scripted code has no RPC to record).
  std::unique_ptr<TorchContextMirror> MirrorContext(int64_t context_id);

 private:
  // The started agent, or null (with whether one is still to come).
  std::shared_ptr<TorchAgent> Current(absl::Time deadline);

  absl::Mutex mu_;
  std::shared_ptr<TorchAgent> agent_ ABSL_GUARDED_BY(mu_);
  bool expect_start_ ABSL_GUARDED_BY(mu_) = false;
};

// ---- Baton's RRefs in TorchScript (drop-in mode) ----
// TorchScript's RRef operators (to_here, local_value, is_owner, ...) take
// torch's C++ RRef. A baton RRef passed where scripted code expects
// RRef[T] becomes one at the boundary: InstallRRefConversion() adds a
// conversion to torch's PyRRef binding that calls
// baton.rpc.api._torch_rref(rref), which makes, on the owner, a torch
// OwnerRRef over the same value (TorchOwnerRRef) and, on a user, a torch fork
// of one its owner makes (torch's fork protocol, carried by TorchAgent).
// The value is shared, not copied, for tensors and Python objects; a
// container TorchScript converts (a list, a dict) is a copy, except the list
// or dict a TorchScript function returned to remote(): the owner keeps that
// as TorchScript's value in a torch OwnerRRef (baton.rpc.api._ScriptValue),
// and every conversion of the RRef is, or forks, that torch RRef.

// torch's RRef (a torch.distributed.rpc.PyRRef) owned here, over `value`:
// with `value_type` (a TorchScript type's annotation, "List[int]"), the
// value converted to that type; else a ScriptModule with its own class type
// unless `type_hint` names its interface; anything else as torch's
// PyRRef(value, type_hint) makes it. REQUIRES: the GIL; a TorchAgent started.
pybind11::object TorchOwnerRRef(const pybind11::object& value, const pybind11::object& type_hint,
                                const std::string& value_type = "");

// The two halves of a torch fork for a baton user (torch's fork protocol,
// parent = owner): on the owner, one fork of `owner` (a torch OwnerRRef,
// TorchOwnerRRef's) registered, as plain values (owner, rref id, fork id,
// type); on the user, the torch UserRRef of that fork, confirmed by its
// owner (which registered it before answering). REQUIRES: the GIL; a
// TorchAgent started.
pybind11::tuple TorchForkForUser(const pybind11::object& owner);
pybind11::object TorchUserRRef(const pybind11::tuple& fork);

// Adds the conversion to torch's PyRRef binding (once per process; later
// calls do nothing). REQUIRES: the GIL.
void InstallRRefConversion();

}  // namespace baton::python

#endif  // BATON_PYTHON_SRC_TORCH_AGENT_H_
