// The rendezvous' store-key protocol (rpc/internal/rendezvous.h), without an
// agent: threads of this process act as the workers of a job on one
// store::MemoryStore, and each step's values and errors are checked.
#include "rpc/internal/rendezvous.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "store/memory_store.h"

namespace baton::rpc::internal {
namespace {

AgentOptions Options(int rank, int world_size, const std::string& name = "") {
  AgentOptions o;
  o.name = name.empty() ? absl::StrCat("w", rank) : name;
  o.rank = rank;
  o.world_size = world_size;
  o.max_ranks = 16;
  o.timeouts.init = absl::Seconds(20);
  o.timeouts.shutdown = absl::Seconds(20);
  return o;
}

proto::WorkerRecord Record(int rank, int64_t incarnation) {
  proto::WorkerRecord r;
  r.set_name(absl::StrCat("w", rank));
  r.set_address(absl::StrCat("10.0.0.", rank, ":", 5000 + incarnation));
  r.set_incarnation(incarnation);
  return r;
}

// Runs `body(rank)` on one thread per rank and joins them.
template <typename Body>
void OnEveryRank(int world_size, Body body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) threads.emplace_back([&body, r] { body(r); });
  for (auto& t : threads) t.join();
}

// One Rendezvous per rank of a `world_size` job on `store`, each past
// TakeRound (the first round of each).
std::vector<std::unique_ptr<Rendezvous>> RanksInOneRound(
    const std::shared_ptr<store::MemoryStore>& store, int world_size) {
  std::vector<std::unique_ptr<Rendezvous>> ranks;
  for (int r = 0; r < world_size; ++r) {
    ranks.push_back(std::make_unique<Rendezvous>(store, Options(r, world_size)));
    EXPECT_TRUE(ranks.back()->TakeRound(/*rejoin=*/false).ok()) << "rank " << r;
  }
  return ranks;
}

TEST(Rendezvous, WorkersTakeOneRoundAndEachItsOwnIncarnationAndClaim) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kWorld = 2;
  std::vector<absl::StatusOr<Rendezvous::Round>> rounds(kWorld, absl::UnknownError("not run"));
  std::vector<absl::StatusOr<std::string>> claims(kWorld, absl::UnknownError("not run"));
  OnEveryRank(kWorld, [&](int rank) {
    Rendezvous rv(store, Options(rank, kWorld));
    rounds[rank] = rv.TakeRound(/*rejoin=*/false);
    if (rounds[rank].ok()) claims[rank] = rv.ClaimRank(/*rejoin=*/false);
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(rounds[r].ok()) << rounds[r].status();
    EXPECT_EQ(rounds[r]->ns, "baton/r1/");
    EXPECT_EQ(rounds[r]->incarnation, 1);
    EXPECT_FALSE(rounds[r]->rejoin);
    ASSERT_TRUE(claims[r].ok()) << claims[r].status();
    EXPECT_EQ(store->Get(absl::StrCat("baton/r1/rank_claim/", r), absl::ZeroDuration()).value(),
              *claims[r]);
  }
  EXPECT_NE(*claims[0], *claims[1]);
  EXPECT_EQ(store->Get("baton/group_kind", absl::ZeroDuration()).value(), "static");

  // A second init of rank 0 is a new round; a restarted rank 1 rejoins its
  // predecessor's, as the next incarnation, and takes over the claim.
  Rendezvous again(store, Options(0, kWorld));
  absl::StatusOr<Rendezvous::Round> next = again.TakeRound(/*rejoin=*/false);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->ns, "baton/r2/");
  EXPECT_EQ(next->incarnation, 1);
  Rendezvous restarted(store, Options(1, kWorld));
  absl::StatusOr<Rendezvous::Round> rejoined = restarted.TakeRound(/*rejoin=*/true);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ(rejoined->ns, "baton/r1/");
  EXPECT_EQ(rejoined->incarnation, 2);
  EXPECT_TRUE(rejoined->rejoin);
  EXPECT_EQ(restarted.ns(), "baton/r1/");
  absl::StatusOr<std::string> taken = restarted.ClaimRank(/*rejoin=*/true);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_NE(*taken, *claims[1]);
}

TEST(Rendezvous, P5_ARejoinOfARankThatNeverTookARoundIsItsFirstStart) {
  auto store = std::make_shared<store::MemoryStore>();
  Rendezvous rv(store, Options(3, 4));
  absl::StatusOr<Rendezvous::Round> round = rv.TakeRound(/*rejoin=*/true);
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_FALSE(round->rejoin);
  EXPECT_EQ(round->ns, "baton/r1/");
  EXPECT_EQ(round->incarnation, 1);
}

TEST(Rendezvous, ASecondClaimOfAHeldRankFailsNamingIt) {
  auto store = std::make_shared<store::MemoryStore>();
  Rendezvous first(store, Options(3, 0, "a"));
  Rendezvous second(store, Options(3, 0, "b"));
  ASSERT_TRUE(first.EnterGroup().ok());
  ASSERT_TRUE(second.EnterGroup().ok());
  absl::StatusOr<std::string> held = first.ClaimRank(/*rejoin=*/false);
  ASSERT_TRUE(held.ok()) << held.status();
  absl::StatusOr<std::string> again = second.ClaimRank(/*rejoin=*/false);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_TRUE(absl::StrContains(again.status().message(), "rank 3 is already taken"))
      << again.status();
  // The holder keeps it.
  EXPECT_EQ(store->Get("baton/group/rank_claim/3", absl::ZeroDuration()).value(), *held);
}

TEST(Rendezvous, M4_FixedAndDynamicWorkersNeverShareAStore) {
  auto store = std::make_shared<store::MemoryStore>();
  Rendezvous fixed(store, Options(0, 2));
  ASSERT_TRUE(fixed.TakeRound(/*rejoin=*/false).ok());
  Rendezvous dynamic(store, Options(1, 0));
  const absl::Status s = dynamic.EnterGroup();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), kMixedGroups)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "the store's is static")) << s;
  // Not counted in a group it never entered.
  EXPECT_FALSE(store->Get("baton/group/live", absl::ZeroDuration()).ok());
}

TEST(Rendezvous, TheTokenAndTheStoreInstanceAreRankZerosForEveryRank) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kWorld = 3;
  std::vector<std::string> tokens(kWorld), instances(kWorld), external(kWorld);
  std::vector<absl::Status> errors(kWorld);
  OnEveryRank(kWorld, [&](int rank) {
    Rendezvous rv(store, Options(rank, kWorld));
    absl::Status s = rv.TakeRound(/*rejoin=*/false).status();
    absl::StatusOr<std::string> token = rv.AgreeOnToken();
    absl::StatusOr<std::string> instance = rv.ShareStoreInstance(/*external_store=*/false);
    if (s.ok() && !token.ok()) s = token.status();
    if (s.ok() && !instance.ok()) s = instance.status();
    errors[rank] = s;
    if (!s.ok()) return;
    tokens[rank] = *token;
    instances[rank] = *instance;
    if (rank != 0) external[rank] = rv.ShareStoreInstance(/*external_store=*/true).value_or("?");
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(errors[r].ok()) << errors[r];
    EXPECT_EQ(tokens[r], tokens[0]);
    EXPECT_EQ(instances[r], instances[0]);
  }
  EXPECT_EQ(tokens[0].size(), 32u);
  EXPECT_EQ(instances[0].size(), 16u);
  EXPECT_EQ(store->Get("baton/r1/store_instance", absl::ZeroDuration()).value(), instances[0]);
  EXPECT_EQ(external[1], "");  // an injected or etcd store: no instance to read
}

TEST(Rendezvous, PublishedRecordsAreReadBackByEveryRankPastBothBarriers) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kWorld = 3;
  std::vector<absl::StatusOr<std::vector<proto::WorkerRecord>>> read(kWorld,
                                                                     absl::UnknownError("not run"));
  std::vector<absl::Status> barriers(kWorld);
  OnEveryRank(kWorld, [&](int rank) {
    Rendezvous rv(store, Options(rank, kWorld));
    absl::StatusOr<Rendezvous::Round> round = rv.TakeRound(/*rejoin=*/false);
    absl::Status s = round.status();
    if (s.ok()) s = rv.Publish(Record(rank, round->incarnation));
    if (!s.ok()) {
      read[rank] = s;
      return;
    }
    read[rank] = rv.ReadRecords();
    s = rv.ProbedBarrier();
    if (s.ok()) s = rv.DoneBarrier();
    if (s.ok()) s = rank == 0 ? rv.AwaitOthersPassed() : rv.SayPassed();
    barriers[rank] = s;
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(read[r].ok()) << read[r].status();
    ASSERT_EQ(read[r]->size(), static_cast<size_t>(kWorld));
    for (int p = 0; p < kWorld; ++p) {
      EXPECT_EQ((*read[r])[p].name(), absl::StrCat("w", p));
      EXPECT_EQ((*read[r])[p].address(), Record(p, 1).address());
      EXPECT_EQ((*read[r])[p].incarnation(), 1);
    }
    EXPECT_TRUE(barriers[r].ok()) << barriers[r];
    // P7: the mark a caller waiting for this incarnation waits on.
    EXPECT_EQ(store->Get(absl::StrCat("baton/r1/registered/", r, "/1"), absl::ZeroDuration())
                  .value_or(""),
              "1");
  }
}

TEST(Rendezvous, AReadWithAMissingRankTimesOutByItsDeadlineNamingIt) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kWorld = 3;
  AgentOptions o = Options(0, kWorld);
  o.timeouts.init = absl::Milliseconds(300);
  Rendezvous zero(store, o);
  ASSERT_TRUE(zero.TakeRound(/*rejoin=*/false).ok());
  ASSERT_TRUE(zero.Publish(Record(0, 1)).ok());
  Rendezvous two(store, Options(2, kWorld));
  ASSERT_TRUE(two.TakeRound(/*rejoin=*/false).ok());
  ASSERT_TRUE(two.Publish(Record(2, 1)).ok());

  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<proto::WorkerRecord>> read = zero.ReadRecords();
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDeadlineExceeded) << read.status();
  EXPECT_TRUE(absl::StrContains(read.status().message(), "'baton/r1/worker/1'")) << read.status();
  EXPECT_FALSE(absl::StrContains(read.status().message(), "worker/0")) << read.status();
  EXPECT_FALSE(absl::StrContains(read.status().message(), "worker/2")) << read.status();
  EXPECT_TRUE(absl::StrContains(read.status().message(), "waiting for every worker to register"))
      << read.status();
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(10));

  // The init barrier says which rank did not come, by the same deadline.
  const absl::Status barrier = zero.ProbedBarrier();
  EXPECT_EQ(barrier.code(), absl::StatusCode::kDeadlineExceeded) << barrier;
  EXPECT_TRUE(absl::StrContains(barrier.message(), "missing ranks 1, 2")) << barrier;
}

TEST(Rendezvous, AMalformedRecordIsDataLossNamingItsRank) {
  auto store = std::make_shared<store::MemoryStore>();
  Rendezvous zero(store, Options(0, 2));
  ASSERT_TRUE(zero.TakeRound(/*rejoin=*/false).ok());
  ASSERT_TRUE(zero.Publish(Record(0, 1)).ok());
  proto::WorkerRecord nameless = Record(1, 1);
  nameless.clear_name();
  ASSERT_TRUE(store->Set("baton/r1/worker/1", nameless.SerializeAsString()).ok());
  absl::StatusOr<std::vector<proto::WorkerRecord>> read = zero.ReadRecords();
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_TRUE(absl::StrContains(read.status().message(), "malformed registration of rank 1"))
      << read.status();
}

TEST(Rendezvous, P5_ASuccessorThatRegisteredAgainIsReadAsNewer) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kWorld = 3;
  std::vector<std::unique_ptr<Rendezvous>> ranks = RanksInOneRound(store, kWorld);
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(ranks[r]->Publish(Record(r, 1)).ok());
  absl::StatusOr<std::vector<proto::WorkerRecord>> before = ranks[0]->ReadRecords();
  ASSERT_TRUE(before.ok()) << before.status();
  absl::StatusOr<std::vector<Rendezvous::RankRecord>> none = ranks[0]->ReadSuccessors(*before);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());

  // Rank 2 died and its successor rejoined the round.
  Rendezvous successor(store, Options(2, kWorld));
  absl::StatusOr<Rendezvous::Round> round = successor.TakeRound(/*rejoin=*/true);
  ASSERT_TRUE(round.ok()) << round.status();
  ASSERT_EQ(round->incarnation, 2);
  ASSERT_TRUE(successor.Publish(Record(2, round->incarnation)).ok());
  absl::StatusOr<std::vector<Rendezvous::RankRecord>> newer = ranks[0]->ReadSuccessors(*before);
  ASSERT_TRUE(newer.ok()) << newer.status();
  ASSERT_EQ(newer->size(), 1u);
  EXPECT_EQ((*newer)[0].rank, 2);
  EXPECT_EQ((*newer)[0].record.incarnation(), 2);
  EXPECT_EQ((*newer)[0].record.address(), Record(2, 2).address());
  // Rank 2's own view has no successor of itself.
  absl::StatusOr<std::vector<Rendezvous::RankRecord>> own = successor.ReadSuccessors(*before);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_TRUE(own->empty());
}

TEST(Rendezvous, SameHostLinksAreReadAsPublishedAndNoneIsNone) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kWorld = 3;
  std::vector<std::unique_ptr<Rendezvous>> ranks = RanksInOneRound(store, kWorld);
  proto::SameHostLinks made;
  (*made.mutable_links())[2] = "link-0-2";
  ASSERT_TRUE(ranks[0]->PublishLinks(made).ok());
  ASSERT_TRUE(ranks[1]->PublishLinks(proto::SameHostLinks()).ok());
  EXPECT_EQ(store->Get("baton/r1/shm_links/1", absl::ZeroDuration()).value(), "-");
  // P5: a rejoining rank's "none" does not replace a record already there.
  ASSERT_TRUE(ranks[0]->PublishNoLinks().ok());
  absl::StatusOr<std::vector<proto::SameHostLinks>> links = ranks[2]->ReadLinks({0, 1});
  ASSERT_TRUE(links.ok()) << links.status();
  ASSERT_EQ(links->size(), 2u);
  ASSERT_EQ((*links)[0].links().count(2), 1u);
  EXPECT_EQ((*links)[0].links().at(2), "link-0-2");
  EXPECT_TRUE((*links)[1].links().empty());
  ASSERT_TRUE(store->Set("baton/r1/shm_links/1", "not a record").ok());
  links = ranks[2]->ReadLinks({1});
  EXPECT_EQ(links.status().code(), absl::StatusCode::kDataLoss) << links.status();
  EXPECT_TRUE(absl::StrContains(links.status().message(), "link record of rank 1"))
      << links.status();
}

TEST(Rendezvous, M2_ANameBelongsToOneRankAndARankKeepsItsFirstName) {
  auto store = std::make_shared<store::MemoryStore>();
  Rendezvous one(store, Options(1, 0, "alice"));
  ASSERT_TRUE(one.EnterGroup().ok());
  ASSERT_TRUE(one.ClaimName().ok());

  Rendezvous two(store, Options(2, 0, "alice"));
  ASSERT_TRUE(two.EnterGroup().ok());
  absl::Status s = two.ClaimName();
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "worker name 'alice' is not unique: rank 1")) << s;
  // Its failed claim did not name rank 2: it may join under another name.
  Rendezvous two_again(store, Options(2, 0, "bob"));
  ASSERT_TRUE(two_again.EnterGroup().ok());
  EXPECT_TRUE(two_again.ClaimName().ok());

  Rendezvous renamed(store, Options(1, 0, "carol"));
  ASSERT_TRUE(renamed.EnterGroup().ok());
  s = renamed.ClaimName();
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1 joined this group as 'alice'")) << s;
  // Joining again under its first name is no conflict.
  Rendezvous same(store, Options(1, 0, "alice"));
  ASSERT_TRUE(same.EnterGroup().ok());
  EXPECT_TRUE(same.ClaimName().ok());
}

// What one dynamic member's join leaves, for Release().
struct Joined {
  std::unique_ptr<Rendezvous> rv;
  Rendezvous::Membership membership;
};

Joined Join(const std::shared_ptr<store::Store>& store, int rank) {
  Joined j;
  j.rv = std::make_unique<Rendezvous>(store, Options(rank, 0));
  EXPECT_TRUE(j.rv->EnterGroup().ok());
  j.membership.counted = true;
  j.membership.incarnation = j.rv->TakeIncarnation().value_or(-1);
  j.membership.claim = j.rv->ClaimRank(/*rejoin=*/false).value_or("");
  EXPECT_FALSE(j.membership.claim.empty());
  EXPECT_TRUE(j.rv->Publish(Record(rank, j.membership.incarnation)).ok());
  const int64_t place = j.rv->TakePlace().value_or(0);
  EXPECT_GT(place, 0);
  j.membership.joined = place > 0;
  return j;
}

TEST(Rendezvous, AMemberReadsThoseBeforeItAndAReleasedMembershipIsSeenGone) {
  auto store = std::make_shared<store::MemoryStore>();
  Joined a = Join(store, 4);
  Joined b = Join(store, 7);
  Joined c = Join(store, 2);
  absl::StatusOr<std::vector<Rendezvous::RankRecord>> before = c.rv->ReadMembersBefore(3);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->size(), 2u);
  EXPECT_EQ((*before)[0].rank, 4);
  EXPECT_EQ((*before)[0].record.name(), "w4");
  EXPECT_EQ((*before)[1].rank, 7);
  absl::StatusOr<proto::WorkerRecord> seven = a.rv->ReadMember(7, absl::Seconds(5));
  ASSERT_TRUE(seven.ok()) << seven.status();
  EXPECT_EQ(seven->address(), Record(7, 1).address());
  EXPECT_EQ(store->Add("baton/group/live", 0).value(), 3);

  // b leaves: its record is withdrawn, its claim and count given back.
  b.rv->Release(b.membership, absl::Seconds(5));
  before = c.rv->ReadMembersBefore(3);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->size(), 1u);
  EXPECT_EQ((*before)[0].rank, 4);
  absl::StatusOr<proto::WorkerRecord> gone = a.rv->ReadMember(7, absl::Seconds(5));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable) << gone.status();
  EXPECT_TRUE(absl::StrContains(gone.status().message(), "worker id 7: malformed or withdrawn"))
      << gone.status();
  EXPECT_EQ(store->Add("baton/group/live", 0).value(), 2);
  Joined b_again = Join(store, 7);  // the rank is free again
  EXPECT_EQ(b_again.membership.incarnation, 2);

  // A leaver that withdrew its record is skipped, also before it released;
  // the place of a rank that joined again reads its new record.
  ASSERT_TRUE(a.rv->WithdrawRecord().ok());
  before = c.rv->ReadMembersBefore(3);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->size(), 1u);
  EXPECT_EQ((*before)[0].rank, 7);
  EXPECT_EQ((*before)[0].record.incarnation(), 2);
}

TEST(Rendezvous, TheStoresHostWaitsForEveryMemberToLeaveByItsDeadline) {
  auto store = std::make_shared<store::MemoryStore>();
  Joined host = Join(store, 0);
  Joined member = Join(store, 1);
  host.rv->Release(host.membership, absl::Seconds(5));

  const absl::Time start = absl::Now();
  absl::Status s = host.rv->AwaitMembersGone(absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "1 member(s) of the group still in it")) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));

  absl::Notification waiting;
  absl::Status waited = absl::UnknownError("not run");
  std::thread waiter([&] {
    waiting.Notify();
    waited = host.rv->AwaitMembersGone(absl::Seconds(20));
  });
  waiting.WaitForNotification();
  member.rv->Release(member.membership, absl::Seconds(5));
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_EQ(store->Add("baton/group/live", 0).value(), 0);
}

TEST(Rendezvous, P7_ASuccessorIsAwaitedByItsRegistrationAndItsRecordReadNow) {
  auto store = std::make_shared<store::MemoryStore>();
  Rendezvous w0(store, Options(0, 2));
  Rendezvous w1(store, Options(1, 2));
  ASSERT_TRUE(w0.TakeRound(/*rejoin=*/false).ok());
  ASSERT_TRUE(w1.TakeRound(/*rejoin=*/false).ok());
  ASSERT_TRUE(w1.Publish(Record(1, 1)).ok());
  // Incarnation 2 has not registered: the wait ends at its bound.
  const absl::Status none = w0.AwaitRegistered(1, 2, absl::Milliseconds(50));
  EXPECT_EQ(none.code(), absl::StatusCode::kDeadlineExceeded) << none;
  // It registers while rank 0 waits: the wait returns, and the record read
  // now is the successor's.
  absl::Notification waiting;
  absl::Status awaited = absl::UnknownError("not run");
  std::thread waiter([&] {
    waiting.Notify();
    awaited = w0.AwaitRegistered(1, 2, absl::Seconds(20));
  });
  waiting.WaitForNotification();
  Rendezvous successor(store, Options(1, 2));
  ASSERT_TRUE(successor.TakeRound(/*rejoin=*/true).ok());
  ASSERT_TRUE(successor.Publish(Record(1, 2)).ok());
  waiter.join();
  EXPECT_TRUE(awaited.ok()) << awaited;
  for (bool fail_fast : {false, true}) {
    absl::StatusOr<proto::WorkerRecord> read = w0.ReadRecordNow(1, absl::Seconds(1), fail_fast);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->incarnation(), 2);
    EXPECT_EQ(read->address(), "10.0.0.1:5002");
  }
  ASSERT_TRUE(store->Set("baton/r1/worker/1", "\xff\xff not a record").ok());
  absl::StatusOr<proto::WorkerRecord> bad = w0.ReadRecordNow(1, absl::Seconds(1), false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "worker id 1")) << bad.status();
}

TEST(Rendezvous, ShutdownBarriersWaitForEveryRankAndTheHostForEveryLeaver) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kWorld = 3;
  std::vector<std::unique_ptr<Rendezvous>> rv = RanksInOneRound(store, kWorld);
  // Rank 2 has not entered: the others' barrier ends at its bound, and
  // who arrived is known.
  const absl::Status early = rv[0]->EnterShutdownBarrier(absl::Milliseconds(50));
  EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded) << early;
  EXPECT_TRUE(rv[0]->ArrivedAtShutdown(0));
  EXPECT_FALSE(rv[0]->ArrivedAtShutdown(1));
  EXPECT_FALSE(rv[0]->ArrivedAtShutdown(2));
  std::vector<absl::Status> entered(kWorld, absl::UnknownError("not run"));
  std::vector<absl::Status> drained(kWorld, absl::UnknownError("not run"));
  OnEveryRank(kWorld, [&](int rank) {
    entered[rank] = rv[rank]->EnterShutdownBarrier(absl::Seconds(20));
    drained[rank] = rv[rank]->DrainedBarrier(absl::Seconds(20));
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(entered[r].ok()) << r << ": " << entered[r];
    EXPECT_TRUE(drained[r].ok()) << r << ": " << drained[r];
    EXPECT_TRUE(rv[0]->ArrivedAtShutdown(r));
  }
  // The host waits for every rank's word that it left.
  rv[0]->SayLeft(absl::Seconds(1));
  rv[1]->SayLeft(absl::Seconds(1));
  absl::Notification waiting;
  absl::Time returned;
  std::thread host([&] {
    waiting.Notify();
    rv[0]->AwaitAllLeft(absl::Seconds(20));
    returned = absl::Now();
  });
  waiting.WaitForNotification();
  const absl::Time said = absl::Now();
  rv[2]->SayLeft(absl::Seconds(1));
  host.join();
  EXPECT_GE(returned, said);
  EXPECT_TRUE(store->Get("baton/r1/shutdown/left/2", absl::ZeroDuration()).ok());
}

TEST(Rendezvous, RetiredRanksAreAddedOnceEachAndReadInOrder) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kWorld = 4;
  Rendezvous zero(store, Options(0, kWorld));
  ASSERT_TRUE(zero.TakeRound(/*rejoin=*/false).ok());
  absl::StatusOr<std::vector<int>> retired = zero.Retired();
  ASSERT_TRUE(retired.ok()) << retired.status();
  EXPECT_TRUE(retired->empty());

  // Two workers retire ranks at once, one of them twice.
  std::vector<absl::Status> done(kWorld);
  OnEveryRank(kWorld, [&](int rank) {
    if (rank == 0) return;
    Rendezvous rv(store, Options(rank, kWorld));
    absl::Status s = rv.TakeRound(/*rejoin=*/true).status();  // the same round
    if (s.ok()) s = rv.Retire(rank == 1 ? 3 : 2);
    if (s.ok() && rank == 3) s = rv.Retire(2);
    done[rank] = s;
  });
  for (int r = 1; r < kWorld; ++r) EXPECT_TRUE(done[r].ok()) << done[r];
  retired = zero.Retired();
  ASSERT_TRUE(retired.ok()) << retired.status();
  EXPECT_EQ(*retired, (std::vector<int>{2, 3}));
  EXPECT_EQ(store->Get("baton/r1/shutdown/left/3", absl::ZeroDuration()).value_or(""), "1");
  EXPECT_TRUE(store->Get("baton/r1/shutdown/enter/arrived/2", absl::ZeroDuration()).ok());
  EXPECT_TRUE(store->Get("baton/r1/shutdown/drained/arrived/3", absl::ZeroDuration()).ok());
}

}  // namespace
}  // namespace baton::rpc::internal
