// baton-run --rdzv_backend etcd against a real etcd started by the test
// (testing/etcd_server.h): the node agents rendezvous in etcd and the
// workers keep their store there, so no process of the job serves it.
// - Rank 0 (the head role, restart policy "worker") is SIGKILLed during
//   start-up; it restarts alone, rejoins (P5) and the job ends well. With
//   baton-run's own store this cannot work: rank 0 serves that store.
// - Two nodes, static and elastic (no node ranks: the first to claim the
//   host key hosts), get consistent ranks from one etcd.
// - The job's keys are gone from etcd once the job ended.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/agent.h"
#include "store/etcd_store.h"
#include "testing/etcd_server.h"
#include "tests/launcher/fixture.h"

namespace baton::launcher::testing {
namespace {

using ::baton::testing::EtcdServer;
using ::testing::HasSubstr;

constexpr absl::Duration kJobTimeout = absl::Seconds(90);
constexpr char kToken[] = "etcd-test-job-token-0123456789";

class EtcdLaunchTest : public LauncherTest {
 protected:
  void SetUp() override {
    LauncherTest::SetUp();
    auto etcd = EtcdServer::Start();
    ASSERT_TRUE(etcd.ok()) << etcd.status() << " (tools/install_deps.sh installs etcd-server)";
    etcd_ = *std::move(etcd);
  }
  std::vector<std::string> EtcdFlags(const std::string& job) {
    return {"--rdzv_backend", "etcd", "--rdzv_endpoint", etcd_->endpoint(), "--rdzv_id", job};
  }
  // How many keys the job left under /baton/<job>/ (its rendezvous).
  int64_t KeysLeft(const std::string& job) {
    store::EtcdStoreOptions o;
    o.endpoint = etcd_->endpoint();
    o.prefix = absl::StrCat("/baton/", job, "/rdzv/");
    o.lease_ttl = absl::ZeroDuration();
    auto store = store::EtcdStore::Connect(o);
    if (!store.ok()) return -1;
    auto n = (*store)->NumKeys();
    return n.ok() ? *n : -1;
  }
  std::unique_ptr<EtcdServer> etcd_;
};

TEST_F(EtcdLaunchTest, RankZeroRestartedAloneDuringStartUpRejoins) {
  const std::pair<rpc::RendezvousStep, const char*> steps[] = {
      {rpc::RendezvousStep::kRegistered, "rank0-registered"},
      {rpc::RendezvousStep::kBeforeInitBarrier, "rank0-before-barrier"}};
  for (const auto& [at, job] : steps) {
    const std::string step = rpc::RendezvousStepName(at);
    SCOPED_TRACE(step);
    std::vector<std::string> args = EtcdFlags(job);
    args.insert(args.end(), {"--standalone",
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
                             "head=worker",
                             "--restart_policy",
                             "w=worker",
                             "--max_restarts",
                             "2",
                             "--tee",
                             Runfile("tests/launcher/startup_job"),
                             "--all_pairs",
                             "--victim=0",
                             absl::StrCat("--die_at=", step)});
    Launcher l(marker_, args, {{"BATON_JOB_TOKEN", kToken}});
    ASSERT_EQ(l.Wait(kJobTimeout), 0) << l.Output();
    EXPECT_THAT(l.Output(), HasSubstr(absl::StrCat("rank 0: SIGKILL at rendezvous step '", step)));
    EXPECT_THAT(l.Output(), HasSubstr("restarting that worker alone"));
    EXPECT_THAT(l.Output(), HasSubstr("rank 0: started, incarnation 2"));
    EXPECT_THAT(l.Output(), HasSubstr("RESULT OK"));
    EXPECT_EQ(KeysLeft(job), 0);
  }
}

TEST_F(EtcdLaunchTest, TwoNodesRendezvousInEtcd) {
  const int master_port = FreePort();
  auto node = [&](int rank) {
    std::vector<std::string> flags = EtcdFlags("two-nodes");
    flags.insert(flags.end(),
                 {"--nnodes", "2", "--node_rank", absl::StrCat(rank), "--nproc_per_node", "2",
                  "--master_port", absl::StrCat(master_port)});
    return std::make_unique<Launcher>(
        marker_, Args(flags, "env"),
        std::map<std::string, std::string>{{"BATON_JOB_TOKEN", kToken}});
  };
  auto n1 = node(1);
  auto n0 = node(0);
  ASSERT_EQ(n0->Wait(kJobTimeout), 0) << n0->Output();
  ASSERT_EQ(n1->Wait(kJobTimeout), 0) << n1->Output();
  for (int r = 0; r < 4; ++r) {
    auto env = Env(r, 0);
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(env["RANK"], absl::StrCat(r));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["GROUP_RANK"], absl::StrCat(r / 2));
    EXPECT_EQ(env["BATON_RUN_ID"], "two-nodes");
    EXPECT_EQ(env["BATON_STORE_ETCD"], etcd_->endpoint());
    EXPECT_EQ(env["BATON_STORE_PREFIX"], "/baton/two-nodes/w/0/");
  }
  EXPECT_EQ(KeysLeft("two-nodes"), 0);
}

TEST_F(EtcdLaunchTest, ElasticNodesWithoutRanksClaimTheHost) {
  auto node = [&] {
    std::vector<std::string> flags = EtcdFlags("elastic");
    flags.insert(flags.end(),
                 {"--nnodes", "2:3", "--nproc_per_node", "2", "--rdzv_last_call", "1"});
    return std::make_unique<Launcher>(
        marker_, Args(flags, "env"),
        std::map<std::string, std::string>{{"BATON_JOB_TOKEN", kToken}});
  };
  auto a = node();
  auto b = node();
  ASSERT_EQ(a->Wait(kJobTimeout), 0) << a->Output();
  ASSERT_EQ(b->Wait(kJobTimeout), 0) << b->Output();
  for (int r = 0; r < 4; ++r) {
    auto env = Env(r, 0);
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(env["RANK"], absl::StrCat(r));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
  }
}

// N4, no node is special: the node hosting an elastic job's rendezvous dies
// (SIGKILL, its workers with it); its etcd session expires after
// --heartbeat_timeout, exactly one survivor claims the job's host key, and
// the two survivors train on as a smaller job.
TEST_F(EtcdLaunchTest, N4_ElasticJobSurvivesTheLossOfItsHostNode) {
  std::vector<std::unique_ptr<Launcher>> nodes;
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> flags = EtcdFlags("host-lost");
    // The last call must outlast a loaded machine's start of the third node.
    flags.insert(flags.end(), {"--nnodes", "2:3", "--nproc_per_node", "2", "--rdzv_last_call", "5",
                               "--heartbeat_timeout", "2"});
    nodes.push_back(std::make_unique<Launcher>(
        marker_, Args(flags, "elastic", "4"),
        std::map<std::string, std::string>{{"BATON_JOB_TOKEN", kToken}}));
  }
  // Workers succeed once the world is 2 nodes x 2 workers.
  for (int r = 0; r < 6; ++r) {
    ASSERT_TRUE(WaitForFile(absl::StrCat(out_, "/ready.", r, ".6"), kJobTimeout))
        << nodes[0]->Output() << nodes[1]->Output() << nodes[2]->Output();
  }
  int host = -1;
  for (int i = 0; i < 3; ++i) {
    if (nodes[i]->Output().find("this node hosts the rendezvous") != std::string::npos) host = i;
  }
  ASSERT_GE(host, 0);
  ::kill(nodes[host]->pid(), SIGKILL);
  EXPECT_EQ(nodes[host]->Wait(absl::Seconds(10)), 128 + SIGKILL);
  std::string took_over;
  for (int i = 0; i < 3; ++i) {
    if (i == host) continue;
    ASSERT_EQ(nodes[i]->Wait(kJobTimeout), 0) << nodes[i]->Output();
    if (nodes[i]->Output().find("hosts the rendezvous now") != std::string::npos) {
      took_over += absl::StrCat(i);
    }
  }
  EXPECT_EQ(took_over.size(), 1u) << "exactly one survivor takes over";
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(FileExists(absl::StrCat(out_, "/ready.", r, ".4"))) << r;
  }
  EXPECT_EQ(KeysLeft("host-lost"), 0);
}

}  // namespace
}  // namespace baton::launcher::testing
