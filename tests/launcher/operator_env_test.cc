// baton-run started as the Kubeflow operators start a pod's container: no
// node flags, only the environment each operator's source sets
// (tests/launcher/torchrun_env_test.cc lists it), with the pods' names
// replaced by loopback addresses. Checks the ranks, world sizes and
// addresses every worker gets.
#include <unistd.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/ports.h"
#include "tests/launcher/fixture.h"

namespace baton::launcher::testing {
namespace {

constexpr absl::Duration kJobTimeout = absl::Seconds(60);
constexpr char kToken[] = "operator-env-test-token-0123456789";

// MASTER_PORT: baton-run's rendezvous takes the next port, so both must be
// free.
int MasterPort() {
  for (int tries = 0; tries < 50; ++tries) {
    const int p = FreePort();
    if (p > 0 && p < 65535 && baton::testing::PortIsFree(p + 1)) return p;
  }
  return -1;
}

class OperatorEnvTest : public LauncherTest {
 protected:
  std::unique_ptr<Launcher> Pod(std::map<std::string, std::string> env) {
    env["BATON_JOB_TOKEN"] = kToken;  // from the job's Secret (docs/kubernetes.md)
    return std::make_unique<Launcher>(marker_, Args({}, "env"), env);
  }
  // Every worker of a 2-node x 2-worker job got consistent ranks.
  void ExpectFourWorkers(const std::string& master_addr, const std::string& master_port) {
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
      EXPECT_EQ(env["MASTER_ADDR"], master_addr);
      if (!master_port.empty()) {
        EXPECT_EQ(env["MASTER_PORT"], master_port);
      }
      EXPECT_EQ(env["MASTER_PORT"], first.at("MASTER_PORT"));
      EXPECT_EQ(env["BATON_RUN_ID"], first.at("BATON_RUN_ID"));
    }
  }
};

// A PyTorchJob with a Master and one Worker, nprocPerNode "2": the master
// pod has RANK 0, the worker pod RANK 1; WORLD_SIZE counts processes.
TEST_F(OperatorEnvTest, PyTorchJobMasterAndWorkerPods) {
  const int port = MasterPort();
  ASSERT_GT(port, 0);
  auto pod = [&](int index) {
    return std::map<std::string, std::string>{{"PYTHONUNBUFFERED", "1"},
                                              {"MASTER_PORT", absl::StrCat(port)},
                                              {"PET_MASTER_PORT", absl::StrCat(port)},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"PET_MASTER_ADDR", "127.0.0.1"},
                                              {"WORLD_SIZE", "4"},
                                              {"RANK", absl::StrCat(index)},
                                              {"PET_NODE_RANK", absl::StrCat(index)},
                                              {"PET_NPROC_PER_NODE", "2"},
                                              {"PET_NNODES", "2"}};
  };
  auto worker = Pod(pod(1));
  auto master = Pod(pod(0));
  ASSERT_EQ(master->Wait(kJobTimeout), 0) << master->Output();
  ASSERT_EQ(worker->Wait(kJobTimeout), 0) << worker->Output();
  ExpectFourWorkers("127.0.0.1", absl::StrCat(port));
  EXPECT_THAT(master->Output(),
              ::testing::HasSubstr("defaults from the environment: PET_NNODES=2"));
}

// A TrainJob of 2 nodes: PET_* only, the node rank from the Job's
// completion index.
TEST_F(OperatorEnvTest, TrainJobNodes) {
  const int port = MasterPort();
  ASSERT_GT(port, 0);
  auto node = [&](int index) {
    return std::map<std::string, std::string>{{"PET_NNODES", "2"},
                                              {"PET_NPROC_PER_NODE", "2"},
                                              {"PET_NODE_RANK", absl::StrCat(index)},
                                              {"PET_MASTER_ADDR", "127.0.0.1"},
                                              {"PET_MASTER_PORT", absl::StrCat(port)}};
  };
  auto n1 = Pod(node(1));
  auto n0 = Pod(node(0));
  ASSERT_EQ(n0->Wait(kJobTimeout), 0) << n0->Output();
  ASSERT_EQ(n1->Wait(kJobTimeout), 0) << n1->Output();
  ExpectFourWorkers("127.0.0.1", absl::StrCat(port));
}

// An elastic PyTorchJob (workers only): no node rank, a rendezvous endpoint.
// On one machine both pods match the loopback endpoint; the one that binds
// its port hosts, as under torchrun. The job id is the operator's rdzvID.
TEST_F(OperatorEnvTest, ElasticPyTorchJobWithoutNodeRanks) {
  const int rdzv = FreePort();
  ASSERT_GT(rdzv, 0);
  const std::map<std::string, std::string> env = {
      {"PYTHONUNBUFFERED", "1"},          {"PET_RDZV_ENDPOINT", absl::StrCat("127.0.0.1:", rdzv)},
      {"PET_RDZV_BACKEND", "c10d"},       {"PET_NNODES", "2:3"},
      {"PET_MAX_RESTARTS", "0"},          {"PET_NPROC_PER_NODE", "2"},
      {"PET_RDZV_ID", "elastic-job-uid"}, {"PET_RDZV_CONF", "join_timeout=30,last_call_timeout=1"}};
  auto a = Pod(env);
  auto b = Pod(env);
  ASSERT_EQ(a->Wait(kJobTimeout), 0) << a->Output();
  ASSERT_EQ(b->Wait(kJobTimeout), 0) << b->Output();
  ExpectFourWorkers("127.0.0.1", "");
  EXPECT_EQ(Env(0, 0)["BATON_RUN_ID"], "elastic-job-uid");
  // Exactly one of them found the port taken and joined the other.
  const bool a_joined = a->Output().find("is taken") != std::string::npos;
  const bool b_joined = b->Output().find("is taken") != std::string::npos;
  EXPECT_NE(a_joined, b_joined) << a->Output() << "\n----\n" << b->Output();
}

}  // namespace
}  // namespace baton::launcher::testing
