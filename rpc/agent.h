// RpcAgent: one per worker process (or several in one process, for tests).
// It rendezvouses with the other workers through the store, serves the
// functions of its FunctionRegistry, and calls functions on other workers.
//
//   auto registry = std::make_shared<FunctionRegistry>();
//   registry->Register(add_fn, [](torch::Tensor a, torch::Tensor b) { return a + b; });
//   auto agent = RpcAgent::Create(AgentOptions::FromEnv("worker").value(), registry);
//   torch::Tensor c = (*agent)->rpc_sync("worker1", add_fn, a, b);
//   (*agent)->Shutdown();
//
// Contract:
// - Create() returns once every worker of the job has registered its name
//   and address (bounded by timeouts.init). Names must be unique; a duplicate
//   name or rank fails Create() on the workers involved with ALREADY_EXISTS.
// - Calls: every call has a deadline (CallOptions::timeout, else
//   AgentOptions::timeouts.rpc), which travels to the callee, and its future
//   completes by then; only a timeout of absl::InfiniteDuration() (asked for
//   explicitly) gives a call none, and it then ends with its reply, its
//   peer's failure or the agent's shutdown. Errors keep their code end to end and name the
//   callee worker and function:
//     DEADLINE_EXCEEDED  timeout;             UNAVAILABLE  dead/unreachable peer;
//     NOT_FOUND          unknown function or worker;
//     INVALID_ARGUMENT   argument type mismatch (signatures differ) or a value
//                        the codec cannot send (a CUDA tensor no device map
//                        applies to, docs/cuda.md);
//     DATA_LOSS          undecodable payload;  RESOURCE_EXHAUSTED  over the
//                        message size limit, or no room in the peer's window
//                        by the deadline (AgentOptions::transport.max_calls_in_flight);
//                        UNKNOWN  exception in user code
//                        (with its message);   UNAUTHENTICATED  wrong job token.
// - Tensors are sent from their own memory: do not modify a tensor passed to
//   rpc_async until its future completes.
// - Dynamic groups (AgentOptions::dynamic_group, torch's init_rpc without a
//   world size): the group has no fixed size. A worker joins the group that
//   the store holds whenever it starts, and leaves it at its Shutdown();
//   workers() lists the members of the moment. Guarantees (M):
// M1 Create() returns once every member that joined before this worker
//    knows it: from then on each can call it by name, and it can call each.
//    A member that joins later is known to this one once that member's
//    Create() returned.
// M2 Names and ranks are unique among the members: a second process with a
//    rank or a name in use fails Create() with ALREADY_EXISTS naming it; a
//    rank keeps the name it first joined with for the store's life.
// M3 A graceful Shutdown() tells every member before it drains: their
//    later calls to it fail at once with NOT_FOUND ("... left the group"),
//    and calls already running on either side complete. A worker that dies
//    instead is reported dead as in a fixed group.
// M4 Fixed and dynamic members never meet: a worker of the other kind fails
//    Create() with FAILED_PRECONDITION ("RPC group mixes statically and
//    dynamically initialized members which is not supported.").
//   A dynamic group travels over the network transport only (no
//   shared-memory links or channel). Rank 0, when it serves the store,
//   waits at its Shutdown() (up to timeouts.shutdown) for the members that
//   joined to leave, as the store goes with it.
// - Shutdown(graceful=true): all workers agree through the store, every
//   worker drains its outstanding calls (incoming and outgoing), then servers
//   stop. Each step is bounded by timeouts.shutdown, also when a peer died;
//   waiting for the others to arrive may be longer
//   (AgentOptions::timeouts.shutdown_wait_for_peers).
//   Afterwards no thread or socket of the agent remains.
//
// Thread-safety: safe for concurrent use from any thread, including from
// inside remote functions (nested calls). Shutdown() must not be called from
// a remote function.
#ifndef BATON_RPC_AGENT_H_
#define BATON_RPC_AGENT_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "rpc/agent_options.h"
#include "rpc/function.h"
#include "rpc/future.h"
#include "rpc/runtime.h"
#include "rpc/worker_info.h"

namespace baton::rpc::internal {
class AgentImpl;
class AgentInternals;
}  // namespace baton::rpc::internal

namespace baton::rpc {

// The user's handle of one worker's agent: calls, worker information,
// shutdown. What the protocol layers use (raw calls, the registry, the
// executor, shutdown hooks, peer failures, devices) is its Runtime
// (rpc/runtime.h). The state and protocol live in internal::AgentImpl
// (rpc/internal/agent_impl.h), which this header does not include: users of
// the agent compile no transport or gRPC header.
class RpcAgent final {
 public:
  static absl::StatusOr<std::unique_ptr<RpcAgent>> Create(
      AgentOptions options, std::shared_ptr<FunctionRegistry> registry,
      AgentCollaborators collaborators = {});
  // Shuts down without the graceful agreement if Shutdown() was not called.
  ~RpcAgent();

  RpcAgent(const RpcAgent&) = delete;
  RpcAgent& operator=(const RpcAgent&) = delete;

  const WorkerInfo& self() const { return runtime_->self(); }
  // The group's workers, in rank order: every worker of a fixed group, the
  // members of the moment in a dynamic one (a copy).
  std::vector<WorkerInfo> workers() const { return runtime_->workers(); }
  absl::StatusOr<WorkerInfo> worker(const WorkerRef& ref) const { return runtime_->worker(ref); }
  const AgentOptions& options() const { return runtime_->options(); }

  // Typed calls. Arguments convert to the Function's parameter types at
  // compile time. rpc_sync throws baton::Error on failure.
  template <typename R, typename... Args, typename... CallArgs>
  Future<R> rpc_async(const CallOptions& opts, const WorkerRef& to, const Function<R(Args...)>& fn,
                      CallArgs&&... args) {
    return runtime_->rpc_async(opts, to, fn, std::forward<CallArgs>(args)...);
  }
  template <typename R, typename... Args, typename... CallArgs>
  Future<R> rpc_async(const WorkerRef& to, const Function<R(Args...)>& fn, CallArgs&&... args) {
    return runtime_->rpc_async(CallOptions{}, to, fn, std::forward<CallArgs>(args)...);
  }
  template <typename R, typename... Args, typename... CallArgs>
  R rpc_sync(const CallOptions& opts, const WorkerRef& to, const Function<R(Args...)>& fn,
             CallArgs&&... args) {
    return rpc_async(opts, to, fn, std::forward<CallArgs>(args)...).value();
  }
  template <typename R, typename... Args, typename... CallArgs>
  R rpc_sync(const WorkerRef& to, const Function<R(Args...)>& fn, CallArgs&&... args) {
    return rpc_async(CallOptions{}, to, fn, std::forward<CallArgs>(args)...).value();
  }

  absl::Status Shutdown(bool graceful = true);
  bool running() const { return runtime_->running(); }
  AgentStats stats() const;
  // The port the metrics are served on (0: off).
  int metrics_port() const;
  // This worker's state for the hang report, as JSON of proto/state.proto's
  // WorkerState (what GET /state answers): outgoing and incoming calls, the
  // executor's threads, progress counters, and the protocol layers'
  // sections and waits (FunctionRegistry::AddStateCollector).
  std::string StateJson() const { return runtime_->StateJson(); }

  // For the protocol layers built on the agent (rref, dist_autograd, ps,
  // pipeline, rl, the Python binding): a user's program does not need it.
  Runtime& runtime() const { return *runtime_; }

 private:
  // What proves this worker (its stream identity) is not on the user's
  // handle: baton's wire-level tests reach it through
  // rpc/internal/agent_internals.h.
  friend class internal::AgentInternals;
  explicit RpcAgent(std::unique_ptr<internal::AgentImpl> impl);

  std::unique_ptr<internal::AgentImpl> impl_;
  Runtime* const runtime_;  // impl_, as the protocol layers see it
};

}  // namespace baton::rpc

#endif  // BATON_RPC_AGENT_H_
