// Peer failures and incarnations of the RPC agent (internal::AgentImpl):
// confirming a suspected death with a probe, reporting each incarnation of a
// peer dead at most once, learning of a restarted incarnation from its
// requests or its registration, following its new address, waiting for a
// dead rank's successor, sending requests known undelivered again
// (docs/peer_failures.md, P1-P8), a shutdown's wait for workers that may
// have died, and what the transports report of ending streams (closed,
// refused, requests a dead peer never read). Calls and replies are in
// agent.cc.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "proto/rpc.pb.h"
#include "rpc/internal/agent_impl.h"
#include "rpc/transport/shm/shm_transport.h"
#include "store/store.h"

namespace baton::rpc::internal {

void AgentImpl::AddPeerFailureListener(PeerFailureListener listener) {
  absl::MutexLock lock(&mu_);
  failure_listeners_.push_back(std::move(listener));
}

int64_t AgentImpl::peer_incarnation(int peer) const {
  const Peer* p = PeerAt(peer);
  return p != nullptr ? p->incarnations().latest : 0;
}

bool AgentImpl::peer_known_dead(int peer) const {
  const Peer* p = PeerAt(peer);
  return p != nullptr && p->known_dead();
}

void AgentImpl::SuspectPeer(int peer, const absl::Status& cause) {
  // A member that left a dynamic group (M3) is not suspected of anything.
  if (!ready_.HasBeenNotified() || !IsMember(peer) || peer == rank_) {
    return;
  }
  int64_t incarnation;
  Peer::Suspicion suspicion;
  {
    absl::MutexLock lock(&mu_);
    if (!running_ || failure_listeners_.empty()) return;
    // Every worker of the job agreed to shut down (EnterShutdown): a peer
    // whose link or stream ends now is finishing its own shutdown, maybe
    // ahead of this worker, not dying. Its calls still fail by their
    // streams; nobody is told it died.
    if (entered_.has_value() && entered_->ok()) return;
    suspicion = peers_[peer]->Suspect(&incarnation);
  }
  if (suspicion == Peer::Suspicion::kProbing) return;
  if (suspicion == Peer::Suspicion::kReportedAlready) {
    // P2: that incarnation is reported already (this is its old stream, or
    // a probe's); a restarted one may have registered since.
    RefreshPeer(peer);
    return;
  }
  CallOptions probe;
  probe.timeout = std::min(options_.timeouts.rpc, absl::Seconds(2));
  const absl::Time probed = absl::Now();
  Call(peer, kPingFunction, "", Payload(), probe, /*windowed=*/false)
      .OnReady([this, peer, incarnation, cause, probed](const absl::StatusOr<Payload>& r) {
        // Silence (no answer, no refusal) is not a death within the
        // partition tolerance: since when the peer has been silent.
        const absl::Time silent_since = peers_[peer]->EndProbe(r.status(), probed);
        const bool dead =
            !r.ok() && (absl::IsUnavailable(r.status()) || absl::IsDeadlineExceeded(r.status()));
        if (!dead) return;
        if (silent_since != absl::InfiniteFuture()) {
          const absl::Duration silent = absl::Now() - silent_since;
          if (silent < options_.timeouts.partition_tolerance) {
            ProbeAgain(peer, cause);
            return;
          }
          ReportDead(
              peer, incarnation,
              absl::UnavailableError(absl::StrCat(
                  "worker '", workers_[peer].name, "' (id ", peer, ", incarnation ", incarnation,
                  ") is dead: it did not answer for ", DurationText(silent),
                  ", past the partition tolerance (",
                  DurationText(options_.timeouts.partition_tolerance),
                  ", AgentOptions::timeouts.partition_tolerance): it is cut off from this worker "
                  "by the network, or hung (first sign: ",
                  cause.message(), "; the last probe: ", r.status().message(), ")")));
          // Calls that wait for the link to it end now.
          transport_->ResetPeer(peer);
        } else {
          ReportDead(peer, incarnation,
                     absl::UnavailableError(
                         absl::StrCat("worker '", workers_[peer].name, "' (id ", peer,
                                      ", incarnation ", incarnation, ") is dead: ", cause.message(),
                                      "; a probe call then failed: ", r.status().message())));
        }
        // Its successor may have registered already (P1).
        RefreshPeer(peer);
      });
}

void AgentImpl::ProbeAgain(int peer, const absl::Status& cause) {
  timer_->Schedule(timer_->clock().Now() + kSilentProbePeriod, [this, peer, cause] {
    (void)executor_->Submit([this, peer, cause] { SuspectPeer(peer, cause); });
  });
}

void AgentImpl::ReportDead(int peer, int64_t incarnation, const absl::Status& cause) {
  std::vector<PeerFailureListener> listeners;
  {
    absl::MutexLock lock(&mu_);
    Peer* p = PeerAt(peer);
    if (!running_ || p == nullptr || !p->MarkDead(incarnation)) {
      return;  // reported dead already, this incarnation or a later one (P2)
    }
    ++peer_failures_;
    listeners = failure_listeners_;
  }
  const PeerFailure failure{peer, incarnation, cause};
  for (auto& l : listeners) l(failure);
}

bool AgentImpl::NoteIncarnation(int peer, int64_t incarnation) {
  if (incarnation <= 0 || peer < 0 || peer >= static_cast<int>(workers_.size())) return true;
  {
    Peer* p = PeerAt(peer);
    if (p == nullptr) return true;  // before the rendezvous filled the table
    const Peer::Note note = p->NoteIncarnation(incarnation);
    if (note == Peer::Note::kOlder) return false;
    if (note == Peer::Note::kSame) return true;
  }
  // The new incarnation opened none of our probes (P3), and keeps no
  // same-host link: the one to its predecessor goes now, not when the
  // predecessor's death is noticed (T3).
  if (peer < static_cast<int>(paths_.size())) {
    paths_[peer]->LoseSameHost(
        absl::UnavailableError(absl::StrCat("worker '", workers_[peer].name, "': incarnation ",
                                            incarnation, " replaced the process linked")));
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
  Peer* p = PeerAt(peer);
  if (p == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    if (!running_ || !p->BeginRefresh(absl::Now())) return;
  }
  const bool submitted = executor_->Submit([this, p, peer] {
    (void)LoadPeerRecord(peer, absl::Seconds(2));
    p->EndRefresh();
  });
  if (!submitted) p->EndRefresh();
}

bool AgentImpl::LoadPeerRecord(int peer, absl::Duration timeout) {
  // The record exists since the rendezvous: this is a read bounded by
  // `timeout`, not a wait. A store that does not answer in time (gone, or
  // cut off) is no news, which the callers ask again later; StoreClient's
  // Get would repeat for its whole call_timeout (the partition tolerance),
  // holding an executor thread that the agent's shutdown then waits for.
  absl::StatusOr<proto::WorkerRecord> read =
      rendezvous_->ReadRecordNow(peer, timeout, /*fail_fast=*/true);
  const bool parsed = read.ok() && !read->address().empty();
  const proto::WorkerRecord record = parsed ? *std::move(read) : proto::WorkerRecord();
  // The transport gets the new address before address_incarnation says so:
  // a concurrent reader that sees the newer incarnation recorded then knows
  // its calls go there (P6). One update at a time, so an older record read
  // late cannot overwrite a newer one in the transport.
  absl::MutexLock update(&peer_update_mu_);
  Peer* p = PeerAt(peer);
  if (p == nullptr || !parsed) return false;
  {
    absl::MutexLock lock(&mu_);
    // A newer incarnation than the one whose address the transport has:
    // the transport's address follows it (calls, and the probe, go there).
    // Else the transport has what the store has: the address is not stale.
    if (!p->ShouldFollow(record.incarnation()) || !running_) return false;
  }
  AddNetworkPeer(peer, record);
  p->Followed(record.incarnation());
  (void)NoteIncarnation(peer, record.incarnation());
  return true;
}

void AgentImpl::FollowNewerIncarnation(int peer, absl::Time deadline) {
  const Peer* p = PeerAt(peer);
  if (p == nullptr || !p->address_stale()) return;
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
  }
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return;
  (void)LoadPeerRecord(peer, std::min(left, absl::Seconds(2)));
}

void AgentImpl::WaitForSuccessor(int peer, absl::Time deadline) {
  if (options_.restarts.wait <= absl::ZeroDuration()) return;
  const Peer* p = PeerAt(peer);
  if (p == nullptr || !running()) return;
  const Peer::Incarnations known = p->incarnations();
  if (known.dead < known.latest) return;  // alive, as far as we know
  const int64_t dead = known.dead;
  (void)AwaitSuccessor(peer, dead, std::min(deadline, absl::Now() + options_.restarts.wait));
}

bool AgentImpl::AwaitSuccessor(int peer, int64_t dead, absl::Time until) {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return false;
    ++waiting_for_restart_;
  }
  // Every incarnation announces itself at registration, so the wait is for
  // that (Rendezvous::AwaitRegistered), not a poll. In slices of at most a
  // second, so that a shutdown is not held up.
  bool followed = false;
  {
    Executor::BlockingScope blocking;  // a pool thread lends its place (E2)
    for (;;) {
      const absl::Duration left = until - absl::Now();
      if (left <= absl::ZeroDuration() || !running()) break;
      const absl::Status s =
          rendezvous_->AwaitRegistered(peer, dead + 1, std::min(left, absl::Seconds(1)));
      if (s.ok()) {
        (void)LoadPeerRecord(peer, std::max(absl::Milliseconds(1), until - absl::Now()));
        followed = true;
        break;
      }
      if (!absl::IsDeadlineExceeded(s)) break;  // the store failed: no wait helps
    }
  }
  absl::MutexLock lock(&mu_);
  --waiting_for_restart_;
  return followed;
}

// ---- Streams that end (TransportHandler) ----

void AgentImpl::OnPeerLost(int peer, const absl::Status& cause) {
  DeliveryScope delivering;
  SuspectPeer(peer, cause);
}

void AgentImpl::OnStreamRefused(int peer, uint64_t stream_id, const absl::Status& cause) {
  // P8 with a restart wait; without one, only a refusal by silence (the link
  // is down: the calls wait for it within their deadlines).
  if (!absl::IsUnavailable(cause) ||
      (options_.restarts.wait <= absl::ZeroDuration() && !IsSilence(cause))) {
    OnStreamClosed(peer, stream_id, cause);
    return;
  }
  DeliveryScope delivering;
  const auto refused = CallsOnStream(peer, stream_id);
  SuspectPeer(peer, cause);
  // P8: none of them was read; they go again once the rank can take them.
  RedeliverUnread(peer, refused, "stream refused", cause);
}

void AgentImpl::OnRequestsUnread(int peer, uint64_t stream_id, const std::vector<uint64_t>& ids,
                                 const absl::Status& cause) {
  if (!absl::IsUnavailable(cause)) return;  // OnStreamClosed fails them
  DeliveryScope delivering;
  std::vector<std::pair<uint64_t, std::string>> unread;
  {
    const absl::flat_hash_set<uint64_t> named(ids.begin(), ids.end());
    for (auto& call : CallsOnStream(peer, stream_id)) {
      if (named.contains(call.first)) unread.push_back(std::move(call));
    }
  }
  SuspectPeer(peer, cause);
  // P8: the transport knows the dead process read none of them.
  RedeliverUnread(peer, unread, "its process exited before reading the request", cause);
}

void AgentImpl::RedeliverUnread(int peer,
                                const std::vector<std::pair<uint64_t, std::string>>& calls,
                                absl::string_view why, const absl::Status& cause) {
  for (const auto& [id, function] : calls) {
    if ((options_.restarts.wait > absl::ZeroDuration() || IsSilence(cause)) &&
        Redeliver(peer, id, /*unread=*/true)) {
      continue;
    }
    Complete(peer, id,
             Annotate(absl::UnavailableError(absl::StrCat("worker is dead or unreachable (", why,
                                                          ": ", cause.message(), ")")),
                      CallContextText(peer, function)),
             /*undelivered=*/true);
  }
}

std::vector<std::pair<uint64_t, std::string>> AgentImpl::CallsOnStream(int peer,
                                                                       uint64_t stream_id) const {
  if (peer < 0 || peer >= static_cast<int>(peers_.size())) return {};
  return peers_[peer]->CallsOnStream(stream_id);
}

void AgentImpl::OnStreamClosed(int peer, uint64_t stream_id, const absl::Status& cause) {
  DeliveryScope delivering;
  const auto failed = CallsOnStream(peer, stream_id);
  if (absl::IsUnavailable(cause)) SuspectPeer(peer, cause);
  for (const auto& [id, function] : failed) {
    // The stream broke (a partition, or a connection reset at its end): an
    // idempotent call goes again once the peer answers a probe, unless the
    // probe proves it dead.
    if (absl::IsUnavailable(cause) && Idempotent(peer, id) &&
        Redeliver(peer, id, /*unread=*/false)) {
      continue;
    }
    const absl::Status s =
        cause.code() == absl::StatusCode::kUnauthenticated ? cause
        : IsSilence(cause)
            ? absl::UnavailableError(absl::StrCat(
                  "worker unreachable: no answer on its stream (a network partition or a hung "
                  "host; the call may have run there): ",
                  cause.message()))
            : absl::UnavailableError(absl::StrCat(
                  "worker is dead or unreachable (stream ended: ", cause.message(), ")"));
    Complete(peer, id, Annotate(s, CallContextText(peer, function)));
  }
}

// ---- P8: requests known undelivered go again ----

bool AgentImpl::Redeliver(int peer, uint64_t id, bool unread) {
  if (!running()) return false;
  switch (peers_[peer]->QueueRedelivery(id, kMaxDeliveries, unread)) {
    case Peer::Redelivery::kGone: return true;  // completed meanwhile
    case Peer::Redelivery::kRefused: return false;
    case Peer::Redelivery::kQueued: return true;  // the peer's sending task takes it
    case Peer::Redelivery::kStartTask: break;
  }
  if (executor_->Submit([this, peer] { RedeliverTo(peer); })) return true;
  // Shutting down: nothing goes again.
  const std::vector<uint64_t> ids = peers_[peer]->DropRedeliveries();
  for (uint64_t other : ids) {
    if (other != id) {
      Resend(other, peer, absl::FailedPreconditionError("the agent is shutting down"));
    }
  }
  return false;
}

void AgentImpl::RedeliverTo(int peer) {
  for (;;) {
    const std::vector<uint64_t> ids = peers_[peer]->TakeRedeliveries();
    if (ids.empty()) return;
    absl::Time until = absl::InfinitePast();
    for (uint64_t id : ids) {
      peers_[peer]->WithCall(
          id, [&until](PendingCall& call) { until = std::max(until, call.deadline); });
    }
    const int64_t incarnation = peers_[peer]->incarnations().latest;
    const absl::Status why = AwaitDeliverable(peer, incarnation, until);
    for (uint64_t id : ids) Resend(id, peer, why);
  }
}

bool AgentImpl::Idempotent(int peer, uint64_t id) const {
  bool idempotent = false;
  peers_[peer]->WithCall(id, [&idempotent](PendingCall& call) {
    idempotent = call.idempotent && call.resend != nullptr;
  });
  return idempotent;
}

absl::Status AgentImpl::AwaitDeliverable(int peer, int64_t incarnation, absl::Time until) {
  // A successor within the restart wait; a partition's end within the
  // tolerance; either within the calls' deadlines.
  until = std::min(
      until, absl::Now() + std::max(options_.restarts.wait, options_.timeouts.partition_tolerance));
  auto left = [&until] { return std::max(absl::Milliseconds(1), until - absl::Now()); };
  // Its successor registered already: follow it.
  (void)LoadPeerRecord(peer, std::min(left(), absl::Seconds(2)));
  if (!running()) return absl::FailedPreconditionError("the agent is shut down");
  const Peer::Incarnations known = peers_[peer]->incarnations();
  if (known.latest > incarnation && known.dead < known.latest) return absl::OkStatus();
  incarnation = known.latest;
  const bool dead = known.dead >= incarnation;
  absl::Status probe;
  if (!dead) {
    // The refusal may have been passing (the process is alive), or the
    // link down for a while (a partition): a probe that gets through says
    // so. Silence is probed again, until an answer, a death or `until`.
    Executor::BlockingScope blocking;  // a pool thread lends its place (E2)
    for (;;) {
      CallOptions o;
      o.timeout = std::min(left(), absl::Seconds(2));
      const absl::Time sent = absl::Now();
      auto ping = Call(peer, kPingFunction, "", Payload(), o, /*windowed=*/false);
      probe = ping.Wait(o.timeout + absl::Seconds(1));
      if (probe.ok()) return absl::OkStatus();
      if (!IsSilence(probe) || absl::Now() >= until || !running()) break;
      // A probe that failed at once (the link is down) waits for its turn,
      // or until the agent stops.
      absl::MutexLock lock(&mu_);
      auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !running_; };
      if (mu_.AwaitWithDeadline(absl::Condition(&stopped),
                                std::min(until, sent + kSilentProbePeriod))) {
        return absl::FailedPreconditionError("the agent is shut down");
      }
    }
    if (IsSilence(probe) && options_.restarts.wait <= absl::ZeroDuration()) {
      return absl::UnavailableError(absl::StrCat(
          "worker '", workers_[peer].name, "' (id ", peer, ", incarnation ", incarnation,
          ") did not answer (cut off by the network, or hung) within the partition tolerance (",
          DurationText(options_.timeouts.partition_tolerance),
          ", AgentOptions::timeouts.partition_tolerance) or the call's deadline: ",
          probe.message()));
    }
  }
  if (options_.restarts.wait <= absl::ZeroDuration()) {
    return absl::UnavailableError(absl::StrCat(
        "worker '", workers_[peer].name, "' (id ", peer, ", incarnation ", incarnation, ") is dead",
        probe.ok() ? "" : absl::StrCat(" (a probe failed: ", probe.message(), ")")));
  }
  if (AwaitSuccessor(peer, incarnation, until)) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "worker '", workers_[peer].name, "' (id ", peer, ", incarnation ", incarnation, ") is dead",
      probe.ok() ? "" : absl::StrCat(" (a probe failed: ", probe.message(), ")"),
      " and no successor registered within ", DurationText(options_.restarts.wait),
      " (AgentOptions::restarts.wait) or the call's deadline"));
}

void AgentImpl::Resend(uint64_t id, int peer, const absl::Status& why) {
  std::shared_ptr<const Frame> request;
  std::string function;
  absl::Time deadline;
  bool unread = false;
  const bool pending = peers_[peer]->WithCall(id, [&](PendingCall& call) {
    request = call.resend;
    function = call.function;
    deadline = call.deadline;
    unread = call.known_unread();
    if (why.ok()) {
      ++call.deliveries;
      // As in Call: a stream that ends before Send returns concerns it.
      call.stream_id = 0;
    }
  });
  if (!pending) return;  // timed out meanwhile
  if (!why.ok()) {
    // Undelivered only if known never read: an idempotent call that went
    // again after its stream ended in silence may have been (G8).
    Complete(peer, id, Annotate(why, CallContextText(peer, function)), /*undelivered=*/unread);
    return;
  }
  Frame frame = *request;
  // A successor has not opened our probe (P3): its reply comes over the
  // stream.
  frame.header.set_reply_shm(false);
  if (deadline != absl::InfiniteFuture()) {
    frame.header.set_timeout_us(
        std::max<int64_t>(1, absl::ToInt64Microseconds(deadline - absl::Now())));
  }
  SendRequest(id, peer, function, std::move(frame));
}

// ---- Shutdown with a worker missing ----

absl::Status AgentImpl::AwaitPeersAtShutdown() {
  // A dynamic group's members leave one by one (M3): nobody waits for them.
  if (options_.dynamic_group) return absl::OkStatus();
  if (options_.timeouts.shutdown_wait_for_peers == absl::ZeroDuration()) {
    return rendezvous_->EnterShutdownBarrier(options_.timeouts.shutdown);
  }
  const absl::Time end =
      absl::Now() + options_.timeouts.shutdown_wait_for_peers;  // may be infinite
  // In slices: every few seconds the workers still missing are pinged, and
  // one whose ping fails with UNAVAILABLE (its process is gone), or that
  // was confirmed dead meanwhile, ends the wait. A live worker answers the
  // ping at once however busy it is (the ping is answered inline).
  absl::Time next_ping = absl::Now() + absl::Seconds(2);
  for (;;) {
    const absl::Time slice_end = std::min(end, absl::Now() + absl::Seconds(1));
    absl::Status s = rendezvous_->EnterShutdownBarrier(slice_end - absl::Now());
    if (!absl::IsDeadlineExceeded(s) || absl::Now() >= end) return s;
    if (absl::Now() < next_ping) continue;
    next_ping = absl::Now() + absl::Seconds(3);
    for (int p = 0; p < options_.world_size; ++p) {
      if (p == rank_ || rendezvous_->ArrivedAtShutdown(p)) continue;
      // One reading of both: a death noted between two reads would be
      // taken for the successor's.
      const Peer* peer = PeerAt(p);
      const Peer::Incarnations known =
          peer != nullptr ? peer->incarnations() : Peer::Incarnations{};
      const int64_t incarnation = known.latest;
      const bool confirmed_dead = known.latest_dead();
      absl::Status ping;
      if (!confirmed_dead) {
        CallOptions probe;
        probe.timeout = absl::Seconds(2);
        ping = Call(p, kPingFunction, "", Payload(), probe, /*windowed=*/false).status();
      }
      if (!confirmed_dead && !absl::IsUnavailable(ping)) continue;
      // P9: a rank whose launcher restarts it is not lost until its
      // successor fails to register within restarts.wait; once it has, the
      // barrier waits for the successor to reach its own shutdown.
      if (options_.restarts.wait > absl::ZeroDuration() &&
          AwaitSuccessor(p, incarnation, std::min(end, absl::Now() + options_.restarts.wait))) {
        next_ping = absl::Now() + absl::Seconds(3);
        continue;
      }
      return absl::UnavailableError(
          absl::StrCat("worker ", p, " (", workers_[p].name, ") died before it reached shutdown",
                       confirmed_dead ? "" : absl::StrCat(" (a ping failed: ", ping.message(), ")"),
                       options_.restarts.wait > absl::ZeroDuration()
                           ? absl::StrCat(", and no successor registered within restart_wait (",
                                          absl::FormatDuration(options_.restarts.wait), ")")
                           : ""));
    }
  }
}

}  // namespace baton::rpc::internal
