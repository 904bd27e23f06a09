// What the agent knows of one peer (rpc/internal/peer.h): the rules of
// docs/peer_failures.md that the agent builds on, one peer at a time.
#include "rpc/internal/peer.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace baton::rpc::internal {
namespace {

TEST(Peer, P2_AnIncarnationIsReportedDeadOnceAndAnEarlierOneNeverAgain) {
  Peer p;
  p.Reset(3);
  EXPECT_FALSE(p.known_dead());
  EXPECT_TRUE(p.MarkDead(3));
  EXPECT_TRUE(p.known_dead());
  EXPECT_FALSE(p.MarkDead(3));
  EXPECT_FALSE(p.MarkDead(2));
  EXPECT_EQ(p.incarnations().dead, 3);
}

TEST(Peer, P1_ANewerIncarnationReplacesTheLatestAndMarksTheAddressStaleUntilFollowed) {
  Peer p;
  p.Reset(1);
  EXPECT_EQ(p.NoteIncarnation(1), Peer::Note::kSame);
  EXPECT_FALSE(p.address_stale());
  EXPECT_EQ(p.NoteIncarnation(2), Peer::Note::kNewer);
  EXPECT_TRUE(p.address_stale());
  EXPECT_EQ(p.NoteIncarnation(1), Peer::Note::kOlder);  // a replaced process
  EXPECT_EQ(p.incarnations().latest, 2);
  // The store still holds incarnation 1's registration: nothing to follow,
  // and the address is not stale, the transport has what the store has.
  EXPECT_FALSE(p.ShouldFollow(1));
  EXPECT_FALSE(p.address_stale());
  EXPECT_EQ(p.NoteIncarnation(3), Peer::Note::kNewer);
  EXPECT_TRUE(p.ShouldFollow(3));
  p.Followed(3);
  EXPECT_EQ(p.incarnations().address, 3);
  EXPECT_FALSE(p.ShouldFollow(3));
  EXPECT_FALSE(p.address_stale());
}

TEST(Peer, OneProbeAtATimeAndNoneForAnIncarnationReportedDead) {
  Peer p;
  p.Reset(4);
  int64_t incarnation = 0;
  EXPECT_EQ(p.Suspect(&incarnation), Peer::Suspicion::kProbeNow);
  EXPECT_EQ(incarnation, 4);
  EXPECT_TRUE(p.probing());
  EXPECT_EQ(p.Suspect(&incarnation), Peer::Suspicion::kProbing);
  EXPECT_EQ(p.EndProbe(absl::OkStatus(), absl::Now()), absl::InfiniteFuture());
  EXPECT_FALSE(p.probing());
  ASSERT_TRUE(p.MarkDead(4));
  EXPECT_EQ(p.Suspect(&incarnation), Peer::Suspicion::kReportedAlready);
  EXPECT_FALSE(p.probing());
}

TEST(Peer, SilenceIsCountedFromTheFirstUnansweredProbeUntilAnAnswer) {
  Peer p;
  p.Reset(1);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const absl::Status silence = absl::DeadlineExceededError("no answer");
  int64_t incarnation = 0;
  ASSERT_EQ(p.Suspect(&incarnation), Peer::Suspicion::kProbeNow);
  EXPECT_EQ(p.EndProbe(silence, t0), t0);
  ASSERT_EQ(p.Suspect(&incarnation), Peer::Suspicion::kProbeNow);
  EXPECT_EQ(p.EndProbe(silence, t0 + absl::Seconds(1)), t0);  // since the first
  // A refusal is no silence: it neither starts nor ends the count.
  ASSERT_EQ(p.Suspect(&incarnation), Peer::Suspicion::kProbeNow);
  EXPECT_EQ(p.EndProbe(absl::UnavailableError("connection refused"), t0 + absl::Seconds(2)),
            absl::InfiniteFuture());
  ASSERT_EQ(p.Suspect(&incarnation), Peer::Suspicion::kProbeNow);
  EXPECT_EQ(p.EndProbe(silence, t0 + absl::Seconds(3)), t0);
  // An answer ends it; the next silence counts anew.
  ASSERT_EQ(p.Suspect(&incarnation), Peer::Suspicion::kProbeNow);
  EXPECT_EQ(p.EndProbe(absl::OkStatus(), t0 + absl::Seconds(4)), absl::InfiniteFuture());
  ASSERT_EQ(p.Suspect(&incarnation), Peer::Suspicion::kProbeNow);
  EXPECT_EQ(p.EndProbe(silence, t0 + absl::Seconds(5)), t0 + absl::Seconds(5));
}

TEST(Peer, P8_QueuedCallsAreSentByOneTaskAtATime) {
  Peer p;
  p.Reset(1);
  EXPECT_TRUE(p.QueueRedelivery(10));   // start a task
  EXPECT_FALSE(p.QueueRedelivery(11));  // the running task takes it
  EXPECT_EQ(p.TakeRedeliveries(), (std::vector<uint64_t>{10, 11}));
  EXPECT_FALSE(p.QueueRedelivery(12));  // still running until it finds none
  EXPECT_EQ(p.TakeRedeliveries(), (std::vector<uint64_t>{12}));
  EXPECT_TRUE(p.TakeRedeliveries().empty());  // the task ends
  EXPECT_TRUE(p.QueueRedelivery(13));         // so the next starts another
  EXPECT_EQ(p.DropRedeliveries(), (std::vector<uint64_t>{13}));
  EXPECT_TRUE(p.QueueRedelivery(14));
}

TEST(Peer, ResetForgetsWhatWasKnown) {
  Peer p;
  p.Reset(2);
  p.SetIdentity("key", 2);
  ASSERT_TRUE(p.MarkDead(2));
  ASSERT_TRUE(p.QueueRedelivery(1));
  ASSERT_TRUE(p.BeginRefresh(absl::Now()));
  p.Reset(5);
  EXPECT_EQ(p.incarnations().latest, 5);
  EXPECT_EQ(p.incarnations().dead, 0);
  EXPECT_EQ(p.incarnations().address, 5);
  EXPECT_EQ(p.KeyOf(2), "");
  EXPECT_TRUE(p.QueueRedelivery(2));
  EXPECT_TRUE(p.BeginRefresh(absl::Now()));
}

TEST(Peer, AnIdentityKeyIsTheOneOfItsIncarnationOnly) {
  Peer p;
  p.Reset(1);
  p.SetIdentity("k1", 1);
  EXPECT_EQ(p.KeyOf(1), "k1");
  EXPECT_EQ(p.KeyOf(2), "");
  EXPECT_EQ(p.identity(), (std::pair<std::string, int64_t>{"k1", 1}));
}

TEST(Peer, ARegistrationIsReadAtMostOnceAtATimeAndOncePer500Ms) {
  Peer p;
  p.Reset(1);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(p.BeginRefresh(t0));
  EXPECT_FALSE(p.BeginRefresh(t0 + absl::Seconds(1)));  // one in flight
  p.EndRefresh();
  EXPECT_FALSE(p.BeginRefresh(t0 + absl::Milliseconds(499)));
  EXPECT_TRUE(p.BeginRefresh(t0 + absl::Milliseconds(500)));
  p.EndRefresh();
  // A newer incarnation's address is in the store: read it at once.
  ASSERT_EQ(p.NoteIncarnation(2), Peer::Note::kNewer);
  EXPECT_TRUE(p.BeginRefresh(t0 + absl::Milliseconds(501)));
}

}  // namespace
}  // namespace baton::rpc::internal
