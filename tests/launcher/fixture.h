// Shared fixture of the launcher's process tests: a marker, an output
// directory for the worker script, and a teardown that kills and reports
// any process the test left behind.
#ifndef BATON_TESTS_LAUNCHER_FIXTURE_H_
#define BATON_TESTS_LAUNCHER_FIXTURE_H_

#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/launcher/harness.h"

namespace baton::launcher::testing {

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    marker_ = NewMarker();
    out_ = MakeTempDir("workers");
  }
  void TearDown() override {
    std::vector<pid_t> left = KillMarked(marker_);
    EXPECT_TRUE(left.empty()) << "processes survived SIGKILL: " << absl::StrJoin(left, ", ");
  }
  // baton-run arguments that every test uses, then the worker command.
  std::vector<std::string> Args(std::vector<std::string> flags, const std::string& mode,
                                const std::string& arg = "") {
    // Defaults first: a flag given twice takes the last value.
    flags.insert(flags.begin(),
                 {"--monitor_interval", "0.05", "--stop_timeout", "2", "--rdzv_timeout", "20"});
    flags.push_back(WorkerScriptPath());
    flags.push_back(mode);
    flags.push_back(out_);
    if (!arg.empty()) flags.push_back(arg);
    return flags;
  }
  std::map<std::string, std::string> Env(int rank, int restart) {
    return ReadEnvFile(absl::StrCat(out_, "/env.", rank, ".", restart));
  }

  std::string marker_;
  std::string out_;
};

}  // namespace baton::launcher::testing

#endif  // BATON_TESTS_LAUNCHER_FIXTURE_H_
