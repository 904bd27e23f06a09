// Peer failures and incarnations of the RPC agent (internal::AgentImpl):
// confirming a suspected death with a probe, reporting each incarnation of a
// peer dead at most once, learning of a restarted incarnation from its
// requests or its registration, and following its new address
// (docs/peer_failures.md, P1-P4). Calls and replies are in agent.cc.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/rpc.pb.h"
#include "rpc/internal/agent_impl.h"
#include "rpc/internal/shm_transport.h"

namespace baton::rpc::internal {

void AgentImpl::AddPeerFailureListener(RpcAgent::PeerFailureListener listener) {
  absl::MutexLock lock(&mu_);
  failure_listeners_.push_back(std::move(listener));
}

int64_t AgentImpl::peer_incarnation(int peer) const {
  absl::MutexLock lock(&mu_);
  if (peer < 0 || peer >= static_cast<int>(peers_.size())) return 0;
  return peers_[peer].incarnation;
}

void AgentImpl::SuspectPeer(int peer, const absl::Status& cause) {
  if (!ready_.HasBeenNotified() || peer < 0 || peer >= static_cast<int>(workers_.size()) ||
      peer == rank_) {
    return;
  }
  int64_t incarnation;
  bool reported;
  {
    absl::MutexLock lock(&mu_);
    if (!running_ || failure_listeners_.empty()) return;
    incarnation = peers_[peer].incarnation;
    reported = peers_[peer].dead >= incarnation;
    if (!reported && !suspects_.insert(peer).second) return;
  }
  if (reported) {
    // P2: that incarnation is reported already (this is its old stream, or
    // a probe's); a restarted one may have registered since.
    RefreshPeer(peer);
    return;
  }
  CallOptions probe;
  probe.timeout = std::min(options_.rpc_timeout, absl::Seconds(2));
  Call(peer, kPingFunction, "", Payload(), probe, /*windowed=*/false)
      .OnReady([this, peer, incarnation, cause](const absl::StatusOr<Payload>& r) {
        const bool dead = !r.ok() && (absl::IsUnavailable(r.status()) ||
                                      absl::IsDeadlineExceeded(r.status()));
        {
          absl::MutexLock lock(&mu_);
          suspects_.erase(peer);
        }
        if (!dead) return;
        ReportDead(peer, incarnation,
                   absl::UnavailableError(absl::StrCat(
                       "worker '", workers_[peer].name, "' (id ", peer, ", incarnation ",
                       incarnation, ") is dead: ", cause.message(),
                       "; a probe call then failed: ", r.status().message())));
        // Its successor may have registered already (P1).
        RefreshPeer(peer);
      });
}

void AgentImpl::ReportDead(int peer, int64_t incarnation, const absl::Status& cause) {
  std::vector<RpcAgent::PeerFailureListener> listeners;
  {
    absl::MutexLock lock(&mu_);
    if (!running_ || peer >= static_cast<int>(peers_.size()) ||
        peers_[peer].dead >= incarnation) {
      return;  // P2
    }
    peers_[peer].dead = incarnation;
    ++peer_failures_;
    listeners = failure_listeners_;
  }
  const PeerFailure failure{peer, incarnation, cause};
  for (auto& l : listeners) l(failure);
}

bool AgentImpl::NoteIncarnation(int peer, int64_t incarnation) {
  if (incarnation <= 0 || peer < 0 || peer >= static_cast<int>(workers_.size())) return true;
  {
    absl::MutexLock lock(&mu_);
    if (peers_.empty()) return true;  // before the rendezvous filled it
    PeerState& p = peers_[peer];
    if (incarnation < p.incarnation) return false;
    if (incarnation == p.incarnation) return true;
    p.incarnation = incarnation;
    if (p.incarnation > p.address_incarnation && peer < static_cast<int>(address_stale_.size())) {
      address_stale_[peer].store(true, std::memory_order_release);
    }
    p.next_refresh = absl::InfinitePast();  // its new address is in the store
  }
  // The new incarnation opened none of our probes (P3), and keeps no
  // same-host link: the one to its predecessor goes now, not when the
  // predecessor's death is noticed (T3).
  if (peer < static_cast<int>(peer_shm_.size())) peer_shm_[peer].store(false);
  if (shm_transport_ != nullptr) {
    shm_transport_->Disconnect(
        peer, absl::UnavailableError(absl::StrCat("worker '", workers_[peer].name,
                                                  "': incarnation ", incarnation,
                                                  " replaced the process linked")));
  }
  // P1: a rejoined restart replaces its predecessors (every incarnation
  // before it, also one we never heard of), which are dead.
  const std::string name = workers_[peer].name;
  executor_->Submit([this, peer, incarnation, name] {
    ReportDead(peer, incarnation - 1,
               absl::UnavailableError(absl::StrCat(
                   "worker '", name, "' (id ", peer, ", incarnation ", incarnation - 1,
                   ") is dead: incarnation ", incarnation, " of its rank rejoined the job")));
  });
  RefreshPeer(peer);
  return true;
}

void AgentImpl::RefreshPeer(int peer) {
  {
    absl::MutexLock lock(&mu_);
    if (!running_ || peers_.empty()) return;
    PeerState& p = peers_[peer];
    const absl::Time now = absl::Now();
    if (p.refreshing || now < p.next_refresh) return;
    p.refreshing = true;
    p.next_refresh = now + absl::Milliseconds(500);
  }
  const bool submitted = executor_->Submit([this, peer] {
    (void)LoadPeerRecord(peer, absl::Seconds(2));
    absl::MutexLock lock(&mu_);
    peers_[peer].refreshing = false;
  });
  if (!submitted) {
    absl::MutexLock lock(&mu_);
    peers_[peer].refreshing = false;
  }
}

bool AgentImpl::LoadPeerRecord(int peer, absl::Duration timeout) {
  auto v = store_->Get(absl::StrCat(ns_, "worker/", peer), timeout);
  proto::WorkerRecord record;
  const bool parsed = v.ok() && record.ParseFromString(*v) && !record.address().empty();
  bool newer = false;
  {
    absl::MutexLock lock(&mu_);
    // A newer incarnation than the one whose address the transport has:
    // the transport's address follows it (calls, and the probe, go there).
    newer = parsed && running_ && record.incarnation() > peers_[peer].address_incarnation;
    if (newer) peers_[peer].address_incarnation = record.incarnation();
    if (parsed && record.incarnation() <= peers_[peer].address_incarnation) {
      // Nothing newer to follow: the transport has what the store has.
      address_stale_[peer].store(false, std::memory_order_release);
    }
  }
  if (!newer) return false;
  AddNetworkPeer(peer, record);
  (void)NoteIncarnation(peer, record.incarnation());
  return true;
}

void AgentImpl::FollowNewerIncarnation(int peer, absl::Time deadline) {
  if (peer >= static_cast<int>(address_stale_.size()) ||
      !address_stale_[peer].load(std::memory_order_acquire)) {
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
  }
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return;
  (void)LoadPeerRecord(peer, std::min(left, absl::Seconds(2)));
}

void AgentImpl::WaitForSuccessor(int peer, absl::Time deadline) {
  if (options_.restart_wait <= absl::ZeroDuration()) return;
  int64_t dead;
  {
    absl::MutexLock lock(&mu_);
    if (!running_ || peer >= static_cast<int>(peers_.size())) return;
    const PeerState& p = peers_[peer];
    if (p.dead < p.incarnation) return;  // alive, as far as we know
    dead = p.dead;
    ++waiting_for_restart_;
  }
  // Every incarnation announces itself under its own key at registration
  // (bootstrap.cc), so the wait is for that key, not a poll.
  const absl::Time until = std::min(deadline, absl::Now() + options_.restart_wait);
  {
    Executor::BlockingScope blocking;  // a pool thread lends its place (E2)
    const absl::Duration left = until - absl::Now();
    if (left > absl::ZeroDuration() &&
        store_->Wait({absl::StrCat(ns_, "registered/", peer, "/", dead + 1)}, left).ok()) {
      (void)LoadPeerRecord(peer, std::max(absl::Milliseconds(1), until - absl::Now()));
    }
  }
  absl::MutexLock lock(&mu_);
  --waiting_for_restart_;
}

}  // namespace baton::rpc::internal
