// baton-run with several node agents on one machine: static two-node jobs,
// a node that never arrives, an elastic MIN:MAX job losing a node, and the
// job token a multi-node job must bring (never sent through the store).
#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/first_connection.h"
#include "tests/launcher/fixture.h"

namespace baton::launcher::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kJobTimeout = absl::Seconds(60);
constexpr char kToken[] = "multi-node-test-token-0123456789";

class MultiNodeTest : public LauncherTest {
 protected:
  std::unique_ptr<Launcher> Node(const std::string& nnodes, int node_rank, const std::string& mode,
                                 std::vector<std::string> extra = {}, const std::string& arg = "") {
    std::vector<std::string> flags = {"--nnodes",         nnodes,
                                      "--node_rank",      absl::StrCat(node_rank),
                                      "--nproc_per_node", "2",
                                      "--master_addr",    "127.0.0.1",
                                      "--master_port",    absl::StrCat(master_port_),
                                      "--rdzv_port",      absl::StrCat(rdzv_port_)};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return std::make_unique<Launcher>(marker_, Args(flags, mode, arg), env_);
  }
  // Writes `token` to a file of mode `mode` in the test's directory.
  std::string TokenFile(const std::string& token, mode_t mode) {
    const std::string path = absl::StrCat(::testing::TempDir(), "/token-", master_port_);
    std::ofstream(path) << token << "\n";
    ::chmod(path.c_str(), mode);
    return path;
  }
  // The job's CA with certificate "node", and another CA with "rogue" in
  // other/ (tools/make_certs.sh); empty if openssl failed.
  std::string Certificates() {
    const std::string dir = absl::StrCat(::testing::TempDir(), "/certs-", master_port_);
    const std::string cmd = absl::StrCat("bash tools/make_certs.sh ", dir, " node && ",
                                         "bash tools/make_certs.sh ", dir, "/other rogue");
    return std::system(cmd.c_str()) == 0 ? dir : "";
  }
  // Every node gets the same token unless a test says otherwise.
  std::map<std::string, std::string> env_ = {{"BATON_JOB_TOKEN", kToken}};
  int master_port_ = FreePort();
  int rdzv_port_ = FreePort();
};

TEST_F(MultiNodeTest, TwoNodesGetConsistentGlobalRanks) {
  // Node 1 starts first: it waits for the master node's store. Its first
  // try finds no store (the test's listener takes the connection and drops
  // it); only then does the master node start.
  auto n1 = Node("2", 1, "env");
  ASSERT_TRUE(::baton::testing::AcceptAndDropOneConnection(rdzv_port_, kJobTimeout))
      << n1->Output();
  auto n0 = Node("2", 0, "env");
  ASSERT_EQ(n0->Wait(kJobTimeout), 0) << n0->Output();
  ASSERT_EQ(n1->Wait(kJobTimeout), 0) << n1->Output();
  const auto first = Env(0, 0);
  for (int r = 0; r < 4; ++r) {
    auto env = Env(r, 0);
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(env["RANK"], absl::StrCat(r));
    EXPECT_EQ(env["LOCAL_RANK"], absl::StrCat(r % 2));
    EXPECT_EQ(env["GROUP_RANK"], absl::StrCat(r / 2));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(env["MASTER_PORT"], absl::StrCat(master_port_));
    EXPECT_EQ(env["BATON_RUN_ID"], first.at("BATON_RUN_ID"));
    EXPECT_EQ(env["BATON_JOB_TOKEN"], kToken);
  }
}

TEST_F(MultiNodeTest, JobWithoutATokenFailsAtStartSayingHowToProvideOne) {
  env_.clear();
  auto n0 = Node("2", 0, "env");
  EXPECT_EQ(n0->Wait(absl::Seconds(20)), 2);
  EXPECT_THAT(n0->Output(), HasSubstr("needs the same job token from outside the job"));
  EXPECT_THAT(n0->Output(), HasSubstr("BATON_JOB_TOKEN"));
  EXPECT_THAT(n0->Output(), HasSubstr("--job_token_file"));
  env_ = {{"BATON_JOB_TOKEN", "short"}};
  auto n1 = Node("2", 1, "env");
  EXPECT_EQ(n1->Wait(absl::Seconds(20)), 2);
  EXPECT_THAT(n1->Output(), HasSubstr("needs at least 16 random characters"));
}

TEST_F(MultiNodeTest, NodeWithAnotherTokenCannotReadTheRendezvousRecord) {
  auto n0 = Node("2", 0, "env", {"--rdzv_timeout", "5"});
  env_ = {{"BATON_JOB_TOKEN", "some-other-token-0123456789"}};
  auto n1 = Node("2", 1, "env", {"--rdzv_timeout", "5"});
  EXPECT_NE(n1->Wait(kJobTimeout), 0);
  EXPECT_THAT(n1->Output(), HasSubstr("publish the job settings"));
  EXPECT_THAT(n1->Output(), HasSubstr("wrong job token"));
  // Node 0 never sees a second node: it gives up at the rendezvous timeout.
  EXPECT_NE(n0->Wait(kJobTimeout), 0);
  EXPECT_TRUE(ProcessesWithMarker(marker_).empty());
}

TEST_F(MultiNodeTest, TokenFromAFileOnEveryNode) {
  const std::string path = TokenFile("token-from-a-file-0123456789", 0600);
  env_.clear();
  auto n0 = Node("2", 0, "env", {"--job_token_file", path});
  auto n1 = Node("2", 1, "env", {"--job_token_file", path});
  ASSERT_EQ(n0->Wait(kJobTimeout), 0) << n0->Output();
  ASSERT_EQ(n1->Wait(kJobTimeout), 0) << n1->Output();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(Env(r, 0)["BATON_JOB_TOKEN"], "token-from-a-file-0123456789") << r;
  }
  // A token file others can read is refused.
  ::chmod(path.c_str(), 0644);
  auto bad = Node("2", 0, "env", {"--job_token_file", path});
  EXPECT_EQ(bad->Wait(absl::Seconds(20)), 2);
  EXPECT_THAT(bad->Output(), HasSubstr("chmod 600"));
}

TEST_F(MultiNodeTest, MutualTlsBetweenNodesAndItsFilesReachTheWorkers) {
  const std::string certs = Certificates();
  ASSERT_FALSE(certs.empty());
  const std::vector<std::string> tls = {"--tls_ca",   certs + "/ca.pem",
                                        "--tls_cert", certs + "/node.pem",
                                        "--tls_key",  certs + "/node.key"};
  auto n0 = Node("2", 0, "env", tls);
  auto n1 = Node("2", 1, "env", tls);
  ASSERT_EQ(n0->Wait(kJobTimeout), 0) << n0->Output();
  ASSERT_EQ(n1->Wait(kJobTimeout), 0) << n1->Output();
  for (int r = 0; r < 4; ++r) {
    auto env = Env(r, 0);
    EXPECT_EQ(env["BATON_TLS_CA"], certs + "/ca.pem") << r;
    EXPECT_EQ(env["BATON_TLS_KEY"], certs + "/node.key") << r;
  }
}

TEST_F(MultiNodeTest, NodeWithoutTheJobsCertificateCannotJoin) {
  const std::string certs = Certificates();
  ASSERT_FALSE(certs.empty());
  auto n0 = Node("2", 0, "env",
                 {"--rdzv_timeout", "4", "--tls_ca", certs + "/ca.pem", "--tls_cert",
                  certs + "/node.pem", "--tls_key", certs + "/node.key"});
  auto rogue =
      Node("2", 1, "env",
           {"--rdzv_timeout", "4", "--heartbeat_timeout", "4", "--tls_ca", certs + "/other/ca.pem",
            "--tls_cert", certs + "/other/rogue.pem", "--tls_key", certs + "/other/rogue.key"});
  EXPECT_NE(rogue->Wait(kJobTimeout), 0);
  EXPECT_NE(n0->Wait(kJobTimeout), 0);  // no second node ever arrived
  EXPECT_TRUE(ProcessesWithMarker(marker_).empty());
}

TEST_F(MultiNodeTest, FailureOnOneNodeRestartsBothNodes) {
  auto n0 = Node("2", 0, "fail_once", {"--max_restarts", "2"});
  auto n1 = Node("2", 1, "fail_once", {"--max_restarts", "2"});
  ASSERT_EQ(n0->Wait(kJobTimeout), 0) << n0->Output();
  ASSERT_EQ(n1->Wait(kJobTimeout), 0) << n1->Output();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(Env(r, 1)["BATON_RESTART_COUNT"], "1") << r;
  }
}

TEST_F(MultiNodeTest, RestartsExhaustedFailEveryNodeWithTheSummary) {
  auto n0 = Node("2", 0, "fail_always", {"--max_restarts", "1"});
  auto n1 = Node("2", 1, "fail_always", {"--max_restarts", "1"});
  EXPECT_EQ(n0->Wait(kJobTimeout), 1);
  EXPECT_EQ(n1->Wait(kJobTimeout), 1);
  // Rank 1 runs on node 0; node 1 prints the same summary from the store.
  for (Launcher* n : {n0.get(), n1.get()}) {
    EXPECT_THAT(n->Output(), HasSubstr("first failure: rank 1 "));
    EXPECT_THAT(n->Output(), HasSubstr("exit code 42"));
    EXPECT_THAT(n->Output(), HasSubstr("planned failure 1"));
  }
}

// Node 1 must have arrived when node 0's rendezvous times out, or node 0
// would name it missing too: node 1 starts once node 0's rendezvous store
// accepts connections, and the timeout (8 s) leaves it ample time to arrive
// on a loaded machine (it once was 2 s, which under load sometimes passed
// before node 1 connected).
TEST_F(MultiNodeTest, NodeThatNeverArrivesIsNamed) {
  auto n0 = Node("3", 0, "env", {"--rdzv_timeout", "8"});
  ASSERT_TRUE(WaitForPort(rdzv_port_, absl::Seconds(30))) << n0->Output();
  auto n1 = Node("3", 1, "env", {"--rdzv_timeout", "8"});
  EXPECT_EQ(n0->Wait(kJobTimeout), 1);
  EXPECT_EQ(n1->Wait(kJobTimeout), 1);
  for (Launcher* n : {n0.get(), n1.get()}) {
    EXPECT_THAT(n->Output(), HasSubstr("missing node rank 2")) << n->Output();
  }
}

TEST_F(MultiNodeTest, SigtermOnTheMasterStopsEveryNode) {
  auto n0 = Node("2", 0, "sleep_trap");
  auto n1 = Node("2", 1, "sleep_trap");
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(WaitForFile(absl::StrCat(out_, "/ready.", r), kJobTimeout));
  }
  n0->Signal(SIGTERM);
  EXPECT_EQ(n0->Wait(absl::Seconds(30)), 128 + SIGTERM) << n0->Output();
  EXPECT_EQ(n1->Wait(absl::Seconds(30)), 1) << n1->Output();
  EXPECT_THAT(n1->Output(), HasSubstr("received SIGTERM"));
  EXPECT_THAT(ProcessesWithMarker(marker_), ::testing::IsEmpty());
}

TEST_F(MultiNodeTest, ElasticJobLosesANodeAndContinuesSmaller) {
  // The last call (from the second node's arrival) must outlast a loaded
  // machine's start of the third node; a full round closes at once.
  const std::vector<std::string> elastic = {"--heartbeat_timeout", "2", "--rdzv_last_call", "5"};
  // Workers succeed once the world is down to 2 nodes x 2 workers.
  auto n0 = Node("2:3", 0, "elastic", elastic, "4");
  auto n1 = Node("2:3", 1, "elastic", elastic, "4");
  auto n2 = Node("2:3", 2, "elastic", elastic, "4");
  for (int r = 0; r < 6; ++r) {
    ASSERT_TRUE(WaitForFile(absl::StrCat(out_, "/ready.", r, ".6"), kJobTimeout)) << n0->Output();
  }
  // Node 2 dies without a word; its workers die with it (PDEATHSIG).
  ::kill(n2->pid(), SIGKILL);
  EXPECT_EQ(n2->Wait(absl::Seconds(10)), 128 + SIGKILL);
  ASSERT_EQ(n0->Wait(kJobTimeout), 0) << n0->Output();
  ASSERT_EQ(n1->Wait(kJobTimeout), 0) << n1->Output();
  EXPECT_THAT(n0->Output(), HasSubstr("node_lost"));
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(FileExists(absl::StrCat(out_, "/ready.", r, ".4"))) << r;
  }
  // A membership change does not consume a restart.
  auto env = ReadEnvFile(absl::StrCat(out_, "/env.3.0"));
  EXPECT_EQ(env["WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
}

TEST_F(MultiNodeTest, ElasticJobGrowsWhenANodeJoins) {
  const std::vector<std::string> elastic = {"--rdzv_last_call", "0.5"};
  auto n0 = Node("1:2", 0, "elastic", elastic, "4");
  ASSERT_TRUE(WaitForFile(absl::StrCat(out_, "/ready.0.2"), kJobTimeout)) << n0->Output();
  // A node without --node_rank joins the running job.
  std::vector<std::string> flags = {"--nnodes",         "1:2",
                                    "--nproc_per_node", "2",
                                    "--master_addr",    "127.0.0.1",
                                    "--master_port",    absl::StrCat(master_port_),
                                    "--rdzv_port",      absl::StrCat(rdzv_port_),
                                    "--rdzv_last_call", "0.5"};
  Launcher n1(marker_, Args(flags, "elastic", "4"), env_);
  ASSERT_EQ(n0->Wait(kJobTimeout), 0) << n0->Output();
  ASSERT_EQ(n1.Wait(kJobTimeout), 0) << n1.Output();
  EXPECT_THAT(n0->Output(), HasSubstr("node_joined"));
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(FileExists(absl::StrCat(out_, "/ready.", r, ".4"))) << r;
  }
}

}  // namespace
}  // namespace baton::launcher::testing
