// The worker's state for the hang report (obs/state.h, proto/state.proto):
// its calls both ways, its executor, flow control, progress counters, and
// what the protocol layers' collectors add; served on
// AgentOptions::observability.state_socket (and beside the metrics).
#include <unistd.h>

#include "base/status.h"
#include "obs/http_server.h"
#include "obs/state.h"
#include "rpc/internal/agent_impl.h"

namespace baton::rpc::internal {
namespace {

constexpr absl::string_view kJson = "application/json";
// Answers with the worker's state (JSON of WorkerState), inline: a worker
// whose executor is stuck still answers.
constexpr char kStateFn[] = "baton.state";
// How long /job_state waits for the other workers.
constexpr absl::Duration kJobStateTimeout = absl::Seconds(3);

}  // namespace

void AgentImpl::RegisterStateFunction() {
  // A registry reused by a later agent has it already; it asks whichever
  // agent dispatched the call.
  (void)registry_->RegisterInternalInline(kStateFn,
                                          [](const CallContext& call, Payload, Responder done) {
                                            Payload state;
                                            state.bytes = call.agent->StateJson();
                                            done(std::move(state));
                                          });
}

std::string AgentImpl::JobStateJson(absl::Duration timeout) {
  proto::JobState job;
  CollectState(job.add_workers());
  if (ready_.HasBeenNotified()) {
    std::vector<std::pair<int, Future<Payload>>> asked;
    for (int p = 0; p < static_cast<int>(workers_.size()); ++p) {
      if (p == rank_ || !IsMember(p)) continue;
      // Outside the window: a full one is what a hang may look like.
      asked.emplace_back(p, Call(p, kStateFn, "", Payload(), CallOptions{timeout},
                                 /*windowed=*/false));
    }
    for (auto& [rank, future] : asked) {
      absl::StatusOr<Payload> reply = future.result();
      proto::WorkerState w;
      absl::Status s = reply.ok() ? obs::FromJson(reply->bytes, &w) : reply.status();
      if (s.ok()) {
        *job.add_workers() = std::move(w);
        continue;
      }
      proto::Field* f = job.add_unanswered();
      f->set_key(absl::StrCat(rank));
      f->set_value(
          absl::StrCat("asked by worker '", options_.name, "' through RPC: ", s.ToString()));
    }
  }
  return obs::ToJson(job);
}

std::vector<Runtime::OutgoingCall> AgentImpl::OutgoingCalls() const {
  std::vector<OutgoingCall> out;
  for (const auto& p : peers_) {
    p->ForEachCall([&out](const PendingCall& call) {
      out.push_back({call.peer, call.function, call.started});
    });
  }
  return out;
}

void AgentImpl::CollectState(proto::WorkerState* out) const {
  const absl::Time now = absl::Now();
  out->set_name(options_.name);
  out->set_rank(rank_);
  out->set_incarnation(incarnation_);
  out->set_pid(static_cast<int32_t>(::getpid()));
  out->set_time_unix_us(absl::ToUnixMicros(now));
  out->set_world_size(options_.dynamic_group ? static_cast<int>(workers().size())
                                             : options_.world_size);
  const bool ready = ready_.HasBeenNotified();
  auto name_of = [&](int rank) -> std::string {
    if (ready && rank >= 0 && rank < static_cast<int>(workers_.size())) return workers_[rank].name;
    return absl::StrCat("rank ", rank);
  };
  for (const auto& p : peers_) {
    p->ForEachCall([&](const PendingCall& call) {
      proto::OutgoingCallState* c = out->add_outgoing();
      c->set_peer(call.peer);
      c->set_peer_name(name_of(call.peer));
      c->set_function(call.function);
      c->set_age_s(absl::ToDoubleSeconds(now - call.started));
      if (call.deadline != absl::InfiniteFuture()) {
        c->set_has_deadline(true);
        c->set_time_left_s(absl::ToDoubleSeconds(call.deadline - now));
      }
    });
  }
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, call] : incoming_calls_) {
      proto::IncomingCallState* c = out->add_incoming();
      c->set_caller(key.first);
      c->set_caller_name(name_of(key.first));
      c->set_function(call.function);
      c->set_state(call.running ? "running" : "queued");
      c->set_age_s(absl::ToDoubleSeconds(now - call.started));
    }
  }
  // Oldest first, so that a long list starts with what matters.
  std::sort(out->mutable_outgoing()->begin(), out->mutable_outgoing()->end(),
            [](const auto& a, const auto& b) { return a.age_s() > b.age_s(); });
  std::sort(out->mutable_incoming()->begin(), out->mutable_incoming()->end(),
            [](const auto& a, const auto& b) { return a.age_s() > b.age_s(); });
  if (executor_ != nullptr) {
    proto::ExecutorState* e = out->mutable_executor();
    e->set_threads(executor_->num_threads());
    e->set_busy(executor_->busy_threads());
    e->set_blocked(executor_->blocked_threads());
    e->set_idle(std::max(0, e->threads() - e->busy()));
  }
  obs::StateWriter w(out, now);
  w.AddProgress("rpc_calls_completed_out", calls_done_out_.load(std::memory_order_relaxed));
  w.AddProgress("rpc_calls_completed_in", calls_done_in_.load(std::memory_order_relaxed));
  auto flow = w.AddSection("flow_control");
  if (window_ != nullptr) {
    const CallWindow::Stats s = window_->stats();
    flow.Field("window_calls_in_flight", s.calls_in_flight)
        .Field("window_bytes_in_flight", s.bytes_in_flight)
        .Field("calls_waited_for_window", s.calls_waited)
        .Field("calls_refused_by_window", s.calls_refused);
  }
  if (gate_ != nullptr) {
    const RequestGate::Stats s = gate_->stats();
    flow.Field("requests_held", s.held)
        .Field("requests_queued", s.queued)
        .Field("requests_refused", s.refused);
  }
  for (const auto& collect : registry_->state_collectors()) collect(w);
}

std::string AgentImpl::StateJson() const {
  proto::WorkerState s;
  CollectState(&s);
  return obs::ToJson(s);
}

std::map<std::string, obs::HttpRoute> AgentImpl::ObservabilityRoutes() {
  std::map<std::string, obs::HttpRoute> routes;
  routes["/state"] = {std::string(kJson), [this] { return StateJson(); }};
  // Every worker's state, the others' through RPC: a node's baton-run asks
  // one of its workers for the ranks on other nodes.
  routes["/job_state"] = {std::string(kJson), [this] { return JobStateJson(kJobStateTimeout); }};
  if (metrics_ != nullptr) {
    routes["/metrics"] = {std::string(obs::kMetricsContentType),
                          [m = metrics_.get()] { return m->Render(); }};
  }
  return routes;
}

absl::Status AgentImpl::StartStateServer() {
  if (options_.observability.state_socket.empty()) return absl::OkStatus();
  auto server = obs::HttpServer::Start(absl::StrCat("unix:", options_.observability.state_socket),
                                       ObservabilityRoutes());
  if (!server.ok()) {
    // The job runs on without it: a report names this worker as silent.
    Log().Warning(absl::StrCat("serves no state for hang reports: ", server.status().message()));
    return absl::OkStatus();
  }
  state_server_ = *std::move(server);
  return absl::OkStatus();
}

}  // namespace baton::rpc::internal
