// Peer: what one worker knows of one rank of its job, a slot of the agent's
// peer table (AgentImpl::peers_). Which incarnation of the rank is the
// latest heard of, which was last reported dead, which one the transport's
// address belongs to, the key that incarnation's streams prove (W2), the
// registration read and the liveness probe in flight, since when the rank
// has been silent, the calls made to it that await their reply, and those
// of them waiting to go to it again (P8). docs/peer_failures.md says what
// each means to the calls.
//
// The calls are the peer's own: a reply is looked up only among the calls
// made to the peer whose stream brought it, so one peer's replies can never
// complete (or fail) a call made to another, whatever ids they carry. The
// call window toward the peer (F1) is CallWindow's (flow_control.h), which
// keeps one per peer.
//
// The agent makes one per slot when it is made and keeps it for its life,
// so a reference to one stays valid. Each has its own lock: what concerns
// one peer never waits for another peer's, nor for the agent's lock
// (AgentImpl::mu_).
//
// Thread-safety: every method may be called from any thread. The lock is a
// leaf: it may be taken while AgentImpl::mu_ is held, never the other way
// round, and nothing is called while it is held (WithCall's function only
// reads or writes the call it is given).
#ifndef BATON_RPC_INTERNAL_PEER_H_
#define BATON_RPC_INTERNAL_PEER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "obs/metrics.h"
#include "rpc/future.h"
#include "rpc/internal/wire.h"
#include "rpc/payload.h"
#include "rpc/timer.h"

namespace baton::rpc::internal {

// A call this worker made to a peer, awaiting its reply: its entry in the
// peer's table from the moment it is sent until it completes.
struct PendingCall {
  Promise<Payload> promise;
  int peer = -1;
  std::string function;
  // The stream it left on; 0 while not recorded yet (Send has not returned:
  // it may be any stream), kAwaitingRedelivery while queued to go again (P8:
  // no stream's end concerns it).
  uint64_t stream_id = 0;
  static constexpr uint64_t kAwaitingRedelivery = ~uint64_t{0};
  DeadlineTimer::Id timer = 0;
  absl::Duration timeout;
  int64_t window_bytes = -1;  // room taken in the call window (-1: none)
  // The request's Payload::undo_if_undelivered (RRef G8), run if it is known
  // that the callee never decoded it.
  std::vector<std::function<void()>> undo;
  absl::Time deadline = absl::InfiniteFuture();
  // P8: the request, kept (with AgentOptions::restarts.wait) so that it can
  // go again to the rank's next incarnation if it is known undelivered.
  std::shared_ptr<const Frame> resend;
  // CallOptions::idempotent: with `resend`, it also goes again after its
  // stream ended in silence, although it may have been read.
  bool idempotent = false;
  int deliveries = 1;  // sends of the request so far
  // While awaiting redelivery: it is known that the callee never read the
  // request (it did not leave, or the transport knows it was not read); not
  // so for an idempotent call whose stream ended in silence.
  bool unread = false;
  // Awaiting redelivery, and known never read: a failure now is a failure
  // before the callee decoded anything (RRef G8's undo runs).
  bool known_unread() const { return stream_id == kAwaitingRedelivery && unread; }
  // Metrics (AgentOptions::observability.metrics_address): null when off.
  obs::RpcMetrics* metrics = nullptr;
  absl::Time started;
};

class Peer {
 public:
  Peer() = default;
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  // Forgets everything known of the rank (a rendezvous fills the table
  // anew), then takes `incarnation` (0: none, a dynamic group's empty slot)
  // as both the latest and the one the transport's address belongs to.
  void Reset(int64_t incarnation);

  struct Incarnations {
    int64_t latest = 0;   // heard of
    int64_t dead = 0;     // last reported dead (0: none)
    int64_t address = 0;  // whose registered address the transport uses
    // The latest incarnation was reported dead.
    bool latest_dead() const { return dead > 0 && dead >= latest; }
  };
  Incarnations incarnations() const;
  // The latest known incarnation was reported dead.
  bool known_dead() const;

  // Outcomes of NoteIncarnation.
  enum class Note { kOlder, kSame, kNewer };
  // Takes `incarnation` as the latest if it is newer (P1); a newer one also
  // marks the address stale when the transport's address is older, and
  // allows a registration read at once.
  Note NoteIncarnation(int64_t incarnation);
  // A member admitted to a dynamic group registered as `incarnation`.
  void Admit(int64_t incarnation);
  // Records that `incarnation` (and every earlier one) is dead; false if
  // it, or a later one, was recorded already (P2).
  bool MarkDead(int64_t incarnation);

  // P6: whether a newer incarnation is known than the one whose address the
  // transport has (read without the lock, on every call).
  bool address_stale() const { return address_stale_.load(std::memory_order_acquire); }
  // Whether a registration of `incarnation` is newer than the address the
  // transport has; when it is not, the address is not stale (the transport
  // has what the store has).
  bool ShouldFollow(int64_t incarnation);
  // The transport now uses the address of `incarnation`.
  void Followed(int64_t incarnation);

  // The identity key that `incarnation`'s streams prove (W2).
  void SetIdentity(std::string key, int64_t incarnation);
  std::pair<std::string, int64_t> identity() const;
  // The key if it is `incarnation`'s, else empty.
  std::string KeyOf(int64_t incarnation) const;

  // At most one registration read at a time, and one per 500 ms: true if
  // one may start now (EndRefresh when it ends).
  bool BeginRefresh(absl::Time now);
  void EndRefresh();

  // Outcomes of Suspect.
  enum class Suspicion { kReportedAlready, kProbing, kProbeNow };
  // A sign that the latest incarnation (written to `incarnation`) died:
  // whether it was reported dead already, a probe of it is in flight, or a
  // probe starts now (EndProbe when it ends).
  Suspicion Suspect(int64_t* incarnation);
  // The probe that Suspect started ended with `result`; it was sent at
  // `sent`. Returns since when the rank has been silent (no answer, no
  // refusal: IsSilence) or InfiniteFuture if it is not.
  absl::Time EndProbe(const absl::Status& result, absl::Time sent);
  bool probing() const;

  // ---- The calls made to this rank that await their reply ----

  // Adds call `id`, moving `call` into the table; false once CloseCalls()
  // ran (the agent shut down), and then `call` is left as it was.
  bool AddCall(uint64_t id, PendingCall& call);
  // Runs `f(PendingCall&)` on call `id` under the lock, if it is pending;
  // false if it is not (it completed meanwhile). `f` only reads or writes
  // the call: it must not call out, nor take a lock.
  template <typename F>
  bool WithCall(uint64_t id, F&& f) {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(id);
    if (it == calls_.end()) return false;
    f(it->second);
    return true;
  }
  // Removes call `id` and returns it (nullopt: already gone). With
  // `keep_undo`, its undo (RRef G8) is kept, in the same step, for a late
  // answer that the callee never decoded the request (TakeLateUndo),
  // unless the call is known_unread() (no answer will come: the undo stays
  // with the call); at most kMaxLateUndo are kept per peer, the oldest
  // dropped without running.
  std::optional<PendingCall> TakeCall(uint64_t id, bool keep_undo = false);
  static constexpr size_t kMaxLateUndo = 4096;
  // The undo kept for call `id` by TakeCall, taken (empty if none).
  std::vector<std::function<void()>> TakeLateUndo(uint64_t id);
  // The calls (id, function) that went on `stream_id`, or whose stream is
  // not recorded yet (it may be this one).
  std::vector<std::pair<uint64_t, std::string>> CallsOnStream(uint64_t stream_id) const;
  // Refuses calls from now on (AddCall: false) and returns those pending
  // (id, call), taken.
  std::vector<std::pair<uint64_t, PendingCall>> CloseCalls();
  size_t pending_calls() const;
  // Runs `visit(const PendingCall&)` on every pending call, under the lock
  // (the same rule as WithCall's `f`).
  template <typename F>
  void ForEachCall(F&& visit) const {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, call] : calls_) visit(call);
  }

  // Outcomes of QueueRedelivery.
  enum class Redelivery {
    kGone,       // the call completed meanwhile
    kRefused,    // it cannot go again: no request kept, its sends used up
    kQueued,     // queued; this peer's running sending task takes it
    kStartTask,  // queued; no task sends the queue now, the caller starts one
  };
  // P8: queues pending call `id` to go again, if it kept its request and
  // was sent fewer than `max_deliveries` times; it then awaits redelivery
  // (PendingCall::kAwaitingRedelivery, with PendingCall::unread = `unread`),
  // in the same step.
  Redelivery QueueRedelivery(uint64_t id, int max_deliveries, bool unread);
  // The queued calls, taken; when there are none, the sending task ends
  // (the next QueueRedelivery starts another).
  std::vector<uint64_t> TakeRedeliveries();
  // The queued calls, taken, and no task sends them (shutting down).
  std::vector<uint64_t> DropRedeliveries();

 private:
  mutable absl::Mutex mu_;
  int64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dead_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t address_incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  std::string identity_key_ ABSL_GUARDED_BY(mu_);
  int64_t key_incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  bool refreshing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time next_refresh_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool probing_ ABSL_GUARDED_BY(mu_) = false;
  // When a probe it did not answer started, without a sign of death;
  // InfiniteFuture while it answers. The agent reports it dead once silent
  // for AgentOptions::timeouts.partition_tolerance.
  absl::Time silent_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::vector<uint64_t> redeliver_ ABSL_GUARDED_BY(mu_);
  bool redelivering_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<uint64_t, PendingCall> calls_ ABSL_GUARDED_BY(mu_);
  bool calls_closed_ ABSL_GUARDED_BY(mu_) = false;
  // TakeCall's kept undo, by call id; oldest first in late_order_.
  absl::flat_hash_map<uint64_t, std::vector<std::function<void()>>> late_undo_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> late_order_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> address_stale_{false};
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_INTERNAL_PEER_H_
