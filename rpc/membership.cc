// Dynamic groups (rpc/agent.h, M1-M4; internal::AgentImpl): joining a
// group that has no fixed size, and leaving it.
//
// The group's keys live under one namespace for the store's life
// (AgentImpl::kGroupNamespace), as torch's dynamic groups keep theirs in
// the store of their init method:
//
//   kind                  "static" or "dynamic": the first worker's (M4)
//   rank_claim/<rank>     the nonce of the process that holds the rank
//   rank_name/<rank>      the name the rank first joined with (M2)
//   name/<name>           the rank that holds the name (M2)
//   incarnation/<rank>    one more at every join of the rank
//   worker/<rank>         its registration (proto::WorkerRecord); "" once
//                         it left
//   members/count         the joins so far; members/<k> the k-th's rank
//   live                  the workers joining or in the group now (the
//                         store's host waits for 0)
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

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "rpc/internal/agent_impl.h"
#include "store/store_client.h"

namespace baton::rpc::internal {
namespace {

constexpr char kJoinFunction[] = "__baton.join";
constexpr char kLeaveFunction[] = "__baton.leave";
// torch's words (its test suite matches them).
constexpr char kMixedGroups[] =
    "RPC group mixes statically and dynamically initialized members which is not supported.";
// The store's kind of group, claimed by its first worker.
constexpr char kGroupKindKey[] = "baton/group_kind";

// A notice's answer: empty, or the error.
void Answer(Responder& done, const absl::Status& s) {
  if (s.ok()) {
    done(Payload());
  } else {
    done(s);
  }
}

}  // namespace

absl::Status CheckGroupKind(store::Store& store, bool dynamic) {
  const std::string mine = dynamic ? "dynamic" : "static";
  ASSIGN_OR_RETURN(auto kind, store.CompareSet(kGroupKindKey, "", mine));
  if (kind != mine) {
    return absl::FailedPreconditionError(absl::StrCat(kMixedGroups, " (this worker's group is ",
                                                      mine, "; the store's is ", kind, ")"));
  }
  return absl::OkStatus();
}

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

// ns_, incarnation_; the store's kind of group (M4).
absl::Status AgentImpl::TakeGroupRound() {
  RETURN_IF_ERROR(CheckGroupKind(*store_, /*dynamic=*/true));
  ns_ = kGroupNamespace;
  // Counted from its first step, so that the store's host, leaving, waits
  // for a worker that is still joining too.
  RETURN_IF_ERROR(store_->Add(absl::StrCat(ns_, "live"), 1).status());
  counted_ = true;
  ASSIGN_OR_RETURN(incarnation_, store_->Add(absl::StrCat(ns_, "incarnation/", rank_), 1));
  return Step(RendezvousStep::kRoundTaken);
}

// M2: the rank keeps its first name, and the name belongs to one rank.
absl::Status AgentImpl::ClaimName() {
  const std::string rank_key = absl::StrCat(ns_, "rank_name/", rank_);
  // Whether this join names the rank first (undone if the name is taken).
  auto before = store_->Get(rank_key, absl::ZeroDuration());
  const bool first = !before.ok() || before->empty();
  ASSIGN_OR_RETURN(auto name, store_->CompareSet(rank_key, "", options_.name));
  if (name != options_.name) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", rank_, " joined this group as '", name,
                                                 "' before: a rank keeps its name, so it cannot "
                                                 "join as '",
                                                 options_.name, "'"));
  }
  const std::string mine = absl::StrCat(rank_);
  ASSIGN_OR_RETURN(auto holder,
                   store_->CompareSet(absl::StrCat(ns_, "name/", options_.name), "", mine));
  if (holder != mine) {
    if (first) (void)store_->CompareSet(rank_key, options_.name, "");
    return absl::AlreadyExistsError(absl::StrCat(
        "worker name '", options_.name, "' is not unique: rank ", holder,
        " of this group holds it (a name stays with the rank that first joined with it)"));
  }
  return absl::OkStatus();
}

void AgentImpl::MakeSlots(const proto::WorkerRecord& mine) {
  workers_.assign(slots_, WorkerInfo());
  for (int r = 0; r < slots_; ++r) workers_[r].id = r;
  peer_limits_.assign(slots_, options_.transport.max_message_bytes);
  device_map_to_.assign(slots_, {});
  has_device_map_to_.assign(slots_, false);
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

// member_seq_; every member before this one admitted.
absl::Status AgentImpl::ReadMembers() {
  ASSIGN_OR_RETURN(int64_t seq, store_->Add(absl::StrCat(ns_, "members/count"), 1));
  RETURN_IF_ERROR(store_->Set(absl::StrCat(ns_, "members/", seq), absl::StrCat(rank_)));
  member_seq_ = seq;
  std::vector<std::string> keys;
  for (int64_t k = 1; k < seq; ++k) keys.push_back(absl::StrCat(ns_, "members/", k));
  // A worker that died between taking its place and writing its rank left
  // a hole: after a short wait, the places are read one by one and holes
  // skipped.
  std::vector<std::string> places(keys.size());
  if (auto all = store_->MultiGet(keys, absl::Seconds(2)); all.ok()) {
    places = *std::move(all);
  } else {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (auto v = store_->Get(keys[i], absl::ZeroDuration()); v.ok()) places[i] = *v;
    }
  }
  std::vector<int> ranks;
  for (const std::string& place : places) {
    int r = -1;
    if (absl::SimpleAtoi(place, &r) && r >= 0 && r < slots_ && r != rank_ &&
        std::find(ranks.begin(), ranks.end(), r) == ranks.end()) {
      ranks.push_back(r);
    }
  }
  keys.clear();
  for (int r : ranks) keys.push_back(absl::StrCat(ns_, "worker/", r));
  // Each registration was written before its place.
  ASSIGN_OR_RETURN(auto records, store_->MultiGet(keys, options_.timeouts.init));
  for (size_t i = 0; i < ranks.size(); ++i) {
    proto::WorkerRecord record;
    if (records[i].empty()) continue;  // it left
    if (!record.ParseFromString(records[i]) || record.address().empty()) {
      return absl::DataLossError(absl::StrCat("malformed registration of rank ", ranks[i]));
    }
    RETURN_IF_ERROR(AdmitMember(ranks[i], record));
  }
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
  absl::StatusOr<std::string> v;
  {
    Executor::BlockingScope blocking;  // a store read (E2)
    v = store_->Get(absl::StrCat(ns_, "worker/", caller), absl::Seconds(5));
  }
  proto::WorkerRecord record;
  if (!v.ok() || !record.ParseFromString(*v) || record.address().empty()) {
    return absl::UnavailableError(
        absl::StrCat("worker '", options_.name, "' could not read the registration of worker id ",
                     caller, ": ", v.ok() ? "malformed or withdrawn" : v.status().ToString()));
  }
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
  (void)store_->Set(absl::StrCat(ns_, "worker/", rank_), "");
  // One member that does not answer must not hold the rest of the shutdown.
  const absl::Duration timeout = std::clamp(deadline - absl::Now(), absl::Milliseconds(1),
                                            std::min(options_.timeouts.rpc, absl::Seconds(5)));
  // A member that does not answer has left or died itself: nothing to wait for.
  for (auto& [r, future] : NotifyMembers(kLeaveFunction, timeout)) (void)future.result();
}

void AgentImpl::ReleaseMembership(absl::Duration timeout) {
  if ((!counted_ && rank_claim_.empty()) || store_ == nullptr) return;
  const bool joined = member_seq_ > 0;
  const bool counted = std::exchange(counted_, false);
  const std::string claim = std::exchange(rank_claim_, std::string());
  member_seq_ = 0;
  // The store may be gone (its host left): a bounded write says so first,
  // as the store's other calls would wait for it.
  const std::string left = absl::StrCat(ns_, "left/", rank_, "/", incarnation_);
  if (auto* client = dynamic_cast<store::StoreClient*>(store_.get()); client != nullptr) {
    if (!client->TrySet(left, "1", std::min(timeout, absl::Seconds(2))).ok()) return;
  }
  if (joined) (void)store_->Set(absl::StrCat(ns_, "worker/", rank_), "");
  if (!claim.empty()) {
    (void)store_->CompareSet(absl::StrCat(ns_, "rank_claim/", rank_), claim, "");
  }
  if (counted) (void)store_->Add(absl::StrCat(ns_, "live"), -1);
}

absl::Status AgentImpl::AwaitMembersGone(absl::Duration timeout) {
  // Bounded also without a timeouts.shutdown: a member that died never
  // counts itself out.
  const absl::Time deadline =
      absl::Now() + std::min({timeout, options_.timeouts.shutdown, absl::Minutes(1)});
  const std::string key = absl::StrCat(ns_, "live");
  // The count has no key to wait for: it is read every 10 ms, bounded.
  for (;;) {
    ASSIGN_OR_RETURN(int64_t live, store_->Add(key, 0));
    if (live <= 0) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(live, " member(s) of the group still in it when the store's host left"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// Supervision's drop (Runtime::RetirePeer). The job's retired ranks are one
// key, "retired": their ranks, comma-separated, each added by a CompareSet
// (no entry is ever half written, whoever dies when).
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
  for (const char* barrier : {"shutdown/enter", "shutdown/drained"}) {
    RETURN_IF_ERROR(store::ArriveFor(*store_, ns_ + barrier, peer));
  }
  // Rank 0 keeps its store until every rank left (Teardown).
  RETURN_IF_ERROR(store_->Set(absl::StrCat(ns_, "shutdown/left/", peer), "1"));
  const std::string key = ns_ + "retired";
  const std::string me = absl::StrCat(peer);
  std::string seen;
  for (;;) {
    // Added by this CompareSet, or by another worker before it.
    if (absl::StrContains(absl::StrCat(",", seen, ","), absl::StrCat(",", me, ","))) {
      return absl::OkStatus();
    }
    const std::string desired = seen.empty() ? me : absl::StrCat(seen, ",", me);
    ASSIGN_OR_RETURN(seen, store_->CompareSet(key, seen, desired));
  }
}

absl::StatusOr<std::vector<int>> AgentImpl::RetiredPeers() {
  absl::StatusOr<std::string> held = store_->Get(ns_ + "retired", absl::ZeroDuration());
  std::vector<int> out;
  if (!held.ok()) {
    // A zero-timeout read of a key nobody set: nobody was retired.
    if (absl::IsDeadlineExceeded(held.status())) return out;
    return held.status();
  }
  for (absl::string_view part : absl::StrSplit(*held, ',', absl::SkipEmpty())) {
    int rank = 0;
    if (absl::SimpleAtoi(part, &rank)) out.push_back(rank);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace baton::rpc::internal
