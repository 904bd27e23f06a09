// How a supervisor hears, during a group call, which member keeps it waiting
// (supervisor.h, SV2), however deep in the tree that member is. Private to
// the group package.
//
// A call made through a supervisor's group() is watched: its root gives it
// an id (CallWatches) and a report moment, hung_after after its start, and
// every hop's request carries both. At that moment each hop that still
// waits reports to the root, in one GroupHangReport each:
// - OWN_RUNNING: its own function still runs (that member hangs);
// - PART_WAITING: a part it sent has not answered (the part's first member,
//   or one below it, keeps it waiting); PART_ANSWERED if it answers later.
// The moment travels as deadlines do, as the time left until it when a
// request is sent, so it is about the same for every hop. A hop whose
// request arrives after it (a slow forwarder) reports ALIVE at once and
// takes hung_after from its arrival as its own moment. The root reports its
// own parts the same way, without a message.
//
// The supervisor (CallWatcher) then judges: a member whose own function
// still runs hangs; a member named by its forwarder that neither reports
// anything itself nor answers within a grace period (its process stopped,
// its link cut) hangs; a member that sent a report, or whose part
// answered, is alive, whatever its forwarder said. Reports about workers
// that are not members of the call, or that a member makes about another's
// own function, are dropped.
//
// Thread-safety: every class here is safe for concurrent use.
#ifndef BATON_GROUP_CALL_WATCH_H_
#define BATON_GROUP_CALL_WATCH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "group/group.h"
#include "proto/group.pb.h"
#include "rpc/agent.h"

namespace baton::group::internal {

// What watches the calls made through a supervised group (the supervisor).
class CallWatcher {
 public:
  virtual ~CallWatcher() = default;
  // How long after its start a call's waits are reported; zero: no reports
  // during the call (its entries that timed out are still in End()).
  virtual absl::Duration hung_after() const = 0;
  // A call of `function` (its label) to `members` starts: its id for the
  // other methods (0: nothing watches it).
  virtual uint64_t Begin(const std::string& function, const std::vector<int>& members) = 0;
  // During call `call`, worker `from` reports `kind` about `member`.
  virtual void Report(uint64_t call, int from, int member, proto::GroupHangReport::Kind kind) = 0;
  // Call `call` ended: its failed entries, each naming its member.
  virtual void End(uint64_t call,
                   const std::vector<std::pair<rpc::WorkerInfo, absl::Status>>& failed) = 0;
};

// The watched calls in flight from this worker, by id: where the hops'
// reports find their watcher. One per registry, made by Install().
class CallWatches {
 public:
  CallWatches();
  // The wire id (GroupRequest.watch_id) of `watcher`'s call `call`.
  uint64_t Add(std::shared_ptr<CallWatcher> watcher, uint64_t call);
  void Remove(uint64_t id);
  // The watcher and its call's id; a null watcher once removed, or for an
  // id never given.
  std::pair<std::shared_ptr<CallWatcher>, uint64_t> Find(uint64_t id) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::pair<std::weak_ptr<CallWatcher>, uint64_t>> calls_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_);
};

// Registers kHangReportFn and this registry's CallWatches.
absl::Status InstallHangReports(rpc::FunctionRegistry& registry);

// Runs `report` on the executor at `at` (a real time) unless Cancel() came
// first (not on the timer's thread: a report sends a message; dropped if
// the executor is closed); an infinite `at` arms nothing.
class ReportTimer {
 public:
  static std::shared_ptr<ReportTimer> Arm(rpc::Runtime& runtime, absl::Time at,
                                          std::function<void()> report);
  // The report will not run. Returns whether it ran (or was handed to the
  // executor) before.
  bool Cancel();

 private:
  explicit ReportTimer(rpc::Runtime* runtime) : runtime_(runtime) {}
  rpc::Runtime* const runtime_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  rpc::DeadlineTimer::Id id_ ABSL_GUARDED_BY(mu_) = 0;
};

// The reports about the parts a hop sends: PART_WAITING about a part that
// has not answered at `at`, then PART_ANSWERED if it answers.
struct PartReports {
  absl::Time at = absl::InfiniteFuture();
  std::function<void(int head, proto::GroupHangReport::Kind kind)> report;
  bool active() const { return at != absl::InfiniteFuture() && report != nullptr; }
};

// A watched call as its root sees it.
class RootWatch {
 public:
  // Inactive (null) without a watcher, or once its supervisor is gone.
  static std::shared_ptr<RootWatch> Begin(rpc::Runtime& runtime,
                                          std::shared_ptr<CallWatcher> watcher,
                                          const std::string& label, const std::vector<int>& members,
                                          absl::Time deadline);
  ~RootWatch();
  // Asks the hops of `request` to report (when this worker can hear them).
  void Stamp(proto::GroupRequest& request) const;
  // The root's own parts' reports (none when the hops cannot report here:
  // a part's first member waiting for one below it would look hung).
  PartReports Parts();
  // The call ended (once).
  void End(const std::vector<std::pair<rpc::WorkerInfo, absl::Status>>& failed);

 private:
  RootWatch() = default;
  // Whether the hops report during the call: there is a moment before the
  // deadline, and this worker hears reports.
  bool reporting() const { return watches_ != nullptr && at_ != absl::InfiniteFuture(); }
  rpc::Runtime* runtime_ = nullptr;
  std::shared_ptr<CallWatcher> watcher_;
  std::shared_ptr<CallWatches> watches_;  // null: reports cannot reach here
  uint64_t call_ = 0;                     // the watcher's id of the call
  uint64_t wire_ = 0;                     // its id in watches_
  absl::Time at_ = absl::InfiniteFuture();
  absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

// When a hop reports for the watched call of `request`, which arrived at
// `arrived` (infinite: not watched); `late` if the call's moment had passed
// (the hop reports ALIVE, and its moment is hung_after from its arrival).
struct ReportMoment {
  absl::Time at = absl::InfiniteFuture();
  bool late = false;
};
ReportMoment HopReportMoment(const proto::GroupRequest& request, absl::Time arrived);
// A hop's report to `root` (nothing waits for it).
void SendHangReport(rpc::Runtime& runtime, int root, uint64_t watch_id, int member,
                    proto::GroupHangReport::Kind kind);

}  // namespace baton::group::internal

#endif  // BATON_GROUP_CALL_WATCH_H_
