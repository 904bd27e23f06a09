#include "group/group.h"

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "proto/group.pb.h"

namespace baton::group {
namespace {

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

// How long before its own deadline a hop answers, so that its answer
// reaches its caller in time: an eighth of the time left, 2 to 250 ms.
absl::Duration Margin(absl::Duration left) {
  return std::clamp(left / 8, absl::Milliseconds(2), absl::Milliseconds(250));
}

std::string Describe(rpc::Runtime& runtime, int id) {
  absl::StatusOr<rpc::WorkerInfo> w = runtime.worker(id);
  return w.ok() ? absl::StrCat("worker '", w->name, "'") : absl::StrCat("worker ", id);
}

// A part's reply, split into its members' outcomes (GC4: one per member, in
// order); DATA_LOSS if it is not that.
absl::StatusOr<std::vector<Outcome>> SplitReply(const rpc::Payload& reply,
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
    const proto::GroupEntry& e = r.entries(i);
    if (e.member() != members[i] || e.blobs() < 0 ||
        static_cast<size_t>(e.blobs()) > reply.blobs.size() - blob) {
      return absl::DataLossError(
          absl::StrCat("a group reply whose entry ", i, " does not match its request"));
    }
    if (e.code() == 0) {
      rpc::Payload value;
      value.bytes = e.value();
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

// Sends `base` to the first member of each of at most base.fanout() parts
// of `members` (GC3), each request listing its part, within `timeout`;
// `done` gets each part's outcomes, in its order, as the part answers.
void FanOut(rpc::Runtime& runtime, const proto::GroupRequest& base,
            const std::vector<rpc::Blob>& blobs, const std::vector<int>& members,
            absl::Duration timeout, const PartDone& done) {
  for (const auto& [begin, end] : Split(static_cast<int>(members.size()), base.fanout())) {
    std::vector<int> part(members.begin() + begin, members.begin() + end);
    proto::GroupRequest request = base;
    request.clear_members();
    for (int m : part) request.add_members(m);
    rpc::Payload payload;
    payload.bytes = request.SerializeAsString();
    payload.blobs = blobs;
    rpc::CallOptions opts;
    opts.timeout = timeout;
    opts.label = absl::StrCat("group call of '", base.function(), "'");
    rpc::Runtime* rt = &runtime;
    runtime.CallRaw(part[0], kForwardFn, "", std::move(payload), opts)
        .OnReady([rt, part = std::move(part), done](const Outcome& reply) {
          std::vector<Outcome> outcomes;
          absl::Status failed = reply.status();
          if (reply.ok()) {
            absl::StatusOr<std::vector<Outcome>> split = SplitReply(*reply, part);
            if (split.ok()) {
              outcomes = *std::move(split);
            } else {
              failed = split.status();
            }
          }
          if (!failed.ok()) {
            // GC2: the part's first member did not answer for it: each of
            // the others gets an error naming it and the cause.
            outcomes.assign(1, failed);
            for (size_t i = 1; i < part.size(); ++i) {
              outcomes.push_back(absl::Status(
                  failed.code(),
                  absl::StrCat("not reached: ", Describe(*rt, part[0]),
                               ", which was to forward the call, failed: ", failed.message())));
            }
          }
          done(part, std::move(outcomes));
        });
  }
}

// One hop of a group call on a member: its own outcome and its part's.
class Hop : public std::enable_shared_from_this<Hop> {
 public:
  Hop(proto::GroupRequest request, rpc::WorkerInfo root, absl::Time reply_by, rpc::Responder done)
      : request_(std::move(request)),
        root_(std::move(root)),
        reply_by_(reply_by),
        done_(std::move(done)) {
    for (int i = 0; i < request_.members_size(); ++i) position_[request_.members(i)] = i;
    outcomes_.resize(request_.members_size());
    left_ = request_.members_size();
  }

  void Run(const rpc::CallContext& ctx, const std::vector<rpc::Blob>& blobs) {
    rpc::Runtime& runtime = *ctx.runtime;
    auto self = shared_from_this();
    if (reply_by_ != absl::InfiniteFuture()) {
      absl::MutexLock lock(&mu_);
      timers_ = runtime.timer();
      timer_ = runtime.timer()->Schedule(runtime.timer()->FromRealTime(reply_by_),
                                         [self] { self->Answer(); });
    }
    // The part first, so that its members start while this one works.
    std::vector<int> rest(request_.members().begin() + 1, request_.members().end());
    if (!rest.empty()) {
      const absl::Duration timeout = reply_by_ == absl::InfiniteFuture()
                                         ? absl::InfiniteDuration()
                                         : std::max(reply_by_ - absl::Now(), absl::Milliseconds(1));
      FanOut(runtime, request_, blobs, rest, timeout,
             [self](const std::vector<int>& part, std::vector<Outcome> outcomes) {
               for (size_t i = 0; i < part.size(); ++i) {
                 self->Set(self->position_.at(part[i]), std::move(outcomes[i]));
               }
             });
    }
    RunOwn(ctx, blobs);
  }

 private:
  // This member's own function, as the agent runs a request.
  void RunOwn(const rpc::CallContext& ctx, const std::vector<rpc::Blob>& blobs) {
    rpc::Runtime& runtime = *ctx.runtime;
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
    auto self = shared_from_this();
    try {
      entry->handler(own, std::move(args), [self](Outcome r) { self->Set(0, std::move(r)); });
    } catch (const std::exception& e) {
      Set(0,
          absl::UnknownError(absl::StrCat("exception in '", request_.function(), "': ", e.what())));
    }
  }

  void Set(int position, Outcome outcome) {
    bool all = false;
    {
      absl::MutexLock lock(&mu_);
      if (answered_ || outcomes_[position].has_value()) return;
      outcomes_[position] = std::move(outcome);
      all = --left_ == 0;
    }
    if (all) Answer();
  }

  // Answers once: every outcome in, or the hop's time is up (GC1).
  void Answer() {
    rpc::Payload reply;
    proto::GroupReply r;
    rpc::Responder done;
    {
      absl::MutexLock lock(&mu_);
      if (answered_) return;
      answered_ = true;
      for (int i = 0; i < request_.members_size(); ++i) {
        proto::GroupEntry* e = r.add_entries();
        e->set_member(request_.members(i));
        const std::optional<Outcome>& o = outcomes_[i];
        if (!o.has_value()) {
          e->set_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
          e->set_message(
              absl::StrCat(i == 0 ? "timed out: its function ran past the group call's deadline"
                                  : "timed out: no answer within the group call's deadline"));
        } else if (!o->ok()) {
          e->set_code(static_cast<int>(o->status().code()));
          e->set_message(std::string(o->status().message()));
        } else if (!request_.discard_values()) {
          e->set_value((*o)->bytes);
          e->set_blobs(static_cast<int>((*o)->blobs.size()));
          for (const rpc::Blob& b : (*o)->blobs) reply.blobs.push_back(b);
        }
      }
      done = std::move(done_);
      // What the timer holds (this hop, its tensors) goes now, not at the
      // deadline.
      if (timers_ != nullptr && timer_ != 0) timers_->Cancel(timer_);
    }
    reply.bytes = r.SerializeAsString();
    done(std::move(reply));
  }

  const proto::GroupRequest request_;
  const rpc::WorkerInfo root_;
  const absl::Time reply_by_;
  absl::flat_hash_map<int, int> position_;  // member -> its place in request_.members
  absl::Mutex mu_;
  std::vector<std::optional<Outcome>> outcomes_ ABSL_GUARDED_BY(mu_);
  int left_ ABSL_GUARDED_BY(mu_) = 0;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  rpc::Responder done_ ABSL_GUARDED_BY(mu_);
  rpc::DeadlineTimer* timers_ ABSL_GUARDED_BY(mu_) = nullptr;
  rpc::DeadlineTimer::Id timer_ ABSL_GUARDED_BY(mu_) = 0;
};

// A request a hop takes: its members are distinct workers of the job, this
// worker first; its fanout in range; its root a worker.
absl::Status CheckRequest(rpc::Runtime& runtime, const proto::GroupRequest& r) {
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
  const absl::Time reply_by = ctx.deadline == absl::InfiniteFuture()
                                  ? absl::InfiniteFuture()
                                  : ctx.deadline - Margin(ctx.deadline - absl::Now());
  std::vector<rpc::Blob> blobs = std::move(payload.blobs);
  auto hop = std::make_shared<Hop>(std::move(request), *std::move(root), reply_by, std::move(done));
  hop->Run(ctx, blobs);
}

}  // namespace

absl::Status Install(rpc::FunctionRegistry& registry) {
  return registry.RegisterRaw(kForwardFn, "", Forward);
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
                                               const GroupOptions& options, bool discard_values) {
  std::vector<rpc::Promise<rpc::Payload>> promises;
  std::vector<rpc::Future<rpc::Payload>> out;
  std::vector<int> ids;
  auto position = std::make_shared<absl::flat_hash_map<int, int>>();
  for (const rpc::WorkerInfo& m : members) {
    promises.emplace_back(runtime.executor());
    out.push_back(promises.back().future());
    (*position)[m.id] = static_cast<int>(ids.size());
    ids.push_back(m.id);
  }
  proto::GroupRequest base;
  base.set_function(function);
  base.set_signature(signature);
  base.set_fanout(options.fanout);
  base.set_root(runtime.self().id);
  base.set_discard_values(discard_values);
  base.set_args(std::move(args.bytes));
  const absl::Duration timeout =
      options.timeout > absl::ZeroDuration() ? options.timeout : runtime.options().rpc_timeout;
  FanOut(
      runtime, base, args.blobs, ids, timeout,
      [promises, position, members](const std::vector<int>& part, std::vector<Outcome> outcomes) {
        for (size_t i = 0; i < part.size(); ++i) {
          const int at = position->at(part[i]);
          if (outcomes[i].ok()) {
            promises[at].Set(std::move(outcomes[i]));
          } else {
            promises[at].SetError(ForMember(outcomes[i].status(), members[at]));
          }
        }
      });
  return out;
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
               options_);
}

}  // namespace baton::group
