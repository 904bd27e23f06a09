#include "group/supervisor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "env/launcher_request.h"
#include "group/call_watch.h"

namespace baton::group {

absl::string_view KindName(MemberFailure::Kind kind) {
  return kind == MemberFailure::Kind::kHung ? "hung" : "died";
}

struct Supervisor::State {
  rpc::Runtime* runtime = nullptr;
  GroupOptions group_options;
  SupervisorOptions options;
  Handler handler;
  // What group()'s calls are watched by (SV2).
  std::shared_ptr<internal::CallWatcher> watcher;

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
  // SV2: the group calls in flight through group(): who showed it is alive
  // (a hop that reported), who was reported hung.
  struct WatchedCall {
    std::string function;
    absl::Time start;
    absl::flat_hash_set<int> members;
    absl::flat_hash_set<int> alive;
    absl::flat_hash_set<int> judging;  // named by a forwarder, in their grace
    absl::flat_hash_set<int> reported;
  };
  absl::flat_hash_map<uint64_t, WatchedCall> calls ABSL_GUARDED_BY(mu);
  uint64_t next_call ABSL_GUARDED_BY(mu) = 1;

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

  // A kHung event about `member`, whose cause is "worker '<name>' <detail>";
  // nothing for a worker the job does not have.
  std::optional<MemberFailure> Hung(int member, const std::string& function,
                                    absl::string_view detail) const {
    absl::StatusOr<rpc::WorkerInfo> w = runtime->worker(member);
    if (!w.ok()) return std::nullopt;
    return MemberFailure{
        MemberFailure::Kind::kHung, *w, runtime->peer_incarnation(member),
        absl::DeadlineExceededError(absl::StrCat("worker '", w->name, "' ", detail)), function};
  }

  // What group()'s calls are watched by (call_watch.h); holds the state
  // weakly.
  class Watcher;
  // A member named by its forwarder, once its grace is over: hung unless it
  // reported for itself meanwhile (SV2).
  static void Judge(const std::shared_ptr<State>& s, uint64_t call, int from, int member);

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

namespace {

// How long a member that its forwarder reports as not answering has to
// report for itself: hops report at one moment, but their reports travel
// and their timers run late under load.
absl::Duration Grace(absl::Duration hung_after) {
  return std::clamp(hung_after / 2, absl::Milliseconds(250), absl::Seconds(5));
}

}  // namespace

class Supervisor::State::Watcher final : public internal::CallWatcher {
 public:
  Watcher(std::weak_ptr<State> state, absl::Duration hung_after)
      : state_(std::move(state)), hung_after_(hung_after) {}

  absl::Duration hung_after() const override { return hung_after_; }

  uint64_t Begin(const std::string& function, const std::vector<int>& members) override {
    std::shared_ptr<State> s = state_.lock();
    if (s == nullptr) return 0;
    absl::MutexLock lock(&s->mu);
    const uint64_t id = s->next_call++;
    WatchedCall& c = s->calls[id];
    c.function = function;
    c.start = absl::Now();
    c.members.insert(members.begin(), members.end());
    return id;
  }

  void Report(uint64_t call, int from, int member, proto::GroupHangReport::Kind kind) override {
    using Kind = proto::GroupHangReport;
    std::shared_ptr<State> s = state_.lock();
    if (s == nullptr) return;
    std::optional<MemberFailure> hung;
    {
      absl::MutexLock lock(&s->mu);
      auto it = s->calls.find(call);
      if (it == s->calls.end() || s->agent_gone) return;
      WatchedCall& c = it->second;
      // Reports about the call's members only, from its members or this
      // worker; a member speaks for its own function only, a forwarder for
      // the parts it sent.
      const bool self_report = kind == Kind::OWN_RUNNING || kind == Kind::ALIVE;
      if (!c.members.contains(member) ||
          (from != s->runtime->self().id && !c.members.contains(from)) ||
          self_report != (member == from)) {
        return;
      }
      // Whoever reports is alive, whatever its forwarder said of it; so is
      // the first member of a part that answered.
      c.alive.insert(from);
      if (kind == Kind::ALIVE) return;
      if (kind == Kind::PART_ANSWERED) {
        c.alive.insert(member);
        return;
      }
      if (kind == Kind::PART_WAITING) {
        if (c.alive.contains(member) || c.reported.contains(member) ||
            !c.judging.insert(member).second) {
          return;
        }
        rpc::DeadlineTimer* timer = s->runtime->timer();
        std::weak_ptr<State> weak = s;
        timer->Schedule(timer->clock().Now() + Grace(hung_after_), [weak, call, from, member] {
          std::shared_ptr<State> alive = weak.lock();
          if (alive == nullptr) return;
          {
            absl::MutexLock lock(&alive->mu);
            if (alive->agent_gone) return;
          }
          (void)alive->runtime->executor()->Submit(
              [alive, call, from, member] { Judge(alive, call, from, member); });
        });
        return;
      }
      c.alive.insert(member);  // OWN_RUNNING
      if (!c.reported.insert(member).second) return;
      hung = s->Hung(member, c.function,
                     absl::StrCat("has run its part of a group call of '", c.function, "' for ",
                                  DurationText(absl::Now() - c.start), " (hung_after ",
                                  DurationText(hung_after_), ")"));
    }
    if (hung.has_value()) State::Post(s, *std::move(hung));
  }

  void End(uint64_t call,
           const std::vector<std::pair<rpc::WorkerInfo, absl::Status>>& failed) override {
    std::shared_ptr<State> s = state_.lock();
    if (s == nullptr) return;
    std::vector<MemberFailure> hung;
    {
      absl::MutexLock lock(&s->mu);
      auto it = s->calls.find(call);
      if (it == s->calls.end()) return;
      const WatchedCall c = std::move(it->second);
      s->calls.erase(it);
      // An entry that timed out is a hang, unless reported during the call.
      for (const auto& [member, outcome] : failed) {
        if (!internal::MemberTimedOut(outcome) || c.reported.contains(member.id)) continue;
        hung.push_back(MemberFailure{MemberFailure::Kind::kHung, member,
                                     s->runtime->peer_incarnation(member.id), outcome, c.function});
      }
    }
    for (MemberFailure& f : hung) State::Post(s, std::move(f));
  }

 private:
  const std::weak_ptr<State> state_;
  const absl::Duration hung_after_;
};

void Supervisor::State::Judge(const std::shared_ptr<State>& s, uint64_t call, int from,
                              int member) {
  std::optional<MemberFailure> hung;
  {
    absl::MutexLock lock(&s->mu);
    auto it = s->calls.find(call);
    if (it == s->calls.end()) return;  // the call ended: its entries say
    WatchedCall& c = it->second;
    c.judging.erase(member);
    if (c.alive.contains(member) || !c.reported.insert(member).second) return;
    absl::StatusOr<rpc::WorkerInfo> forwarder = s->runtime->worker(from);
    hung = s->Hung(
        member, c.function,
        absl::StrCat(
            "has not answered its part of a group call of '", c.function, "' to ",
            forwarder.ok() ? absl::StrCat("worker '", forwarder->name, "'") : "its forwarder",
            " for ", DurationText(absl::Now() - c.start),
            " and sent no report of its own (hung_after ", DurationText(s->options.hung_after),
            "): its process may be stopped, or its link cut"));
  }
  if (hung.has_value()) s->Deliver(*hung);
}

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
  state->watcher = std::make_shared<State::Watcher>(weak, options.hung_after);
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
  return Group(state_->runtime, state_->members, state_->group_options, state_->watcher);
}

Group Supervisor::Watching(Group g) const {
  g.watcher_ = state_->watcher;
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
