// rl::ReinforceAgent in one process, observers on threads through
// ReinforceAgent::LocalLink: the guarantees R1-R7 of rl/reinforce_agent.h
// by name, plus the returns and the policy it is built on.
#include "rl/reinforce_agent.h"

#include <atomic>
#include <cmath>
#include <thread>

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "rl/cartpole.h"
#include "rl/observer.h"
#include "rl/policy.h"
#include "rl/returns.h"

namespace baton::rl {
namespace {

// ---- returns and policy ----------------------------------------------------

TEST(Returns, DiscountedWithinEpisodesThenNormalizedPerEpisode) {
  // Episodes: steps 0-2 (ends at 2), then 3-4 cut by the end of the round.
  const std::vector<float> r = {1, 1, 1, 1, 1};
  auto g = EpisodeReturns(r, {2}, 0.5);
  ASSERT_TRUE(g.ok()) << g.status();
  // Raw: 1.75, 1.5, 1 | 1.5, 1. Episode 1: mean 1.41667, std 0.381881.
  const double m1 = (1.75 + 1.5 + 1) / 3;
  const double s1 =
      std::sqrt(((1.75 - m1) * (1.75 - m1) + (1.5 - m1) * (1.5 - m1) + (1 - m1) * (1 - m1)) / 2);
  const double eps = 1.1920928955078125e-07;
  EXPECT_NEAR((*g)[0], (1.75 - m1) / (s1 + eps), 1e-6);
  EXPECT_NEAR((*g)[2], (1 - m1) / (s1 + eps), 1e-6);
  // Episode 2: mean 1.25, std 0.353553.
  EXPECT_NEAR((*g)[3], 0.25 / (std::sqrt(0.125) + eps), 1e-6);
  EXPECT_NEAR((*g)[4], -0.25 / (std::sqrt(0.125) + eps), 1e-6);
  auto rewards = EpisodeRewards(r, {2});
  ASSERT_TRUE(rewards.ok());
  EXPECT_EQ(*rewards, std::vector<double>{3});  // the cut episode is not counted
}

TEST(Returns, OneStepPieceGetsZeroAndBadEndsAreRefused) {
  auto g = EpisodeReturns({1, 1, 1}, {1, 2}, 0.99);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)[2], 0.0f);
  for (const auto& ends : std::vector<std::vector<int32_t>>{{3}, {1, 1}, {-1}, {2, 1}}) {
    auto bad = EpisodeReturns({1, 1, 1}, ends, 0.99);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(bad.status().message(), "episode_ends")) << bad.status();
  }
  RunningReward running;
  running.Add(30);
  EXPECT_DOUBLE_EQ(running.value, 0.05 * 30 + 0.95 * 10);
}

TEST(Policy, ActDrawsMasksAndLogProbsReproducesTheActingForward) {
  Policy p(7);
  at::Tensor states = at::randn({5, 4});
  auto acted = p.Act(states);
  ASSERT_TRUE(acted.ok()) << acted.status();
  ASSERT_EQ(acted->actions.sizes(), (at::IntArrayRef{5}));
  ASSERT_EQ(acted->masks.sizes(), (at::IntArrayRef{5, 128}));
  // Dropout 0.6: every mask element is 0 or 1 / 0.4.
  at::Tensor zero = acted->masks.eq(0), kept = acted->masks.sub(2.5).abs().lt(1e-6);
  EXPECT_TRUE(zero.logical_or(kept).all().item<bool>());
  const double kept_share = kept.to(at::kDouble).mean().item<double>();
  EXPECT_GT(kept_share, 0.25);
  EXPECT_LT(kept_share, 0.55);
  auto lp = p.LogProbs(states, acted->masks, acted->actions);
  auto probs = p.Probs(states, acted->masks);
  ASSERT_TRUE(lp.ok() && probs.ok());
  EXPECT_TRUE(lp->requires_grad());
  at::Tensor chosen = probs->gather(1, acted->actions.unsqueeze(1)).squeeze(1).log();
  EXPECT_TRUE(at::allclose(lp->detach(), chosen, 1e-5, 1e-6));
  // Same seed, same parameters and the same draws.
  Policy q(7);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(at::equal(p.parameters()[i], q.parameters()[i]));
}

TEST(Policy, BadShapesAreRefusedWithTheArgumentNamed) {
  Policy p(1);
  auto a = p.Act(at::zeros({3, 5}));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(a.status().message(), "states")) << a.status();
  auto l = p.LogProbs(at::zeros({2, 4}), at::ones({2, 128}), at::zeros({3}, at::kLong));
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_action = p.LogProbs(at::zeros({1, 4}), at::ones({1, 128}), at::full({1}, 2, at::kLong));
  EXPECT_EQ(bad_action.status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- the agent ---------------------------------------------------------------

std::vector<float> Obs(const CartPoleObservation& o) { return {o.begin(), o.end()}; }

class AgentTest : public ::testing::Test {
 protected:
  std::shared_ptr<ReinforceAgent> Make(ReinforceOptions o) {
    auto a = ReinforceAgent::Create(o, &executor_, &timer_);
    EXPECT_TRUE(a.ok()) << a.status();
    (*a)->set_log([this](const std::string& line) {
      absl::MutexLock lock(&mu_);
      log_.push_back(line);
    });
    return *a;
  }
  bool Logged(absl::string_view what) {
    absl::MutexLock lock(&mu_);
    for (const auto& l : log_) {
      if (absl::StrContains(l, what)) return true;
    }
    return false;
  }

  rpc::Executor executor_{rpc::Executor::Options{2, 16}};
  rpc::DeadlineTimer timer_;
  absl::Mutex mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
};

// Drives observers by hand, step by step, in a fixed order, and replays the
// same acts on a reference Policy with the same seed: the actions must be the
// same (R1: the parameters do not change within a round) and, after each
// update, so must the parameters (R2: the loss and the Adam step).
void CheckReinforceEquivalence(AgentTest* /*t*/, std::shared_ptr<ReinforceAgent> agent,
                               int observers, int64_t steps, int rounds, double gamma, double lr,
                               uint64_t seed) {
  Policy ref(seed);
  torch::optim::Adam adam(ref.parameters(), torch::optim::AdamOptions(lr));
  std::vector<JoinReply> joins;
  std::vector<rpc::Future<JoinReply>> pending;
  for (int k = 0; k < observers; ++k) pending.push_back(agent->Join("obs" + std::to_string(k)));
  for (auto& f : pending) {
    ASSERT_TRUE(f.WaitFor(absl::Seconds(10)));
    ASSERT_TRUE(f.result().ok()) << f.result().status();
    joins.push_back(*f.result());
  }
  std::vector<CartPole> envs;
  for (int k = 0; k < observers; ++k) envs.emplace_back(100 + k);
  int64_t round = joins[0].round;
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::vector<float>> obs(observers),
        rewards(observers, std::vector<float>(steps, 0));
    std::vector<std::vector<int32_t>> ends(observers);
    std::vector<at::Tensor> s_all(observers), m_all(observers), a_all(observers);
    for (int k = 0; k < observers; ++k) {
      obs[k] = Obs(envs[k].Reset());
      s_all[k] = at::zeros({steps, 4});
      m_all[k] = at::zeros({steps, 128});
      a_all[k] = at::zeros({steps}, at::kLong);
    }
    for (int64_t step = 0; step < steps; ++step) {
      for (int k = 0; k < observers; ++k) {
        auto f = agent->Act(joins[k].session, round, step, obs[k]);
        ASSERT_TRUE(f.WaitFor(absl::Seconds(10)));
        ASSERT_TRUE(f.result().ok()) << f.result().status();
        at::Tensor s = at::from_blob(obs[k].data(), {1, 4}, at::kFloat).clone();
        auto acted = ref.Act(s);
        ASSERT_TRUE(acted.ok());
        ASSERT_EQ(*f.result(), acted->actions[0].item<int64_t>())
            << "round " << r << " step " << step << " observer " << k;
        s_all[k][step].copy_(s[0]);
        m_all[k][step].copy_(acted->masks[0]);
        a_all[k][step] = acted->actions[0];
        auto next = envs[k].Step(static_cast<int>(*f.result()));
        ASSERT_TRUE(next.ok());
        rewards[k][step] = static_cast<float>(next->reward);
        if (next->terminated || next->truncated) {
          ends[k].push_back(static_cast<int32_t>(step));
          obs[k] = Obs(envs[k].Reset());
        } else {
          obs[k] = Obs(next->observation);
        }
      }
    }
    std::vector<rpc::Future<RoundReply>> finishes;
    for (int k = 0; k < observers; ++k) {
      finishes.push_back(agent->Finish(joins[k].session, round, rewards[k], ends[k]));
    }
    for (auto& f : finishes) {
      ASSERT_TRUE(f.WaitFor(absl::Seconds(10)));
      ASSERT_TRUE(f.result().ok()) << f.result().status();
      EXPECT_EQ(f.result()->next_round, round + 1);
    }
    round = finishes[0].result()->next_round;
    // The reference update.
    std::vector<float> g;
    for (int k = 0; k < observers; ++k) {
      auto gk = EpisodeReturns(rewards[k], ends[k], gamma);
      g.insert(g.end(), gk->begin(), gk->end());
    }
    at::Tensor returns = at::from_blob(g.data(), {static_cast<int64_t>(g.size())}).clone();
    auto lp = ref.LogProbs(at::cat(s_all), at::cat(m_all), at::cat(a_all));
    at::Tensor loss = -(*lp * returns).sum() / static_cast<double>(observers);
    adam.zero_grad();
    loss.backward();
    adam.step();
    std::vector<at::Tensor> got = agent->parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(at::allclose(got[i], ref.parameters()[i].detach(), 1e-6, 1e-6))
          << "parameter " << i << " after round " << r << ": max diff "
          << (got[i] - ref.parameters()[i].detach()).abs().max().item<double>();
    }
  }
}

TEST_F(AgentTest, R1_R2_UpdateIsReinforceOnTheRoundsStepsOneObserver) {
  ReinforceOptions o;
  o.steps_per_round = 60;
  o.batched = false;
  o.seed = 3;
  CheckReinforceEquivalence(this, Make(o), 1, o.steps_per_round, 3, o.gamma, o.lr, o.seed);
}

TEST_F(AgentTest, R1_R2_UpdateIsReinforceOnTheRoundsStepsThreeObservers) {
  ReinforceOptions o;
  o.steps_per_round = 40;
  o.batched = false;
  o.min_observers = 3;
  o.seed = 11;
  o.gamma = 0.9;
  o.lr = 5e-3;
  CheckReinforceEquivalence(this, Make(o), 3, o.steps_per_round, 3, o.gamma, o.lr, o.seed);
}

TEST_F(AgentTest, R3_BatchedAnswersAllWaitingObserversWithOneForward) {
  ReinforceOptions o;
  o.steps_per_round = 30;
  o.min_observers = 4;
  o.max_batch_delay = absl::Seconds(20);  // a batch runs only when all four wait
  o.max_episodes = 1;                     // stop after the first round
  auto agent = Make(o);
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<ObserverResult>> results(4);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      auto link = ReinforceAgent::LocalLink(agent, absl::Seconds(30));
      CartPole env(k);
      results[k] = RunObserver(*link, env, {"obs" + std::to_string(k)});
    });
  }
  for (auto& th : threads) th.join();
  for (auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  const ReinforceStats s = agent->stats();
  // The budget of one episode stops training after the first round in
  // which an episode ended (usually round 0; random actions may need more).
  ASSERT_GE(s.rounds, 1);
  EXPECT_EQ(s.steps, s.rounds * 4 * 30);
  EXPECT_EQ(s.forwards, s.rounds * 30);  // one per step, for all four observers
  EXPECT_TRUE(agent->WaitAllLeft(absl::Seconds(5)));
}

TEST_F(AgentTest, R3_UnbatchedRunsOneForwardPerRequest) {
  ReinforceOptions o;
  o.steps_per_round = 30;
  o.min_observers = 2;
  o.batched = false;
  o.max_episodes = 1;
  auto agent = Make(o);
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back([&, k] {
      auto link = ReinforceAgent::LocalLink(agent, absl::Seconds(30));
      CartPole env(k);
      EXPECT_TRUE(RunObserver(*link, env, {"obs"}).ok());
    });
  }
  for (auto& th : threads) th.join();
  const ReinforceStats s = agent->stats();
  ASSERT_GE(s.rounds, 1);
  EXPECT_EQ(s.forwards, s.rounds * 60);  // one per request: 2 observers x 30 steps
}

TEST_F(AgentTest, R4_SilentMemberIsDroppedItsStepsDiscardedAndTheRoundGoesOn) {
  ReinforceOptions o;
  o.steps_per_round = 50;
  o.min_observers = 3;
  o.observer_timeout = absl::Milliseconds(300);
  o.max_batch_delay = absl::Milliseconds(2);
  o.max_episodes = 4;
  auto agent = Make(o);
  // The silent one: joins, plays 5 steps, then says nothing (as if killed).
  std::atomic<int64_t> silent_session{-1};
  std::thread silent([&] {
    auto j = agent->Join("silent");
    ASSERT_TRUE(j.WaitFor(absl::Seconds(10)));
    silent_session = j.result()->session;
    CartPole env(99);
    std::vector<float> obs = Obs(env.Reset());
    for (int t = 0; t < 5; ++t) {
      auto a = agent->Act(j.result()->session, j.result()->round, t, obs);
      ASSERT_TRUE(a.WaitFor(absl::Seconds(10)));
      ASSERT_TRUE(a.result().ok()) << a.result().status();
    }
  });
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<ObserverResult>> results(2);
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back([&, k] {
      auto link = ReinforceAgent::LocalLink(agent, absl::Seconds(30));
      CartPole env(k);
      results[k] = RunObserver(*link, env, {"live" + std::to_string(k)});
    });
  }
  silent.join();
  for (auto& th : threads) th.join();
  for (auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  const ReinforceStats s = agent->stats();
  EXPECT_EQ(s.dropped, 1);
  EXPECT_TRUE(Logged("observer 'silent'")) << "the log names the dropped observer";
  EXPECT_TRUE(Logged("steps of round 0 are discarded"));
  for (const auto& [session, episodes] : s.episodes_by_session) {
    EXPECT_NE(session, silent_session.load()) << "the dropped member's steps were counted";
  }
  EXPECT_EQ(s.steps, s.rounds * 2 * o.steps_per_round);  // only the live members' steps
  // Its later calls fail with ABORTED and say why.
  auto late = agent->Act(silent_session, 0, 5, {0, 0, 0, 0});
  ASSERT_TRUE(late.WaitFor(absl::Seconds(5)));
  EXPECT_EQ(late.result().status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(late.result().status().message(), "dropped"));
  EXPECT_TRUE(absl::StrContains(late.result().status().message(), "join again"));
}

TEST_F(AgentTest, R4_LeaveMidRoundDropsAtOnce) {
  ReinforceOptions o;
  o.steps_per_round = 20;
  o.min_observers = 2;
  o.batched = false;
  o.max_episodes = 1;
  auto agent = Make(o);
  auto a = agent->Join("a"), b = agent->Join("b");
  ASSERT_TRUE(a.WaitFor(absl::Seconds(5)) && b.WaitFor(absl::Seconds(5)));
  ASSERT_TRUE(agent->Act(a.result()->session, 0, 0, {0, 0, 0, 0}).result().ok());
  ASSERT_TRUE(agent->Leave(a.result()->session).ok());
  ASSERT_TRUE(agent->Leave(a.result()->session).ok());  // idempotent
  // b alone finishes the round.
  for (int t = 0; t < 20; ++t) {
    ASSERT_TRUE(agent->Act(b.result()->session, 0, t, {0.01f, 0, 0, 0}).result().ok());
  }
  auto f = agent->Finish(b.result()->session, 0, std::vector<float>(20, 1.0f), {9, 19});
  ASSERT_TRUE(f.WaitFor(absl::Seconds(5)));
  ASSERT_TRUE(f.result().ok()) << f.result().status();
  EXPECT_TRUE(f.result()->stop);  // max_episodes 1 reached
  EXPECT_EQ(agent->stats().left, 1);
  EXPECT_EQ(agent->stats().episodes, 2);
}

TEST_F(AgentTest, R5_JoinDuringRoundIsAdmittedAtTheNextRound) {
  ReinforceOptions o;
  o.steps_per_round = 10;
  o.batched = false;
  auto agent = Make(o);
  auto a = agent->Join("a");
  ASSERT_TRUE(a.WaitFor(absl::Seconds(5)));  // min_observers 1: starts at once
  EXPECT_EQ(a.result()->round, 0);
  auto b = agent->Join("b");
  // b's join was taken (Join records it before it returns), and it waits:
  // round 0 is running.
  ASSERT_EQ(agent->stats().joined, 2);
  EXPECT_FALSE(b.WaitFor(absl::Milliseconds(100)));
  for (int t = 0; t < 10; ++t) {
    ASSERT_TRUE(agent->Act(a.result()->session, 0, t, {0, 0, 0, 0}).result().ok());
  }
  auto f = agent->Finish(a.result()->session, 0, std::vector<float>(10, 1.0f), {});
  ASSERT_TRUE(b.WaitFor(absl::Seconds(5)));
  EXPECT_EQ(b.result()->round, 1);
  EXPECT_EQ(f.result()->next_round, 1);
  EXPECT_FALSE(b.result()->stop);
  EXPECT_NE(a.result()->session, b.result()->session);
}

TEST_F(AgentTest, R5_FirstRoundWaitsForMinObserversOrTheWait) {
  ReinforceOptions o;
  o.min_observers = 2;
  auto agent = Make(o);
  auto a = agent->Join("a");
  ASSERT_EQ(agent->stats().joined, 1);  // taken, and waiting for a second
  EXPECT_FALSE(a.WaitFor(absl::Milliseconds(100)));
  auto b = agent->Join("b");
  ASSERT_TRUE(a.WaitFor(absl::Seconds(5)) && b.WaitFor(absl::Seconds(5)));
  EXPECT_EQ(a.result()->round, 0);
  EXPECT_EQ(b.result()->round, 0);

  o.min_observers = 3;
  o.first_round_wait = absl::Milliseconds(200);
  auto agent2 = Make(o);
  const absl::Time start = absl::Now();
  auto c = agent2->Join("c");
  ASSERT_TRUE(c.WaitFor(absl::Seconds(5)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  EXPECT_TRUE(Logged("starting the first round with 1 of 3 observers"));
}

TEST_F(AgentTest, R6_SolvedStopsTrainingAndLaterJoinsAreToldToStop) {
  ReinforceOptions o;
  o.steps_per_round = 40;
  o.solve_threshold = 10.5;  // the first episode of more than ~20 steps solves it
  o.batched = false;
  auto agent = Make(o);
  auto link = ReinforceAgent::LocalLink(agent, absl::Seconds(30));
  auto a = agent->Join("a");
  ASSERT_TRUE(a.WaitFor(absl::Seconds(5)));
  for (int t = 0; t < 40; ++t) {
    ASSERT_TRUE(agent->Act(a.result()->session, 0, t, {0, 0, 0, 0}).result().ok());
  }
  auto f = agent->Finish(a.result()->session, 0, std::vector<float>(40, 1.0f), {39});
  ASSERT_TRUE(f.WaitFor(absl::Seconds(5)));
  ASSERT_TRUE(f.result().ok()) << f.result().status();
  EXPECT_TRUE(f.result()->stop);
  EXPECT_TRUE(agent->WaitStopped(absl::Seconds(1)));
  EXPECT_EQ(agent->stats().solved_at, 1);
  EXPECT_TRUE(Logged("solved at episode 1"));
  auto late = link->Join("late");
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->stop);
  ASSERT_TRUE(agent->Leave(a.result()->session).ok());
  ASSERT_TRUE(link->Leave(late->session).ok());
  EXPECT_TRUE(agent->WaitAllLeft(absl::Seconds(1)));
}

TEST_F(AgentTest, R6_EpisodeBudgetStopsUnsolved) {
  ReinforceOptions o;
  o.steps_per_round = 100;
  o.max_episodes = 3;
  auto agent = Make(o);
  auto link = ReinforceAgent::LocalLink(agent, absl::Seconds(30));
  CartPole env(5);
  auto r = RunObserver(*link, env, {"a"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(agent->WaitStopped(absl::Seconds(1)));
  EXPECT_GE(agent->stats().episodes, 3);
  EXPECT_EQ(agent->stats().solved_at, -1);
  EXPECT_TRUE(Logged("episode budget of 3 ran out"));
}

TEST_F(AgentTest, R7_BadInputIsRefusedNamingTheObserverAndChangesNothing) {
  ReinforceOptions o;
  o.steps_per_round = 3;
  o.batched = false;
  auto agent = Make(o);
  auto a = agent->Join("alice");
  ASSERT_TRUE(a.WaitFor(absl::Seconds(5)));
  const int64_t s = a.result()->session;
  auto code = [](auto f) { return f.result().status().code(); };
  auto msg = [](auto f) { return std::string(f.result().status().message()); };
  EXPECT_EQ(code(agent->Act(12345, 0, 0, {0, 0, 0, 0})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(agent->Act(s, 0, 1, {0, 0, 0, 0})), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(msg(agent->Act(s, 0, 1, {0, 0, 0, 0})), "observer 'alice'"));
  EXPECT_EQ(code(agent->Act(s, 7, 0, {0, 0, 0, 0})), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(agent->Act(s, 0, 0, {0, 0, 0})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(agent->Act(s, 0, 0, {0, NAN, 0, 0})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(agent->Finish(s, 0, {1, 1, 1}, {})), absl::StatusCode::kFailedPrecondition);
  // Nothing changed: the protocol goes on from step 0.
  for (int t = 0; t < 3; ++t) ASSERT_TRUE(agent->Act(s, 0, t, {0, 0, 0, 0}).result().ok());
  EXPECT_EQ(code(agent->Finish(s, 0, {1, 1}, {})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(agent->Finish(s, 0, {1, 1, 1}, {2, 1})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(agent->Finish(s, 0, {1, NAN, 1}, {})), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(msg(agent->Finish(s, 0, {1, 1}, {})), "observer 'alice'"));
  auto ok = agent->Finish(s, 0, {1, 1, 1}, {2});
  ASSERT_TRUE(ok.WaitFor(absl::Seconds(5)));
  ASSERT_TRUE(ok.result().ok()) << ok.result().status();
  EXPECT_EQ(agent->stats().episodes, 1);
  EXPECT_EQ(agent->Leave(999).code(), absl::StatusCode::kNotFound);
}

// Observers come and go while training continues: one goes silent, a new
// one joins later and contributes episodes.
TEST_F(AgentTest, ObserversComeAndGoWhileTrainingContinues) {
  ReinforceOptions o;
  o.steps_per_round = 100;
  o.min_observers = 3;
  o.observer_timeout = absl::Milliseconds(300);
  o.max_batch_delay = absl::Milliseconds(2);
  o.max_episodes = 150;
  auto agent = Make(o);
  std::atomic<bool> quiet{false};
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<ObserverResult>> results(4);
  for (int k = 0; k < 3; ++k) {
    threads.emplace_back([&, k] {
      auto link = ReinforceAgent::LocalLink(agent, absl::Seconds(30));
      CartPole env(k);
      ObserverOptions oo{"obs" + std::to_string(k)};
      if (k == 2) {
        // Goes silent after a while, as if SIGKILLed: it blocks and never
        // calls again (quit's sleep outlasts observer_timeout). The silence
        // is the scenario, not synchronization.
        oo.quit = [&] {
          if (agent->stats().episodes >= 30 && !quiet.exchange(true)) {
            absl::SleepFor(absl::Milliseconds(800));
          }
          return false;
        };
      }
      results[k] = RunObserver(*link, env, oo);
    });
  }
  while (agent->stats().episodes < 60 && !agent->WaitStopped(absl::Milliseconds(20))) {
  }
  const int64_t before = agent->stats().episodes;
  threads.emplace_back([&] {
    auto link = ReinforceAgent::LocalLink(agent, absl::Seconds(30));
    CartPole env(42);
    results[3] = RunObserver(*link, env, {"newcomer"});
  });
  for (auto& th : threads) th.join();
  for (auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  const ReinforceStats s = agent->stats();
  EXPECT_GE(s.dropped, 1);
  EXPECT_GE(results[2]->rejoins, 1) << "the dropped observer joined again";
  EXPECT_GT(results[3]->episodes, 0) << "the newcomer contributed episodes";
  EXPECT_GT(s.episodes, before);
  EXPECT_TRUE(Logged("newcomer"));
  EXPECT_TRUE(agent->WaitAllLeft(absl::Seconds(5)));
}

// The log callback runs without the agent's lock (docs/threading.md): it
// may call the agent, and sees the event it reports already done.
TEST_F(AgentTest, LogLinesComeWithoutTheAgentsLockBeforeTheReply) {
  ReinforceOptions o;
  o.steps_per_round = 2;
  o.batched = false;
  auto agent = Make(o);
  ReinforceAgent* raw = agent.get();
  std::vector<std::pair<std::string, int64_t>> lines;  // line, alive then
  absl::Mutex lines_mu;
  agent->set_log([&](const std::string& line) {
    const int64_t alive = raw->stats().alive;  // would deadlock under the lock
    absl::MutexLock lock(&lines_mu);
    lines.push_back({line, alive});
  });
  auto a = agent->Join("a");
  // The line is out before the reply that reveals the join.
  ASSERT_TRUE(a.WaitFor(absl::Seconds(5)));
  {
    absl::MutexLock lock(&lines_mu);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0].first, "observer 'a' (session 1) joined");
    EXPECT_EQ(lines[0].second, 1);
  }
  ASSERT_TRUE(agent->Leave(a.result()->session).ok());
  agent->Stop("test over");
  absl::MutexLock lock(&lines_mu);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1].first, "observer 'a' (session 1) left; its 0 steps of round 0 are discarded");
  EXPECT_EQ(lines[1].second, 0);
  EXPECT_EQ(lines[2].first, "training stops: test over");
}

TEST_F(AgentTest, CreateRefusesBadOptions) {
  ReinforceOptions o;
  o.steps_per_round = 0;
  EXPECT_EQ(ReinforceAgent::Create(o, &executor_, &timer_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReinforceAgent::Create(ReinforceOptions{}, nullptr, &timer_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::rl
