// The multi-process harness itself (testing/multiprocess.h): a worker started
// through the fork server (testing/fork_server.h) is indistinguishable from
// one executed anew, each test running once with the server and once with
// BATON_TEST_NO_FORK_SERVER=1.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "testing/fork_server.h"
#include "testing/multiprocess.h"
#include "testing/multiprocess_gtest.h"

namespace baton::testing {
namespace {

BATON_SCENARIO(env_and_output) {
  const char* rank = std::getenv("RANK");
  const char* extra = std::getenv("HARNESS_EXTRA");
  const char* unset = std::getenv("HARNESS_ONLY_IN_PARENT_AT_START");
  std::printf("rank=%s extra=%s\n", rank, extra == nullptr ? "(none)" : extra);
  std::fprintf(stderr, "to stderr %s\n", unset == nullptr ? "unset" : unset);
  return 10 + std::atoi(rank);
}

BATON_SCENARIO(signalled) {
  std::fflush(nullptr);
  ::raise(SIGABRT);
  return 0;
}

BATON_SCENARIO(hangs) {
  std::printf("started\n");
  std::fflush(nullptr);
  ::pause();  // until the harness kills it at its timeout
  return 0;
}

BATON_SCENARIO(own_process) {
  // A worker is its own process: its pid is not the test's, and its parent
  // is the server or the test, never another worker.
  std::printf("pid=%d\n", static_cast<int>(::getpid()));
  return 0;
}

TEST(Harness, ForkServerStartsInASingleThreadedBinary) {
  // This binary starts no thread before main, so the server must accept:
  // if it refuses, every multi-process suite silently pays the slow path.
  absl::StatusOr<std::unique_ptr<ForkServer>> server = ForkServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
}

TEST(Harness, WorkersGetTheirEnvironmentExitCodeAndOutput) {
  ::setenv("HARNESS_ONLY_IN_PARENT_AT_START", "set-later", 1);
  const auto results =
      RunWorkers("env_and_output", 3, absl::Seconds(60), {{"HARNESS_EXTRA", "x y=z"}});
  ::unsetenv("HARNESS_ONLY_IN_PARENT_AT_START");
  ASSERT_EQ(results.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].rank, r);
    EXPECT_EQ(results[r].exit_code, 10 + r) << Describe(results);
    EXPECT_EQ(results[r].signal, 0);
    EXPECT_FALSE(results[r].timed_out);
    EXPECT_NE(results[r].output.find("rank=" + std::to_string(r) + " extra=x y=z\n"),
              std::string::npos)
        << results[r].output;
    // The environment is the test's at the time of the call, not at the
    // time the server started.
    EXPECT_NE(results[r].output.find("to stderr set-later\n"), std::string::npos)
        << results[r].output;
  }
}

TEST(Harness, ASignalledWorkerIsReportedBySignal) {
  const auto results = RunWorkers("signalled", 2, absl::Seconds(60));
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_EQ(r.signal, SIGABRT) << Describe(results);
    EXPECT_FALSE(r.timed_out);
  }
}

TEST(Harness, AWorkerPastTheTimeoutIsKilledAndMarked) {
  const absl::Time start = absl::Now();
  // Long enough for a loaded machine to start the workers and print.
  const auto results = RunWorkers("hangs", 2, absl::Seconds(5));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_TRUE(r.timed_out) << Describe(results);
    EXPECT_EQ(r.signal, SIGKILL);
    EXPECT_NE(r.output.find("started\n"), std::string::npos);
    // Where it waited, before the kill: every thread's stack, by gdb.
    EXPECT_NE(r.output.find("[multiprocess] timed out; the stacks of worker pid"),
              std::string::npos)
        << r.output;
    if (access("/usr/bin/gdb", X_OK) == 0) {
      EXPECT_NE(r.output.find("\n#0 "), std::string::npos) << r.output;
    }
  }
}

TEST(Harness, EachWorkerIsItsOwnProcess) {
  const auto results = RunWorkers("own_process", 2, absl::Seconds(60));
  ExpectAllSucceeded(results);
  ASSERT_EQ(results.size(), 2u);
  const std::string self = "pid=" + std::to_string(::getpid()) + "\n";
  EXPECT_EQ(results[0].output.find(self), std::string::npos);
  EXPECT_NE(results[0].output, results[1].output);
}

}  // namespace
}  // namespace baton::testing
