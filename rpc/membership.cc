// Dynamic groups (rpc/agent.h, M1-M4; internal::AgentImpl): joining a
// group that has no fixed size, and leaving it.
//
// The group's keys live under one namespace for the store's life
// (Rendezvous::kGroupNamespace), as torch's dynamic groups keep theirs in
// the store of their init method; rpc/internal/rendezvous.h names each and
// says what it means, and every read and write of them goes through
// rendezvous_. What they say is applied to the agent here.
//
// A worker joins in these steps: it claims its rank and name, registers,
// takes the next place in the member list, reads the registrations of the
// members before it (each admitted: its entry, name, window and address),
// becomes ready, and then calls each of them with a join notice, which
// makes them read its registration and admit it. Create() returns once
// every notice is answered (M1); a member that joins concurrently with a
// later place learns of this one from the list, and this one from its
// notice. A graceful Shutdown() sends every member a leave notice before
// its drain (M3); Teardown then takes its registration and rank claim back
// and counts it out of `live`.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "rpc/internal/agent_impl.h"

namespace baton::rpc::internal {
namespace {

constexpr char kJoinFunction[] = "__baton.join";
constexpr char kLeaveFunction[] = "__baton.leave";

// A notice's answer: empty, or the error.
void Answer(Responder& done, const absl::Status& s) {
  if (s.ok()) {
    done(Payload());
  } else {
    done(s);
  }
}

}  // namespace

absl::Status AgentImpl::JoinGroup() {
  rank_ = options_.rank;
  RETURN_IF_ERROR(PrepareRuntime());
  // The notices reach whichever agent the call is for, also when agents in
  // one process share a registry (which then has them already).
  (void)registry_->RegisterRaw(
      kJoinFunction, "", [](const CallContext& ctx, Payload, Responder done) {
        Answer(done, static_cast<AgentImpl*>(ctx.runtime)
                         ->OnJoinNotice(ctx.caller->id, ctx.caller_incarnation));
      });
  (void)registry_->RegisterInternalInline(
      kLeaveFunction, [](const CallContext& ctx, Payload, Responder done) {
        Answer(done, static_cast<AgentImpl*>(ctx.runtime)
                         ->OnLeaveNotice(ctx.caller->id, ctx.caller_incarnation));
      });
  RETURN_IF_ERROR(Step(RendezvousStep::kConnectingStore));
  RETURN_IF_ERROR(ConnectStore());
  RETURN_IF_ERROR(TakeGroupRound());
  ASSIGN_OR_RETURN(auto token, AgreeOnToken());
  RETURN_IF_ERROR(StartNetworkTransport(token));
  RETURN_IF_ERROR(ClaimRank());
  RETURN_IF_ERROR(ClaimName());
  // Over the network transport only: no probe, hub or link to publish.
  Registration reg;
  RETURN_IF_ERROR(Register(reg));
  MakeSlots(reg.mine);
  RETURN_IF_ERROR(ReadMembers());
  RETURN_IF_ERROR(BecomeReady(reg.mine));
  AnnounceJoin();
  return StartTrace();
}

// ns_, incarnation_; the store's kind of group (M4), and this worker
// counted in the group's `live` (Rendezvous::EnterGroup).
absl::Status AgentImpl::TakeGroupRound() {
  const absl::Status entered = rendezvous_->EnterGroup();
  ns_ = rendezvous_->ns();  // once the kind is claimed, also if the count failed
  RETURN_IF_ERROR(entered);
  counted_ = true;
  ASSIGN_OR_RETURN(incarnation_, rendezvous_->TakeIncarnation());
  return Step(RendezvousStep::kRoundTaken);
}

// M2: the rank keeps its first name, and the name belongs to one rank
// (Rendezvous::ClaimName).
absl::Status AgentImpl::ClaimName() { return rendezvous_->ClaimName(); }

void AgentImpl::MakeSlots(const proto::WorkerRecord& mine) {
  workers_.assign(slots_, WorkerInfo());
  for (int r = 0; r < slots_; ++r) workers_[r].id = r;
  peer_limits_.assign(slots_, options_.transport.max_message_bytes);
  device_maps_ = DeviceMaps();
  cuda_channel_peer_.assign(slots_, false);
  paths_.clear();
  for (int r = 0; r < slots_; ++r) {
    paths_.push_back(std::make_unique<PeerPath>(r, transport_.get(), nullptr, nullptr, ""));
  }
  window_ = std::make_unique<CallWindow>(std::vector<FlowLimits>(
      slots_,
      FlowLimits{options_.transport.max_calls_in_flight, options_.transport.max_bytes_in_flight}));
  {
    absl::MutexLock lock(&members_mu_);
    named_.assign(slots_, false);
  }
  FillPeers([](int) { return int64_t{0}; });
  (void)AdmitMember(rank_, mine);
}

// member_seq_ (this worker's place in the member list); every member
// before this one that has not left admitted.
absl::Status AgentImpl::ReadMembers() {
  ASSIGN_OR_RETURN(member_seq_, rendezvous_->TakePlace());
  ASSIGN_OR_RETURN(auto members, rendezvous_->ReadMembersBefore(member_seq_));
  for (const auto& [rank, record] : members) RETURN_IF_ERROR(AdmitMember(rank, record));
  return absl::OkStatus();
}

// M1: every member known now hears of this one before Create() returns. A
// member that does not answer (it left, or died) is not waited for beyond
// timeouts.init; it is said in the log.
std::vector<std::pair<int, Future<Payload>>> AgentImpl::NotifyMembers(const char* function,
                                                                      absl::Duration timeout) {
  std::vector<std::pair<int, Future<Payload>>> sent;
  CallOptions notice;
  notice.timeout = timeout;
  for (int r = 0; r < slots_; ++r) {
    if (r == rank_ || !IsMember(r)) continue;
    sent.emplace_back(r, Call(r, function, "", Payload(), notice, /*windowed=*/false));
  }
  return sent;
}

void AgentImpl::AnnounceJoin() {
  for (auto& [r, future] : NotifyMembers(kJoinFunction, options_.timeouts.init)) {
    absl::StatusOr<Payload> answer = future.result();
    if (!answer.ok()) {
      // It is leaving, or gone: it does not know this worker, so it is no
      // member for this one either.
      Log().Warning(absl::StrCat("worker '", workers_[r].name, "' (id ", r,
                                 ") did not take this worker into the group, which goes on "
                                 "without it: ",
                                 answer.status().ToString()));
      RemoveMember(r);
    }
  }
}

absl::Status AgentImpl::OnJoinNotice(int caller, int64_t incarnation) {
  if (!options_.dynamic_group) {
    return absl::FailedPreconditionError(kMixedGroups);
  }
  if (leaving_.load(std::memory_order_acquire)) {
    return absl::NotFoundError(absl::StrCat("worker '", options_.name, "' is leaving the group"));
  }
  absl::StatusOr<proto::WorkerRecord> read;
  {
    Executor::BlockingScope blocking;  // a store read (E2)
    read = rendezvous_->ReadMember(caller, absl::Seconds(5));
  }
  if (!read.ok()) return read.status();
  const proto::WorkerRecord& record = *read;
  if (record.incarnation() != incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("the join notice of worker id ", caller, " comes from incarnation ",
                     incarnation, ", but incarnation ", record.incarnation(), " is registered"));
  }
  return AdmitMember(caller, record);
}

absl::Status AgentImpl::AdmitMember(int rank, const proto::WorkerRecord& record) {
  if (rank < 0 || rank >= slots_) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker id ", rank, " is outside [0, ", slots_, ")"));
  }
  {
    absl::MutexLock lock(&members_mu_);
    if (!named_[rank]) {
      // Nobody reads the entry before the slot's first admission.
      workers_[rank] = WorkerInfo{record.name(),
                                  rank,
                                  record.address(),
                                  {record.front_ends().begin(), record.front_ends().end()}};
      peer_limits_[rank] = record.max_message_bytes();
      named_[rank] = true;
    } else if (workers_[rank].name != record.name()) {
      return absl::AlreadyExistsError(absl::StrCat("worker id ", rank, " is '", workers_[rank].name,
                                                   "' in this group, not '", record.name(), "'"));
    }
    auto [it, inserted] = by_name_.emplace(record.name(), rank);
    if (!inserted && it->second != rank) {
      return absl::AlreadyExistsError(absl::StrCat("worker name '", record.name(),
                                                   "' is not unique: ranks ", it->second, " and ",
                                                   rank, " both use it"));
    }
  }
  // F1: the window toward it stays within what it holds.
  auto smaller = [](int64_t mine, int64_t theirs) {
    return theirs > 0 ? std::min(mine, theirs) : mine;
  };
  window_->SetLimits(
      rank,
      FlowLimits{smaller(options_.transport.max_calls_in_flight, record.max_calls_in_flight()),
                 smaller(options_.transport.max_bytes_in_flight, record.max_bytes_in_flight())});
  const int64_t incarnation =
      rank == rank_ ? incarnation_ : std::max<int64_t>(1, record.incarnation());
  peers_[rank]->Admit(incarnation);
  if (rank != rank_) AddNetworkPeer(rank, record);
  member_[rank].store(true, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status AgentImpl::OnLeaveNotice(int caller, int64_t incarnation) {
  if (!IsMember(caller) || caller == rank_) return absl::OkStatus();
  // A notice of an earlier incarnation than the member's says nothing of it.
  if (incarnation < peers_[caller]->incarnations().latest) return absl::OkStatus();
  RemoveMember(caller);
  return absl::OkStatus();
}

void AgentImpl::RemoveMember(int rank) {
  if (!IsMember(rank) || rank == rank_) return;
  member_[rank].store(false, std::memory_order_release);
  absl::MutexLock lock(&members_mu_);
  auto it = by_name_.find(workers_[rank].name);
  if (it != by_name_.end() && it->second == rank) by_name_.erase(it);
}

void AgentImpl::AnnounceLeave(absl::Time deadline) {
  // From now on nobody joins this worker, and a joiner that reads the
  // registration finds it withdrawn.
  leaving_.store(true, std::memory_order_release);
  (void)rendezvous_->WithdrawRecord();
  // One member that does not answer must not hold the rest of the shutdown.
  const absl::Duration timeout = std::clamp(deadline - absl::Now(), absl::Milliseconds(1),
                                            std::min(options_.timeouts.rpc, absl::Seconds(5)));
  // A member that does not answer has left or died itself: nothing to wait for.
  for (auto& [r, future] : NotifyMembers(kLeaveFunction, timeout)) (void)future.result();
}

void AgentImpl::ReleaseMembership(absl::Duration timeout) {
  if ((!counted_ && rank_claim_.empty()) || store_ == nullptr || rendezvous_ == nullptr) return;
  Rendezvous::Membership membership;
  membership.incarnation = incarnation_;
  membership.joined = member_seq_ > 0;
  membership.counted = std::exchange(counted_, false);
  membership.claim = std::exchange(rank_claim_, std::string());
  member_seq_ = 0;
  rendezvous_->Release(membership, timeout);
}

absl::Status AgentImpl::AwaitMembersGone(absl::Duration timeout) {
  if (rendezvous_ == nullptr) return absl::OkStatus();
  return rendezvous_->AwaitMembersGone(timeout);
}

// Supervision's drop (Runtime::RetirePeer): the store's part is
// Rendezvous::Retire (the "retired" key, added to by CompareSet).
absl::Status AgentImpl::RetirePeer(int peer) {
  if (peer < 0 || peer >= static_cast<int>(workers_.size())) {
    return absl::NotFoundError(absl::StrCat("retire: no worker with id ", peer));
  }
  if (peer == rank_ || peer == 0 || options_.dynamic_group) {
    return absl::FailedPreconditionError(
        absl::StrCat("retire worker ", peer, " (", workers_[peer].name, "): ",
                     peer == rank_ ? "a worker cannot retire itself"
                     : peer == 0   ? "rank 0 releases the job's barriers and cannot leave it"
                                   : "a dynamic group's members leave by themselves (shutdown)"));
  }
  return rendezvous_->Retire(peer);
}

absl::StatusOr<std::vector<int>> AgentImpl::RetiredPeers() { return rendezvous_->Retired(); }

}  // namespace baton::rpc::internal
