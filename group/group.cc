#include "group/group.h"

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "group/call_watch.h"
#include "group/partial_sum.h"
#include "proto/group.pb.h"

namespace baton::group {
namespace {

using internal::Describe;
using internal::PartialSum;

constexpr int kMaxFanout = 64;
// The most members one request may list (a hostile one lists more).
constexpr int kMaxMembers = 1 << 16;

using Outcome = absl::StatusOr<rpc::Payload>;

// The [begin, end) of each of at most `parts` contiguous parts of n items,
// of sizes that differ by one at most.
std::vector<std::pair<int, int>> Split(int n, int parts) {
  parts = std::min(parts, n);
  std::vector<std::pair<int, int>> out;
  int begin = 0;
  for (int p = 0; p < parts; ++p) {
    const int size = n / parts + (p < n % parts ? 1 : 0);
    out.emplace_back(begin, begin + size);
    begin += size;
  }
  return out;
}

// The levels of the tree below a hop whose part has `n` members (itself
// first) and the given fanout.
int LevelsBelow(int n, int fanout) {
  int levels = 0;
  while (n > 1) {
    n = (n - 1 + fanout - 1) / fanout;  // the largest part below
    ++levels;
  }
  return levels;
}

// How long before its own deadline a hop answers, so that its answer
// reaches the member above in time: a share of the time left that shrinks
// with the levels below it (they keep margins of their own), 1 to 250 ms.
// Over a whole chain the leaves keep a good part of the time: the shares
// are 1/4, 1/8, 1/12, ... from the bottom.
absl::Duration Margin(absl::Duration left, int levels_below) {
  return std::clamp(left / (4 * (levels_below + 1)), absl::Milliseconds(1),
                    absl::Milliseconds(250));
}

// A part's reply, split into its members' outcomes (GC4: one per member, in
// order); DATA_LOSS if it is not that.
absl::StatusOr<std::vector<Outcome>> SplitReply(rpc::Payload reply,
                                                const std::vector<int>& members) {
  proto::GroupReply r;
  if (!r.ParseFromString(reply.bytes)) return absl::DataLossError("undecodable group reply");
  if (r.entries_size() != static_cast<int>(members.size())) {
    return absl::DataLossError(absl::StrCat("a group reply with ", r.entries_size(),
                                            " entries for ", members.size(), " members"));
  }
  std::vector<Outcome> out;
  out.reserve(members.size());
  size_t blob = 0;
  for (int i = 0; i < r.entries_size(); ++i) {
    proto::GroupEntry& e = *r.mutable_entries(i);
    if (e.member() != members[i] || e.blobs() < 0 ||
        static_cast<size_t>(e.blobs()) > reply.blobs.size() - blob ||
        (e.code() != 0 && e.blobs() != 0)) {
      return absl::DataLossError(
          absl::StrCat("a group reply whose entry ", i, " does not match its request"));
    }
    if (e.code() == 0) {
      rpc::Payload value;
      value.bytes = std::move(*e.mutable_value());
      value.blobs.assign(reply.blobs.begin() + static_cast<std::ptrdiff_t>(blob),
                         reply.blobs.begin() + static_cast<std::ptrdiff_t>(blob + e.blobs()));
      out.push_back(std::move(value));
    } else {
      const bool known =
          e.code() > 0 && e.code() <= static_cast<int>(absl::StatusCode::kUnauthenticated);
      out.push_back(
          absl::Status(known ? static_cast<absl::StatusCode>(e.code()) : absl::StatusCode::kUnknown,
                       e.message()));
    }
    blob += static_cast<size_t>(e.blobs());
  }
  if (blob != reply.blobs.size()) {
    return absl::DataLossError("a group reply with tensors that no entry claims");
  }
  return out;
}

using PartDone = std::function<void(const std::vector<int>& part, std::vector<Outcome> outcomes)>;

// What the call is called in errors, metrics and hang reports.
std::string CallLabel(const proto::GroupRequest& r) {
  return absl::StrCat(internal::kCallLabelPrefix, r.label().empty() ? r.function() : r.label(),
                      "'");
}

// Sends `base` to the first member of each of at most base.fanout() parts
// of `members` (GC3), each request listing its part, each due by
// `deadline`; `done` gets each part's outcomes, in its order, as the part
// answers. A watched call's part that has not answered at the report
// moment is reported (call_watch.h).
void FanOut(rpc::Runtime& runtime, const proto::GroupRequest& base,
            const std::vector<rpc::Blob>& blobs, const std::vector<int>& members,
            absl::Time deadline, const internal::PartReports& reports, const PartDone& done) {
  rpc::Runtime* rt = &runtime;
  for (const auto& [begin, end] : Split(static_cast<int>(members.size()), base.fanout())) {
    std::vector<int> part(members.begin() + begin, members.begin() + end);
    // Each part's time is taken from the deadline as it is sent: a send
    // that waited (for a peer's window) takes nothing from the next part.
    const absl::Duration left =
        deadline == absl::InfiniteFuture() ? absl::InfiniteDuration() : deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      std::vector<Outcome> outcomes(
          part.size(),
          absl::DeadlineExceededError(absl::StrCat(
              internal::kNotSent, "the group call's deadline passed before its request left")));
      done(part, std::move(outcomes));
      continue;
    }
    proto::GroupRequest request = base;
    request.clear_members();
    for (int m : part) request.add_members(m);
    if (reports.active() && request.watch_id() != 0) {
      request.set_report_in_us(absl::ToInt64Microseconds(reports.at - absl::Now()));
    }
    rpc::Payload payload;
    payload.bytes = request.SerializeAsString();
    payload.blobs = blobs;
    rpc::CallOptions opts;
    opts.timeout = left;
    opts.label = CallLabel(base);
    const int head = part[0];
    const bool reduce = base.reduce_sum();
    std::shared_ptr<internal::ReportTimer> report;
    if (reports.active()) {
      report = internal::ReportTimer::Arm(runtime, reports.at, [r = reports.report, head] {
        r(head, proto::GroupHangReport::PART_WAITING);
      });
    }
    runtime.CallRaw(head, kForwardFn, "", std::move(payload), opts)
        .OnReady([rt, reduce, part = std::move(part), done, report, r = reports.report,
                  head](const Outcome& reply) {
          // A part reported waiting that answered after all: its first
          // member is alive.
          if (report != nullptr && report->Cancel() && reply.ok()) {
            r(head, proto::GroupHangReport::PART_ANSWERED);
          }
          std::vector<Outcome> outcomes;
          absl::Status failed = reply.status();
          if (reply.ok() && reduce) {
            // The part's sum stands for all its members: the first
            // member's outcome carries it, the others' are empty.
            outcomes.push_back(*reply);
            outcomes.resize(part.size(), rpc::Payload());
          } else if (reply.ok()) {
            absl::StatusOr<std::vector<Outcome>> split = SplitReply(*reply, part);
            if (split.ok()) {
              outcomes = *std::move(split);
            } else {
              failed = split.status();
            }
          }
          if (!failed.ok()) {
            // GC2: the part's first member did not answer for it: each of
            // the others gets an error naming it and the cause. They may
            // have run all the same.
            outcomes.assign(1, failed);
            for (size_t i = 1; i < part.size(); ++i) {
              outcomes.push_back(absl::Status(
                  failed.code(),
                  absl::StrCat(internal::kNoAnswerThrough, Describe(*rt, part[0]),
                               ", which was to forward the call to it (it may have run): ",
                               failed.message())));
            }
          }
          done(part, std::move(outcomes));
        });
  }
}

// One hop of a group call on a member: its own outcome and its part's.
class Hop : public std::enable_shared_from_this<Hop> {
 public:
  Hop(rpc::Runtime* runtime, proto::GroupRequest request, rpc::WorkerInfo root, absl::Time reply_by,
      internal::ReportMoment report_at, rpc::Responder done)
      : runtime_(runtime),
        request_(std::move(request)),
        root_(std::move(root)),
        reply_by_(reply_by),
        report_at_(report_at.at),
        late_(report_at.late),
        done_(std::move(done)) {
    const int n = request_.members_size();
    position_.reserve(n);
    for (int i = 0; i < n; ++i) position_[request_.members(i)] = i;
    forwarder_.assign(n, request_.members(0));
    for (const auto& [begin, end] : Split(n - 1, request_.fanout())) {
      for (int i = begin; i < end; ++i) forwarder_[i + 1] = request_.members(begin + 1);
    }
    outcomes_.resize(n);
    left_ = n;
  }

  void Run(const rpc::CallContext& ctx, const std::vector<rpc::Blob>& blobs) {
    auto self = shared_from_this();
    if (reply_by_ <= absl::Now()) {
      // No time left to do anything in (the request waited in a queue):
      // nothing is forwarded and nothing runs.
      Answer();
      return;
    }
    if (reply_by_ != absl::InfiniteFuture()) {
      rpc::DeadlineTimer* timer = runtime_->timer();
      absl::MutexLock lock(&mu_);
      timer_ = timer->Schedule(timer->FromRealTime(reply_by_), [self] { self->AnswerSoon(); });
    }
    // A watched call: what still keeps it waiting here at the report
    // moment is reported to its root (call_watch.h).
    internal::PartReports reports;
    if (report_at_ != absl::InfiniteFuture()) {
      const uint64_t id = request_.watch_id();
      // Late: whoever sent this waited past the moment for it; this member
      // is not the one that hangs (so far).
      if (late_) {
        internal::SendHangReport(*runtime_, root_.id, id, runtime_->self().id,
                                 proto::GroupHangReport::ALIVE);
      }
      reports.at = report_at_;
      reports.report = [rt = runtime_, root = root_.id, id](int head,
                                                            proto::GroupHangReport::Kind kind) {
        internal::SendHangReport(*rt, root, id, head, kind);
      };
      auto own = internal::ReportTimer::Arm(*runtime_, report_at_, [weak = weak_from_this()] {
        if (auto hop = weak.lock()) hop->ReportOwn();
      });
      absl::MutexLock lock(&mu_);
      own_report_ = std::move(own);
    }
    // The part first, so that its members start while this one works.
    std::vector<int> rest(request_.members().begin() + 1, request_.members().end());
    if (!rest.empty()) {
      FanOut(*runtime_, request_, blobs, rest, reply_by_, reports,
             [self](const std::vector<int>& part, std::vector<Outcome> outcomes) {
               std::vector<int> positions;
               for (int m : part) positions.push_back(self->position_.at(m));
               self->Set(positions, std::move(outcomes));
             });
    }
    RunOwn(ctx, blobs);
  }

 private:
  // This member's own function, as the agent runs a request.
  void RunOwn(const rpc::CallContext& ctx, const std::vector<rpc::Blob>& blobs) {
    rpc::Runtime& runtime = *runtime_;
    std::shared_ptr<const rpc::FunctionRegistry::Entry> entry =
        runtime.registry().Find(request_.function());
    if (entry == nullptr) {
      Set(0, absl::NotFoundError(absl::StrCat("unknown function '", request_.function(),
                                              "' (not registered on worker '", runtime.self().name,
                                              "')")));
      return;
    }
    if (!request_.signature().empty() && !entry->signature.empty() &&
        request_.signature() != entry->signature) {
      Set(0, absl::InvalidArgumentError(
                 absl::StrCat("argument type mismatch: the caller sends ", request_.signature(),
                              " but worker '", runtime.self().name, "' registered '",
                              request_.function(), "' as ", entry->signature)));
      return;
    }
    rpc::CallContext own;
    own.agent = ctx.agent;
    own.runtime = ctx.runtime;
    own.registry = ctx.registry;
    own.caller = &root_;
    own.caller_incarnation = runtime.peer_incarnation(root_.id);
    own.function = request_.function();
    own.deadline = reply_by_;
    rpc::Payload args;
    args.bytes = request_.args();
    args.blobs = blobs;
    {
      absl::MutexLock lock(&mu_);
      started_ = true;
    }
    auto self = shared_from_this();
    try {
      entry->handler(own, std::move(args), [self](Outcome r) { self->Set(0, std::move(r)); });
    } catch (const std::exception& e) {
      Set(0,
          absl::UnknownError(absl::StrCat("exception in '", request_.function(), "': ", e.what())));
    }
  }

  // At the report moment: this member's own function still runs.
  void ReportOwn() {
    {
      absl::MutexLock lock(&mu_);
      if (answered_ || outcomes_[0].has_value()) return;
    }
    internal::SendHangReport(*runtime_, root_.id, request_.watch_id(), runtime_->self().id,
                             proto::GroupHangReport::OWN_RUNNING);
  }

  void Set(int position, Outcome outcome) {
    std::vector<Outcome> one;
    one.push_back(std::move(outcome));
    Set({position}, std::move(one));
  }

  // A part's outcomes go in together, so that the answer sees all of them
  // or none (a reduce's part sum stands for every member of the part).
  void Set(const std::vector<int>& positions, std::vector<Outcome> outcomes) {
    bool all = false;
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < positions.size(); ++i) {
        if (answered_ || outcomes_[positions[i]].has_value()) continue;
        outcomes_[positions[i]] = std::move(outcomes[i]);
        all = --left_ == 0;
        outcomes[i] = absl::CancelledError();  // taken
      }
    }
    // An outcome that came too late is never delivered (RRef G8).
    for (Outcome& o : outcomes) {
      if (o.ok()) o->Undeliverable();
    }
    if (all) AnswerSoon();
  }

  // Answer() on the executor: the timer's thread and the transport's, where
  // the last outcome may arrive, only hand it over. On an executor thread
  // (a leaf's function that answered at once) it answers there, saving a
  // thread's wake-up per member.
  void AnswerSoon() {
    rpc::Executor* executor = runtime_->executor();
    if (executor->InPool()) {
      Answer();
      return;
    }
    auto self = shared_from_this();
    if (!executor->Submit([self] { self->Answer(); })) Answer();
  }

  // The entry of member `i` that has no outcome at the answer.
  std::string Missing(int i, bool started) const {
    if (i == 0) {
      return started ? "timed out: its function was still running at the group call's deadline"
                     : "not started: the group call's deadline passed before it reached this "
                       "member";
    }
    if (forwarder_[i] == request_.members(i)) {
      return "timed out: no answer within the group call's deadline";
    }
    return absl::StrCat("timed out: no answer within the group call's deadline through ",
                        Describe(*runtime_, forwarder_[i]),
                        ", which was to forward the call to it");
  }

  // Answers once: every outcome in, or the hop's time is up (GC1).
  void Answer() {
    rpc::Payload reply;
    proto::GroupReply r;
    rpc::Responder done;
    std::vector<std::optional<Outcome>> outcomes;
    bool started;
    {
      absl::MutexLock lock(&mu_);
      if (answered_) return;
      answered_ = true;
      outcomes.swap(outcomes_);
      started = started_;
      done = std::move(done_);
      // What the timer holds (this hop, its tensors) goes now, not at the
      // deadline.
      if (timer_ != 0) runtime_->timer()->Cancel(timer_);
      if (own_report_ != nullptr) own_report_->Cancel();
    }
    if (request_.reduce_sum()) {
      AnswerSum(outcomes, started, std::move(done));
      return;
    }
    // A part's values travel in one message: what would not fit is
    // refused, member by member, instead of failing them all.
    const int64_t room = runtime_->options().transport.max_message_bytes - (int64_t{64} << 10);
    int64_t size = 0;
    for (int i = 0; i < request_.members_size(); ++i) {
      proto::GroupEntry* e = r.add_entries();
      e->set_member(request_.members(i));
      std::optional<Outcome>& o = outcomes[i];
      if (!o.has_value()) {
        e->set_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
        e->set_message(Missing(i, started));
        continue;
      }
      if (!o->ok()) {
        e->set_code(static_cast<int>(o->status().code()));
        e->set_message(std::string(o->status().message()));
        continue;
      }
      rpc::Payload& value = **o;
      if (request_.discard_values()) {
        value.Undeliverable();
        continue;
      }
      const int64_t bytes = static_cast<int64_t>(value.total_size()) + 64;
      if (size + bytes > room) {
        e->set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
        e->set_message(absl::StrCat(
            "its value of ", bytes, " bytes does not fit in the reply of ",
            Describe(*runtime_, request_.members(0)), " for its part (max_message_bytes ",
            runtime_->options().transport.max_message_bytes, "): call fewer members at once"));
        value.Undeliverable();
        continue;
      }
      size += bytes;
      e->set_value(std::move(value.bytes));
      e->set_blobs(static_cast<int>(value.blobs.size()));
      for (rpc::Blob& b : value.blobs) reply.blobs.push_back(std::move(b));
      for (auto& undo : value.undo_if_undelivered) {
        reply.undo_if_undelivered.push_back(std::move(undo));
      }
    }
    reply.bytes = r.SerializeAsString();
    done(std::move(reply));
  }

  // A reduce's answer: this member's tensor and its parts' sums, added.
  void AnswerSum(std::vector<std::optional<Outcome>>& outcomes, bool started, rpc::Responder done) {
    PartialSum sum(runtime_);
    const int n = request_.members_size();
    for (int i = 0; i < n; ++i) {
      const int m = request_.members(i);
      std::optional<Outcome>& o = outcomes[i];
      if (!o.has_value()) {
        sum.Fail(m, absl::DeadlineExceededError(Missing(i, started)));
      } else if (i == 0) {
        sum.AddOwn(m, *o);
      } else if (!o->ok()) {
        sum.Fail(m, o->status());
      } else if (forwarder_[i] == m) {
        // The first of a part: its outcome is the part's sum (FanOut).
        std::vector<int> part;
        for (int j = i; j < n && forwarder_[j] == m; ++j) part.push_back(request_.members(j));
        sum.AddPart(part, **o);
      }
    }
    done(sum.ToReply());
  }

  rpc::Runtime* const runtime_;
  const proto::GroupRequest request_;
  const rpc::WorkerInfo root_;
  const absl::Time reply_by_;
  const absl::Time report_at_;  // infinite: not a watched call
  const bool late_;             // the request came after the call's moment
  // Member -> its place in request_.members, and the member that forwards
  // the call to it (itself for the first of a part); constant.
  absl::flat_hash_map<int, int> position_;
  std::vector<int> forwarder_;
  absl::Mutex mu_;
  std::vector<std::optional<Outcome>> outcomes_ ABSL_GUARDED_BY(mu_);
  int left_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  rpc::Responder done_ ABSL_GUARDED_BY(mu_);
  rpc::DeadlineTimer::Id timer_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<internal::ReportTimer> own_report_ ABSL_GUARDED_BY(mu_);
};

// A request a hop takes: its members are distinct workers of the job, this
// worker first; its fanout in range; its root a worker; its function not
// the forwarding one (which would nest without bound).
absl::Status CheckRequest(rpc::Runtime& runtime, const proto::GroupRequest& r) {
  if (r.function() == kForwardFn) {
    return absl::InvalidArgumentError("a group request cannot call the group's own function");
  }
  if (r.members_size() < 1 || r.members_size() > kMaxMembers) {
    return absl::InvalidArgumentError(
        absl::StrCat("a group request for ", r.members_size(), " members"));
  }
  if (r.members(0) != runtime.self().id) {
    return absl::InvalidArgumentError(absl::StrCat("a group request for worker ", r.members(0),
                                                   " reached worker ", runtime.self().id));
  }
  if (r.fanout() < 1 || r.fanout() > kMaxFanout) {
    return absl::InvalidArgumentError(absl::StrCat("a group request with fanout ", r.fanout()));
  }
  absl::flat_hash_set<int> seen;
  for (int m : r.members()) {
    if (!seen.insert(m).second) {
      return absl::InvalidArgumentError(absl::StrCat("a group request lists worker ", m, " twice"));
    }
    RETURN_IF_ERROR(runtime.worker(m).status());
  }
  return absl::OkStatus();
}

void Forward(const rpc::CallContext& ctx, rpc::Payload payload, rpc::Responder done) {
  proto::GroupRequest request;
  if (ctx.runtime == nullptr || !request.ParseFromString(payload.bytes)) {
    done(absl::DataLossError("undecodable group request"));
    return;
  }
  rpc::Runtime& runtime = *ctx.runtime;
  if (absl::Status s = CheckRequest(runtime, request); !s.ok()) {
    done(s);
    return;
  }
  absl::StatusOr<rpc::WorkerInfo> root = runtime.worker(request.root());
  if (!root.ok()) {
    done(root.status());
    return;
  }
  const absl::Time now = absl::Now();
  const absl::Time reply_by =
      ctx.deadline == absl::InfiniteFuture()
          ? absl::InfiniteFuture()
          : ctx.deadline -
                Margin(ctx.deadline - now, LevelsBelow(request.members_size(), request.fanout()));
  const internal::ReportMoment report_at = internal::HopReportMoment(request, now);
  std::vector<rpc::Blob> blobs = std::move(payload.blobs);
  auto hop = std::make_shared<Hop>(&runtime, std::move(request), *std::move(root), reply_by,
                                   report_at, std::move(done));
  hop->Run(ctx, blobs);
}

}  // namespace

absl::Status Install(rpc::FunctionRegistry& registry) {
  RETURN_IF_ERROR(registry.RegisterRaw(kForwardFn, "", Forward));
  return internal::InstallHangReports(registry);
}

namespace {

// What every hop of a call from this worker is sent, but its members.
proto::GroupRequest BaseRequest(rpc::Runtime& runtime, const std::string& function,
                                const std::string& signature, const GroupOptions& options,
                                rpc::Payload& args) {
  proto::GroupRequest base;
  base.set_function(function);
  base.set_signature(signature);
  base.set_fanout(options.fanout);
  base.set_root(runtime.self().id);
  base.set_label(options.label);
  base.set_args(std::move(args.bytes));
  return base;
}

// What a call is called in its supervisor's events.
std::string Label(const GroupOptions& options, const std::string& function) {
  return options.label.empty() ? function : options.label;
}

absl::Time Deadline(rpc::Runtime& runtime, const GroupOptions& options) {
  const absl::Duration timeout =
      options.timeout > absl::ZeroDuration() ? options.timeout : runtime.options().timeouts.rpc;
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
}

}  // namespace

absl::Status Reduced::status() const {
  if (failures.empty()) return absl::OkStatus();
  std::string failed;
  for (const auto& [member, status] : failures) {
    absl::StrAppend(&failed, failed.empty() ? "" : "; ", status.message());
  }
  return absl::Status(failures.front().second.code(),
                      absl::StrCat(failures.size(), " of ", failures.size() + contributors.size(),
                                   " members failed: ", failed));
}

namespace internal {

absl::Status ForMember(const absl::Status& status, const rpc::WorkerInfo& member) {
  if (status.ok() ||
      absl::StrContains(status.message(), absl::StrCat("worker '", member.name, "'"))) {
    return status;
  }
  return absl::Status(status.code(),
                      absl::StrCat("worker '", member.name, "': ", status.message()));
}

std::vector<rpc::Future<rpc::Payload>> CallRaw(rpc::Runtime& runtime,
                                               const std::vector<rpc::WorkerInfo>& members,
                                               const std::string& function,
                                               const std::string& signature, rpc::Payload args,
                                               const GroupOptions& options, bool discard_values,
                                               std::shared_ptr<CallWatcher> watcher) {
  // One state for every part's callback.
  struct Pending {
    std::vector<rpc::Promise<rpc::Payload>> promises;
    absl::flat_hash_map<int, int> position;
    std::vector<rpc::WorkerInfo> members;
    std::shared_ptr<RootWatch> watch;  // null: not watched
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu) = 0;
    std::vector<std::pair<rpc::WorkerInfo, absl::Status>> failed ABSL_GUARDED_BY(mu);
  };
  auto pending = std::make_shared<Pending>();
  pending->members = members;
  std::vector<rpc::Future<rpc::Payload>> out;
  std::vector<int> ids;
  for (const rpc::WorkerInfo& m : members) {
    pending->promises.emplace_back(runtime.executor());
    out.push_back(pending->promises.back().future());
    pending->position[m.id] = static_cast<int>(ids.size());
    ids.push_back(m.id);
  }
  const absl::Time deadline = Deadline(runtime, options);
  proto::GroupRequest base = BaseRequest(runtime, function, signature, options, args);
  base.set_discard_values(discard_values);
  pending->watch =
      RootWatch::Begin(runtime, std::move(watcher), Label(options, function), ids, deadline);
  PartReports reports;
  if (pending->watch != nullptr) {
    pending->watch->Stamp(base);
    reports = pending->watch->Parts();
    absl::MutexLock lock(&pending->mu);
    pending->left = members.size();
  }
  FanOut(runtime, base, args.blobs, ids, deadline, reports,
         [pending](const std::vector<int>& part, std::vector<Outcome> outcomes) {
           std::vector<std::pair<rpc::WorkerInfo, absl::Status>> failed;
           for (size_t i = 0; i < part.size(); ++i) {
             const int at = pending->position.at(part[i]);
             if (outcomes[i].ok()) {
               pending->promises[at].Set(std::move(outcomes[i]));
               continue;
             }
             absl::Status error = ForMember(outcomes[i].status(), pending->members[at]);
             if (pending->watch != nullptr) failed.emplace_back(pending->members[at], error);
             pending->promises[at].SetError(std::move(error));
           }
           if (pending->watch == nullptr) return;
           bool last;
           {
             absl::MutexLock lock(&pending->mu);
             for (auto& f : failed) pending->failed.push_back(std::move(f));
             pending->left -= part.size();
             last = pending->left == 0;
             if (last) failed.swap(pending->failed);
           }
           if (last) pending->watch->End(failed);
         });
  return out;
}

bool MemberTimedOut(const absl::Status& outcome) {
  return absl::IsDeadlineExceeded(outcome) &&
         !absl::StrContains(outcome.message(), kNoAnswerThrough) &&
         !absl::StrContains(outcome.message(), kNotSent);
}

rpc::Future<Reduced> ReduceRaw(rpc::Runtime& runtime, const std::vector<rpc::WorkerInfo>& members,
                               const std::string& function, const std::string& signature,
                               absl::StatusOr<rpc::Payload> args, const GroupOptions& options,
                               ReduceOp op, std::shared_ptr<CallWatcher> watcher) {
  rpc::Promise<Reduced> promise(runtime.executor());
  if (!args.ok()) {
    Reduced r;
    for (const rpc::WorkerInfo& m : members)
      r.failures.emplace_back(m, ForMember(args.status(), m));
    promise.SetValue(std::move(r));
    return promise.future();
  }
  // Each part's reply is kept as it comes (on the transport's threads) and
  // added up on the executor once the last is in.
  struct Parts {
    absl::Mutex mu;
    std::vector<std::pair<std::vector<int>, std::vector<Outcome>>> replies ABSL_GUARDED_BY(mu);
    size_t left ABSL_GUARDED_BY(mu) = 0;
  };
  auto parts = std::make_shared<Parts>();
  std::vector<int> ids;
  for (const rpc::WorkerInfo& m : members) ids.push_back(m.id);
  {
    absl::MutexLock lock(&parts->mu);
    parts->left = Split(static_cast<int>(ids.size()), options.fanout).size();
  }
  const absl::Time deadline = Deadline(runtime, options);
  proto::GroupRequest base = BaseRequest(runtime, function, signature, options, *args);
  base.set_reduce_sum(true);
  std::shared_ptr<RootWatch> watch =
      RootWatch::Begin(runtime, std::move(watcher), Label(options, function), ids, deadline);
  PartReports reports;
  if (watch != nullptr) {
    watch->Stamp(base);
    reports = watch->Parts();
  }
  rpc::Runtime* rt = &runtime;
  FanOut(runtime, base, args->blobs, ids, deadline, reports,
         [rt, parts, promise, members, op, watch](const std::vector<int>& part,
                                                  std::vector<Outcome> outcomes) {
           {
             absl::MutexLock lock(&parts->mu);
             parts->replies.emplace_back(part, std::move(outcomes));
             if (--parts->left > 0) return;
           }
           auto add_up = [rt, parts, promise, members, op, watch] {
             std::vector<std::pair<std::vector<int>, std::vector<Outcome>>> replies;
             {
               absl::MutexLock lock(&parts->mu);
               replies.swap(parts->replies);
             }
             PartialSum sum(rt);
             for (auto& [part, outcomes] : replies) {
               if (outcomes[0].ok()) {
                 sum.AddPart(part, *outcomes[0]);
                 continue;
               }
               for (size_t i = 0; i < part.size(); ++i) sum.Fail(part[i], outcomes[i].status());
             }
             Reduced result = sum.Result(members, op);
             if (watch != nullptr) watch->End(result.failures);
             promise.SetValue(std::move(result));
           };
           if (!rt->executor()->Submit(add_up)) add_up();
         });
  return promise.future();
}

}  // namespace internal

absl::StatusOr<Group> Group::Of(rpc::RpcAgent& agent, const std::vector<rpc::WorkerRef>& members,
                                GroupOptions options) {
  if (options.fanout < 1 || options.fanout > kMaxFanout) {
    return absl::InvalidArgumentError(
        absl::StrCat("a group's fanout must be in [1, ", kMaxFanout, "], got ", options.fanout));
  }
  if (members.empty()) return absl::InvalidArgumentError("a group needs at least one member");
  std::vector<rpc::WorkerInfo> infos;
  absl::flat_hash_set<int> seen;
  for (const rpc::WorkerRef& ref : members) {
    absl::StatusOr<rpc::WorkerInfo> w = agent.worker(ref);
    if (!w.ok()) return Annotate(w.status(), "a group's member");
    if (!seen.insert(w->id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker '", w->name, "' is listed twice in a group (GC5)"));
    }
    infos.push_back(*std::move(w));
  }
  return Group(&agent.runtime(), std::move(infos), options);
}

absl::StatusOr<Group> Group::WithPrefix(rpc::RpcAgent& agent, absl::string_view prefix,
                                        GroupOptions options) {
  std::vector<rpc::WorkerRef> members;
  for (const rpc::WorkerInfo& w : agent.workers()) {
    if (absl::StartsWith(w.name, prefix)) members.emplace_back(w.id);
  }
  if (members.empty()) {
    return absl::NotFoundError(absl::StrCat("no worker's name starts with '", prefix, "'"));
  }
  return Of(agent, members, options);
}

absl::StatusOr<Group> Group::Slice(int begin, int end) const {
  if (begin < 0 || end > size() || begin >= end) {
    return absl::InvalidArgumentError(
        absl::StrCat("members [", begin, ", ", end, ") of a group of ", size()));
  }
  return Group(runtime_,
               std::vector<rpc::WorkerInfo>(members_.begin() + begin, members_.begin() + end),
               options_, watcher_);
}

}  // namespace baton::group
