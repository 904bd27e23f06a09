// What the agent knows of one peer (rpc/internal/peer.h): the rules of
// docs/peer_failures.md that the agent builds on, one peer at a time.
#include "rpc/internal/peer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "rpc/internal/wire.h"

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

// A pending call to `p` whose request is kept (it may go again, P8).
void AddResendable(Peer& p, uint64_t id) {
  PendingCall call;
  call.function = absl::StrCat("f", id);
  call.resend = std::make_shared<const Frame>();
  ASSERT_TRUE(p.AddCall(id, call));
}

TEST(Peer, P8_QueuedCallsAreSentByOneTaskAtATime) {
  Peer p;
  p.Reset(1);
  for (uint64_t id = 10; id <= 14; ++id) AddResendable(p, id);
  using R = Peer::Redelivery;
  EXPECT_EQ(p.QueueRedelivery(10, 4, true), R::kStartTask);
  EXPECT_EQ(p.QueueRedelivery(11, 4, true), R::kQueued);  // the running task takes it
  EXPECT_EQ(p.TakeRedeliveries(), (std::vector<uint64_t>{10, 11}));
  EXPECT_EQ(p.QueueRedelivery(12, 4, true), R::kQueued);  // still running until it finds none
  EXPECT_EQ(p.TakeRedeliveries(), (std::vector<uint64_t>{12}));
  EXPECT_TRUE(p.TakeRedeliveries().empty());                 // the task ends
  EXPECT_EQ(p.QueueRedelivery(13, 4, true), R::kStartTask);  // so the next starts another
  EXPECT_EQ(p.DropRedeliveries(), (std::vector<uint64_t>{13}));
  EXPECT_EQ(p.QueueRedelivery(14, 4, true), R::kStartTask);
}

TEST(Peer, P8_OnlyAPendingCallWithItsRequestKeptAndSendsLeftGoesAgain) {
  Peer p;
  p.Reset(1);
  using R = Peer::Redelivery;
  EXPECT_EQ(p.QueueRedelivery(1, 4, true), R::kGone);  // completed meanwhile
  PendingCall kept_none;
  ASSERT_TRUE(p.AddCall(2, kept_none));
  EXPECT_EQ(p.QueueRedelivery(2, 4, true), R::kRefused);  // no request kept
  AddResendable(p, 3);
  ASSERT_TRUE(p.WithCall(3, [](PendingCall& c) { c.deliveries = 4; }));
  EXPECT_EQ(p.QueueRedelivery(3, 4, true), R::kRefused);  // its sends used up
  EXPECT_TRUE(p.TakeRedeliveries().empty());              // none of them was queued
  AddResendable(p, 4);
  ASSERT_TRUE(p.WithCall(4, [](PendingCall& c) { c.stream_id = 7; }));
  EXPECT_EQ(p.QueueRedelivery(4, 4, true), R::kStartTask);
  // Queued, it awaits redelivery: the end of the stream it left on no
  // longer concerns it (calls 2 and 3, never sent, may be on any stream).
  for (const auto& [id, function] : p.CallsOnStream(7)) EXPECT_NE(id, 4u) << function;
  EXPECT_EQ(p.CallsOnStream(7).size(), 2u);
}

TEST(Peer, ACallIsTakenOnceAndItsStreamsEndConcernsIt) {
  Peer p;
  p.Reset(1);
  PendingCall a;
  a.function = "a";
  a.stream_id = 5;
  PendingCall b;
  b.function = "b";  // sent, its stream not recorded yet
  PendingCall c;
  c.function = "c";
  c.stream_id = 6;
  ASSERT_TRUE(p.AddCall(1, a));
  ASSERT_TRUE(p.AddCall(2, b));
  ASSERT_TRUE(p.AddCall(3, c));
  EXPECT_EQ(p.pending_calls(), 3u);
  auto on5 = p.CallsOnStream(5);
  std::sort(on5.begin(), on5.end());
  EXPECT_EQ(on5, (std::vector<std::pair<uint64_t, std::string>>{{1, "a"}, {2, "b"}}));
  std::optional<PendingCall> taken = p.TakeCall(1);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->function, "a");
  EXPECT_FALSE(p.TakeCall(1).has_value());  // a reply and a timeout: one wins
  EXPECT_FALSE(p.WithCall(1, [](PendingCall&) { ADD_FAILURE() << "ran on a taken call"; }));
  EXPECT_EQ(p.pending_calls(), 2u);
}

TEST(Peer, AClosedTableRefusesCallsAndGivesBackThosePending) {
  Peer p;
  p.Reset(1);
  PendingCall a;
  a.function = "a";
  ASSERT_TRUE(p.AddCall(1, a));
  const auto closed = p.CloseCalls();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].first, 1u);
  EXPECT_EQ(closed[0].second.function, "a");
  EXPECT_EQ(p.pending_calls(), 0u);
  PendingCall late;
  late.function = "late";
  EXPECT_FALSE(p.AddCall(2, late));
  EXPECT_EQ(late.function, "late");  // refused, left as it was
  EXPECT_EQ(p.pending_calls(), 0u);
}

TEST(Peer, G8_ATimedOutCallsUndoIsKeptForALateAnswerAndBounded) {
  Peer p;
  p.Reset(1);
  int undone = 0;
  PendingCall a;
  a.undo.push_back([&undone] { ++undone; });
  ASSERT_TRUE(p.AddCall(1, a));
  std::optional<PendingCall> taken = p.TakeCall(1, /*keep_undo=*/true);
  ASSERT_TRUE(taken.has_value());
  EXPECT_TRUE(taken->undo.empty());  // kept, not the taker's to run
  auto undo = p.TakeLateUndo(1);
  ASSERT_EQ(undo.size(), 1u);
  undo[0]();
  EXPECT_EQ(undone, 1);
  EXPECT_TRUE(p.TakeLateUndo(1).empty());  // once

  // Only the newest kMaxLateUndo are kept.
  const uint64_t n = Peer::kMaxLateUndo + 1;
  for (uint64_t id = 100; id < 100 + n; ++id) {
    PendingCall c;
    c.undo.push_back([] {});
    ASSERT_TRUE(p.AddCall(id, c));
    ASSERT_TRUE(p.TakeCall(id, /*keep_undo=*/true).has_value());
  }
  EXPECT_TRUE(p.TakeLateUndo(100).empty());  // the oldest was dropped
  EXPECT_EQ(p.TakeLateUndo(101).size(), 1u);
  EXPECT_EQ(p.TakeLateUndo(100 + n - 1).size(), 1u);
}

// A call queued to go again because it is known never read will get no
// late answer: its undo stays with it (the agent runs it when it fails),
// while an idempotent call that went again after silence may have been
// read, and its undo waits for the callee's word as any timed-out call's.
TEST(Peer, G8_AKnownUnreadCallKeepsItsUndoAndAMaybeReadOneWaitsForAWord) {
  Peer p;
  p.Reset(1);
  for (uint64_t id : {1, 2}) {
    PendingCall c;
    c.resend = std::make_shared<const Frame>();
    c.undo.push_back([] {});
    ASSERT_TRUE(p.AddCall(id, c));
  }
  ASSERT_EQ(p.QueueRedelivery(1, 4, /*unread=*/true), Peer::Redelivery::kStartTask);
  ASSERT_EQ(p.QueueRedelivery(2, 4, /*unread=*/false), Peer::Redelivery::kQueued);
  ASSERT_TRUE(p.WithCall(1, [](PendingCall& c) { EXPECT_TRUE(c.known_unread()); }));
  ASSERT_TRUE(p.WithCall(2, [](PendingCall& c) { EXPECT_FALSE(c.known_unread()); }));
  std::optional<PendingCall> unread = p.TakeCall(1, /*keep_undo=*/true);
  ASSERT_TRUE(unread.has_value());
  EXPECT_EQ(unread->undo.size(), 1u);
  EXPECT_TRUE(p.TakeLateUndo(1).empty());
  std::optional<PendingCall> maybe_read = p.TakeCall(2, /*keep_undo=*/true);
  ASSERT_TRUE(maybe_read.has_value());
  EXPECT_TRUE(maybe_read->undo.empty());
  EXPECT_EQ(p.TakeLateUndo(2).size(), 1u);
  // Sent again, it is no longer awaiting redelivery: a timeout now is an
  // ordinary one.
  PendingCall c;
  c.resend = std::make_shared<const Frame>();
  ASSERT_TRUE(p.AddCall(3, c));
  ASSERT_EQ(p.QueueRedelivery(3, 4, /*unread=*/true), Peer::Redelivery::kQueued);
  ASSERT_TRUE(p.WithCall(3, [](PendingCall& call) { call.stream_id = 0; }));
  ASSERT_TRUE(p.WithCall(3, [](PendingCall& call) { EXPECT_FALSE(call.known_unread()); }));
}

TEST(Peer, ResetForgetsWhatWasKnownButNotTheCallsInFlight) {
  Peer p;
  p.Reset(2);
  p.SetIdentity("key", 2);
  ASSERT_TRUE(p.MarkDead(2));
  AddResendable(p, 1);
  ASSERT_EQ(p.QueueRedelivery(1, 4, true), Peer::Redelivery::kStartTask);
  ASSERT_TRUE(p.BeginRefresh(absl::Now()));
  p.Reset(5);
  EXPECT_EQ(p.incarnations().latest, 5);
  EXPECT_EQ(p.incarnations().dead, 0);
  EXPECT_EQ(p.incarnations().address, 5);
  EXPECT_EQ(p.KeyOf(2), "");
  EXPECT_TRUE(p.TakeRedeliveries().empty());
  EXPECT_TRUE(p.BeginRefresh(absl::Now()));
  // The call still awaits its reply (or its failure): it is the agent's
  // to complete, whatever is learned of the rank.
  EXPECT_EQ(p.pending_calls(), 1u);
  EXPECT_EQ(p.QueueRedelivery(1, 4, true), Peer::Redelivery::kStartTask);
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
