// Flow control between workers: what bounds a worker's memory when a peer
// calls it faster than it can answer (docs/flow_control.md).
//
// Each direction of a call has its half, per peer:
// - CallWindow, on the caller: calls sent to a peer and not yet answered,
//   and their request bytes. A call that does not fit waits for replies to
//   free room, at most until its own deadline.
// - RequestGate, on the callee: requests received from a peer and not yet
//   replied (queued or running), and their bytes. What does not fit is
//   refused at once. Admitted requests wait in the peer's own queue, and only
//   a few of them at a time in the executor's, so one peer's backlog cannot
//   push another peer's requests back.
//
// Guarantees (tests/rpc/flow_control_test.cc names its tests after them):
//   F1 bounded caller: per peer, at most `max_calls` calls and `max_bytes`
//      request bytes are in flight; a single call larger than `max_bytes`
//      goes only when nothing else is in flight to that peer. A call that
//      does not fit waits until it does or until its deadline, and then
//      fails with RESOURCE_EXHAUSTED naming the peer and the limits.
//   F2 bounded callee: per peer, at most `max_calls` requests and
//      `max_bytes` bytes (or one larger request alone) are held, queued or
//      running. A request beyond that is refused with RESOURCE_EXHAUSTED
//      before anything is queued for it; admitted requests are never dropped.
//   F3 fairness: a peer's requests start in the order they arrived, and at
//      most `fanout` of them wait in the executor's queue at a time. A new
//      request of another peer therefore waits behind at most
//      (peers - 1) * fanout tasks, however deep a flooding peer's backlog.
//   F4 no hang: a wait for room never happens where it could block replies
//      (may_wait false: a transport's delivery thread), and Close() wakes
//      every waiter. Every wait ends by its deadline.
//
// A worker whose callers all use CallWindow with limits no larger than its
// own never refuses a request under F2 (the caller's call stays in flight
// until its reply arrives, which is after the callee finished with it);
// only a caller that ignores its window, or whose calls timed out while the
// callee still runs them, meets the refusal.
//
// Thread-safety: both classes are safe for concurrent use.
#ifndef BATON_RPC_INTERNAL_FLOW_CONTROL_H_
#define BATON_RPC_INTERNAL_FLOW_CONTROL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/executor.h"

namespace baton::rpc::internal {

struct FlowLimits {
  int64_t max_calls = 1024;
  int64_t max_bytes = int64_t{256} << 20;
};

// The caller's half: one window per peer.
class CallWindow {
 public:
  // `limits[p]`: the window toward peer p (the smaller of the caller's and
  // the callee's limits). Non-positive values mean no limit.
  explicit CallWindow(std::vector<FlowLimits> limits);

  CallWindow(const CallWindow&) = delete;
  CallWindow& operator=(const CallWindow&) = delete;

  // Takes room for one call of `bytes` to `peer` (F1). Waits while the
  // window is full, until `deadline`, if `may_wait`; else fails at once.
  //   RESOURCE_EXHAUSTED  no room by the deadline (or at once);
  //   CANCELLED           Close() was called;
  //   INVALID_ARGUMENT    `peer` is out of range.
  absl::Status Acquire(int peer, int64_t bytes, absl::Time deadline, bool may_wait);
  // Gives back what Acquire took, when the call's reply arrived or the call
  // failed for good.
  void Release(int peer, int64_t bytes);
  // The window toward `peer` from now on (a dynamic group's member, known
  // once it joined); no-op out of range.
  void SetLimits(int peer, FlowLimits limits);
  // Wakes every waiter (CANCELLED); later Acquires fail the same way.
  void Close();

  struct Stats {
    int64_t calls_in_flight = 0;
    int64_t bytes_in_flight = 0;
    int64_t calls_waited = 0;   // calls that found the window full
    int64_t calls_refused = 0;  // ... and got RESOURCE_EXHAUSTED
  };
  Stats stats() const;
  // Per peer: calls and bytes in flight toward it.
  struct PeerUsage {
    int64_t calls = 0;
    int64_t bytes = 0;
  };
  std::vector<PeerUsage> PerPeer() const;

 private:
  struct Slot {
    int64_t calls = 0;
    int64_t bytes = 0;
  };
  bool FitsLocked(int peer, int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int peers_;
  mutable absl::Mutex mu_;
  std::vector<FlowLimits> limits_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  int64_t waited_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// The callee's half: admission and fair dispatch onto the executor.
class RequestGate {
 public:
  // At most this many of one peer's requests wait in the executor's queue.
  static constexpr int kDefaultFanout = 8;

  // `executor` must outlive every task this gate submitted (the agent joins
  // it before the gate goes).
  RequestGate(int peers, FlowLimits limits, Executor* executor, int fanout = kDefaultFanout);

  RequestGate(const RequestGate&) = delete;
  RequestGate& operator=(const RequestGate&) = delete;

  // Admits a request of `bytes` from `peer` (F2) and runs `task` on the
  // executor after the peer's earlier requests started (F3).
  //   RESOURCE_EXHAUSTED  over the peer's limits; nothing was queued;
  //   UNAVAILABLE         the executor is closed; nothing was queued;
  //   INVALID_ARGUMENT    `peer` is out of range.
  // On OK the request counts until Finish(peer, bytes).
  absl::Status Submit(int peer, int64_t bytes, absl::AnyInvocable<void()> task);
  // The admitted request was replied to.
  void Finish(int peer, int64_t bytes);
  // Stops using the executor: later Submits fail with UNAVAILABLE, and
  // requests still queued run on the runner threads already started. Call
  // before closing the executor; afterwards no runner touches it.
  void Close();

  struct Stats {
    int64_t held = 0;     // admitted, not yet finished (all peers)
    int64_t queued = 0;   // admitted, not yet started (all peers)
    int64_t refused = 0;  // requests refused under F2
  };
  Stats stats() const;
  // Per peer: its requests admitted and not finished, and those of them not
  // started yet (the queue depth).
  struct PeerLoad {
    int64_t held = 0;
    int64_t queued = 0;
  };
  std::vector<PeerLoad> PerPeer() const;

 private:
  struct Peer {
    int64_t calls = 0;
    int64_t bytes = 0;
    int scheduled = 0;  // runners in the executor's queue
    std::deque<absl::AnyInvocable<void()>> queue;
  };
  // Shared with the runners, which may outlive a gate whose executor was
  // detached at a deadline.
  struct State {
    State(int peers, FlowLimits limits, Executor* executor, int fanout)
        : limits(limits), executor(executor), fanout(fanout), peers(peers) {}
    const FlowLimits limits;
    Executor* const executor;
    const int fanout;
    mutable absl::Mutex mu;
    std::vector<Peer> peers ABSL_GUARDED_BY(mu);
    int64_t refused ABSL_GUARDED_BY(mu) = 0;
    bool closed ABSL_GUARDED_BY(mu) = false;
  };
  // Starts the oldest request of `peer`, and schedules the next runner.
  static void RunOne(const std::shared_ptr<State>& state, int peer);

  const std::shared_ptr<State> state_;
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_INTERNAL_FLOW_CONTROL_H_
