// P5, P7 and P8 (docs/peer_failures.md) on real processes through baton-run:
// a worker
// SIGKILLed at each step of the job's start-up (tests/launcher/startup_job.cc)
// is restarted with BATON_REJOIN=1 and joins; the job then runs to its end.
// Before P5, a worker killed before it took its init round failed every
// restart with FAILED_PRECONDITION "... never joined this job", and the job
// exited 1 once its restarts were used up.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/agent.h"
#include "tests/launcher/fixture.h"

namespace baton::launcher::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kJobTimeout = absl::Seconds(90);

std::string StartupJobPath() { return Runfile("tests/launcher/startup_job"); }

// The steps a worker is killed at, and their names in the test's name.
struct Case {
  rpc::RendezvousStep step;
  const char* name;
};
const Case kCases[] = {
    {rpc::RendezvousStep::kConnectingStore, "BeforeTheStore"},
    {rpc::RendezvousStep::kRoundTaken, "AfterTakingItsRound"},
    {rpc::RendezvousStep::kRegistered, "AfterRegistering"},
    {rpc::RendezvousStep::kBeforeInitBarrier, "BeforeTheInitBarrier"},
    {rpc::RendezvousStep::kAfterInitBarrier, "AfterTheInitBarrier"},
};

class StartupRestart : public LauncherTest, public ::testing::WithParamInterface<Case> {
 protected:
  // baton-run with a head and three w workers, rank `victim` killed at the
  // case's step on its first start, under `policy`.
  int RunJob(const std::string& policy, int victim, bool all_pairs, std::string* output) {
    std::vector<std::string> args = {
        "--standalone",
        "--monitor_interval",
        "0.05",
        "--stop_timeout",
        "2",
        "--rdzv_timeout",
        "30",
        "--role",
        "head:1",
        "--role",
        "w:3",
        "--restart_policy",
        "w=" + policy,
        "--max_restarts",
        "2",
        "--tee",
        StartupJobPath(),
        absl::StrCat("--die_at=", rpc::RendezvousStepName(GetParam().step)),
        absl::StrCat("--victim=", victim)};
    if (all_pairs) args.push_back("--all_pairs");
    Launcher l(marker_, args);
    const int code = l.Wait(kJobTimeout);
    *output = l.Output();
    return code;
  }
};

// Only the killed worker restarts; afterwards every worker calls every
// worker, and the restarted one reports its incarnation (P1, P6).
TEST_P(StartupRestart, P5_AWorkerKilledDuringStartUpRejoinsAndEveryoneCallsEveryone) {
  std::string out;
  ASSERT_EQ(RunJob("worker", 2, /*all_pairs=*/true, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("rank 2: SIGKILL at rendezvous step '",
                                          rpc::RendezvousStepName(GetParam().step), "'")));
  EXPECT_THAT(out, HasSubstr("restarting that worker alone"));
  EXPECT_THAT(out, HasSubstr("RESULT OK"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("never joined")));
}

// The shape: the whole role restarts (the survivors of the role
// are killed and rejoin too, wherever their own start-up was).
TEST_P(StartupRestart, P5_ARoleRestartedDuringStartUpRejoins) {
  std::string out;
  ASSERT_EQ(RunJob("role", 1, /*all_pairs=*/false, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("restarting the role's workers"));
  EXPECT_THAT(out, HasSubstr("RESULT OK"));
}

// P7, P8 (docs/peer_failures.md) through baton-run: rank 1 is killed while
// the job runs and restarted alone; rank 2, which never called it, then
// calls it (tests/launcher/startup_job.cc, --callee_restart).
class CalleeRestart : public LauncherTest {
 protected:
  int RunJob(const std::vector<std::string>& extra, std::string* output) {
    std::vector<std::string> args = {"--standalone",
                                     "--monitor_interval",
                                     "0.05",
                                     "--stop_timeout",
                                     "2",
                                     "--rdzv_timeout",
                                     "30",
                                     "--role",
                                     "head:1",
                                     "--role",
                                     "w:2",
                                     "--restart_policy",
                                     "w=worker",
                                     "--max_restarts",
                                     "1",
                                     "--tee"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(StartupJobPath());
    args.push_back("--callee_restart");
    Launcher l(marker_, args);
    const int code = l.Wait(kJobTimeout);
    *output = l.Output();
    return code;
  }
};

// baton-run gives workers a restart wait when a role restarts alone; the
// call that finds rank 1's old address dead (its stream refused, so
// undelivered) waits for the successor and reaches it, as does the head's.
TEST_F(CalleeRestart, P8_CallsToAWorkerRestartedAloneReachItsSuccessor) {
  std::string out;
  ASSERT_EQ(RunJob({}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("rank 2: started, incarnation 1, restart_wait 1m"));
  EXPECT_THAT(out, HasSubstr("rank 1: SIGKILL in die()"));
  EXPECT_THAT(out, HasSubstr("restarting that worker alone"));
  EXPECT_THAT(out, HasSubstr("RESULT OK"));
}

// The same job without the wait: rank 2's call fails at once (what every
// such call did before P8), and the job fails.
TEST_F(CalleeRestart, P8_WithoutARestartWaitTheCallFailsAtOnce) {
  std::string out;
  EXPECT_NE(RunJob({"--restart_wait", "0"}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("restart_wait 0"));
  EXPECT_THAT(out, HasSubstr("rank 2 -> rank 1: "));
  EXPECT_THAT(out, HasSubstr("UNAVAILABLE"));
}

INSTANTIATE_TEST_SUITE_P(EveryStep, StartupRestart, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace baton::launcher::testing
