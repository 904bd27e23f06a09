// Peer: what one worker knows of one rank of its job, a slot of the agent's
// peer table (AgentImpl::peers_). Which incarnation of the rank is the
// latest heard of, which was last reported dead, which one the transport's
// address belongs to, the key that incarnation's streams prove (W2), the
// registration read and the liveness probe in flight, since when the rank
// has been silent, and the calls waiting to go to it again (P8).
// docs/peer_failures.md says what each means to the calls.
//
// The agent makes one per slot when it is made and keeps it for its life,
// so a reference to one stays valid. Each has its own lock: what concerns
// one peer never waits for another peer's, nor for the agent's table of
// pending calls (AgentImpl::mu_).
//
// Thread-safety: every method may be called from any thread. The lock is a
// leaf: it may be taken while AgentImpl::mu_ is held, never the other way
// round, and nothing is called while it is held.
#ifndef BATON_RPC_INTERNAL_PEER_H_
#define BATON_RPC_INTERNAL_PEER_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton::rpc::internal {

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

  // P8: queues pending call `id` to go again; true if no task sends this
  // peer's queue now, so the caller starts one.
  bool QueueRedelivery(uint64_t id);
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
  std::atomic<bool> address_stale_{false};
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_INTERNAL_PEER_H_
