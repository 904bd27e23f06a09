// Supervisor: a group's member failures, delivered to the group's owner as
// events, and the owner's answers to them (restart the member, drop it).
//
//   auto sup = group::Supervisor::Watch(observers, [&](const MemberFailure& f) {
//     if (f.kind == MemberFailure::Kind::kHung) (void)sup_ptr->Restart(f, "hung");
//   }, {.hung_after = absl::Seconds(30)});
//   ...
//   sup->group().call(step_fn, 7);   // the members of the moment
//
// Guarantees (SV; tests in tests/group/supervisor_test.cc and, through
// baton-run, tests/group/supervision_test.sh):
// SV1 A member's death is an event (kDied) as soon as this worker's agent
//     knows it (a probe confirmed it, or a newer incarnation of the member
//     replaced it: docs/peer_failures.md), without a call to the member; once
//     per dead incarnation.
// SV2 A call from this worker to a member that has awaited its reply for
//     hung_after is an event (kHung), once per call, while the call is still
//     waiting: a hang is known before the call's own deadline. So is a
//     member that keeps a call through group() (or Watching()) waiting for
//     hung_after, however deep in the tree: every hop reports to this worker
//     what it still waits for at that moment (group/call_watch.h), and a
//     member is hung if its own function still runs, or if its forwarder
//     still waits for it and within a grace period (hung_after / 2, 250 ms
//     to 5 s) it neither reports anything itself nor answers (its process
//     is stopped or its link cut). Forwarders that only wait for a member
//     below them are not hung, nor is a member whose request reached it
//     after that moment (its forwarder was slow: it counts hung_after from
//     its arrival). An entry that ends DEADLINE_EXCEEDED without having been
//     reported is an event too (kHung). Each member once per call.
// SV3 Handlers run on the agent's executor, one at a time, never once Stop()
//     has returned, and never for a member dropped before the event.
// SV4 Drop(m) takes m out of group() at once (later calls through it leave m
//     out), retires it from the job (Runtime::RetirePeer: no graceful
//     shutdown waits for it) and, under baton-run, has baton-run stop it for
//     good (env/launcher_request.h, LR4).
// SV5 Restart(m), under baton-run only, has baton-run stop m so that its
//     restart policy starts it again (LR3); m stays in group(), and calls
//     after its successor rejoined reach the successor. An incarnation is
//     asked for once: not again, not once replaced, not once known dead.
//
// Lifetime: a supervisor may outlive its agent; once the agent shut down it
// hears nothing more, and its methods fail with FAILED_PRECONDITION.
//
// Watch() registers with the agent for the agent's life (a failure listener
// and a shutdown hook, each a few bytes once the supervisor is gone): make
// one per group, not one per step.
//
// Thread-safety: every method may be called from any thread, including from
// the handler. Stop() waits for a handler that runs (unless called from it):
// whoever calls it must not hold a lock the handler takes.
#ifndef BATON_GROUP_SUPERVISOR_H_
#define BATON_GROUP_SUPERVISOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "group/group.h"
#include "rpc/agent.h"

namespace baton::group {

// A member's failure, as its supervisor hears of it.
struct MemberFailure {
  enum class Kind { kDied, kHung };
  Kind kind = Kind::kDied;
  rpc::WorkerInfo member;
  // kDied: this incarnation of the member, and every earlier one, is dead.
  // kHung: the member's incarnation this worker knew when it found the call
  // hung.
  int64_t incarnation = 0;
  // kDied: UNAVAILABLE naming the member and the evidence. kHung:
  // DEADLINE_EXCEEDED naming the member, the function and how long it waited
  // (or the group call's error for its entry).
  absl::Status cause;
  // kHung: the function of the call that hangs.
  std::string function;
};

absl::string_view KindName(MemberFailure::Kind kind);

struct SupervisorOptions {
  // SV2: how long a call to a member may await its reply before it is
  // reported hung. Zero: calls are not watched (group() entries that end
  // DEADLINE_EXCEEDED still are).
  absl::Duration hung_after = absl::ZeroDuration();
};

class Supervisor {
 public:
  using Handler = std::function<void(const MemberFailure&)>;
  // Watches `group`'s members from now until Stop() or destruction.
  // INVALID_ARGUMENT for a negative hung_after; FAILED_PRECONDITION once the
  // agent shut down.
  static absl::StatusOr<std::unique_ptr<Supervisor>> Watch(const Group& group, Handler handler,
                                                           SupervisorOptions options = {});
  ~Supervisor() { Stop(); }
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // The watched group less the members dropped so far (SV4); its calls'
  // entries are watched (SV2). FAILED_PRECONDITION once every member was
  // dropped.
  absl::StatusOr<Group> group() const;

  // `g` (a group of this worker's, e.g. a slice of group()) with its calls'
  // entries watched as group()'s are (SV2).
  Group Watching(Group g) const;

  // SV4. NOT_FOUND for a worker that is not a member (or was dropped);
  // FAILED_PRECONDITION for this worker itself or rank 0 (see
  // Runtime::RetirePeer). Outside baton-run the member is out of group() and
  // retired, but its process keeps running.
  absl::Status Drop(const rpc::WorkerRef& member, absl::string_view reason = "");
  // SV5. `incarnation` (0: the latest this worker knows) is the one to
  // restart: nothing is asked if the member has a newer one already, if its
  // latest is known dead (baton-run's restart policy restarts it by itself),
  // or if a restart of it was asked for already. NOT_FOUND as for Drop;
  // FAILED_PRECONDITION outside baton-run and for rank 0 (it serves the
  // job's store).
  absl::Status Restart(const rpc::WorkerRef& member, absl::string_view reason = "",
                       int64_t incarnation = 0);
  // The member and incarnation a failure names: what a handler answers a
  // hang with.
  absl::Status Restart(const MemberFailure& failure, absl::string_view reason = "");

  void Stop();

 private:
  struct State;
  explicit Supervisor(std::shared_ptr<State> state) : state_(std::move(state)) {}
  absl::StatusOr<rpc::WorkerInfo> Member(const rpc::WorkerRef& ref) const;

  const std::shared_ptr<State> state_;
};

}  // namespace baton::group

#endif  // BATON_GROUP_SUPERVISOR_H_
