// baton-run's hang report (docs/observability.md), end to end: a real job
// of two workers whose calls form a cycle (tests/launcher/stall_job.cc).
// The report names the cycle when --hang_timeout finds no progress, on
// SIGUSR1, and from `baton-run --dump RUN_ID` in another process.
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "obs/http_server.h"
#include "obs/state.h"
#include "testing/eventually.h"
#include "testing/promtool.h"
#include "tests/launcher/fixture.h"

namespace baton::launcher::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

std::string StallJobPath() { return Runfile("tests/launcher/stall_job"); }

// The reports baton-run wrote into `dir`, sorted by name (time).
std::vector<std::string> Reports(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (absl::StartsWith(e->d_name, "state_report_") && absl::EndsWith(e->d_name, ".json")) {
        out.push_back(absl::StrCat(dir, "/", e->d_name));
      }
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

proto::StateReport Load(const std::string& path) {
  proto::StateReport r;
  absl::Status s = obs::FromJson(ReadFile(path), &r);
  EXPECT_TRUE(s.ok()) << path << ": " << s;
  return r;
}

// The reports in `dir` whose reason contains `reason`, oldest first. A test
// picks reports by reason, not by position or count: on a loaded machine
// baton-run may legitimately write another automatic report (a worker that
// answered a progress check late counts as a change).
std::vector<proto::StateReport> ReportsFor(const std::string& dir, absl::string_view reason) {
  std::vector<proto::StateReport> out;
  for (const std::string& path : Reports(dir)) {
    proto::StateReport r = Load(path);
    if (absl::StrContains(r.reason(), reason)) out.push_back(std::move(r));
  }
  return out;
}

class StateReportTest : public LauncherTest {};

TEST_F(StateReportTest, H2_ACycleOfNestedCallsIsNamedByHangTimeoutSigusr1AndDump) {
  const std::string logs = out_ + "/logs";
  const std::string ready = out_ + "/ready";
  const std::string run_id = absl::StrCat("stall-", ::getpid());
  const int metrics_port = FreePort();
  Launcher job(marker_, {"--standalone", "--nproc_per_node", "2", "--run_id", run_id, "--log_dir",
                         logs, "--hang_timeout", "1", "--node_metrics_port",
                         absl::StrCat(metrics_port), "--stop_timeout", "2", "--monitor_interval",
                         "0.05", StallJobPath(), "--ready_file=" + ready});
  ASSERT_TRUE(WaitForFile(ready, absl::Seconds(60))) << job.Output();

  // --hang_timeout: nothing moves while they wait, so baton-run reports
  // (once the cycle stands; an earlier report, while rank 1 had not yet
  // called inner, would show only the one edge).
  proto::StateReport automatic;
  ASSERT_TRUE(::baton::testing::Eventually(
      [&] {
        for (proto::StateReport& r : ReportsFor(logs, "no progress for")) {
          if (::testing::Value(r.cycles(), Contains("0 -> 1 -> 0"))) {
            automatic = std::move(r);
            return true;
          }
        }
        return false;
      },
      absl::Seconds(30)))
      << job.Output();
  EXPECT_THAT(automatic.reason(), HasSubstr("(--hang_timeout)"));
  EXPECT_EQ(automatic.workers_size(), 2);
  EXPECT_EQ(automatic.unanswered_size(), 0);

  // SIGUSR1: another report, printed too.
  job.Signal(SIGUSR1);
  ASSERT_TRUE(::baton::testing::Eventually([&] { return !ReportsFor(logs, "SIGUSR1").empty(); },
                                           absl::Seconds(30)))
      << job.Output();
  const std::vector<proto::StateReport> asked_all = ReportsFor(logs, "SIGUSR1");
  ASSERT_EQ(asked_all.size(), 1u);
  const proto::StateReport& asked = asked_all.front();
  EXPECT_EQ(asked.reason(), "SIGUSR1");
  EXPECT_THAT(asked.cycles(), Contains("0 -> 1 -> 0"));
  EXPECT_THAT(asked.summary(), HasSubstr("w0 (rank 0) -> w1 (rank 1): rpc call of 'outer'"));
  EXPECT_THAT(asked.summary(), HasSubstr("w1 (rank 1) -> w0 (rank 0): rpc call of 'inner'"));
  ASSERT_TRUE(::baton::testing::Eventually(
      [&] { return absl::StrContains(job.Output(), "state report written to"); },
      absl::Seconds(10)));
  EXPECT_THAT(job.Output(), HasSubstr("cycle: w0 (rank 0) -> w1 (rank 1) -> w0 (rank 0)"));

  // --dump from another shell: the same report on stdout, and a file of it.
  Launcher dump(marker_, {"--dump", run_id});
  EXPECT_EQ(dump.Wait(absl::Seconds(30)), 0) << dump.Output();
  EXPECT_THAT(dump.Output(), HasSubstr("cycle: w0 (rank 0) -> w1 (rank 1) -> w0 (rank 0)"));
  EXPECT_THAT(dump.Output(), HasSubstr("in: inner from w1, running"));
  const std::vector<proto::StateReport> dumped = ReportsFor(logs, "baton-run --dump");
  ASSERT_EQ(dumped.size(), 1u);
  EXPECT_THAT(dumped.front().cycles(), Contains("0 -> 1 -> 0"));

  // A run that is not here.
  Launcher none(marker_, {"--dump", "no-such-run"});
  EXPECT_EQ(none.Wait(absl::Seconds(30)), 1);
  EXPECT_THAT(none.Output(), HasSubstr("no worker of run 'no-such-run'"));

  // --node_metrics_port: both workers' metrics on baton-run's one port,
  // labelled by rank, accepted by promtool.
  auto scrape =
      obs::HttpGet(absl::StrCat("127.0.0.1:", metrics_port), "/metrics", absl::Seconds(10));
  ASSERT_TRUE(scrape.ok()) << scrape.status();
  const std::string text = obs::HttpBody(*scrape);
  EXPECT_THAT(text, HasSubstr("baton_node_workers_scraped 2"));
  EXPECT_THAT(text, HasSubstr(R"(baton_rpc_pending_outgoing{rank="0"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(baton_rpc_pending_outgoing{rank="1"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(baton_rpc_messages_total{rank="0",peer="w1",transport="shm",)"
                              R"(direction="out"} 1)"));
  auto [code, said] = ::baton::testing::Promtool(text);
  EXPECT_EQ(code, 0) << said << "\n" << text;

  job.Signal(SIGTERM);
  EXPECT_EQ(job.Wait(absl::Seconds(30)), 128 + SIGTERM) << job.Output();
  // The sockets went with the job.
  Launcher after(marker_, {"--dump", run_id});
  EXPECT_EQ(after.Wait(absl::Seconds(30)), 1) << after.Output();
}

// Across nodes: two node agents (one worker each, each node with its own
// TMPDIR, so its own state directory) run the cycle between them. Node 0's
// report holds node 1's worker too, asked through its local worker by RPC
// (GET /job_state), and names the cycle that crosses the nodes.
TEST_F(StateReportTest, H2_AReportCoversTheWorkersOfOtherNodes) {
  const std::string ready = out_ + "/ready";
  const std::string run_id = absl::StrCat("stall2-", ::getpid());
  const int master_port = FreePort(), rdzv_port = FreePort();
  // Short directories: under a long TMPDIR the state dir falls back to
  // /tmp (socket paths are short), which both nodes would share.
  std::vector<std::string> tmp;
  for (int n = 0; n < 2; ++n) {
    char dir[] = "/tmp/baton-node-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    tmp.push_back(dir);
  }
  struct Cleanup {
    std::vector<std::string> dirs;
    ~Cleanup() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  } cleanup{tmp};
  std::vector<std::unique_ptr<Launcher>> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(std::make_unique<Launcher>(
        marker_, std::vector<std::string>{"--nnodes",           "2",
                                          "--node_rank",        absl::StrCat(n),
                                          "--nproc_per_node",   "1",
                                          "--master_addr",      "127.0.0.1",
                                          "--master_port",      absl::StrCat(master_port),
                                          "--rdzv_port",        absl::StrCat(rdzv_port),
                                          "--run_id",           run_id,
                                          "--log_dir",          absl::StrCat(out_, "/logs", n),
                                          "--stop_timeout",     "2",
                                          "--monitor_interval", "0.05",
                                          StallJobPath(),       "--ready_file=" + ready},
        std::map<std::string, std::string>{{"TMPDIR", tmp[n]},
                                           {"BATON_JOB_TOKEN", "state-report-test-token-0123"}}));
  }
  ASSERT_TRUE(WaitForFile(ready, absl::Seconds(60))) << nodes[0]->Output() << nodes[1]->Output();

  // Each node has only its own worker's socket.
  for (int n = 0; n < 2; ++n) {
    const std::string dir = absl::StrCat(tmp[n], "/baton-", ::getuid(), "/", run_id);
    EXPECT_EQ(::access(absl::StrCat(dir, "/rank", n, ".sock").c_str(), F_OK), 0) << dir;
    EXPECT_NE(::access(absl::StrCat(dir, "/rank", 1 - n, ".sock").c_str(), F_OK), 0) << dir;
  }
  Launcher dump(marker_, {"--dump", run_id}, {{"TMPDIR", tmp[0]}});
  EXPECT_EQ(dump.Wait(absl::Seconds(30)), 0) << dump.Output();
  EXPECT_THAT(dump.Output(), HasSubstr("cycle: w0 (rank 0) -> w1 (rank 1) -> w0 (rank 0)"));
  EXPECT_THAT(dump.Output(), HasSubstr("in: inner from w1, running"));
  EXPECT_THAT(dump.Output(), HasSubstr("in: outer from w0, running"));
  const std::vector<std::string> written = Reports(absl::StrCat(out_, "/logs0"));
  ASSERT_EQ(written.size(), 1u) << dump.Output();
  const proto::StateReport report = Load(written.front());
  EXPECT_EQ(report.workers_size(), 2);
  EXPECT_EQ(report.unanswered_size(), 0) << report.summary();
  EXPECT_THAT(report.cycles(), Contains("0 -> 1 -> 0"));
  // And from the other node, the same job.
  Launcher dump1(marker_, {"--dump", run_id}, {{"TMPDIR", tmp[1]}});
  EXPECT_EQ(dump1.Wait(absl::Seconds(30)), 0) << dump1.Output();
  EXPECT_THAT(dump1.Output(), HasSubstr("cycle: w0 (rank 0) -> w1 (rank 1) -> w0 (rank 0)"));

  for (auto& node : nodes) node->Signal(SIGTERM);
  for (auto& node : nodes) EXPECT_NE(node->Wait(absl::Seconds(30)), -1) << node->Output();
}

}  // namespace
}  // namespace baton::launcher::testing
