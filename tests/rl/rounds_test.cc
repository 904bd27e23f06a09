// rl::Rounds (rl/rounds.h), the agent's protocol bookkeeping, driven
// directly on a fake clock: joins, the first round's wait, rounds that end
// and start, drops at the deadline, leaves, stopping, counting and bad
// input. Every test asserts the replies, log lines and counts a call
// produced, in order; time moves only when a test moves it.
#include "rl/rounds.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "testing/fake_clock.h"

namespace baton::rl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Effects = Rounds::Effects;
using Phase = Rounds::Phase;

const std::vector<float> kObs = {0.01f, 0, 0, 0};

// "1 round 0 of 3" (a join reply), "1 round 0 of 3 stop", or "1 ABORTED".
std::vector<std::string> Joins(const Effects& e) {
  std::vector<std::string> out;
  for (const auto& [session, r] : e.join_replies) {
    out.push_back(r.ok() ? absl::StrCat(session, " round ", r->round, " of ", r->steps_per_round,
                                        r->stop ? " stop" : "")
                         : absl::StrCat(session, " ", absl::StatusCodeToString(r.status().code())));
  }
  return out;
}

// "1 next 1" (a finish reply), "1 next 1 stop", or "1 ABORTED".
std::vector<std::string> Finishes(const Effects& e) {
  std::vector<std::string> out;
  for (const auto& [session, r] : e.finish_replies) {
    out.push_back(r.ok() ? absl::StrCat(session, " next ", r->next_round, r->stop ? " stop" : "")
                         : absl::StrCat(session, " ", absl::StatusCodeToString(r.status().code())));
  }
  return out;
}

bool Nothing(const Effects& e) {
  return e.join_replies.empty() && e.finish_replies.empty() && e.gone.empty() && e.log.empty() &&
         !e.round_started && !e.round_ended;
}

class RoundsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Rounds> Make(Rounds::Options o) {
    o.clock = &clock_;
    auto r = Rounds::Create(o);
    EXPECT_TRUE(r.ok()) << r.status();
    return std::move(*r);
  }
  // Steps [from, to) of `round`, each accepted and then answered.
  static void Play(Rounds& r, int64_t session, int64_t round, int64_t from, int64_t to) {
    for (int64_t t = from; t < to; ++t) {
      ASSERT_TRUE(r.Act(session, round, t, kObs).ok()) << "step " << t;
      r.Answered(session, round);
    }
  }

  const absl::Time t0_ = absl::UnixEpoch() + absl::Hours(1);
  baton::testing::FakeClock clock_{t0_};
};

Rounds::Options Opts(int64_t steps, int min_observers) {
  Rounds::Options o;
  o.steps_per_round = steps;
  o.min_observers = min_observers;
  o.first_round_wait = absl::Seconds(60);
  o.observer_timeout = absl::Seconds(5);
  return o;
}

TEST_F(RoundsTest, R5_JoinsWaitForMinObserversThenPlayRoundZeroTogether) {
  auto r = Make(Opts(3, 2));
  Effects e1;
  EXPECT_EQ(r->Join("a", &e1), 1);
  EXPECT_THAT(e1.log, ElementsAre("observer 'a' (session 1) joined"));
  EXPECT_THAT(Joins(e1), IsEmpty());
  EXPECT_FALSE(e1.round_started);
  EXPECT_EQ(r->phase(), Phase::kIdle);
  EXPECT_EQ(r->NextDeadline(), t0_ + absl::Seconds(60));  // the first round's wait

  clock_.Advance(absl::Seconds(1));
  Effects e2;
  EXPECT_EQ(r->Join("b", &e2), 2);
  EXPECT_THAT(e2.log, ElementsAre("observer 'b' (session 2) joined"));
  EXPECT_THAT(Joins(e2), ElementsAre("1 round 0 of 3", "2 round 0 of 3"));
  EXPECT_TRUE(e2.round_started);
  EXPECT_FALSE(e2.round_ended);
  EXPECT_EQ(r->phase(), Phase::kPlaying);
  EXPECT_EQ(r->round(), 0);
  EXPECT_EQ(r->playing(), 2);
  // Both are awaited from the round's start.
  EXPECT_EQ(r->NextDeadline(), clock_.Now() + absl::Seconds(5));

  clock_.Advance(absl::Seconds(2));
  const Rounds::Stats s = r->stats();
  EXPECT_EQ(s.joined, 2);
  EXPECT_EQ(s.alive, 2);
  EXPECT_EQ(s.rounds, 0);
  EXPECT_DOUBLE_EQ(s.seconds, 2.0);  // since the first round began
}

TEST_F(RoundsTest, R5_TheFirstRoundStartsWhenItsWaitEndsWithWhoeverWaits) {
  auto r = Make(Opts(3, 3));
  Effects e;
  r->Join("a", &e);
  clock_.Advance(absl::Seconds(30));
  r->Join("b", &e);
  EXPECT_THAT(Joins(e), IsEmpty());
  EXPECT_EQ(r->NextDeadline(), t0_ + absl::Seconds(60));  // from the first join

  clock_.AdvanceTo(t0_ + absl::Seconds(60) - absl::Nanoseconds(1));
  Effects early;
  r->Tick(&early);
  EXPECT_TRUE(Nothing(early));
  EXPECT_EQ(r->phase(), Phase::kIdle);

  clock_.Advance(absl::Nanoseconds(1));
  Effects due;
  r->Tick(&due);
  EXPECT_THAT(due.log,
              ElementsAre("starting the first round with 2 of 3 observers after waiting 1m"));
  EXPECT_THAT(Joins(due), ElementsAre("1 round 0 of 3", "2 round 0 of 3"));
  EXPECT_TRUE(due.round_started);
  EXPECT_EQ(r->NextDeadline(), clock_.Now() + absl::Seconds(5));
  // Once started, a join waits for the next round and sets no deadline.
  Effects late;
  r->Join("c", &late);
  EXPECT_THAT(Joins(late), IsEmpty());
  EXPECT_EQ(r->NextDeadline(), clock_.Now() + absl::Seconds(5));
}

TEST_F(RoundsTest, R5_AJoinerThatLeavesIsToldAndTheFirstRoundsWaitRestarts) {
  auto r = Make(Opts(3, 2));
  Effects e;
  r->Join("a", &e);
  Effects left;
  ASSERT_TRUE(r->Leave(1, &left).ok());
  EXPECT_THAT(Joins(left), ElementsAre("1 ABORTED"));
  EXPECT_THAT(left.gone, ElementsAre(1));
  EXPECT_THAT(left.log, ElementsAre("observer 'a' (session 1) left"));
  EXPECT_EQ(left.join_replies[0].second.status().message(),
            "rl agent: observer 'a' (session 1) left");
  EXPECT_EQ(r->NextDeadline(), absl::InfiniteFuture());
  clock_.Advance(absl::Seconds(10));
  r->Join("b", &e);
  EXPECT_EQ(r->NextDeadline(), clock_.Now() + absl::Seconds(60));
}

TEST_F(RoundsTest, R1_ARoundEndsWhenEveryMemberFinishedAndTheUpdateStartsTheNext) {
  auto r = Make(Opts(3, 2));
  Effects e;
  r->Join("a", &e);
  r->Join("b", &e);
  Effects joined;
  EXPECT_EQ(r->Join("c", &joined), 3);  // during round 0: waits for round 1
  EXPECT_THAT(Joins(joined), IsEmpty());

  Play(*r, 1, 0, 0, 3);
  Effects fa;
  ASSERT_TRUE(r->Finish(1, 0, {1, 1, 1}, {2}, &fa).ok());
  EXPECT_TRUE(Nothing(fa));  // b still plays
  EXPECT_EQ(r->playing(), 1);
  Play(*r, 2, 0, 0, 3);
  Effects fb;
  ASSERT_TRUE(r->Finish(2, 0, {1, 1, 1}, {}, &fb).ok());
  EXPECT_TRUE(fb.round_ended);
  EXPECT_THAT(Finishes(fb), IsEmpty());  // the replies come with the update
  EXPECT_EQ(r->phase(), Phase::kUpdating);

  // Members waiting for the update and joiners are not awaited: however
  // long the update takes, nobody is dropped.
  EXPECT_EQ(r->NextDeadline(), absl::InfiniteFuture());
  clock_.Advance(absl::Hours(1));
  Effects tick;
  r->Tick(&tick);
  EXPECT_TRUE(Nothing(tick));

  const std::vector<Rounds::Played> played = r->BeginUpdate();
  ASSERT_EQ(played.size(), 2u);
  EXPECT_EQ(played[0].session, 1);
  EXPECT_EQ(played[0].episode_ends, (std::vector<int32_t>{2}));
  EXPECT_EQ(played[1].session, 2);
  EXPECT_EQ(played[1].rewards, (std::vector<float>{1, 1, 1}));

  Effects next;
  const Rounds::RoundEnd end = r->EndUpdate(absl::OkStatus(), &next);
  EXPECT_EQ(end.round, 0);
  EXPECT_EQ(end.members, 2);
  EXPECT_EQ(end.episodes, 1);  // a's episode; b's was cut by the round's end
  EXPECT_DOUBLE_EQ(end.running_reward, 0.05 * 3 + 0.95 * RunningReward::kStart);
  EXPECT_EQ(end.steps, 6);
  EXPECT_DOUBLE_EQ(end.seconds, 3600.0);
  EXPECT_EQ(end.alive, 3);
  EXPECT_EQ(end.solved_at, -1);
  EXPECT_THAT(Finishes(next), ElementsAre("1 next 1", "2 next 1"));
  EXPECT_THAT(Joins(next), ElementsAre("3 round 1 of 3"));
  EXPECT_TRUE(next.round_started);
  EXPECT_THAT(next.log, IsEmpty());
  EXPECT_EQ(r->phase(), Phase::kPlaying);
  EXPECT_EQ(r->round(), 1);
  EXPECT_EQ(r->playing(), 3);
  const Rounds::Stats s = r->stats();
  EXPECT_EQ(s.rounds, 1);
  EXPECT_THAT(s.episodes_by_session, ElementsAre(std::pair<int64_t, int64_t>{1, 1}));
  // Round 1 is played from step 0; round 0 is over.
  EXPECT_EQ(r->Act(1, 0, 0, kObs).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(r->Act(1, 1, 0, kObs).ok());
}

TEST_F(RoundsTest, R4_ASilentMemberIsDroppedAtItsDeadlineAndTheRoundGoesOn) {
  auto r = Make(Opts(4, 2));
  Effects e;
  r->Join("a", &e);
  r->Join("b", &e);
  clock_.AdvanceTo(t0_ + absl::Seconds(1));
  Play(*r, 2, 0, 0, 2);                                  // b's last word, then silence
  EXPECT_EQ(r->NextDeadline(), t0_ + absl::Seconds(5));  // a's, from the round's start
  clock_.AdvanceTo(t0_ + absl::Seconds(2));
  Play(*r, 1, 0, 0, 4);
  Effects fa;
  ASSERT_TRUE(r->Finish(1, 0, {1, 1, 1, 1}, {3}, &fa).ok());
  EXPECT_FALSE(fa.round_ended);
  // a waits for the update; the round waits for b, until 5 s after its act.
  EXPECT_EQ(r->NextDeadline(), t0_ + absl::Seconds(6));

  clock_.AdvanceTo(t0_ + absl::Seconds(6) - absl::Milliseconds(1));
  Effects early;
  r->Tick(&early);
  EXPECT_TRUE(Nothing(early));

  clock_.AdvanceTo(t0_ + absl::Seconds(6));
  Effects drop;
  r->Tick(&drop);
  EXPECT_THAT(drop.gone, ElementsAre(2));
  EXPECT_THAT(drop.log, ElementsAre("observer 'b' (session 2) was dropped after 5s of silence; "
                                    "its 2 steps of round 0 are discarded"));
  EXPECT_THAT(Joins(drop), IsEmpty());  // b waited for no reply
  EXPECT_THAT(Finishes(drop), IsEmpty());
  EXPECT_TRUE(drop.round_ended);  // the round goes on without it: it ends
  EXPECT_EQ(r->alive(), 1);

  // Its later calls say why.
  absl::Status late = r->Act(2, 0, 2, kObs);
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(late.message(),
            "rl agent: act from session 2, which was dropped after 5s of silence; join again");
  Effects none;
  EXPECT_EQ(r->Finish(2, 0, {1, 1, 1, 1}, {}, &none).code(), absl::StatusCode::kAborted);

  // Only a's steps go into the update.
  const std::vector<Rounds::Played> played = r->BeginUpdate();
  ASSERT_EQ(played.size(), 1u);
  EXPECT_EQ(played[0].session, 1);
  Effects next;
  const Rounds::RoundEnd end = r->EndUpdate(absl::OkStatus(), &next);
  EXPECT_EQ(end.members, 1);
  EXPECT_EQ(end.steps, 4);
  EXPECT_EQ(end.dropped, 1);
  EXPECT_THAT(Finishes(next), ElementsAre("1 next 1"));
  EXPECT_EQ(r->stats().dropped, 1);
  // b joins again as a new session; round 1 runs (with a), so it waits.
  Effects again;
  EXPECT_EQ(r->Join("b", &again), 3);
  EXPECT_THAT(Joins(again), IsEmpty());
}

TEST_F(RoundsTest, R4_EveryActMovesTheMembersDeadline) {
  auto r = Make(Opts(10, 1));
  Effects e;
  r->Join("slow", &e);
  for (int t = 0; t < 10; ++t) {
    clock_.Advance(absl::Seconds(4));  // slow, never silent for 5 s
    Effects tick;
    r->Tick(&tick);
    EXPECT_TRUE(Nothing(tick)) << "step " << t;
    ASSERT_TRUE(r->Act(1, 0, t, kObs).ok());
    r->Answered(1, 0);
    EXPECT_EQ(r->NextDeadline(), clock_.Now() + absl::Seconds(5));
  }
  EXPECT_EQ(r->stats().dropped, 0);
}

TEST_F(RoundsTest, R4_LeaveEndsASessionAtOnce) {
  auto r = Make(Opts(2, 2));
  Effects e;
  r->Join("a", &e);
  r->Join("b", &e);
  Play(*r, 1, 0, 0, 1);
  Effects left;
  ASSERT_TRUE(r->Leave(1, &left).ok());
  EXPECT_THAT(left.gone, ElementsAre(1));
  EXPECT_THAT(left.log,
              ElementsAre("observer 'a' (session 1) left; its 1 steps of round 0 are discarded"));
  EXPECT_FALSE(left.round_ended);  // b still plays
  EXPECT_EQ(r->playing(), 1);
  Effects again;
  EXPECT_TRUE(r->Leave(1, &again).ok());  // idempotent
  EXPECT_TRUE(Nothing(again));
  EXPECT_EQ(r->Leave(99, &again).code(), absl::StatusCode::kNotFound);
  absl::Status act = r->Act(1, 0, 1, kObs);
  EXPECT_EQ(act.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(act.message()), HasSubstr("which left; join again"));

  // The last player leaves: the round ends with nobody's steps.
  Effects last;
  ASSERT_TRUE(r->Leave(2, &last).ok());
  EXPECT_TRUE(last.round_ended);
  EXPECT_TRUE(r->BeginUpdate().empty());
  Effects end_effects;
  const Rounds::RoundEnd end = r->EndUpdate(absl::OkStatus(), &end_effects);
  EXPECT_EQ(end.members, 0);
  EXPECT_EQ(end.alive, 0);
  EXPECT_FALSE(end_effects.round_started);
  EXPECT_EQ(r->phase(), Phase::kIdle);
  EXPECT_EQ(r->stats().left, 2);
  // Training started: a join starts the next round at once.
  Effects joined;
  EXPECT_EQ(r->Join("c", &joined), 3);
  EXPECT_THAT(Joins(joined), ElementsAre("3 round 1 of 2"));
  EXPECT_TRUE(joined.round_started);
}

TEST_F(RoundsTest, R6_StopTellsJoinersAtOncePlayersAtTheirFinishAndLaterJoinsAtOnce) {
  auto r = Make(Opts(2, 1));
  Effects e;
  r->Join("a", &e);  // plays round 0
  r->Join("b", &e);  // waits for round 1
  clock_.Advance(absl::Seconds(1));
  Effects stop;
  r->Stop("enough", &stop);
  EXPECT_THAT(stop.log, ElementsAre("training stops: enough"));
  EXPECT_THAT(Joins(stop), ElementsAre("2 round 0 of 2 stop"));
  EXPECT_TRUE(r->stopped());
  Effects twice;
  r->Stop("again", &twice);
  EXPECT_TRUE(Nothing(twice));

  // a finishes its round; the reply says stop and no round starts.
  Play(*r, 1, 0, 0, 2);
  Effects fa;
  ASSERT_TRUE(r->Finish(1, 0, {1, 1}, {}, &fa).ok());
  ASSERT_TRUE(fa.round_ended);
  r->BeginUpdate();
  clock_.Advance(absl::Seconds(1));
  Effects end;
  r->EndUpdate(absl::OkStatus(), &end);
  EXPECT_THAT(Finishes(end), ElementsAre("1 next 1 stop"));
  EXPECT_FALSE(end.round_started);
  EXPECT_EQ(r->phase(), Phase::kIdle);

  Effects late;
  EXPECT_EQ(r->Join("late", &late), 3);
  EXPECT_THAT(late.log, ElementsAre("observer 'late' (session 3) joined after training stopped"));
  EXPECT_THAT(Joins(late), ElementsAre("3 round 1 of 2 stop"));

  // Told to stop, they may leave; the silent ones are dropped, each 5 s
  // after it was told.
  EXPECT_EQ(r->NextDeadline(), t0_ + absl::Seconds(6));  // b, told at t0 + 1 s
  clock_.AdvanceTo(t0_ + absl::Seconds(6));
  Effects drop_b;
  r->Tick(&drop_b);
  EXPECT_THAT(drop_b.gone, ElementsAre(2));
  ASSERT_TRUE(r->Leave(3, &e).ok());
  clock_.AdvanceTo(t0_ + absl::Seconds(7));
  Effects drop_a;
  r->Tick(&drop_a);
  EXPECT_THAT(drop_a.gone, ElementsAre(1));
  EXPECT_EQ(r->alive(), 0);
  EXPECT_EQ(r->NextDeadline(), absl::InfiniteFuture());
}

TEST_F(RoundsTest, R6_SolvedStopsAtTheEpisodeThatCrossesTheThreshold) {
  Rounds::Options o = Opts(4, 1);
  o.solve_threshold = 10.5;
  auto r = Make(o);
  Effects e;
  r->Join("a", &e);
  Play(*r, 1, 0, 0, 4);
  ASSERT_TRUE(r->Finish(1, 0, {30, 1, 1, 1}, {0, 3}, &e).ok());
  r->BeginUpdate();
  Effects end_effects;
  const Rounds::RoundEnd end = r->EndUpdate(absl::OkStatus(), &end_effects);
  // 0.05 * 30 + 0.95 * 10 = 11 > 10.5 at episode 1; then 0.05 * 3 + 0.95 * 11.
  EXPECT_EQ(end.solved_at, 1);
  EXPECT_EQ(end.episodes, 2);
  EXPECT_DOUBLE_EQ(end.running_reward, 0.05 * 3 + 0.95 * (0.05 * 30 + 0.95 * 10));
  // The log and the stats name the running reward that crossed, not the
  // round's last one (which fell back under the threshold here).
  EXPECT_THAT(end_effects.log,
              ElementsAre("training stops: solved at episode 1 (running reward 11 > 10.5)"));
  EXPECT_DOUBLE_EQ(r->stats().solved_reward, 0.05 * 30 + 0.95 * 10);
  EXPECT_THAT(Finishes(end_effects), ElementsAre("1 next 1 stop"));
  EXPECT_TRUE(r->stopped());
}

TEST_F(RoundsTest, R6_TheEpisodeBudgetStopsUnsolved) {
  Rounds::Options o = Opts(3, 1);
  o.max_episodes = 2;
  auto r = Make(o);
  Effects e;
  r->Join("a", &e);
  for (int64_t round = 0; round < 2; ++round) {
    Play(*r, 1, round, 0, 3);
    Effects f;
    ASSERT_TRUE(r->Finish(1, round, {1, 1, 1}, {2}, &f).ok());
    r->BeginUpdate();
    Effects end;
    r->EndUpdate(absl::OkStatus(), &end);
    if (round == 0) {
      EXPECT_THAT(Finishes(end), ElementsAre("1 next 1"));
      EXPECT_THAT(end.log, IsEmpty());
    } else {
      EXPECT_THAT(Finishes(end), ElementsAre("1 next 2 stop"));
      ASSERT_EQ(end.log.size(), 1u);
      EXPECT_THAT(end.log[0], HasSubstr("training stops: the episode budget of 2 ran out"));
    }
  }
  EXPECT_EQ(r->stats().episodes, 2);
  EXPECT_EQ(r->stats().solved_at, -1);
}

TEST_F(RoundsTest, R6_AFailedUpdateStopsTrainingAndSaysWhy) {
  auto r = Make(Opts(2, 1));
  Effects e;
  r->Join("a", &e);
  Play(*r, 1, 0, 0, 2);
  ASSERT_TRUE(r->Finish(1, 0, {1, 1}, {1}, &e).ok());
  r->BeginUpdate();
  Effects end;
  r->EndUpdate(absl::InternalError("nan loss"), &end);
  EXPECT_THAT(end.log, ElementsAre("round 0: the update failed: INTERNAL: nan loss",
                                   "training stops: the update failed: nan loss"));
  EXPECT_THAT(Finishes(end), ElementsAre("1 next 1 stop"));
  EXPECT_TRUE(r->stopped());
}

TEST_F(RoundsTest, R7_BadInputIsRefusedNamingTheObserverAndChangesNothing) {
  auto r = Make(Opts(2, 1));
  Effects e;
  r->Join("alice", &e);
  absl::Status unknown = r->Act(99, 0, 0, kObs);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.message(), "rl agent: act from unknown session 99");
  absl::Status skipped = r->Act(1, 0, 1, kObs);
  EXPECT_EQ(skipped.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(skipped.message(),
            "rl agent: act from observer 'alice' (session 1) for round 0 step 1 does not "
            "follow: it plays round 0, next step 0 of 2 (0 answered)");
  absl::Status short_obs = r->Act(1, 0, 0, {0, 0, 0});
  EXPECT_EQ(short_obs.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(short_obs.message(),
            "rl agent: act from observer 'alice' (session 1) step 0: an observation has 4 "
            "values; got 3");
  EXPECT_THAT(std::string(r->Act(1, 0, 0, {0, NAN, 0, 0}).message()),
              HasSubstr("observation[1] is not finite"));

  // Nothing changed: step 0 is still next. Both steps accepted, one answered.
  ASSERT_TRUE(r->Act(1, 0, 0, kObs).ok());
  ASSERT_TRUE(r->Act(1, 0, 1, kObs).ok());
  r->Answered(1, 0);
  r->Answered(1, 7);   // another round: ignored
  r->Answered(99, 0);  // unknown: ignored
  Effects f;
  absl::Status early = r->Finish(1, 0, {1, 1}, {}, &f);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(early.message(),
            "rl agent: finish from observer 'alice' (session 1) for round 0 before its 2 steps "
            "were answered: it plays round 0, next step 2 of 2 (1 answered)");
  r->Answered(1, 0);
  r->Answered(1, 0);  // more than were accepted: ignored
  absl::Status few = r->Finish(1, 0, {1}, {}, &f);
  EXPECT_EQ(few.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(few.message(),
            "rl agent: finish from observer 'alice' (session 1) round 0: 1 rewards for a round "
            "of 2 steps");
  EXPECT_EQ(r->Finish(1, 0, {1, 1}, {1, 0}, &f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r->Finish(1, 0, {1, NAN}, {}, &f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Nothing(f));
  EXPECT_EQ(r->phase(), Phase::kPlaying);
  ASSERT_TRUE(r->Finish(1, 0, {1, 1}, {1}, &f).ok());
  EXPECT_TRUE(f.round_ended);
  // A second finish of the same round is out of turn.
  Effects again;
  EXPECT_EQ(r->Finish(1, 0, {1, 1}, {1}, &again).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RoundsTest, CreateRefusesBadOptions) {
  Rounds::Options o;
  o.steps_per_round = 0;
  EXPECT_EQ(Rounds::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Rounds::Options{};
  o.observer_timeout = absl::ZeroDuration();
  EXPECT_EQ(Rounds::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Rounds::Create(Rounds::Options{}).ok());
}

}  // namespace
}  // namespace baton::rl
