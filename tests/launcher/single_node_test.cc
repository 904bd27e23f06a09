// baton-run on one node: environment, restarts, the failure summary, signal
// forwarding without orphans, roles, bad flags.
#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/eventually.h"
#include "tests/launcher/fixture.h"

namespace baton::launcher::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kJobTimeout = absl::Seconds(60);

TEST_F(LauncherTest, EveryWorkerGetsItsEnvironment) {
  Launcher l(marker_, Args({"--standalone", "--nproc_per_node", "3", "--run_id", "envtest",
                            "--max_restarts", "4"},
                           "env"));
  ASSERT_EQ(l.Wait(kJobTimeout), 0) << l.Output();
  std::string port, token;
  for (int r = 0; r < 3; ++r) {
    auto env = Env(r, 0);
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(env["RANK"], absl::StrCat(r));
    EXPECT_EQ(env["LOCAL_RANK"], absl::StrCat(r));
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["GROUP_RANK"], "0");
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["BATON_RUN_ID"], "envtest");
    EXPECT_EQ(env["BATON_RESTART_COUNT"], "0");
    EXPECT_EQ(env["BATON_MAX_RESTARTS"], "4");
    // Group restarts only: nobody waits for a single peer's restart.
    EXPECT_EQ(env["BATON_RESTART_WAIT"], "0");
    EXPECT_EQ(env["BATON_ROLE"], "default");
    EXPECT_EQ(env["BATON_ROLE_RANK"], absl::StrCat(r));
    EXPECT_EQ(env["BATON_ROLE_WORLD_SIZE"], "3");
    EXPECT_EQ(env["BATON_ELASTIC_LAUNCHED"], "1");
    EXPECT_FALSE(env["BATON_ERROR_FILE"].empty());
    EXPECT_GE(env["BATON_JOB_TOKEN"].size(), 16u);
    int p = 0;
    EXPECT_TRUE(absl::SimpleAtoi(env["MASTER_PORT"], &p) && p > 0);
    if (r == 0) {
      port = env["MASTER_PORT"];
      token = env["BATON_JOB_TOKEN"];
    }
    EXPECT_EQ(env["MASTER_PORT"], port);
    EXPECT_EQ(env["BATON_JOB_TOKEN"], token);
  }
}

TEST_F(LauncherTest, JobTokenAndPortsComeFromTheLauncher) {
  const int port = FreePort();
  Launcher l(marker_,
             Args({"--nproc_per_node", "2", "--master_port", absl::StrCat(port), "--rdzv_port",
                   absl::StrCat(FreePort())},
                  "env"),
             {{"BATON_JOB_TOKEN", "secret-token"}});
  ASSERT_EQ(l.Wait(kJobTimeout), 0) << l.Output();
  for (int r = 0; r < 2; ++r) {
    auto env = Env(r, 0);
    EXPECT_EQ(env["BATON_JOB_TOKEN"], "secret-token");
    EXPECT_EQ(env["MASTER_PORT"], absl::StrCat(port));
  }
}

TEST_F(LauncherTest, FailsOnceThenSucceedsAfterOneRestart) {
  Launcher l(marker_,
             Args({"--standalone", "--nproc_per_node", "2", "--max_restarts", "3"}, "fail_once"));
  ASSERT_EQ(l.Wait(kJobTimeout), 0) << l.Output();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(Env(r, 0)["BATON_RESTART_COUNT"], "0");
    EXPECT_EQ(Env(r, 1)["BATON_RESTART_COUNT"], "1");
    // A group restart is a new rendezvous, not a rejoin.
    EXPECT_EQ(Env(r, 1)["BATON_REJOIN"], "0");
    EXPECT_FALSE(FileExists(absl::StrCat(out_, "/env.", r, ".2")));
  }
  // Each round gets a store port that was free at its start.
  EXPECT_NE(Env(0, 1)["MASTER_PORT"], "");
  EXPECT_THAT(l.Output(), HasSubstr("rank 1 exit code 7"));
}

TEST_F(LauncherTest, RestartsExhaustedPrintsSummaryAndFails) {
  const std::string logs = MakeTempDir("logs");
  Launcher l(marker_, Args({"--standalone", "--nproc_per_node", "2", "--max_restarts", "1",
                            "--log_dir", logs},
                           "fail_always"));
  EXPECT_EQ(l.Wait(kJobTimeout), 1);
  const std::string out = l.Output();
  EXPECT_THAT(out, HasSubstr("baton-run: job failed"));
  EXPECT_THAT(out, HasSubstr("first failure: rank 1 "));
  EXPECT_THAT(out, HasSubstr("reason:        exit code 42"));
  EXPECT_THAT(out, HasSubstr("time:          2"));
  EXPECT_THAT(out, HasSubstr("planned failure 1"));                 // error file
  EXPECT_THAT(out, HasSubstr("last words of rank 1 (restart 1)"));  // tail
  EXPECT_THAT(out, HasSubstr(absl::StrCat(logs, "/rank_1.log")));
  // One log per rank, holding both attempts.
  EXPECT_THAT(ReadFile(absl::StrCat(logs, "/rank_1.log")),
              HasSubstr("last words of rank 1 (restart 0)"));
  EXPECT_TRUE(FileExists(absl::StrCat(logs, "/rank_0.log")));
}

TEST_F(LauncherTest, TeePrefixesWorkerOutputWithRank) {
  Launcher l(marker_, Args({"--standalone", "--nproc_per_node", "2", "--tee"}, "fail_once"));
  EXPECT_EQ(l.Wait(kJobTimeout), 1);
  EXPECT_THAT(l.Output(), HasSubstr("[rank 1] rank 1 is failing on purpose"));
}

void ExpectStopForwarded(LauncherTest* t, Launcher& l, const std::string& out,
                         const std::string& marker, int sig) {
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitForFile(absl::StrCat(out, "/ready.", r), kJobTimeout)) << l.Output();
  }
  const absl::Time start = absl::Now();
  l.Signal(sig);
  EXPECT_EQ(l.Wait(absl::Seconds(30)), 128 + sig) << l.Output();
  // Rank 1 ignores SIGTERM: it is killed after the 2 s grace period.
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_TRUE(FileExists(absl::StrCat(out, "/term.0"))) << l.Output();
  // No worker nor grandchild outlives the launcher.
  EXPECT_THAT(ProcessesWithMarker(marker), ::testing::IsEmpty());
  (void)t;
}

TEST_F(LauncherTest, SigtermIsForwardedThenKilledAndNoOrphanRemains) {
  Launcher l(marker_, Args({"--standalone", "--nproc_per_node", "2"}, "sleep_trap"));
  ExpectStopForwarded(this, l, out_, marker_, SIGTERM);
}

TEST_F(LauncherTest, SigintIsForwardedToo) {
  // SIGINT reaches the workers as SIGINT; rank 0 traps only SIGTERM, so it
  // dies of SIGINT, rank 1 as well (bash's default), the grandchildren die
  // with their process group.
  Launcher l(marker_, Args({"--standalone", "--nproc_per_node", "2"}, "sleep_trap"));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitForFile(absl::StrCat(out_, "/ready.", r), kJobTimeout));
  }
  l.Signal(SIGINT);
  EXPECT_EQ(l.Wait(absl::Seconds(30)), 128 + SIGINT) << l.Output();
  EXPECT_THAT(ProcessesWithMarker(marker_), ::testing::IsEmpty());
}

TEST_F(LauncherTest, KilledLauncherTakesItsWorkersAlong) {
  Launcher l(marker_, Args({"--standalone", "--nproc_per_node", "2"}, "sleep_trap"));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitForFile(absl::StrCat(out_, "/ready.", r), kJobTimeout));
  }
  std::vector<std::string> starts =
      absl::StrSplit(ReadFile(absl::StrCat(out_, "/starts.default")), '\n', absl::SkipEmpty());
  ASSERT_EQ(starts.size(), 2u);
  ::kill(l.pid(), SIGKILL);
  EXPECT_EQ(l.Wait(absl::Seconds(10)), 128 + SIGKILL);
  // PR_SET_PDEATHSIG: the workers themselves die with the launcher.
  for (const std::string& line : starts) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    int pid = 0;
    ASSERT_TRUE(absl::SimpleAtoi(f[2], &pid));
    (void)::baton::testing::Eventually(
        [&] {
          return ::kill(pid, 0) != 0 ||
                 ReadFile(absl::StrCat("/proc/", pid, "/stat")).find(") Z") != std::string::npos;
        },
        absl::Seconds(5));
    std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    EXPECT_TRUE(stat.empty() || stat.find(") Z") != std::string::npos)
        << "worker " << pid << " outlived the launcher";
  }
}

TEST_F(LauncherTest, WorkerPolicyRestartsOnlyTheWorkerThatFailed) {
  Launcher l(marker_, Args({"--standalone", "--role", "agent:1", "--role", "observer:2",
                            "--restart_policy", "observer=worker", "--max_restarts", "1"},
                           "worker_restart"));
  ASSERT_EQ(l.Wait(kJobTimeout), 0) << l.Output();
  EXPECT_THAT(l.Output(), HasSubstr("restarting that worker alone (restart 1/1)"));
  // Observer 0 (rank 1) ran twice, the second time as a rejoin; observer 1
  // (rank 2) and the agent ran once.
  EXPECT_EQ(Env(1, 0)["BATON_REJOIN"], "0");
  EXPECT_EQ(Env(1, 1)["BATON_REJOIN"], "1");
  EXPECT_EQ(Env(1, 1)["BATON_RESTART_COUNT"], "1");
  EXPECT_EQ(Env(2, 0)["BATON_REJOIN"], "0");
  std::vector<std::string> starts =
      absl::StrSplit(ReadFile(absl::StrCat(out_, "/starts.observer")), '\n', absl::SkipEmpty());
  EXPECT_EQ(starts.size(), 3u);
  std::vector<std::string> agent_starts =
      absl::StrSplit(ReadFile(absl::StrCat(out_, "/starts.agent")), '\n', absl::SkipEmpty());
  EXPECT_EQ(agent_starts.size(), 1u);
}

TEST_F(LauncherTest, WorkerPolicyEndsTheJobWhenNoRestartIsLeft) {
  Launcher l(marker_, Args({"--standalone", "--role", "agent:1", "--role", "observer:2",
                            "--restart_policy", "observer=worker"},
                           "worker_restart"));
  EXPECT_EQ(l.Wait(kJobTimeout), 1) << l.Output();
  EXPECT_THAT(l.Output(), HasSubstr("job failed"));
}

TEST_F(LauncherTest, RolesGetRanksRoleByRoleAndRestartOnlyTheirRole) {
  Launcher l(marker_, Args({"--standalone", "--role", "ps:1", "--role", "trainer:2",
                            "--restart_policy", "trainer=role", "--max_restarts", "1"},
                           "roles"));
  ASSERT_EQ(l.Wait(kJobTimeout), 0) << l.Output();
  auto ps = Env(0, 0);
  EXPECT_EQ(ps["BATON_ROLE"], "ps");
  EXPECT_EQ(ps["BATON_ROLE_RANK"], "0");
  EXPECT_EQ(ps["BATON_ROLE_WORLD_SIZE"], "1");
  EXPECT_EQ(ps["WORLD_SIZE"], "3");
  // The trainers restart alone: every worker's calls to a dead peer wait
  // for its successor (P7, P8), 60 s unless --restart_wait says otherwise.
  EXPECT_EQ(ps["BATON_RESTART_WAIT"], "60");
  for (int restart = 0; restart < 2; ++restart) {
    for (int tr = 0; tr < 2; ++tr) {
      auto env = Env(1 + tr, restart);
      SCOPED_TRACE(absl::StrCat("trainer ", tr, " restart ", restart));
      EXPECT_EQ(env["BATON_ROLE"], "trainer");
      EXPECT_EQ(env["BATON_ROLE_RANK"], absl::StrCat(tr));
      EXPECT_EQ(env["BATON_ROLE_WORLD_SIZE"], "2");
      EXPECT_EQ(env["LOCAL_RANK"], absl::StrCat(1 + tr));
      EXPECT_EQ(env["BATON_RESTART_COUNT"], absl::StrCat(restart));
      // Restarted alone, the role rejoins the running job.
      EXPECT_EQ(env["BATON_REJOIN"], restart == 0 ? "0" : "1");
    }
  }
  EXPECT_EQ(ps["BATON_REJOIN"], "0");
  // The ps was started once and kept running through the trainers' restart.
  std::vector<std::string> ps_starts =
      absl::StrSplit(ReadFile(absl::StrCat(out_, "/starts.ps")), '\n', absl::SkipEmpty());
  EXPECT_EQ(ps_starts.size(), 1u);
  std::vector<std::string> trainer_starts =
      absl::StrSplit(ReadFile(absl::StrCat(out_, "/starts.trainer")), '\n', absl::SkipEmpty());
  EXPECT_EQ(trainer_starts.size(), 4u);
}

TEST_F(LauncherTest, BadFlagsExitWithCode2NamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nnodes", "3:1", "prog"}, "--nnodes"},
      {{"--nproc_per_node", "zero", "prog"}, "--nproc_per_node"},
      {{"--nnodes", "2", "prog"}, "--node_rank"},
      {{"--role", "ps", "prog"}, "--role"},
      {{"--bogus", "prog"}, "--bogus"},
      {{"--monitor_interval", "-1", "prog"}, "--monitor_interval"},
      {{"--nproc_per_node", "2"}, "PROGRAM"},
  };
  for (const auto& [args, flag] : cases) {
    Launcher l(marker_, args);
    EXPECT_EQ(l.Wait(absl::Seconds(10)), 2) << flag;
    EXPECT_THAT(l.Output(), HasSubstr(flag));
  }
}

TEST_F(LauncherTest, MissingProgramFailsClearly) {
  Launcher l(marker_, {"--standalone", "/nonexistent/program"});
  EXPECT_EQ(l.Wait(kJobTimeout), 1);
  EXPECT_THAT(l.Output(), HasSubstr("/nonexistent/program"));
}

}  // namespace
}  // namespace baton::launcher::testing
