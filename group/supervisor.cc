#include "group/supervisor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "env/launcher_request.h"

namespace baton::group {

absl::string_view KindName(MemberFailure::Kind kind) {
  return kind == MemberFailure::Kind::kHung ? "hung" : "died";
}

struct Supervisor::State {
  rpc::Runtime* runtime = nullptr;
  GroupOptions group_options;
  SupervisorOptions options;
  Handler handler;
  std::shared_ptr<const internal::MemberObserver> observer;

  // Handlers run one at a time, under run_mu (SV3); `stopped` is set before
  // Stop() waits for run_mu, and read under it.
  absl::Mutex run_mu;
  std::atomic<bool> stopped{false};

  mutable absl::Mutex mu ABSL_ACQUIRED_AFTER(run_mu);
  // The agent tore down (its shutdown hook ran): its timer and executor are
  // gone.
  bool agent_gone ABSL_GUARDED_BY(mu) = false;
  // The members of the moment, in the group's order (SV4).
  std::vector<rpc::WorkerInfo> members ABSL_GUARDED_BY(mu);
  // Member id -> the incarnation a restart was asked for (SV5).
  absl::flat_hash_map<int, int64_t> restart_asked ABSL_GUARDED_BY(mu);
  // SV2: the calls reported hung and still waiting, by (peer, function,
  // start).
  absl::flat_hash_set<std::tuple<int, std::string, int64_t>> reported ABSL_GUARDED_BY(mu);
  rpc::DeadlineTimer::Id scan_timer ABSL_GUARDED_BY(mu) = 0;
  bool scan_stopped ABSL_GUARDED_BY(mu) = false;

  bool IsMemberLocked(int id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (const rpc::WorkerInfo& m : members) {
      if (m.id == id) return true;
    }
    return false;
  }

  // Runs the handler for `f` on this thread (an executor thread) unless the
  // supervisor stopped or the member was dropped (SV3).
  void Deliver(const MemberFailure& f) {
    absl::MutexLock run(&run_mu);
    if (stopped.load()) return;
    {
      absl::MutexLock lock(&mu);
      if (!IsMemberLocked(f.member.id)) return;
    }
    const State* outer = t_handling;
    t_handling = this;
    handler(f);
    t_handling = outer;
  }

  // The state whose handler this thread runs (Stop() from a handler).
  static thread_local const State* t_handling;

  // From a thread that must not run handlers (the timer's, a transport's).
  static void Post(const std::shared_ptr<State>& s, MemberFailure f) {
    {
      absl::MutexLock lock(&s->mu);
      if (s->agent_gone) return;
    }
    (void)s->runtime->executor()->Submit([s, f = std::move(f)] { s->Deliver(f); });
  }

  // SV2: this worker's calls to members that waited hung_after, each once.
  static void Scan(const std::shared_ptr<State>& s) {
    const absl::Time now = absl::Now();
    std::vector<rpc::Runtime::OutgoingCall> calls = s->runtime->OutgoingCalls();
    std::vector<MemberFailure> hung;
    {
      absl::MutexLock lock(&s->mu);
      if (s->agent_gone) return;
      absl::flat_hash_set<std::tuple<int, std::string, int64_t>> still;
      for (rpc::Runtime::OutgoingCall& c : calls) {
        // A forwarded group call waits for its whole part: its own member
        // is not the one that hangs; the part's entries say who does.
        if (absl::StartsWith(c.function, internal::kCallLabelPrefix) ||
            !s->IsMemberLocked(c.peer)) {
          continue;
        }
        auto key = std::make_tuple(c.peer, c.function, absl::ToUnixNanos(c.started));
        if (s->reported.contains(key)) {
          still.insert(std::move(key));
          continue;
        }
        if (now - c.started < s->options.hung_after) continue;
        still.insert(std::move(key));
        absl::StatusOr<rpc::WorkerInfo> member = s->runtime->worker(c.peer);
        if (!member.ok()) continue;
        MemberFailure f;
        f.kind = MemberFailure::Kind::kHung;
        f.member = *member;
        f.incarnation = s->runtime->peer_incarnation(c.peer);
        f.function = c.function;
        f.cause = absl::DeadlineExceededError(
            absl::StrCat("worker '", member->name, "' has not answered '", c.function, "' for ",
                         DurationText(now - c.started), " (hung_after ",
                         DurationText(s->options.hung_after), ")"));
        hung.push_back(std::move(f));
      }
      s->reported.swap(still);
    }
    for (const MemberFailure& f : hung) s->Deliver(f);
    Schedule(s);
  }

  static void Schedule(const std::shared_ptr<State>& s) {
    const absl::Duration period =
        std::clamp(s->options.hung_after / 4, absl::Milliseconds(10), absl::Seconds(1));
    std::weak_ptr<State> weak = s;
    absl::MutexLock lock(&s->mu);
    if (s->agent_gone || s->scan_stopped) return;
    rpc::DeadlineTimer* timer = s->runtime->timer();
    s->scan_timer = timer->Schedule(timer->clock().Now() + period, [weak] {
      std::shared_ptr<State> alive = weak.lock();
      if (alive == nullptr) return;
      {
        absl::MutexLock lock(&alive->mu);
        if (alive->agent_gone || alive->scan_stopped) return;
      }
      // The timer's thread only hands the scan on.
      (void)alive->runtime->executor()->Submit([alive] { Scan(alive); });
    });
  }
};

thread_local const Supervisor::State* Supervisor::State::t_handling = nullptr;

absl::StatusOr<std::unique_ptr<Supervisor>> Supervisor::Watch(const Group& group, Handler handler,
                                                              SupervisorOptions options) {
  if (!group.runtime_->running()) {
    return absl::FailedPreconditionError("cannot supervise a group: the agent shut down");
  }
  if (options.hung_after < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("a supervisor's hung_after must be >= 0, got ",
                                                   DurationText(options.hung_after)));
  }
  auto state = std::make_shared<State>();
  state->runtime = group.runtime_;
  state->group_options = group.options_;
  state->options = options;
  state->handler = std::move(handler);
  {
    absl::MutexLock lock(&state->mu);
    state->members = group.members();
  }
  // The agent keeps its listeners and hooks for its life: they hold the
  // state weakly and do nothing once it is gone.
  std::weak_ptr<State> weak = state;
  state->observer = std::make_shared<const internal::MemberObserver>(
      [weak](const rpc::WorkerInfo& member, const std::string& function,
             const absl::Status& outcome) {
        if (!internal::MemberTimedOut(outcome)) return;
        std::shared_ptr<State> s = weak.lock();
        if (s == nullptr) return;
        State::Post(s, MemberFailure{MemberFailure::Kind::kHung, member,
                                     s->runtime->peer_incarnation(member.id), outcome, function});
      });
  state->runtime->AddShutdownHook({nullptr, [weak] {
                                     if (std::shared_ptr<State> s = weak.lock()) {
                                       absl::MutexLock lock(&s->mu);
                                       s->agent_gone = true;
                                     }
                                   }});
  state->runtime->AddPeerFailureListener([weak](const rpc::PeerFailure& failure) {
    std::shared_ptr<State> s = weak.lock();
    if (s == nullptr) return;
    absl::StatusOr<rpc::WorkerInfo> member = s->runtime->worker(failure.peer);
    if (!member.ok()) return;
    // Not on this thread: a listener may run on the timer's or a
    // transport's thread (SV3).
    State::Post(s, MemberFailure{MemberFailure::Kind::kDied, *member, failure.incarnation,
                                 failure.cause, ""});
  });
  if (options.hung_after > absl::ZeroDuration()) State::Schedule(state);
  return std::unique_ptr<Supervisor>(new Supervisor(std::move(state)));
}

void Supervisor::Stop() {
  state_->stopped.store(true);
  {
    absl::MutexLock lock(&state_->mu);
    state_->scan_stopped = true;
    if (!state_->agent_gone && state_->scan_timer != 0) {
      state_->runtime->timer()->Cancel(state_->scan_timer);
    }
    state_->scan_timer = 0;
  }
  // Wait for a handler that runs, unless this is it.
  if (State::t_handling != state_.get()) absl::MutexLock run(&state_->run_mu);
}

absl::StatusOr<Group> Supervisor::group() const {
  absl::MutexLock lock(&state_->mu);
  if (state_->agent_gone) return absl::FailedPreconditionError("the agent shut down");
  if (state_->members.empty()) {
    return absl::FailedPreconditionError("every member of the supervised group was dropped");
  }
  return Group(state_->runtime, state_->members, state_->group_options, state_->observer);
}

Group Supervisor::Watching(Group g) const {
  g.observer_ = state_->observer;
  return g;
}

absl::StatusOr<rpc::WorkerInfo> Supervisor::Member(const rpc::WorkerRef& ref) const {
  absl::MutexLock lock(&state_->mu);
  if (state_->agent_gone) return absl::FailedPreconditionError("the agent shut down");
  ASSIGN_OR_RETURN(rpc::WorkerInfo w, state_->runtime->worker(ref));
  if (!state_->IsMemberLocked(w.id)) {
    return absl::NotFoundError(absl::StrCat("worker '", w.name,
                                            "' is not a member of the supervised group (or was "
                                            "dropped from it)"));
  }
  return w;
}

absl::Status Supervisor::Drop(const rpc::WorkerRef& ref, absl::string_view reason) {
  ASSIGN_OR_RETURN(rpc::WorkerInfo m, Member(ref));
  RETURN_IF_ERROR(state_->runtime->RetirePeer(m.id));
  {
    absl::MutexLock lock(&state_->mu);
    auto& members = state_->members;
    members.erase(std::remove_if(members.begin(), members.end(),
                                 [&m](const rpc::WorkerInfo& w) { return w.id == m.id; }),
                  members.end());
  }
  const char* dir = std::getenv(kEnvLauncherRequests);
  if (dir == nullptr || *dir == '\0') return absl::OkStatus();  // not under baton-run
  return SendLauncherRequest(
      dir, {LauncherRequest::Action::kDrop, m.id, state_->runtime->self().id, std::string(reason)});
}

absl::Status Supervisor::Restart(const MemberFailure& failure, absl::string_view reason) {
  return Restart(failure.member.id, reason, failure.incarnation);
}

absl::Status Supervisor::Restart(const rpc::WorkerRef& ref, absl::string_view reason,
                                 int64_t incarnation) {
  ASSIGN_OR_RETURN(rpc::WorkerInfo m, Member(ref));
  if (m.id == 0) {
    return absl::FailedPreconditionError(
        "rank 0 cannot be restarted alone: it serves the job's store and releases its barriers");
  }
  const int64_t known = state_->runtime->peer_incarnation(m.id);
  // SV5: nothing to do for an incarnation already replaced, or known dead
  // (baton-run's restart policy starts its successor: a request now would
  // stop the successor), or already asked for.
  if ((incarnation > 0 && known > incarnation) || state_->runtime->peer_known_dead(m.id)) {
    return absl::OkStatus();
  }
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->restart_asked.find(m.id);
    if (it != state_->restart_asked.end() && it->second >= known) return absl::OkStatus();
  }
  RETURN_IF_ERROR(SendLauncherRequest(
      {LauncherRequest::Action::kRestart, m.id, state_->runtime->self().id, std::string(reason)}));
  absl::MutexLock lock(&state_->mu);
  int64_t& asked = state_->restart_asked[m.id];
  asked = std::max(asked, known);
  return absl::OkStatus();
}

}  // namespace baton::group
