// The default-instance API: torch.distributed.rpc's shape for programs that
// run one agent per process.
//
//   baton::rpc::init_from_env(registry);                // or init(options, registry)
//   torch::Tensor c = baton::rpc::rpc_sync("worker1", add_fn, a, b);
//   auto f = baton::rpc::rpc_async("worker1", add_fn, a, b);
//   baton::rpc::shutdown();
//
// Contract: a thin layer over one process-wide RpcAgent; the core never
// uses it (everything below takes its agent explicitly, and tests run
// several agents in one process). Errors follow the C++ API's one model
// (docs/api.md, "Errors"): before init() or after shutdown(), rpc_async
// returns a failed future (FAILED_PRECONDITION), and what returns a plain
// value (rpc_sync, default_agent, get_worker_info) throws baton::Error with
// that status. init() while an agent is running fails with ALREADY_EXISTS;
// init() after shutdown() starts a new agent.
//
// Thread-safety: init() and shutdown() from one thread; the calls from any
// thread between them.
#ifndef BATON_RPC_DEFAULT_AGENT_H_
#define BATON_RPC_DEFAULT_AGENT_H_

#include <memory>
#include <string>
#include <utility>

#include "rpc/agent.h"

namespace baton::rpc {

absl::Status init(AgentOptions options, std::shared_ptr<FunctionRegistry> registry);
absl::Status init_from_env(std::shared_ptr<FunctionRegistry> registry,
                           const std::string& name_prefix = "worker");
// The default agent; throws baton::Error if there is none.
RpcAgent& default_agent();
namespace internal {
// The default agent, or FAILED_PRECONDITION saying how to start one.
absl::StatusOr<RpcAgent*> DefaultAgent();
}  // namespace internal
absl::Status shutdown(bool graceful = true);
WorkerInfo get_worker_info();
WorkerInfo get_worker_info(const std::string& name);

template <typename R, typename... Args, typename... CallArgs>
R rpc_sync(const WorkerRef& to, const Function<R(Args...)>& fn, CallArgs&&... args) {
  return default_agent().rpc_sync(to, fn, std::forward<CallArgs>(args)...);
}
template <typename R, typename... Args, typename... CallArgs>
Future<R> rpc_async(const WorkerRef& to, const Function<R(Args...)>& fn, CallArgs&&... args) {
  absl::StatusOr<RpcAgent*> agent = internal::DefaultAgent();
  if (!agent.ok()) return MakeErrorFuture<R>(agent.status());
  return (*agent)->rpc_async(to, fn, std::forward<CallArgs>(args)...);
}
template <typename R, typename... Args, typename... CallArgs>
R rpc_sync(const CallOptions& opts, const WorkerRef& to, const Function<R(Args...)>& fn,
           CallArgs&&... args) {
  return default_agent().rpc_sync(opts, to, fn, std::forward<CallArgs>(args)...);
}
template <typename R, typename... Args, typename... CallArgs>
Future<R> rpc_async(const CallOptions& opts, const WorkerRef& to, const Function<R(Args...)>& fn,
                    CallArgs&&... args) {
  absl::StatusOr<RpcAgent*> agent = internal::DefaultAgent();
  if (!agent.ok()) return MakeErrorFuture<R>(agent.status());
  return (*agent)->rpc_async(opts, to, fn, std::forward<CallArgs>(args)...);
}

}  // namespace baton::rpc

#endif  // BATON_RPC_DEFAULT_AGENT_H_
