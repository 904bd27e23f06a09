#include "rpc/internal/rendezvous.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/host.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "store/store_client.h"

namespace baton::rpc::internal {
namespace {

// The store's kind of group, claimed by its first worker.
constexpr char kGroupKindKey[] = "baton/group_kind";

}  // namespace

Rendezvous::Rendezvous(std::shared_ptr<store::Store> store, const AgentOptions& options)
    : store_(std::move(store)),
      rank_(options.rank),
      world_size_(options.world_size),
      max_ranks_(options.max_ranks),
      name_(options.name),
      init_timeout_(options.timeouts.init),
      shutdown_timeout_(options.timeouts.shutdown) {}

std::string Rendezvous::Key(absl::string_view what) const { return absl::StrCat(ns_, what); }

std::string Rendezvous::RecordKey(int rank) const { return absl::StrCat(ns_, "worker/", rank); }

absl::Status Rendezvous::CheckGroupKind(bool dynamic) const {
  const std::string mine = dynamic ? "dynamic" : "static";
  ASSIGN_OR_RETURN(auto kind, store_->CompareSet(kGroupKindKey, "", mine));
  if (kind != mine) {
    return absl::FailedPreconditionError(absl::StrCat(kMixedGroups, " (this worker's group is ",
                                                      mine, "; the store's is ", kind, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Rendezvous::Round> Rendezvous::TakeRound(bool rejoin) {
  // Each init of a rank against a store is a new round with fresh keys, so
  // repeated init/shutdown in one job never sees stale registrations. A
  // rejoining incarnation takes the round its predecessor was in.
  RETURN_IF_ERROR(CheckGroupKind(/*dynamic=*/false));  // M4
  const std::string round_key = absl::StrCat("baton/init_round/", rank_);
  auto round = store_->Add(round_key, rejoin ? 0 : 1);
  if (!round.ok()) return round.status();
  if (*round == 0) {
    // P5: the predecessor died before it took a round, so this rank never
    // joined; the others still wait for its first start.
    rejoin = false;
    round = store_->Add(round_key, 1);
    if (!round.ok()) return round.status();
  }
  ns_ = absl::StrCat("baton/r", *round, "/");
  // 1 for the first start in this round, one more for each rejoin.
  ASSIGN_OR_RETURN(int64_t incarnation, TakeIncarnation());
  return Round{ns_, incarnation, rejoin};
}

absl::StatusOr<std::string> Rendezvous::ShareStoreInstance(bool external_store) const {
  // Which store instance this round uses (see AgentImpl::Teardown).
  if (rank_ == 0) {
    std::string instance = RandomHex(8);
    RETURN_IF_ERROR(store_->Set(Key("store_instance"), instance));
    return instance;
  }
  if (external_store) return std::string();
  return store_->Get(Key("store_instance"), init_timeout_);
}

absl::StatusOr<std::string> Rendezvous::AgreeOnToken() const {
  // An injected in-process store: rank 0 creates the token there.
  const std::string key = Key("job_token");
  if (rank_ == 0) {
    ASSIGN_OR_RETURN(auto v, store_->CompareSet(key, "", RandomHex(16)));
    return v;
  }
  return store_->Get(key, init_timeout_);
}

absl::Status Rendezvous::EnterGroup() {
  RETURN_IF_ERROR(CheckGroupKind(/*dynamic=*/true));
  ns_ = kGroupNamespace;
  // Counted from its first step, so that the store's host, leaving, waits
  // for a worker that is still joining too.
  return store_->Add(Key("live"), 1).status();
}

absl::StatusOr<int64_t> Rendezvous::TakeIncarnation() const {
  return store_->Add(absl::StrCat(ns_, "incarnation/", rank_), 1);
}

// The rank is this process's, or ALREADY_EXISTS names it.
absl::StatusOr<std::string> Rendezvous::ClaimRank(bool rejoin) const {
  const std::string nonce = RandomHex(8);
  const std::string claim_key = absl::StrCat(ns_, "rank_claim/", rank_);
  if (rejoin) {
    // The predecessor holds the claim; the restarted incarnation takes it.
    RETURN_IF_ERROR(store_->Set(claim_key, nonce));
  }
  ASSIGN_OR_RETURN(auto claim, store_->CompareSet(claim_key, "", nonce));
  if (claim != nonce) {
    return absl::AlreadyExistsError(
        absl::StrCat("rank ", rank_, " is already taken by another process in this job"));
  }
  return nonce;
}

// M2: the rank keeps its first name, and the name belongs to one rank.
absl::Status Rendezvous::ClaimName() const {
  const std::string rank_key = absl::StrCat(ns_, "rank_name/", rank_);
  // Whether this join names the rank first (undone if the name is taken).
  auto before = store_->Get(rank_key, absl::ZeroDuration());
  const bool first = !before.ok() || before->empty();
  ASSIGN_OR_RETURN(auto name, store_->CompareSet(rank_key, "", name_));
  if (name != name_) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", rank_, " joined this group as '", name,
                                                 "' before: a rank keeps its name, so it cannot "
                                                 "join as '",
                                                 name_, "'"));
  }
  const std::string mine = absl::StrCat(rank_);
  ASSIGN_OR_RETURN(auto holder, store_->CompareSet(absl::StrCat(ns_, "name/", name_), "", mine));
  if (holder != mine) {
    if (first) (void)store_->CompareSet(rank_key, name_, "");
    return absl::AlreadyExistsError(absl::StrCat(
        "worker name '", name_, "' is not unique: rank ", holder,
        " of this group holds it (a name stays with the rank that first joined with it)"));
  }
  return absl::OkStatus();
}

absl::Status Rendezvous::Publish(const proto::WorkerRecord& mine) const {
  RETURN_IF_ERROR(store_->Set(RecordKey(rank_), mine.SerializeAsString()));
  // P7: callers waiting for this incarnation of the rank wait on this key.
  return store_->Set(absl::StrCat(ns_, "registered/", rank_, "/", mine.incarnation()), "1");
}

absl::StatusOr<std::vector<proto::WorkerRecord>> Rendezvous::ReadRecords() const {
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) keys.push_back(RecordKey(r));
  auto values = store_->MultiGet(keys, init_timeout_);
  if (!values.ok()) return Annotate(values.status(), "waiting for every worker to register");
  std::vector<proto::WorkerRecord> records(world_size_);
  for (int r = 0; r < world_size_; ++r) {
    if (!records[r].ParseFromString((*values)[r]) || records[r].name().empty() ||
        records[r].address().empty()) {
      return absl::DataLossError(absl::StrCat("malformed registration of rank ", r));
    }
  }
  return records;
}

// P5: a rank that died during start-up after registering was replaced by a
// successor that registered again before it reached the barrier.
absl::StatusOr<std::vector<Rendezvous::RankRecord>> Rendezvous::ReadSuccessors(
    const std::vector<proto::WorkerRecord>& read) const {
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) keys.push_back(RecordKey(r));
  std::vector<RankRecord> newer;
  ASSIGN_OR_RETURN(auto values, store_->MultiGet(keys, init_timeout_));
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    proto::WorkerRecord now;
    if (!now.ParseFromString((values)[r]) || now.address().empty()) {
      return absl::DataLossError(absl::StrCat("malformed registration of rank ", r));
    }
    if (r < static_cast<int>(read.size()) && now.incarnation() <= read[r].incarnation()) continue;
    newer.push_back(RankRecord{r, std::move(now)});
  }
  return newer;
}

absl::Status Rendezvous::PublishProbesOpened(int usable) const {
  return store_->Set(absl::StrCat(ns_, "shm_probe/", rank_, "/", usable), "1");
}

absl::Status Rendezvous::PublishLinks(const proto::SameHostLinks& created) const {
  return store_->Set(absl::StrCat(ns_, "shm_links/", rank_),
                     created.links().empty() ? "-" : created.SerializeAsString());
}

absl::Status Rendezvous::PublishNoLinks() const {
  // P5: higher ranks that read the predecessor's registration during
  // start-up wait for the same-host links it would have created; this
  // incarnation sets none up, so it says "none" where the predecessor
  // said nothing (a link it did publish closes when they see it died).
  return store_->CompareSet(absl::StrCat(ns_, "shm_links/", rank_), "", "-").status();
}

absl::StatusOr<std::vector<proto::SameHostLinks>> Rendezvous::ReadLinks(
    const std::vector<int>& ranks) const {
  std::vector<proto::SameHostLinks> out(ranks.size());
  if (ranks.empty()) return out;
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back(absl::StrCat(ns_, "shm_links/", r));
  auto values = store_->MultiGet(keys, init_timeout_);
  if (!values.ok()) return Annotate(values.status(), "waiting for the shared-memory links");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if ((*values)[i] == "-") continue;
    if (!out[i].ParseFromString((*values)[i])) {
      return absl::DataLossError(
          absl::StrCat("malformed shared-memory link record of rank ", ranks[i]));
    }
  }
  return out;
}

absl::Status Rendezvous::ProbedBarrier() const {
  return store::Barrier(*store_, Key("init/probed"), rank_, world_size_, init_timeout_);
}

absl::Status Rendezvous::DoneBarrier() const {
  return store::Barrier(*store_, Key("init/done"), rank_, world_size_, init_timeout_);
}

absl::Status Rendezvous::SayPassed() const {
  return store_->Set(absl::StrCat(ns_, "init/passed/", rank_), "1");
}

absl::Status Rendezvous::AwaitOthersPassed() const {
  std::vector<std::string> passed;
  for (int r = 0; r < world_size_; ++r) {
    if (r != rank_) passed.push_back(absl::StrCat(ns_, "init/passed/", r));
  }
  // Bounded: a rank that died right after the barrier never says so.
  return store_->Wait(passed, init_timeout_);
}

absl::StatusOr<int64_t> Rendezvous::TakePlace() const {
  ASSIGN_OR_RETURN(int64_t seq, store_->Add(Key("members/count"), 1));
  RETURN_IF_ERROR(store_->Set(absl::StrCat(ns_, "members/", seq), absl::StrCat(rank_)));
  return seq;
}

absl::StatusOr<std::vector<Rendezvous::RankRecord>> Rendezvous::ReadMembersBefore(
    int64_t place) const {
  std::vector<std::string> keys;
  for (int64_t k = 1; k < place; ++k) keys.push_back(absl::StrCat(ns_, "members/", k));
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
  for (const std::string& p : places) {
    int r = -1;
    if (absl::SimpleAtoi(p, &r) && r >= 0 && r < max_ranks_ && r != rank_ &&
        std::find(ranks.begin(), ranks.end(), r) == ranks.end()) {
      ranks.push_back(r);
    }
  }
  keys.clear();
  for (int r : ranks) keys.push_back(RecordKey(r));
  // Each registration was written before its place.
  ASSIGN_OR_RETURN(auto records, store_->MultiGet(keys, init_timeout_));
  std::vector<RankRecord> members;
  for (size_t i = 0; i < ranks.size(); ++i) {
    proto::WorkerRecord record;
    if (records[i].empty()) continue;  // it left
    if (!record.ParseFromString(records[i]) || record.address().empty()) {
      return absl::DataLossError(absl::StrCat("malformed registration of rank ", ranks[i]));
    }
    members.push_back(RankRecord{ranks[i], std::move(record)});
  }
  return members;
}

absl::StatusOr<proto::WorkerRecord> Rendezvous::ReadMember(int rank, absl::Duration timeout) const {
  absl::StatusOr<proto::WorkerRecord> read = ReadRecordNow(rank, timeout, /*fail_fast=*/false);
  if (read.ok() && !read->address().empty()) return read;
  const std::string why = read.ok() || absl::IsDataLoss(read.status()) ? "malformed or withdrawn"
                                                                       : read.status().ToString();
  return absl::UnavailableError(absl::StrCat(
      "worker '", name_, "' could not read the registration of worker id ", rank, ": ", why));
}

absl::Status Rendezvous::WithdrawRecord() const { return store_->Set(RecordKey(rank_), ""); }

void Rendezvous::Release(const Membership& membership, absl::Duration timeout) const {
  // The store may be gone (its host left): a bounded write says so first,
  // as the store's other calls would wait for it.
  const std::string left = absl::StrCat(ns_, "left/", rank_, "/", membership.incarnation);
  if (auto* client = dynamic_cast<store::StoreClient*>(store_.get()); client != nullptr) {
    if (!client->TrySet(left, "1", std::min(timeout, absl::Seconds(2))).ok()) return;
  }
  if (membership.joined) (void)store_->Set(RecordKey(rank_), "");
  if (!membership.claim.empty()) {
    (void)store_->CompareSet(absl::StrCat(ns_, "rank_claim/", rank_), membership.claim, "");
  }
  if (membership.counted) (void)store_->Add(Key("live"), -1);
}

absl::Status Rendezvous::AwaitMembersGone(absl::Duration timeout) const {
  // Bounded also without a timeouts.shutdown: a member that died never
  // counts itself out.
  const absl::Time deadline =
      absl::Now() + std::min({timeout, shutdown_timeout_, absl::Minutes(1)});
  const std::string key = Key("live");
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

absl::StatusOr<proto::WorkerRecord> Rendezvous::ReadRecordNow(int rank, absl::Duration timeout,
                                                              bool fail_fast) const {
  auto* client = fail_fast ? dynamic_cast<store::StoreClient*>(store_.get()) : nullptr;
  ASSIGN_OR_RETURN(std::string bytes, client != nullptr ? client->TryGet(RecordKey(rank), timeout)
                                                        : store_->Get(RecordKey(rank), timeout));
  proto::WorkerRecord record;
  if (!record.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("malformed registration of worker id ", rank));
  }
  return record;
}

absl::Status Rendezvous::AwaitRegistered(int rank, int64_t incarnation,
                                         absl::Duration timeout) const {
  // Every incarnation announces itself under its own key (Publish), so this
  // waits for that key, not a poll.
  return store_->Wait({absl::StrCat(ns_, "registered/", rank, "/", incarnation)}, timeout);
}

absl::Status Rendezvous::EnterShutdownBarrier(absl::Duration timeout) const {
  return store::Barrier(*store_, Key("shutdown/enter"), rank_, world_size_, timeout);
}

bool Rendezvous::ArrivedAtShutdown(int rank) const {
  return store_->Get(absl::StrCat(ns_, "shutdown/enter/arrived/", rank), absl::ZeroDuration()).ok();
}

absl::Status Rendezvous::DrainedBarrier(absl::Duration timeout) const {
  return store::Barrier(*store_, Key("shutdown/drained"), rank_, world_size_, timeout);
}

void Rendezvous::SayLeft(absl::Duration timeout) const {
  const std::string key = absl::StrCat(ns_, "shutdown/left/", rank_);
  if (auto* client = dynamic_cast<store::StoreClient*>(store_.get()); client != nullptr) {
    // Rank 0 may have stopped its store already (it waits a bounded time
    // for the others, and a worker whose init failed comes late): never
    // wait for a store that is gone.
    (void)client->TrySet(key, "1", timeout);
  } else {
    (void)store_->Set(key, "1");
  }
}

void Rendezvous::AwaitAllLeft(absl::Duration timeout) const {
  std::vector<std::string> keys;
  keys.reserve(world_size_);
  for (int r = 0; r < world_size_; ++r) keys.push_back(absl::StrCat(ns_, "shutdown/left/", r));
  (void)store_->Wait(keys, timeout);
}

void Rendezvous::AwaitStoreGone(const std::string& instance, absl::Duration timeout) const {
  auto* client = dynamic_cast<store::StoreClient*>(store_.get());
  if (client == nullptr || instance.empty()) return;
  const absl::Time until = absl::Now() + timeout;
  const std::string key = Key("store_instance");
  // A store that stops has no key to wait for: it is asked every 10 ms,
  // bounded.
  while (absl::Now() < until) {
    auto v = client->TryGet(key, absl::Milliseconds(200));
    if (!v.ok() || *v != instance) return;  // gone, or a new store
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// The job's retired ranks are one key, "retired": their ranks,
// comma-separated, each added by a CompareSet (no entry is ever half
// written, whoever dies when).
absl::Status Rendezvous::Retire(int peer) const {
  for (const char* barrier : {"shutdown/enter", "shutdown/drained"}) {
    RETURN_IF_ERROR(store::ArriveFor(*store_, Key(barrier), peer));
  }
  // Rank 0 keeps its store until every rank left (Teardown).
  RETURN_IF_ERROR(store_->Set(absl::StrCat(ns_, "shutdown/left/", peer), "1"));
  const std::string key = Key("retired");
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

absl::StatusOr<std::vector<int>> Rendezvous::Retired() const {
  absl::StatusOr<std::string> held = store_->Get(Key("retired"), absl::ZeroDuration());
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
