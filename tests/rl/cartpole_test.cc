// Tests of rl/cartpole.h. The dynamics are checked twice, independently of
// the implementation: the first steps against arithmetic written out here,
// and 20 steps against values printed by a standalone Python script of gym's
// equations (gym itself is not installed on the build machine).
#include "rl/cartpole.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace baton::rl {
namespace {

using ::testing::HasSubstr;

constexpr CartPoleState kStart = {0.01, -0.02, 0.03, 0.04};

// Steps and fails the test on an error.
StepResult MustStep(CartPole& env, int action) {
  absl::StatusOr<StepResult> result = env.Step(action);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : StepResult{};
}

void ExpectStateEq(const CartPoleState& actual, const std::array<double, 4>& expected) {
  EXPECT_DOUBLE_EQ(actual.x, expected[0]);
  EXPECT_DOUBLE_EQ(actual.x_dot, expected[1]);
  EXPECT_DOUBLE_EQ(actual.theta, expected[2]);
  EXPECT_DOUBLE_EQ(actual.theta_dot, expected[3]);
}

void ExpectObservationIsState(const CartPoleObservation& observation, const CartPoleState& state) {
  EXPECT_EQ(observation[0], static_cast<float>(state.x));
  EXPECT_EQ(observation[1], static_cast<float>(state.x_dot));
  EXPECT_EQ(observation[2], static_cast<float>(state.theta));
  EXPECT_EQ(observation[3], static_cast<float>(state.theta_dot));
}

// A started environment placed at `state`.
CartPole StartedAt(const CartPoleState& state) {
  CartPole env(/*seed=*/7);
  env.Reset();
  env.set_state(state);
  return env;
}

TEST(CartPoleDynamics, ConstantsAreGyms) {
  EXPECT_EQ(CartPole::kTotalMass, 1.1);
  EXPECT_EQ(CartPole::kPoleMassLength, 0.05);
  // 12 degrees; Python prints 12 * 2 * math.pi / 360 as 0.20943951023931953.
  EXPECT_EQ(CartPole::kThetaThresholdRadians, 0.20943951023931953);
  EXPECT_EQ(CartPole::kMaxSteps, 500);
}

// Steps 1 and 2 from kStart with actions 1 then 0, written out from the
// equations (gravity 9.8, total mass 1.1, polemass_length 0.05, half-length
// 0.5, masspole 0.1, tau 0.02). Intermediate values are given to 10 digits.
TEST(CartPoleDynamics, FirstStepsMatchHandArithmetic) {
  CartPole env = StartedAt(kStart);

  // Step 1, action 1: force = +10.
  //   cos(0.03) = 0.9995500337, sin(0.03) = 0.0299955002
  //   temp      = (10 + 0.05 * 0.04^2 * 0.0299955002) / 1.1 = 9.0909112724
  //   denom     = 0.5 * (4/3 - 0.1 * 0.9995500337^2 / 1.1)  = 0.6212530180
  //   thetaacc  = (9.8 * 0.0299955002 - 0.9995500337 * 9.0909112724) / denom
  //             = (0.2939559020 - 9.0868206549) / 0.6212530180
  //             = -14.1534358980
  //   xacc      = 9.0909112724 - 0.05 * -14.1534358980 * 0.9995500337 / 1.1
  //             = 9.7339597874
  //   x         = 0.01 + 0.02 * -0.02             = 0.0096
  //   x_dot     = -0.02 + 0.02 * 9.7339597874     = 0.1746791957
  //   theta     = 0.03 + 0.02 * 0.04              = 0.0308
  //   theta_dot = 0.04 + 0.02 * -14.1534358980    = -0.2430687180
  {
    const double c = std::cos(0.03), s = std::sin(0.03);
    const double temp = (10.0 + 0.05 * (0.04 * 0.04) * s) / 1.1;
    const double thetaacc = (9.8 * s - c * temp) / (0.5 * (4.0 / 3.0 - 0.1 * (c * c) / 1.1));
    const double xacc = temp - 0.05 * thetaacc * c / 1.1;
    EXPECT_NEAR(temp, 9.0909112724, 1e-10);
    EXPECT_NEAR(thetaacc, -14.1534358980, 1e-9);
    EXPECT_NEAR(xacc, 9.7339597874, 1e-10);

    const StepResult r = MustStep(env, 1);
    ExpectStateEq(env.state(), {0.01 + 0.02 * -0.02, -0.02 + 0.02 * xacc, 0.03 + 0.02 * 0.04,
                                0.04 + 0.02 * thetaacc});
    EXPECT_NEAR(env.state().x, 0.0096, 1e-15);
    EXPECT_NEAR(env.state().x_dot, 0.1746791957, 1e-10);
    EXPECT_NEAR(env.state().theta, 0.0308, 1e-15);
    EXPECT_NEAR(env.state().theta_dot, -0.2430687180, 1e-10);
    ExpectObservationIsState(r.observation, env.state());
    EXPECT_EQ(r.reward, 1.0);
    EXPECT_FALSE(r.terminated);
    EXPECT_FALSE(r.truncated);
  }

  // Step 2, action 0: force = -10, from the state above.
  //   cos(0.0308) = 0.9995257175, sin(0.0308) = 0.0307951305
  //   temp      = (-10 + 0.05 * 0.2430687180^2 * 0.0307951305) / 1.1
  //             = -9.0908263886
  //   denom     = 0.5 * (4/3 - 0.1 * 0.9995257175^2 / 1.1)  = 0.6212552276
  //   thetaacc  = (9.8 * 0.0307951305 + 0.9995257175 * 9.0908263886) / denom
  //             = 15.1118358950
  //   xacc      = -9.0908263886 - 0.05 * 15.1118358950 * 0.9995257175 / 1.1
  //             = -9.7774022348
  //   x         = 0.0096 + 0.02 * 0.1746791957     = 0.0130935839
  //   x_dot     = 0.1746791957 + 0.02 * -9.7774022348 = -0.0208688489
  //   theta     = 0.0308 + 0.02 * -0.2430687180    = 0.0259386256
  //   theta_dot = -0.2430687180 + 0.02 * 15.1118358950 = 0.0591679999
  {
    const CartPoleState p = env.state();
    const double c = std::cos(p.theta), s = std::sin(p.theta);
    const double temp = (-10.0 + 0.05 * (p.theta_dot * p.theta_dot) * s) / 1.1;
    const double thetaacc = (9.8 * s - c * temp) / (0.5 * (4.0 / 3.0 - 0.1 * (c * c) / 1.1));
    const double xacc = temp - 0.05 * thetaacc * c / 1.1;
    EXPECT_NEAR(temp, -9.0908263886, 1e-10);
    EXPECT_NEAR(thetaacc, 15.1118358950, 1e-9);
    EXPECT_NEAR(xacc, -9.7774022348, 1e-10);

    const StepResult r = MustStep(env, 0);
    ExpectStateEq(env.state(), {p.x + 0.02 * p.x_dot, p.x_dot + 0.02 * xacc,
                                p.theta + 0.02 * p.theta_dot, p.theta_dot + 0.02 * thetaacc});
    EXPECT_NEAR(env.state().x, 0.0130935839, 1e-10);
    EXPECT_NEAR(env.state().x_dot, -0.0208688489, 1e-10);
    EXPECT_NEAR(env.state().theta, 0.0259386256, 1e-10);
    EXPECT_NEAR(env.state().theta_dot, 0.0591679999, 1e-10);
    ExpectObservationIsState(r.observation, env.state());
    EXPECT_EQ(r.reward, 1.0);
    EXPECT_FALSE(r.terminated);
    EXPECT_EQ(env.steps(), 2);
  }
}

// From kStart under kActions. Obtained with CPython 3.11 (plain floats, the
// same libm), from this script of the equations of gym's cartpole.py:
//
//   import math
//   g, mc, mp, l, F, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
//   tm = mp + mc; pml = mp * l
//   x, x_dot, th, th_dot = 0.01, -0.02, 0.03, 0.04
//   for a in [1,0,0,1,1,1,0,1,0,0,1,1,0,0,0,1,0,1,1,0]:
//       f = F if a == 1 else -F
//       c, s = math.cos(th), math.sin(th)
//       temp = (f + pml * th_dot**2 * s) / tm
//       thacc = (g * s - c * temp) / (l * (4.0 / 3.0 - mp * c**2 / tm))
//       xacc = temp - pml * thacc * c / tm
//       x = x + tau * x_dot; x_dot = x_dot + tau * xacc
//       th = th + tau * th_dot; th_dot = th_dot + tau * thacc
//       print("{%r, %r, %r, %r}," % (x, x_dot, th, th_dot))
constexpr int kActions[] = {1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 0};
constexpr std::array<double, 4> kGymTrajectory[] = {
    {0.009600000000000001, 0.17467919574755525, 0.030799999999999998, -0.2430687179600081},
    {0.013093583914951107, -0.020868848948191993, 0.025938625640799837, 0.0591679999394166},
    {0.012676206935987267, -0.21635292104612766, 0.02712198563958817, 0.3599205713784138},
    {0.008349148515064714, -0.021626799199488206, 0.03432039706715644, 0.0759116989474441},
    {0.00791661253107495, 0.17298676004769037, 0.035838631046105324, -0.20574851582677406},
    {0.011376347732028757, 0.3675783725675468, 0.03172366072956984, -0.4869142013445082},
    {0.01872791518337969, 0.17202349486382784, 0.02198537670267968, -0.18440428392099584},
    {0.022168385080656248, 0.36682408600495897, 0.01829729102425976, -0.4700713747851109},
    {0.02950486680075543, 0.1714485132472654, 0.008895863528557544, -0.17167796834313398},
    {0.03293383706570074, -0.02379962460232901, 0.0054623041616948635, 0.12379799946559022},
    {0.03245784457365416, 0.17124364660288527, 0.007938264151006668, -0.1671566333199878},
    {0.03588271750571186, 0.3662510735271441, 0.004595131484606911, -0.4573247321594314},
    {0.043207738976254746, 0.1710644614991005, -0.004551363158581718, -0.16319694126793038},
    {0.04662902820623675, -0.02399204002427255, -0.007815301983940325, 0.12804668444059647},
    {0.0461491874057513, -0.21900116643758344, -0.005254368295128396, 0.418253765499057},
    {0.04176916407699963, -0.023805152347384673, 0.003110707014852745, 0.12391900896905261},
    {0.04129306103005194, -0.21897153058286062, 0.005589087194233797, 0.41758170631551844},
    {0.036913630418394724, -0.023929228368457872, 0.013940721320544166, 0.12666600559547747},
    {0.03643504585102557, 0.17099026498654915, 0.016474041432453713, -0.16158638454965535},
    {0.03985485115075655, -0.024363606715516434, 0.013242313741460607, 0.13624780960245092},
};

TEST(CartPoleDynamics, TwentyStepsMatchGymReference) {
  CartPole env = StartedAt(kStart);
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE(testing::Message() << "step " << i + 1);
    const StepResult r = MustStep(env, kActions[i]);
    ExpectStateEq(env.state(), kGymTrajectory[i]);
    const std::array<double, 4>& e = kGymTrajectory[i];
    EXPECT_EQ(r.observation,
              (CartPoleObservation{static_cast<float>(e[0]), static_cast<float>(e[1]),
                                   static_cast<float>(e[2]), static_cast<float>(e[3])}));
    EXPECT_EQ(r.reward, 1.0);
    EXPECT_FALSE(r.terminated);
    EXPECT_FALSE(r.truncated);
    EXPECT_EQ(env.steps(), i + 1);
  }
}

// The bounds are strict: a state exactly on the edge is still alive.
TEST(CartPoleTermination, CartExactlyAtEdgeIsNotTerminated) {
  CartPole env = StartedAt({2.4, 0.0, 0.0, 0.0});
  const StepResult r = MustStep(env, 1);
  EXPECT_EQ(env.state().x, 2.4);  // x uses the old velocity, 0
  EXPECT_FALSE(r.terminated);
  EXPECT_FALSE(env.done());
}

TEST(CartPoleTermination, CartPastRightEdge) {
  // x = 2.39 + 0.02 * 1.0 = 2.41 > 2.4.
  CartPole env = StartedAt({2.39, 1.0, 0.0, 0.0});
  const StepResult r = MustStep(env, 1);
  EXPECT_GT(env.state().x, 2.4);
  EXPECT_TRUE(r.terminated);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(r.reward, 1.0);  // the terminating step is rewarded
  EXPECT_TRUE(env.done());
  EXPECT_EQ(env.steps(), 1);
}

TEST(CartPoleTermination, CartPastLeftEdge) {
  CartPole env = StartedAt({-2.39, -1.0, 0.0, 0.0});
  const StepResult r = MustStep(env, 0);
  EXPECT_LT(env.state().x, -2.4);
  EXPECT_TRUE(r.terminated);
  EXPECT_EQ(r.reward, 1.0);
  EXPECT_TRUE(env.done());
}

TEST(CartPoleTermination, PoleBeyondTwelveDegrees) {
  const double limit = CartPole::kThetaThresholdRadians;
  for (const double sign : {1.0, -1.0}) {
    SCOPED_TRACE(testing::Message() << "sign " << sign);
    // One step short of the limit at 0.5 rad/s: theta moves by 0.01 rad.
    CartPole env = StartedAt({0.0, 0.0, sign * (limit - 0.005), sign * 0.5});
    const StepResult r = MustStep(env, sign > 0 ? 1 : 0);
    EXPECT_GT(std::abs(env.state().theta), limit);
    EXPECT_TRUE(r.terminated);
    EXPECT_EQ(r.reward, 1.0);
    EXPECT_TRUE(env.done());
  }
}

TEST(CartPoleTermination, PoleJustInsideIsNotTerminated) {
  CartPole env = StartedAt({0.0, 0.0, CartPole::kThetaThresholdRadians - 0.01, 0.0});
  const StepResult r = MustStep(env, 1);
  EXPECT_FALSE(r.terminated);
}

TEST(CartPoleTruncation, TruncatedAtExactly500StepsBySettingStates) {
  CartPole env = StartedAt({});
  for (int i = 1; i <= CartPole::kMaxSteps; ++i) {
    env.set_state({});  // upright and at rest: never terminates
    const StepResult r = MustStep(env, i % 2);
    EXPECT_EQ(r.reward, 1.0);
    EXPECT_FALSE(r.terminated);
    ASSERT_EQ(r.truncated, i == CartPole::kMaxSteps) << "step " << i;
    ASSERT_EQ(env.done(), i == CartPole::kMaxSteps) << "step " << i;
  }
  EXPECT_EQ(env.steps(), 500);
  EXPECT_FALSE(env.Step(0).ok());
}

// A linear controller keeps the pole up for a whole episode from random
// starts; the return is 500, as for a solved CartPole-v1.
TEST(CartPoleTruncation, BalancingControllerEarns500) {
  for (uint64_t seed : {0, 1, 2, 3, 42}) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    CartPole env(seed);
    env.Reset();
    double episode_return = 0.0;
    StepResult r;
    do {
      const CartPoleState& s = env.state();
      const double u = 0.1 * s.x + 0.5 * s.x_dot + 10 * s.theta + 2 * s.theta_dot;
      r = MustStep(env, u > 0 ? 1 : 0);
      episode_return += r.reward;
    } while (!r.terminated && !r.truncated);
    EXPECT_FALSE(r.terminated);
    EXPECT_TRUE(r.truncated);
    EXPECT_EQ(env.steps(), 500);
    EXPECT_EQ(episode_return, 500.0);
  }
}

TEST(CartPoleTruncation, TerminatingOn500thStepSetsBothFlags) {
  CartPole env = StartedAt({});
  for (int i = 1; i < CartPole::kMaxSteps; ++i) {
    env.set_state({});
    ASSERT_FALSE(MustStep(env, 0).truncated);
  }
  env.set_state({2.39, 1.0, 0.0, 0.0});
  const StepResult r = MustStep(env, 1);
  EXPECT_TRUE(r.terminated);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.reward, 1.0);
}

TEST(CartPoleReset, StartsAnEpisodeWithValuesInRange) {
  CartPole env(/*seed=*/123);
  EXPECT_TRUE(env.done());  // no episode before the first Reset()
  for (int i = 0; i < 10000; ++i) {
    const CartPoleObservation observation = env.Reset();
    const CartPoleState& s = env.state();
    for (const double v : {s.x, s.x_dot, s.theta, s.theta_dot}) {
      ASSERT_GE(v, -0.05);
      ASSERT_LT(v, 0.05);
    }
    ExpectObservationIsState(observation, s);
    ASSERT_EQ(env.steps(), 0);
    ASSERT_FALSE(env.done());
  }
}

// SplitMix64 from seed 42, as documented in cartpole.h, computed by a Python
// transcription (Python ints masked to 64 bits; the generator gives
// 6457827717110365317, 3203168211198807973, ... from seed 1234567, the
// published test vector): u = (next() >> 11) * 2**-53, value = -0.05 + 0.1 * u.
TEST(CartPoleReset, SeedGivesDocumentedValues) {
  CartPole env(/*seed=*/42);
  env.Reset();
  ExpectStateEq(env.state(), {0.02415648787718233, -0.034008960712307995, -0.022139886974486135,
                              -0.015580928347636247});
  env.Reset();
  ExpectStateEq(env.state(), {-0.04619698314597538, 0.03682280765465323, -0.028159480628781566,
                              0.03006318767135034});
}

std::vector<CartPoleObservation> Resets(uint64_t seed, int n) {
  CartPole env(seed);
  std::vector<CartPoleObservation> out;
  for (int i = 0; i < n; ++i) out.push_back(env.Reset());
  return out;
}

TEST(CartPoleReset, DeterministicPerSeed) {
  EXPECT_EQ(Resets(5, 10), Resets(5, 10));
  // Whole episodes too: same seed and actions, same trajectory.
  CartPole a(9), b(9);
  a.Reset();
  b.Reset();
  for (int i = 0; i < 30 && !a.done(); ++i) {
    EXPECT_EQ(MustStep(a, i % 3 == 0).observation, MustStep(b, i % 3 == 0).observation);
  }
}

TEST(CartPoleReset, DiffersAcrossSeedsAndEpisodes) {
  EXPECT_NE(Resets(5, 1), Resets(6, 1));
  EXPECT_NE(Resets(0, 1), Resets(1, 1));
  const std::vector<CartPoleObservation> r = Resets(5, 2);
  EXPECT_NE(r[0], r[1]);  // the generator advances
}

TEST(CartPoleReset, StartsOverAfterTheEpisodeEnds) {
  CartPole env = StartedAt({2.39, 1.0, 0.0, 0.0});
  EXPECT_TRUE(MustStep(env, 1).terminated);
  env.Reset();
  EXPECT_FALSE(env.done());
  EXPECT_EQ(env.steps(), 0);
  EXPECT_TRUE(env.Step(0).ok());
}

TEST(CartPoleErrors, ActionOutOfRange) {
  CartPole env = StartedAt(kStart);
  for (const int action : {2, -1}) {
    const absl::StatusOr<StepResult> r = env.Step(action);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("action must be 0"));
  }
  // A rejected action changes nothing.
  EXPECT_EQ(env.steps(), 0);
  ExpectStateEq(env.state(), {kStart.x, kStart.x_dot, kStart.theta, kStart.theta_dot});
}

TEST(CartPoleErrors, StepBeforeReset) {
  CartPole env(/*seed=*/1);
  const absl::StatusOr<StepResult> r = env.Step(0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("call Reset()"));
}

TEST(CartPoleErrors, StepAfterDone) {
  CartPole env = StartedAt({2.39, 1.0, 0.0, 0.0});
  ASSERT_TRUE(MustStep(env, 1).terminated);
  const CartPoleState after = env.state();
  const absl::StatusOr<StepResult> r = env.Step(1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("episode is over"));
  EXPECT_THAT(r.status().message(), HasSubstr("call Reset()"));
  EXPECT_EQ(env.steps(), 1);
  EXPECT_EQ(env.state().x, after.x);
}

}  // namespace
}  // namespace baton::rl
