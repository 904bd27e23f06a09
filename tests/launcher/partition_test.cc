// A silent network partition between two hosts (two network namespaces),
// as a user meets it: one baton-run node in each, the built-in rendezvous
// store on node 0, and a worker on node 0 calling one on node 1 every 0.1 s
// with a 3 s deadline (partition_job). The guarantees are in
// docs/peer_failures.md, "Partitions"; the agent's own decisions are tested
// on the loopback network in tests/rpc/partition_test.cc.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/etcd_server.h"
#include "testing/eventually.h"
#include "tests/launcher/netns.h"

namespace baton::launcher::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// One line of partition_job's calls.log.
struct CallRecord {
  absl::Time start;
  absl::Duration took;
  std::string outcome;  // "ok", or the status code's name and the message
  bool ok() const { return outcome == "ok"; }
};

std::vector<CallRecord> ReadCalls(const std::string& path) {
  std::vector<CallRecord> calls;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    int64_t start_ms = 0, took_ms = 0;
    if (f.size() != 3 || !absl::SimpleAtoi(f[0], &start_ms) || !absl::SimpleAtoi(f[1], &took_ms)) {
      continue;  // a line being written
    }
    calls.push_back(
        {absl::FromUnixMillis(start_ms), absl::Milliseconds(took_ms), std::string(f[2])});
  }
  return calls;
}

int OkSince(const std::vector<CallRecord>& calls, absl::Time since) {
  int n = 0;
  for (const CallRecord& c : calls) n += c.ok() && c.start >= since;
  return n;
}

class PartitionTest : public NetnsTest {
 protected:
  // Starts both nodes with the flags given (beyond the job's own), running
  // partition_job, or `job` (a command) if given.
  void StartNodes(const std::vector<std::string>& extra, std::vector<std::string> job = {}) {
    if (job.empty()) {
      job = {Runfile("tests/launcher/partition_job"), absl::StrCat("--out=", out_)};
    }
    for (int n = 0; n < 2; ++n) {
      std::vector<std::string> args = {
          "--nnodes",       "2",     "--node_rank", absl::StrCat(n), "--master_addr",      addr_[0],
          "--master_port",  "29600", "--rdzv_port", "29601",         "--monitor_interval", "0.05",
          "--stop_timeout", "2"};
      args.insert(args.end(), extra.begin(), extra.end());
      if (std::find(extra.begin(), extra.end(), "--role") == extra.end()) {
        args.insert(args.end(), {"--nproc_per_node", "1"});
      }
      args.insert(args.end(), job.begin(), job.end());
      nodes_.push_back(std::make_unique<Launcher>(
          marker_, args, Environment(), std::vector<std::string>{"ip", "netns", "exec", ns_[n]}));
    }
  }
  std::map<std::string, std::string> Environment() const {
    std::map<std::string, std::string> env = {
        {"BATON_JOB_TOKEN", "partition-test-token-0123456789"},
        // Both namespaces share one kernel: keep to the network.
        {"BATON_TRANSPORT", "grpc"},
        {"BATON_SHM", "0"}};
    env.insert(extra_env_.begin(), extra_env_.end());
    return env;
  }
  std::string CallsLog() const { return out_ + "/calls.log"; }
  // Waits for `n` successful calls started at or after `since`.
  bool WaitForCalls(int n, absl::Time since, absl::Duration timeout) {
    return ::baton::testing::Eventually([&] { return OkSince(ReadCalls(CallsLog()), since) >= n; },
                                        timeout);
  }

  // With partition_job running: 10 calls, a 10-second partition, 20 calls
  // after the heal, then the job's end, 0 on both nodes.
  void ThroughATenSecondPartition(absl::Time* cut, absl::Time* healed) {
    ASSERT_TRUE(WaitForCalls(10, absl::InfinitePast(), absl::Seconds(60)))
        << nodes_[0]->Output() << nodes_[1]->Output();
    *cut = absl::Now();
    Partition();
    // The partition's length is the scenario, not a wait for an event.
    absl::SleepFor(absl::Seconds(10));
    Heal();
    *healed = absl::Now();
    ASSERT_TRUE(WaitForCalls(20, *healed, absl::Seconds(30)))
        << nodes_[0]->Output() << nodes_[1]->Output();
    ASSERT_EQ(Sh(absl::StrCat("touch ", out_, "/stop")), 0);
    for (int n = 0; n < 2; ++n) {
      EXPECT_EQ(nodes_[n]->Wait(absl::Seconds(60)), 0) << "node " << n << "\n"
                                                       << nodes_[n]->Output();
    }
  }

  std::vector<std::unique_ptr<Launcher>> nodes_;
  std::map<std::string, std::string> extra_env_;
};

// The scenario: a 10-second silent partition, the default tolerance
// (30 s). The calls made during it fail at their own deadlines, naming the
// callee; the calls after the heal succeed; the job ends with 0 on both
// nodes, and no process was killed.
TEST_F(PartitionTest, Q1_Q2_Q4_ATenSecondPartitionCostsOnlyTheCallsDuringIt) {
  StartNodes({});
  absl::Time cut, healed;
  ThroughATenSecondPartition(&cut, &healed);
  if (HasFatalFailure()) return;
  const std::vector<CallRecord> calls = ReadCalls(CallsLog());
  int failed = 0;
  absl::Time first_ok_after = absl::InfiniteFuture();
  for (const CallRecord& c : calls) {
    if (c.ok()) {
      if (c.start + c.took >= healed) first_ok_after = std::min(first_ok_after, c.start + c.took);
      continue;
    }
    ++failed;
    // Only calls that overlapped the partition failed, and each by naming
    // the callee: at its deadline, or when its stream broke.
    EXPECT_GE(c.start + c.took, cut) << c.outcome;
    EXPECT_LE(c.start, healed) << c.outcome;
    EXPECT_THAT(c.outcome, HasSubstr("worker 'w1'"));
    if (absl::StartsWith(c.outcome, "DEADLINE_EXCEEDED")) {
      EXPECT_GE(c.took, absl::Milliseconds(2900)) << c.outcome;
      EXPECT_LE(c.took, absl::Milliseconds(3500)) << c.outcome;
    } else {
      // Its stream broke: timed out during the partition, or reset at the
      // heal by a callee whose end had timed out.
      EXPECT_TRUE(absl::StartsWith(c.outcome, "UNAVAILABLE")) << c.outcome;
      EXPECT_TRUE(absl::StrContains(c.outcome, "a network partition or a hung host") ||
                  absl::StrContains(c.outcome, "stream ended"))
          << c.outcome;
    }
  }
  EXPECT_GE(failed, 2);
  // Calls went through again within a few seconds of the heal.
  EXPECT_LE(first_ok_after - healed, absl::Seconds(5));
  for (int n = 0; n < 2; ++n) {
    EXPECT_THAT(nodes_[n]->Output(), ::testing::Not(HasSubstr("cut off"))) << nodes_[n]->Output();
  }
}

// The parameter server over two nodes (a server and a trainer on each),
// the example's full run (2 epochs), through a 10-second partition early in
// training: the pulls and pushes that the partition broke go again after
// the heal (a server applies a push once, PS9), every push is applied once,
// and the job reaches its usual accuracy (0.84, the example's bar).
TEST_F(PartitionTest, Q3_AParameterServerJobReachesItsAccuracyThroughATenSecondPartition) {
  StartNodes({"--role", "ps:1", "--role", "trainer:1"},
             {Runfile("examples/ps_fashion_mnist"), "--min_accuracy", "0.84"});
  ASSERT_TRUE(::baton::testing::Eventually(
      [&] { return absl::StrContains(nodes_[0]->Output(), "] step 200 "); }, absl::Seconds(120)))
      << nodes_[0]->Output() << nodes_[1]->Output();
  Partition();
  absl::SleepFor(absl::Seconds(10));  // the partition's length (the scenario), not a wait
  Heal();
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(nodes_[n]->Wait(absl::Seconds(180)), 0) << "node " << n << "\n"
                                                      << nodes_[n]->Output();
  }
  EXPECT_THAT(nodes_[0]->Output() + nodes_[1]->Output(), HasSubstr("RESULT OK"));
  // 2 trainers x 938 steps, each push applied once by each server: a push
  // resent after the partition (its reply was lost) is counted as a repeat,
  // "(N repeats not applied)", not applied again.
  for (int n = 0; n < 2; ++n) {
    EXPECT_THAT(nodes_[n]->Output(),
                AnyOf(HasSubstr("applied pushes 1876;"), HasSubstr("applied pushes 1876 (")))
        << "node " << n;
  }
}

// Past the tolerance (4 s here), the cut-off node stops its workers by
// itself, saying why, within the tolerance plus 10 s; the master node
// names the lost node and, the job not being elastic, fails once the node
// did not come back within --rdzv_timeout.
TEST_F(PartitionTest, Q5_ANodeCutOffPastTheToleranceStopsItsWorkersAndTheJobEnds) {
  const absl::Duration tolerance = absl::Seconds(4);
  StartNodes({"--partition_tolerance", "4", "--rdzv_timeout", "5"});
  ASSERT_TRUE(WaitForCalls(10, absl::InfinitePast(), absl::Seconds(60)))
      << nodes_[0]->Output() << nodes_[1]->Output();
  const absl::Time cut = absl::Now();
  Partition();
  EXPECT_EQ(nodes_[1]->Wait(tolerance + absl::Seconds(10)), 1) << nodes_[1]->Output();
  const absl::Duration fenced = absl::Now() - cut;
  EXPECT_GE(fenced, tolerance);
  EXPECT_THAT(nodes_[1]->Output(), HasSubstr("this node is cut off from the job"));
  EXPECT_THAT(nodes_[1]->Output(), HasSubstr(absl::StrCat(addr_[0], ":29601")));
  // The master node: lost after the tolerance + 10 s, then the rendezvous
  // timeout (5 s) and the workers' stop (2 s), with some slack.
  EXPECT_EQ(nodes_[0]->Wait(absl::Seconds(40)), 1) << nodes_[0]->Output();
  EXPECT_THAT(nodes_[0]->Output(), HasSubstr("node_lost: node rank 1"));
  EXPECT_THAT(nodes_[0]->Output(), HasSubstr("missing node rank 1"));
  Heal();
}

// The same two scenarios with the rendezvous in etcd, which runs on node 0's
// host: node 1 is cut off from etcd as well as from node 0.
class EtcdPartitionTest : public PartitionTest {
 protected:
  void SetUp() override {
    PartitionTest::SetUp();
    if (IsSkipped()) return;
    ::baton::testing::EtcdServerOptions o;
    o.netns = ns_[0];
    o.host = addr_[0];
    auto etcd = ::baton::testing::EtcdServer::Start(o);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    // A test etcd on another "host" without TLS or users.
    extra_env_["BATON_ETCD_INSECURE"] = "1";
  }
  void TearDown() override {
    etcd_.reset();
    PartitionTest::TearDown();
  }
  std::vector<std::string> EtcdFlags(const std::string& job) const {
    return {"--rdzv_backend", "etcd", "--rdzv_endpoint", etcd_->endpoint(), "--rdzv_id", job};
  }
  std::unique_ptr<::baton::testing::EtcdServer> etcd_;
};

TEST_F(EtcdPartitionTest, Q1_Q2_Q4_ATenSecondPartitionCostsOnlyTheCallsDuringIt) {
  StartNodes(EtcdFlags("partition-short"));
  absl::Time cut, healed;
  ThroughATenSecondPartition(&cut, &healed);
  if (HasFatalFailure()) return;
  for (int n = 0; n < 2; ++n) {
    EXPECT_THAT(nodes_[n]->Output(), ::testing::Not(HasSubstr("cut off")));
  }
}

TEST_F(EtcdPartitionTest, Q5_ANodeCutOffPastTheToleranceStopsItsWorkersAndTheJobEnds) {
  const absl::Duration tolerance = absl::Seconds(4);
  std::vector<std::string> flags = EtcdFlags("partition-long");
  flags.insert(flags.end(), {"--partition_tolerance", "4", "--rdzv_timeout", "5"});
  StartNodes(flags);
  ASSERT_TRUE(WaitForCalls(10, absl::InfinitePast(), absl::Seconds(60)))
      << nodes_[0]->Output() << nodes_[1]->Output();
  const absl::Time cut = absl::Now();
  Partition();
  EXPECT_EQ(nodes_[1]->Wait(tolerance + absl::Seconds(10)), 1) << nodes_[1]->Output();
  EXPECT_GE(absl::Now() - cut, tolerance);
  EXPECT_THAT(nodes_[1]->Output(), HasSubstr("this node is cut off from the job"));
  EXPECT_THAT(nodes_[1]->Output(), HasSubstr(absl::StrCat("etcd ", etcd_->endpoint())));
  EXPECT_EQ(nodes_[0]->Wait(absl::Seconds(40)), 1) << nodes_[0]->Output();
  EXPECT_THAT(nodes_[0]->Output(), HasSubstr("node_lost: node rank 1"));
  Heal();
}

}  // namespace
}  // namespace baton::launcher::testing
