// Runtime: what the protocol layers built on an agent program against (RRefs,
// distributed autograd, the optimizer, the parameter server, the pipeline,
// RL, the Python binding): raw calls and their decoding, the function
// registry, the executor and the timer, the job's store, the steps of
// shutdown, peers' incarnations and failures, device routing, metrics and
// the timeline. The user's handle (rpc/agent.h) offers calls, worker
// information and shutdown only; a protocol layer reaches this interface
// through RpcAgent::runtime() once, where a user hands it the agent, or
// through CallContext::runtime in a handler, and keeps it.
//
// One object implements both for each worker (internal::AgentImpl), so a
// Runtime lives exactly as long as its RpcAgent. Nothing here proves the
// worker's identity to others (rpc/internal/agent_internals.h).
//
// Contract: the agent's (rpc/agent.h): every call has a deadline, errors
// keep their code end to end and name the worker and function.
//
// Thread-safety: every method may be called from any thread, including
// from remote functions, unless its comment says otherwise.
#ifndef BATON_RPC_RUNTIME_H_
#define BATON_RPC_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "rpc/agent_options.h"
#include "rpc/codec.h"
#include "rpc/executor.h"
#include "rpc/function.h"
#include "rpc/future.h"
#include "rpc/timer.h"
#include "rpc/worker_info.h"
#include "store/store.h"

namespace baton::obs {
class MetricsRegistry;
class TraceRecorder;
}  // namespace baton::obs

namespace baton::rpc {

class RpcAgent;

class Runtime : public DeviceRouter {
 public:
  // The user's handle of this worker's agent (for a layer that hands it to
  // user code, or makes the calls a user would).
  virtual RpcAgent& handle() = 0;

  virtual const WorkerInfo& self() const = 0;
  // The group's workers, in rank order: every worker of a fixed group, the
  // members of the moment in a dynamic one (a copy).
  virtual std::vector<WorkerInfo> workers() const = 0;
  virtual absl::StatusOr<WorkerInfo> worker(const WorkerRef& ref) const = 0;
  virtual const AgentOptions& options() const = 0;
  virtual FunctionRegistry& registry() = 0;
  virtual Executor* executor() = 0;
  // The agent's deadline timer (one thread for every call's deadline).
  virtual DeadlineTimer* timer() = 0;
  virtual store::Store& store() = 0;
  // Prefix of this job's keys in the store (unique per init round).
  virtual const std::string& store_namespace() const = 0;

  // Untyped call: sends `args` as they are. An empty `signature` skips the
  // callee's type check.
  virtual Future<Payload> CallRaw(int to, const std::string& function, const std::string& signature,
                                  Payload args, const CallOptions& opts = {}) = 0;
  // Typed call, as RpcAgent::rpc_async (which forwards here).
  template <typename R, typename... Args, typename... CallArgs>
  Future<R> rpc_async(const CallOptions& opts, const WorkerRef& to, const Function<R(Args...)>& fn,
                      CallArgs&&... args);
  template <typename R, typename... Args, typename... CallArgs>
  Future<R> rpc_async(const WorkerRef& to, const Function<R(Args...)>& fn, CallArgs&&... args) {
    return rpc_async(CallOptions{}, to, fn, std::forward<CallArgs>(args)...);
  }
  // Decodes a raw reply from `from` into R; errors name `what`.
  template <typename R>
  Future<R> DecodeFuture(Future<Payload> raw, const WorkerInfo& from, const std::string& what);

  // Protocol layers settle their state during a graceful shutdown: `settle`
  // runs after every worker stopped issuing calls and before the drain (e.g.
  // RRef users send their deletions); `release` runs after every worker
  // drained, and in every shutdown or destruction, graceful or not, once no
  // call can arrive any more (e.g. owners drop what remains).
  // REQUIRES: called before Shutdown().
  struct ShutdownHook {
    std::function<absl::Status(absl::Time deadline)> settle;
    std::function<void()> release;
  };
  virtual void AddShutdownHook(ShutdownHook hook) = 0;

  // Runs `listener(failure)` when an incarnation of a peer is found dead
  // (docs/peer_failures.md, guarantees P1-P9):
  // - evidence (one of our streams to it ended, its stream to us was
  //   cancelled, or its process on this host is gone) confirmed by a probe
  //   call to its latest known address that fails with UNAVAILABLE or
  //   DEADLINE_EXCEEDED within 2 s; or
  // - a newer incarnation of its rank called us or registered in the store
  //   (a restarted worker that rejoined replaces its predecessor).
  // failure.incarnation and every earlier incarnation of the rank are dead.
  // Each incarnation is reported at most once, and evidence about an
  // incarnation already reported is not probed again. Runs on an executor
  // thread, never after shutdown began. Protocol layers use it to release
  // what a dead incarnation held (dist_autograd: the contexts it created;
  // rref: its forks and the children forked to it).
  using PeerFailureListener = std::function<void(const PeerFailure& failure)>;
  virtual void AddPeerFailureListener(PeerFailureListener listener) = 0;

  // The calls this worker made that await their reply (a copy, in no
  // particular order): supervision (group/group.h) finds hung calls in it.
  struct OutgoingCall {
    int peer = -1;
    std::string function;
    absl::Time started;
  };
  virtual std::vector<OutgoingCall> OutgoingCalls() const = 0;

  // Takes `peer` out of the job for good (supervision's drop,
  // group/supervisor.h): no worker's graceful shutdown waits for it any more
  // (its arrival at the shutdown barriers is set on its behalf, and
  // RetiredPeers() lists it on every worker). It does not stop the worker's
  // process (baton-run does that: env/launcher_request.h) nor refuse calls
  // to it: they fail once it is gone, and its death is reported to the
  // failure listeners as any other, so that the protocol layers release
  // what it held. NOT_FOUND for no such worker;
  // FAILED_PRECONDITION for this worker itself, for rank 0 (it releases the
  // job's barriers) and in a dynamic group (whose members leave by
  // themselves, M3).
  virtual absl::Status RetirePeer(int peer) = 0;
  // The ranks retired so far by any worker of the job, ascending (one store
  // request); the workers a graceful shutdown no longer waits for.
  virtual absl::StatusOr<std::vector<int>> RetiredPeers() = 0;

  // This worker's incarnation of its rank: 1 at its first start, one more
  // for each restart that rejoined the job (AgentOptions::restarts.rejoin).
  virtual int64_t incarnation() const = 0;
  // The latest incarnation of `peer` this worker knows of (0 for an id that
  // is no worker). Every request carries its caller's incarnation, so a
  // restarted worker that calls us is known at once; requests from an
  // older incarnation than the latest known fail with UNAVAILABLE.
  virtual int64_t peer_incarnation(int peer) const = 0;
  // Whether that incarnation was reported dead (a failure listener heard of
  // it) and no newer one is known yet.
  virtual bool peer_known_dead(int peer) const = 0;

  // The first step of a graceful RpcAgent::Shutdown() on its own: returns
  // once every worker entered its shutdown (this call or Shutdown(true)),
  // bounded as that step is (timeouts.shutdown_wait_for_peers); UNAVAILABLE naming a
  // missing worker confirmed dead. Calls keep working until Shutdown(),
  // which then does not wait again and reports this outcome. Front ends run
  // their own steps in between (python: torch's _wait_all_workers and RRef
  // release, which every worker reaches only once all of them stopped their
  // work). Call it from the thread that calls Shutdown(), never from a
  // remote function; a second call returns the first outcome.
  virtual absl::Status EnterShutdown() = 0;
  virtual bool running() const = 0;

  // The worker's metrics (AgentOptions::observability.metrics_address), for components to
  // add their own (RRefs, autograd contexts, PS, pipeline); null when off.
  virtual obs::MetricsRegistry* metrics() const = 0;
  // The worker's timeline recorder (AgentOptions::observability.trace_dir), for
  // components to add their own slices (the pipeline's actions); null when
  // tracing is off.
  virtual obs::TraceRecorder* trace() const = 0;
  // This worker's state for the hang report, as JSON of proto/state.proto's
  // WorkerState (what GET /state answers).
  virtual std::string StateJson() const = 0;
  // Whether calls to `peer` carry large tensors through shared memory.
  virtual bool uses_shm(int peer) const = 0;
  // Whether messages to `peer` go through the same-host shared-memory
  // transport (else the network transport).
  virtual bool uses_shm_transport(int peer) const = 0;

 protected:
  ~Runtime() = default;
};

// ---- Template implementation ----

template <typename R, typename... Args, typename... CallArgs>
Future<R> Runtime::rpc_async(const CallOptions& opts, const WorkerRef& to,
                             const Function<R(Args...)>& fn, CallArgs&&... args) {
  static_assert(sizeof...(CallArgs) == sizeof...(Args),
                "wrong number of arguments for this Function");
  auto worker = this->worker(to);
  if (!worker.ok()) {
    return MakeErrorFuture<R>(
        Annotate(worker.status(), absl::StrCat("rpc of function '", fn.name(), "'")));
  }
  typename Function<R(Args...)>::ArgsTuple tuple(std::forward<CallArgs>(args)...);
  MessageInfo message{this, /*is_request=*/true, worker->id, fn.name()};
  message.answers = opts.answers;
  absl::StatusOr<Payload> payload = registry().EncodeForSend(tuple, message);
  if (!payload.ok()) {
    return MakeErrorFuture<R>(Annotate(
        payload.status(), absl::StrCat("rpc to worker '", worker->name, "' (id ", worker->id,
                                       "), function '", fn.name(), "': cannot encode arguments")));
  }
  Future<Payload> raw = CallRaw(worker->id, fn.name(), Function<R(Args...)>::cached_signature(),
                                *std::move(payload), opts);
  return DecodeFuture<R>(std::move(raw), *worker, fn.name());
}

template <typename R>
Future<R> Runtime::DecodeFuture(Future<Payload> raw, const WorkerInfo& from,
                                const std::string& what) {
  Promise<R> typed(executor());
  raw.OnReady([this, typed, name = from.name, id = from.id,
               fname = what](const absl::StatusOr<Payload>& r) {
    if (!r.ok()) {
      typed.SetError(r.status());
      return;
    }
    internal::Stored<R> value{};
    absl::Status s =
        registry().DecodeReceived(*r, &value, MessageInfo{this, /*is_request=*/false, id, fname});
    if (!s.ok()) {
      typed.SetError(absl::Status(
          s.code() == absl::StatusCode::kDataLoss ? absl::StatusCode::kDataLoss : s.code(),
          absl::StrCat("rpc to worker '", name, "' (id ", id, "), function '", fname,
                       "': ", s.code() == absl::StatusCode::kDataLoss ? "undecodable result: " : "",
                       s.message())));
      return;
    }
    typed.Set(std::move(value));
  });
  return typed.future();
}

}  // namespace baton::rpc

#endif  // BATON_RPC_RUNTIME_H_
