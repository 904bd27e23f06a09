#include "rpc/default_agent.h"

#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/status_macros.h"

namespace baton::rpc {
namespace {

// The one piece of process-wide state, confined to this user-facing layer.
absl::Mutex g_mu(absl::kConstInit);
RpcAgent* g_agent ABSL_GUARDED_BY(g_mu) = nullptr;

}  // namespace

absl::Status init(AgentOptions options, std::shared_ptr<FunctionRegistry> registry) {
  absl::MutexLock lock(&g_mu);
  if (g_agent != nullptr) {
    return absl::AlreadyExistsError("baton::rpc::init: an agent is already running");
  }
  ASSIGN_OR_RETURN(auto agent, RpcAgent::Create(std::move(options), std::move(registry)));
  g_agent = agent.release();
  return absl::OkStatus();
}

absl::Status init_from_env(std::shared_ptr<FunctionRegistry> registry,
                           const std::string& name_prefix) {
  ASSIGN_OR_RETURN(auto options, AgentOptions::FromEnv(name_prefix));
  return init(std::move(options), std::move(registry));
}

namespace internal {

absl::StatusOr<RpcAgent*> DefaultAgent() {
  absl::MutexLock lock(&g_mu);
  if (g_agent == nullptr) {
    return absl::FailedPreconditionError(
        "baton::rpc: no agent; call baton::rpc::init() first (or after shutdown())");
  }
  return g_agent;
}

}  // namespace internal

RpcAgent& default_agent() {
  absl::StatusOr<RpcAgent*> agent = internal::DefaultAgent();
  if (!agent.ok()) throw Error(agent.status());
  return **agent;
}

absl::Status shutdown(bool graceful) {
  RpcAgent* agent;
  {
    absl::MutexLock lock(&g_mu);
    agent = g_agent;
    g_agent = nullptr;
  }
  if (agent == nullptr) return absl::OkStatus();
  absl::Status s = agent->Shutdown(graceful);
  delete agent;
  return s;
}

WorkerInfo get_worker_info() { return default_agent().self(); }

WorkerInfo get_worker_info(const std::string& name) {
  auto w = default_agent().worker(name);
  if (!w.ok()) throw Error(w.status());
  return *w;
}

}  // namespace baton::rpc
