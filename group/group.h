// Group: one call to many workers, sent through a tree instead of a loop.
//
//   group::Install(*registry);                      // every worker, before Create
//   ...
//   auto observers = group::Group::WithPrefix(*agent, "observer").value();
//   group::GroupResult<float> r = observers.call(reward_fn, episode).value();
//   for (size_t i = 0; i < r.size(); ++i) use(r.members[i].name, r.results[i]);
//
// The caller sends one request to the first member of each of at most
// `fanout` parts of the group; each member that receives a request runs the
// function, forwards the request to the first member of each of at most
// `fanout` parts of its own part, and answers with its own outcome and
// those of its part once they are in. A call to n members thus costs the
// caller O(fanout) messages instead of n, and reaches every member in
// O(log n / log fanout) hops.
//
// A reduce (Group::reduce) sums the tensors the members return on the way
// up: each hop adds its own to its parts' sums and answers with one tensor,
// so one tensor travels on each edge of the tree, not one per member below.
//
// Guarantees (GC):
// GC1 Every member has an outcome by the call's deadline: its function's
//     value, its function's error, or DEADLINE_EXCEEDED naming it if it did
//     not answer in time. The others' values arrive all the same: one slow
//     or dead member costs its own entry, never the call.
// GC2 A member that cannot forward (it died, it was partitioned, it timed
//     out) does not lose its part silently: every member it was to reach
//     gets an error naming both that member and the cause.
// GC3 The caller sends at most `fanout` requests, and so does every member
//     (its own part, split); replies come back up the same tree.
// GC4 Results are in member order, one per member, and each names its
//     member in its error.
// GC5 A group's members are distinct workers of the job, known when the
//     group is made: an unknown one is NOT_FOUND, a repeated one
//     INVALID_ARGUMENT.
//
// The members' function (any registered function but the group's own
// forwarding one) runs as an RPC from the caller would (the caller is what
// CallContext::caller names), without call hooks: a group call carries no
// distributed-autograd context. Arguments are encoded once for every
// member, so they may hold tensors in host memory and plain values, but not
// RRefs or CUDA tensors (INVALID_ARGUMENT at the call).
//
// Deadlines: each member answers for its part some time before the
// deadline it was given (a share of the time left, the smaller the more
// levels of the tree are below it, between 1 and 250 ms), so that its
// answer reaches the member above in time. A function that is still running then keeps
// running, outside the agent's count of incoming calls: its entry is
// DEADLINE_EXCEEDED. A part's values come back in one message: entries
// that would take it past max_message_bytes are RESOURCE_EXHAUSTED, naming
// the member.
//
// Thread-safety: a Group is an immutable value; calls may be made from any
// thread, concurrently, including from remote functions.
#ifndef BATON_GROUP_GROUP_H_
#define BATON_GROUP_GROUP_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "rpc/agent.h"
#include "rpc/codec.h"

namespace baton::group {

// The function that carries a group call from hop to hop.
inline constexpr char kForwardFn[] = "__baton.group.forward";
// The function through which hops report to the caller of a supervised
// call what keeps it waiting (supervisor.h, SV2).
inline constexpr char kHangReportFn[] = "__baton.group.hang_report";

// Registers the forwarding function on `registry`. Call on every worker that
// may be a member, before RpcAgent::Create; ALREADY_EXISTS if installed.
absl::Status Install(rpc::FunctionRegistry& registry);

struct GroupOptions {
  // Requests each hop sends at most (1-64). 1 makes a chain.
  int fanout = 8;
  // The whole call's deadline, from the caller. Zero: the agent's
  // timeouts.rpc.
  absl::Duration timeout = absl::ZeroDuration();
  // What to call the function in errors, metrics and hang reports, when not
  // its registered name (a Python function behind a generic entry point).
  std::string label;
};

// How a reduce combines the members' tensors.
enum class ReduceOp { kSum, kMean };

// The outcome of a reduce.
struct Reduced {
  // The sum of the contributors' tensors (integers and booleans summed as
  // int64), or their mean (floating point: double for integers); undefined
  // when no member contributed.
  at::Tensor value;
  // The members whose tensor is in `value`, and every other member with why
  // (its function's error, DEADLINE_EXCEEDED as for call(), INVALID_ARGUMENT
  // for a value that is not a host tensor of the others' shape and dtype);
  // both in member order.
  std::vector<rpc::WorkerInfo> contributors;
  std::vector<std::pair<rpc::WorkerInfo, absl::Status>> failures;

  bool ok() const { return failures.empty(); }
  // OK if every member contributed; else the first failure's code and a
  // message naming each member left out and why.
  absl::Status status() const;
};

// The outcome of a group call: one entry per member, in member order.
template <typename T>
struct GroupResult {
  std::vector<rpc::WorkerInfo> members;
  std::vector<absl::StatusOr<rpc::internal::Stored<T>>> results;

  size_t size() const { return results.size(); }
  bool ok() const { return status().ok(); }
  // OK if every member succeeded; else the code of the first failure and a
  // message naming each member that failed and why.
  absl::Status status() const;
  // Every value, in member order; throws baton::Error with status() if a
  // member failed.
  std::vector<rpc::internal::Stored<T>> values() const;
};

namespace internal {

// What watches the calls of a supervisor's group() (call_watch.h).
class CallWatcher;

// The untyped call: the outcome of each member (its reply, or its error
// naming it), each completing as its part's reply arrives.
std::vector<rpc::Future<rpc::Payload>> CallRaw(rpc::Runtime& runtime,
                                               const std::vector<rpc::WorkerInfo>& members,
                                               const std::string& function,
                                               const std::string& signature, rpc::Payload args,
                                               const GroupOptions& options, bool discard_values,
                                               std::shared_ptr<CallWatcher> watcher = nullptr);

// Completes with every future's outcome once all are ready.
template <typename T>
rpc::Future<GroupResult<T>> Gather(std::vector<rpc::WorkerInfo> members,
                                   std::vector<rpc::Future<T>> each, rpc::Executor* executor);

// `status`, with the member it concerns named first.
absl::Status ForMember(const absl::Status& status, const rpc::WorkerInfo& member);

// How a hop's forwarding calls are labelled (their PendingCall's function in
// Runtime::OutgoingCalls()): "group call of '<function>'".
inline constexpr char kCallLabelPrefix[] = "group call of '";
// In the error of a member reached through a forwarder that did not answer
// (GC2), and of one whose request never left (the deadline passed first):
// DEADLINE_EXCEEDED entries that do not say that this member hangs.
inline constexpr char kNoAnswerThrough[] = "no answer through ";
inline constexpr char kNotSent[] = "not sent: ";
// Whether `outcome` of a member's entry says that the member itself did not
// answer in time (not a forwarder above it, not a request that never left).
bool MemberTimedOut(const absl::Status& outcome);

// The untyped reduce; `args` failed to encode: every member fails so.
rpc::Future<Reduced> ReduceRaw(rpc::Runtime& runtime, const std::vector<rpc::WorkerInfo>& members,
                               const std::string& function, const std::string& signature,
                               absl::StatusOr<rpc::Payload> args, const GroupOptions& options,
                               ReduceOp op, std::shared_ptr<CallWatcher> watcher = nullptr);

}  // namespace internal

class Group {
 public:
  // The workers named (by name or id), in that order.
  static absl::StatusOr<Group> Of(rpc::RpcAgent& agent, const std::vector<rpc::WorkerRef>& members,
                                  GroupOptions options = {});
  // Every worker of the job whose name starts with `prefix` (a role's
  // workers: "observer" gives observer0, observer1, ...), in rank order;
  // NOT_FOUND if there is none.
  static absl::StatusOr<Group> WithPrefix(rpc::RpcAgent& agent, absl::string_view prefix,
                                          GroupOptions options = {});

  const std::vector<rpc::WorkerInfo>& members() const { return members_; }
  int size() const { return static_cast<int>(members_.size()); }
  const GroupOptions& options() const { return options_; }
  // Members [begin, end) as a group of their own (trainers[0:16]);
  // INVALID_ARGUMENT outside [0, size()] or for an empty range.
  absl::StatusOr<Group> Slice(int begin, int end) const;

  // Runs `fn(args...)` on every member. Each member's future completes when
  // its part of the tree answers; `all` once every member has an outcome.
  template <typename R>
  struct Call {
    std::vector<rpc::Future<R>> each;
    rpc::Future<GroupResult<R>> all;
  };
  template <typename R, typename... Args, typename... CallArgs>
  Call<R> call_each(const rpc::Function<R(Args...)>& fn, CallArgs&&... args) const;
  template <typename R, typename... Args, typename... CallArgs>
  rpc::Future<GroupResult<R>> call(const rpc::Function<R(Args...)>& fn, CallArgs&&... args) const {
    return call_each(fn, std::forward<CallArgs>(args)...).all;
  }
  // As call(), for a function whose results are not wanted: only each
  // member's outcome travels back up the tree.
  template <typename R, typename... Args, typename... CallArgs>
  Call<void> broadcast_each(const rpc::Function<R(Args...)>& fn, CallArgs&&... args) const;
  template <typename R, typename... Args, typename... CallArgs>
  rpc::Future<GroupResult<void>> broadcast(const rpc::Function<R(Args...)>& fn,
                                           CallArgs&&... args) const {
    return broadcast_each(fn, std::forward<CallArgs>(args)...).all;
  }
  // Runs `fn(args...)` on every member and sums the tensors they return on
  // the way up the tree (kMean: divided by the number of contributors). A
  // member that fails, or answers late, is left out of the sum and listed
  // with why; GC1 and GC2 hold as for call().
  template <typename... Args, typename... CallArgs>
  rpc::Future<Reduced> reduce(const rpc::Function<at::Tensor(Args...)>& fn, ReduceOp op,
                              CallArgs&&... args) const {
    return internal::ReduceRaw(*runtime_, members_, fn.name(),
                               rpc::Function<at::Tensor(Args...)>::cached_signature(),
                               Encode(fn, std::forward<CallArgs>(args)...), options_, op, watcher_);
  }

 private:
  friend class Supervisor;
  Group(rpc::Runtime* runtime, std::vector<rpc::WorkerInfo> members, GroupOptions options,
        std::shared_ptr<internal::CallWatcher> watcher = nullptr)
      : runtime_(runtime),
        members_(std::move(members)),
        options_(options),
        watcher_(std::move(watcher)) {}
  template <typename R, typename... Args, typename... CallArgs>
  absl::StatusOr<rpc::Payload> Encode(const rpc::Function<R(Args...)>& fn,
                                      CallArgs&&... args) const;

  rpc::Runtime* runtime_;
  std::vector<rpc::WorkerInfo> members_;
  GroupOptions options_;
  std::shared_ptr<internal::CallWatcher> watcher_;  // null: not a supervisor's
};

// ---- Template implementation ----

template <typename T>
absl::Status GroupResult<T>::status() const {
  absl::Status first;
  std::string failed;
  int count = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].ok()) continue;
    if (first.ok()) first = results[i].status();
    absl::StrAppend(&failed, count == 0 ? "" : "; ", results[i].status().message());
    ++count;
  }
  if (first.ok()) return first;
  return absl::Status(first.code(),
                      absl::StrCat(count, " of ", results.size(), " members failed: ", failed));
}

template <typename T>
std::vector<rpc::internal::Stored<T>> GroupResult<T>::values() const {
  if (absl::Status s = status(); !s.ok()) throw Error(s);
  std::vector<rpc::internal::Stored<T>> out;
  out.reserve(results.size());
  for (const auto& r : results) out.push_back(*r);
  return out;
}

template <typename T>
rpc::Future<GroupResult<T>> internal::Gather(std::vector<rpc::WorkerInfo> members,
                                             std::vector<rpc::Future<T>> each,
                                             rpc::Executor* executor) {
  struct State {
    absl::Mutex mu;
    GroupResult<T> result;
    size_t left = 0;
  };
  auto state = std::make_shared<State>();
  state->result.members = std::move(members);
  state->result.results.resize(each.size(), absl::UnknownError("no outcome"));
  state->left = each.size();
  rpc::Promise<GroupResult<T>> promise(executor);
  if (each.empty()) promise.SetValue(GroupResult<T>{});
  for (size_t i = 0; i < each.size(); ++i) {
    each[i].OnReady([state, promise, i](const absl::StatusOr<rpc::internal::Stored<T>>& r) {
      bool last;
      {
        absl::MutexLock lock(&state->mu);
        state->result.results[i] = r;
        last = --state->left == 0;
      }
      if (last) promise.SetValue(std::move(state->result));
    });
  }
  return promise.future();
}

template <typename R, typename... Args, typename... CallArgs>
absl::StatusOr<rpc::Payload> Group::Encode(const rpc::Function<R(Args...)>& fn,
                                           CallArgs&&... args) const {
  static_assert(sizeof...(CallArgs) == sizeof...(Args),
                "wrong number of arguments for this Function");
  typename rpc::Function<R(Args...)>::ArgsTuple tuple(std::forward<CallArgs>(args)...);
  // Encoded once for every member: no destination (peer -1), so a value
  // that needs one (an RRef, a CUDA tensor) fails here; and without the
  // call hooks, as no hook's context travels.
  const rpc::CodecContext context{runtime_, /*peer=*/-1};
  absl::StatusOr<rpc::Payload> payload = rpc::EncodeMessage(tuple, &context);
  if (!payload.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group call of '", fn.name(), "' to ", members_.size(),
                     " members: cannot encode its arguments once for every member (RRefs and "
                     "CUDA tensors need a destination): ",
                     payload.status().message()));
  }
  return payload;
}

template <typename R, typename... Args, typename... CallArgs>
Group::Call<R> Group::call_each(const rpc::Function<R(Args...)>& fn, CallArgs&&... args) const {
  Call<R> out;
  absl::StatusOr<rpc::Payload> payload = Encode(fn, std::forward<CallArgs>(args)...);
  std::vector<rpc::Future<rpc::Payload>> raw;
  if (payload.ok()) {
    raw = internal::CallRaw(*runtime_, members_, fn.name(),
                            rpc::Function<R(Args...)>::cached_signature(), *std::move(payload),
                            options_, /*discard_values=*/false, watcher_);
  }
  out.each.reserve(members_.size());
  for (size_t i = 0; i < members_.size(); ++i) {
    if (!payload.ok()) {
      out.each.push_back(
          rpc::MakeErrorFuture<R>(internal::ForMember(payload.status(), members_[i])));
      continue;
    }
    out.each.push_back(runtime_->DecodeFuture<R>(std::move(raw[i]), members_[i], fn.name()));
  }
  out.all = internal::Gather<R>(members_, out.each, runtime_->executor());
  return out;
}

template <typename R, typename... Args, typename... CallArgs>
Group::Call<void> Group::broadcast_each(const rpc::Function<R(Args...)>& fn,
                                        CallArgs&&... args) const {
  Call<void> out;
  absl::StatusOr<rpc::Payload> payload = Encode(fn, std::forward<CallArgs>(args)...);
  out.each.reserve(members_.size());
  if (!payload.ok()) {
    for (const auto& m : members_) {
      out.each.push_back(rpc::MakeErrorFuture<void>(internal::ForMember(payload.status(), m)));
    }
  } else {
    for (auto& r : internal::CallRaw(
             *runtime_, members_, fn.name(), rpc::Function<R(Args...)>::cached_signature(),
             *std::move(payload), options_, /*discard_values=*/true, watcher_)) {
      rpc::Promise<void> outcome(runtime_->executor());
      r.OnReady([outcome](const absl::StatusOr<rpc::Payload>& reply) {
        if (reply.ok()) {
          outcome.SetValue();
        } else {
          outcome.SetError(reply.status());
        }
      });
      out.each.push_back(outcome.future());
    }
  }
  out.all = internal::Gather<void>(members_, out.each, runtime_->executor());
  return out;
}

}  // namespace baton::group

#endif  // BATON_GROUP_GROUP_H_
