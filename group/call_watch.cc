#include "group/call_watch.h"

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "base/host.h"
#include "base/status_macros.h"

namespace baton::group::internal {

CallWatches::CallWatches() {
  // Ids that a restarted incarnation of this worker does not give again,
  // so that a late report of an earlier call finds nothing.
  uint64_t start = 0;
  if (!absl::SimpleHexAtoi(RandomHex(7), &start)) start = 0;
  absl::MutexLock lock(&mu_);
  next_ = start + 1;
}

uint64_t CallWatches::Add(std::shared_ptr<CallWatcher> watcher, uint64_t call) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_++;
  calls_[id] = {std::move(watcher), call};
  return id;
}

void CallWatches::Remove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  calls_.erase(id);
}

std::pair<std::shared_ptr<CallWatcher>, uint64_t> CallWatches::Find(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return {nullptr, 0};
  return {it->second.first.lock(), it->second.second};
}

namespace {

// A hop's report reaches the root's watcher of its call; one for a call that
// ended, or from a worker or about a member the job does not have, is
// dropped. The sender is the hop that reports (the call's caller).
void OnHangReport(const rpc::CallContext& ctx, rpc::Payload payload, rpc::Responder done) {
  proto::GroupHangReport r;
  if (ctx.runtime == nullptr || ctx.registry == nullptr || ctx.caller == nullptr ||
      !r.ParseFromString(payload.bytes)) {
    done(absl::DataLossError("undecodable group hang report"));
    return;
  }
  if (!ctx.runtime->worker(r.member()).ok()) {
    done(absl::InvalidArgumentError(
        absl::StrCat("a group hang report about worker ", r.member(), ", not of this job")));
    return;
  }
  if (auto watches = ctx.registry->GetExtension<CallWatches>()) {
    if (auto [watcher, call] = watches->Find(r.watch_id()); watcher != nullptr) {
      watcher->Report(call, ctx.caller->id, r.member(), r.kind());
    }
  }
  done(rpc::Payload());
}

}  // namespace

absl::Status InstallHangReports(rpc::FunctionRegistry& registry) {
  RETURN_IF_ERROR(registry.RegisterRaw(kHangReportFn, "", OnHangReport));
  registry.SetExtension(std::make_shared<CallWatches>());
  return absl::OkStatus();
}

std::shared_ptr<ReportTimer> ReportTimer::Arm(rpc::Runtime& runtime, absl::Time at,
                                              std::function<void()> report) {
  std::shared_ptr<ReportTimer> t(new ReportTimer(&runtime));
  if (at == absl::InfiniteFuture()) return t;
  rpc::DeadlineTimer* timer = runtime.timer();
  std::weak_ptr<ReportTimer> weak = t;
  const rpc::DeadlineTimer::Id id =
      timer->Schedule(timer->FromRealTime(at), [weak, report = std::move(report)] {
        std::shared_ptr<ReportTimer> self = weak.lock();
        if (self == nullptr) return;
        {
          absl::MutexLock lock(&self->mu_);
          if (self->cancelled_ || self->fired_) return;
          self->fired_ = true;
        }
        // A report sends a message: not on the timer's thread (a closed
        // executor: the agent is going, and so is the report).
        (void)self->runtime_->executor()->Submit(report);
      });
  absl::MutexLock lock(&t->mu_);
  if (t->cancelled_) {
    timer->Cancel(id);
  } else {
    t->id_ = id;
  }
  return t;
}

bool ReportTimer::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return fired_;
  cancelled_ = true;
  if (!fired_ && id_ != 0) runtime_->timer()->Cancel(id_);
  return fired_;
}

std::shared_ptr<RootWatch> RootWatch::Begin(rpc::Runtime& runtime,
                                            std::shared_ptr<CallWatcher> watcher,
                                            const std::string& label,
                                            const std::vector<int>& members, absl::Time deadline) {
  if (watcher == nullptr) return nullptr;
  const uint64_t call = watcher->Begin(label, members);
  if (call == 0) return nullptr;
  std::shared_ptr<RootWatch> w(new RootWatch());
  w->runtime_ = &runtime;
  w->watcher_ = std::move(watcher);
  w->watches_ = runtime.registry().GetExtension<CallWatches>();
  const absl::Duration after = w->watcher_->hung_after();
  const absl::Time at = absl::Now() + after;
  // A report moment at or past the deadline reports nothing the entries'
  // timeouts do not.
  if (after > absl::ZeroDuration() && at < deadline) w->at_ = at;
  w->call_ = call;
  // Without them (group::Install not called here) nobody hears the hops,
  // and nothing is reported during the call: only its timed-out entries.
  if (w->watches_ != nullptr) w->wire_ = w->watches_->Add(w->watcher_, w->call_);
  return w;
}

RootWatch::~RootWatch() { End({}); }

void RootWatch::Stamp(proto::GroupRequest& request) const {
  if (!reporting()) return;
  request.set_watch_id(wire_);
  request.set_hung_after_us(absl::ToInt64Microseconds(watcher_->hung_after()));
}

PartReports RootWatch::Parts() {
  PartReports p;
  if (!reporting()) return p;
  p.at = at_;
  std::weak_ptr<CallWatcher> weak = watcher_;
  p.report = [weak, call = call_, self = runtime_->self().id](int head,
                                                              proto::GroupHangReport::Kind kind) {
    if (auto w = weak.lock()) w->Report(call, self, head, kind);
  };
  return p;
}

void RootWatch::End(const std::vector<std::pair<rpc::WorkerInfo, absl::Status>>& failed) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    ended_ = true;
  }
  if (watches_ != nullptr) watches_->Remove(wire_);
  watcher_->End(call_, failed);
}

ReportMoment HopReportMoment(const proto::GroupRequest& request, absl::Time arrived) {
  ReportMoment m;
  if (request.watch_id() == 0 || request.hung_after_us() <= 0) return m;
  m.at = arrived + absl::Microseconds(request.report_in_us());
  if (m.at <= arrived) {
    m.late = true;
    m.at = arrived + absl::Microseconds(request.hung_after_us());
  }
  return m;
}

void SendHangReport(rpc::Runtime& runtime, int root, uint64_t watch_id, int member,
                    proto::GroupHangReport::Kind kind) {
  proto::GroupHangReport r;
  r.set_watch_id(watch_id);
  r.set_member(member);
  r.set_kind(kind);
  rpc::Payload payload;
  payload.bytes = r.SerializeAsString();
  rpc::CallOptions opts;
  opts.timeout = absl::Seconds(2);
  // Nothing waits for its answer: a report that is lost reports nothing,
  // and the entry's timeout still does at the call's end.
  (void)runtime.CallRaw(root, kHangReportFn, "", std::move(payload), opts);
}

}  // namespace baton::group::internal
