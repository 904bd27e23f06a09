// baton-run under the Kubeflow operators: each test sets a pod's environment
// exactly as the operator's source sets it, and checks what baton-run makes
// of it (launcher/torchrun_env.h, launcher/options.h).
//
// - PyTorchJob (training-operator v1, pkg/controller.v1/pytorch/envvar.go,
//   master.go, elastic.go): MASTER_ADDR/PET_MASTER_ADDR "<job>-master-0",
//   MASTER_PORT/PET_MASTER_PORT the master's container port, WORLD_SIZE
//   pods x nprocPerNode (1 when it is not a number), RANK and PET_NODE_RANK
//   the pod index (master 0, worker i -> i + 1), PET_NPROC_PER_NODE,
//   PET_NNODES (pods, or MIN:MAX with an elastic policy), and with an elastic
//   policy PET_RDZV_ENDPOINT "<job>-worker-0:<port>", PET_RDZV_BACKEND (c10d
//   by default), PET_RDZV_ID, PET_RDZV_CONF "k=v,...", PET_MAX_RESTARTS and
//   PET_STANDALONE "".
// - TrainJob (Kubeflow Trainer v2, pkg/runtime/framework/plugins/torch):
//   PET_NNODES, PET_NPROC_PER_NODE (a number or "auto"), PET_NODE_RANK (the
//   Job completion index), PET_MASTER_ADDR
//   "<job>-trainer-node-0-0.<job>", PET_MASTER_PORT 29500.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/options.h"
#include "launcher/torchrun_env.h"

namespace baton::launcher {
namespace {

using ::testing::HasSubstr;

using Env = std::map<std::string, std::string>;

EnvLookup FakeEnv(Env vars) {
  return [vars](absl::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

MachineInfo Machine(const std::string& hostname, int cpus = 8, int gpus = 0) {
  MachineInfo m;
  m.hostname = hostname;
  m.cpu_count = cpus;
  m.gpu_count = gpus;
  return m;
}

absl::StatusOr<LaunchOptions> Parse(const Env& env, const MachineInfo& machine,
                                    std::vector<std::string> flags = {}) {
  flags.push_back("train.py");
  return ParseLaunchOptions(flags, FakeEnv(env), machine);
}

// A PyTorchJob with a Master and 2 Workers, nprocPerNode "2", container port
// 23456: the pod of worker 1 (RANK 2).
Env PyTorchJobWorker1() {
  return {{"PYTHONUNBUFFERED", "1"},
          {"MASTER_PORT", "23456"},
          {"PET_MASTER_PORT", "23456"},
          {"MASTER_ADDR", "job-master-0"},
          {"PET_MASTER_ADDR", "job-master-0"},
          {"WORLD_SIZE", "6"},
          {"RANK", "2"},
          {"PET_NODE_RANK", "2"},
          {"PET_NPROC_PER_NODE", "2"},
          {"PET_NNODES", "3"}};
}

TEST(PyTorchJob, StaticJobGivesThePodsNodeRankAndTheMastersAddress) {
  auto o = Parse(PyTorchJobWorker1(), Machine("job-worker-1"));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->min_nodes, 3);
  EXPECT_EQ(o->max_nodes, 3);
  EXPECT_EQ(o->node_rank, 2);
  EXPECT_EQ(o->nproc_per_node, 2);
  EXPECT_EQ(o->master_addr, "job-master-0");
  EXPECT_EQ(o->master_port, 23456);
  EXPECT_EQ(o->rdzv_port, 23457);
  EXPECT_THAT(o->from_env, ::testing::Contains("PET_NNODES=3"));
}

TEST(PyTorchJob, OperatorsBeforePetNodeRankCountWorldSizeInPods) {
  // training-operator 1.5: MASTER_*, WORLD_SIZE = pods, RANK; no PET_*.
  Env env = {{"MASTER_ADDR", "job-master-0"},
             {"MASTER_PORT", "23456"},
             {"WORLD_SIZE", "3"},
             {"RANK", "1"}};
  auto o = Parse(env, Machine("job-worker-0"), {"--nnodes", "3", "--nproc_per_node", "4"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->node_rank, 1);
  EXPECT_EQ(o->master_addr, "job-master-0");
  EXPECT_EQ(o->master_port, 23456);
}

TEST(PyTorchJob, RankIsCheckedAsAPodIndexAgainstWorldSizeAsProcesses) {
  // The operator's caveat: RANK indexes pods, WORLD_SIZE counts processes.
  Env env = PyTorchJobWorker1();
  env["WORLD_SIZE"] = "7";
  auto o = Parse(env, Machine("job-worker-1"));
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("WORLD_SIZE=7"));
  EXPECT_THAT(o.status().message(), HasSubstr("3 node(s) x 2 worker(s) per node"));

  // A process rank where a pod index belongs (an older operator, 3 pods).
  env = {{"MASTER_ADDR", "job-master-0"}, {"WORLD_SIZE", "3"}, {"RANK", "5"}};
  o = Parse(env, Machine("h"), {"--nnodes", "3"});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("RANK=5 is the pod's index"));

  env = PyTorchJobWorker1();
  env["PET_NODE_RANK"] = "1";
  o = Parse(env, Machine("job-worker-1"));
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("RANK=2 and PET_NODE_RANK=1 disagree"));
}

TEST(PyTorchJob, RankAndWorldSizeWithoutMasterAddrAreNotTheOperators) {
  // baton-run started inside another job's worker: its RANK is a process's.
  auto o = Parse({{"RANK", "5"}, {"WORLD_SIZE", "8"}}, Machine("h"), {"--standalone"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->node_rank, 0);
}

// An elastic PyTorchJob, workers only: elasticPolicy minReplicas 2,
// maxReplicas 4, rdzvBackend c10d, rdzvPort 29400, maxRestarts 3,
// nProcPerNode 1, rdzvConf join_timeout=120, last_call_timeout=10,
// standalone unset.
Env ElasticPyTorchJob() {
  return {{"PYTHONUNBUFFERED", "1"},    {"PET_RDZV_ENDPOINT", "job-worker-0:29400"},
          {"PET_RDZV_BACKEND", "c10d"}, {"PET_NNODES", "2:4"},
          {"PET_MAX_RESTARTS", "3"},    {"PET_NPROC_PER_NODE", "1"},
          {"PET_RDZV_ID", "job-uid"},   {"PET_RDZV_CONF", "join_timeout=120,last_call_timeout=10"}};
}

TEST(PyTorchJob, ElasticJobIsHostedByThePodTheEndpointNames) {
  auto host = Parse(ElasticPyTorchJob(), Machine("job-worker-0"));
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_TRUE(host->elastic());
  EXPECT_EQ(host->min_nodes, 2);
  EXPECT_EQ(host->max_nodes, 4);
  EXPECT_EQ(host->node_rank, 0);
  EXPECT_EQ(host->master_addr, "job-worker-0");
  EXPECT_EQ(host->rdzv_port, 29400);
  EXPECT_EQ(host->master_port, 0);  // a free port each round, told by the rendezvous
  EXPECT_EQ(host->max_restarts, 3);
  EXPECT_EQ(host->run_id, "job-uid");
  EXPECT_EQ(host->rdzv_timeout, absl::Seconds(120));
  EXPECT_EQ(host->rdzv_last_call, absl::Seconds(10));
  EXPECT_FALSE(host->rdzv_host_by_bind);

  auto other = Parse(ElasticPyTorchJob(), Machine("job-worker-2"));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_FALSE(other->node_rank.has_value());
  EXPECT_EQ(other->master_addr, "job-worker-0");
}

TEST(PyTorchJob, MasterAndElasticPolicyRendezvousAtTheEndpoint) {
  // With a Master replica the pods also get MASTER_*, RANK and PET_NODE_RANK;
  // torchrun rendezvouses at PET_RDZV_ENDPOINT, and so does baton-run, on a
  // port of its own when MASTER_PORT is the same.
  Env env = ElasticPyTorchJob();
  env.insert({{"MASTER_ADDR", "job-master-0"},
              {"PET_MASTER_ADDR", "job-master-0"},
              {"MASTER_PORT", "29400"},
              {"PET_MASTER_PORT", "29400"},
              {"WORLD_SIZE", "3"},
              {"RANK", "0"},
              {"PET_NODE_RANK", "0"}});
  auto master = Parse(env, Machine("job-master-0"));
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_EQ(master->master_addr, "job-worker-0");
  EXPECT_FALSE(master->node_rank.has_value());  // the endpoint's pod hosts
  EXPECT_EQ(master->master_port, 0);
  env["RANK"] = env["PET_NODE_RANK"] = "1";
  auto worker0 = Parse(env, Machine("job-worker-0"));
  ASSERT_TRUE(worker0.ok()) << worker0.status();
  EXPECT_EQ(worker0->node_rank, 0);
}

TEST(PyTorchJob, StandaloneIsSetToTheEmptyString) {
  auto o = Parse({{"PET_STANDALONE", ""}, {"PET_NPROC_PER_NODE", "3"}}, Machine("pod"));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->standalone);
  EXPECT_EQ(o->nproc_per_node, 3);
  EXPECT_EQ(o->master_port, 0);
}

// A TrainJob's node of index 1 (numNodes 2) under the torch-distributed
// runtime, whose numProcPerNode is "auto".
Env TrainJobNode1() {
  return {{"PET_NNODES", "2"},
          {"PET_NPROC_PER_NODE", "auto"},
          {"PET_NODE_RANK", "1"},
          {"PET_MASTER_ADDR", "job-trainer-node-0-0.job"},
          {"PET_MASTER_PORT", "29500"}};
}

TEST(TrainJob, NodeGetsItsRankTheMasterAndOneWorkerPerDeviceOrCpu) {
  auto cpu = Parse(TrainJobNode1(), Machine("job-trainer-node-0-1", /*cpus=*/6));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->max_nodes, 2);
  EXPECT_EQ(cpu->node_rank, 1);
  EXPECT_EQ(cpu->nproc_per_node, 6);  // auto without a GPU: the CPUs
  EXPECT_EQ(cpu->master_addr, "job-trainer-node-0-0.job");
  EXPECT_EQ(cpu->master_port, 29500);
  EXPECT_EQ(cpu->rdzv_port, 29501);

  auto gpu = Parse(TrainJobNode1(), Machine("job-trainer-node-0-1", 64, /*gpus=*/8));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->nproc_per_node, 8);  // auto with GPUs: one per GPU
}

TEST(TrainJob, NprocPerNodeCpuGpuAndItsErrors) {
  Env env = TrainJobNode1();
  env["PET_NPROC_PER_NODE"] = "cpu";
  auto o = Parse(env, Machine("n", 12, 2));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->nproc_per_node, 12);
  env["PET_NPROC_PER_NODE"] = "gpu";
  o = Parse(env, Machine("n", 12, 2));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->nproc_per_node, 2);
  o = Parse(env, Machine("n", 12, 0));
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("PET_NPROC_PER_NODE='gpu'"));
  EXPECT_THAT(o.status().message(), HasSubstr("no visible GPU"));
  env["PET_NPROC_PER_NODE"] = "tpu";
  o = Parse(env, Machine("n"));
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("not a count, 'auto', 'cpu' or 'gpu'"));
}

TEST(TorchrunEnv, AnExplicitFlagWins) {
  auto o = Parse(TrainJobNode1(), Machine("n"),
                 {"--nnodes", "3", "--node_rank", "2", "--nproc_per_node", "1", "--master_addr",
                  "other", "--master_port", "4000"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->max_nodes, 3);
  EXPECT_EQ(o->node_rank, 2);
  EXPECT_EQ(o->nproc_per_node, 1);
  EXPECT_EQ(o->master_addr, "other");
  EXPECT_EQ(o->master_port, 4000);
}

TEST(TorchrunEnv, ABadValueNamesTheVariable) {
  auto o = Parse({{"PET_NNODES", "two"}}, Machine("n"));
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(),
            "PET_NNODES='two' (torchrun's default of --nnodes): --nnodes: 'two' is not an "
            "integer");
  o = Parse({{"MASTER_ADDR", "m"}, {"MASTER_PORT", "http"}}, Machine("n"));
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("MASTER_PORT='http'"));
  o = Parse({{"PET_RDZV_CONF", "join_timeout=soon"}}, Machine("n"));
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("join_timeout='soon' is not a number of seconds"));
  o = Parse({{"PET_RDZV_CONF", "color=blue"}}, Machine("n"));
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("unknown key 'color'"));
  o = Parse({{"PET_RDZV_BACKEND", "zookeeper"}}, Machine("n"));
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("'zookeeper' is not c10d, static or etcd"));
}

TEST(TorchrunEnv, PythonOnlyFlagsAreListedNotApplied) {
  auto o = Parse({{"PET_START_METHOD", "spawn"}, {"PET_ROLE", "trainer"}, {"PET_TEE", "3"}},
                 Machine("n"));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->env_ignored, (std::vector<std::string>{"PET_START_METHOD", "PET_ROLE"}));
  EXPECT_TRUE(o->tee);
  ASSERT_EQ(o->roles.size(), 1u);
  EXPECT_EQ(o->roles[0].name, "default");
}

TEST(TorchrunEnv, EndpointsAndHosts) {
  auto e = ParseRdzvEndpoint("job-worker-0");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "job-worker-0");
  EXPECT_EQ(e->port, 29400);
  e = ParseRdzvEndpoint("[::1]:7000");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->port, 7000);
  EXPECT_FALSE(ParseRdzvEndpoint("::1:7000").ok());
  EXPECT_FALSE(ParseRdzvEndpoint("h:0").ok());
  EXPECT_FALSE(ParseRdzvEndpoint("h:").ok());
  EXPECT_FALSE(ParseRdzvEndpoint(":80").ok());

  const MachineInfo pod = Machine("job-worker-0");
  EXPECT_TRUE(IsThisMachine("job-worker-0", pod));
  EXPECT_TRUE(IsThisMachine("JOB-WORKER-0.job.ns.svc", pod));
  EXPECT_TRUE(IsThisMachine("127.0.0.1", pod));
  EXPECT_TRUE(IsThisMachine("localhost", pod));
  EXPECT_FALSE(IsThisMachine("job-worker-1", pod));
  EXPECT_FALSE(IsThisMachine("10.0.0.7", pod));
  EXPECT_TRUE(IsLoopback("::1"));
  EXPECT_FALSE(IsLoopback("job-worker-0"));
}

TEST(TorchrunEnv, AnEndpointAgainstAnExplicitMasterAddressIsRefused) {
  auto o = Parse(
      {}, Machine("n"),
      {"--rdzv_endpoint", "a:5000", "--master_addr", "b", "--nnodes", "2", "--node_rank", "0"});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("differs from --rdzv_endpoint's host 'a'"));
  // A loopback endpoint in an elastic job: whoever binds its port hosts.
  o = Parse({}, Machine("n"), {"--rdzv_endpoint", "127.0.0.1:5000", "--nnodes", "1:2"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->rdzv_host_by_bind);
  EXPECT_FALSE(o->node_rank.has_value());
}

// --rdzv_backend etcd: the endpoint is etcd's, not a node's; the job needs
// an id; elastic nodes without a rank claim the host key; etcd's TLS comes
// from torchrun's rdzv_conf keys and its user from the environment only.
TEST(Etcd, TheEndpointIsEtcdsAndTheJobNeedsAnId) {
  Env env = ElasticPyTorchJob();
  env["PET_RDZV_BACKEND"] = "etcd";
  env["PET_RDZV_ENDPOINT"] = "127.0.0.1";
  auto o = Parse(env, Machine("job-worker-3"));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rdzv_backend, "etcd");
  EXPECT_EQ(o->etcd.endpoint, "127.0.0.1:2379");
  EXPECT_TRUE(o->rdzv_host_by_claim);
  EXPECT_FALSE(o->node_rank.has_value());
  EXPECT_EQ(o->master_addr, "127.0.0.1");  // not the endpoint's: no node serves the rendezvous

  env.erase("PET_RDZV_ID");
  o = Parse(env, Machine("n"));
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("--rdzv_id: is required with --rdzv_backend etcd"));

  o = Parse({}, Machine("n"), {"--rdzv_backend", "etcd", "--rdzv_id", "j"});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("etcd needs --rdzv_endpoint"));
}

TEST(Etcd, ARemoteEtcdNeedsTlsOrAUser) {
  const std::vector<std::string> flags = {"--rdzv_backend",    "etcd",      "--rdzv_endpoint",
                                          "etcd.example:2379", "--rdzv_id", "j"};
  auto o = Parse({}, Machine("n"), flags);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("neither TLS"));
  o = Parse({{"BATON_ETCD_USER", "baton"}, {"BATON_ETCD_PASSWORD_FILE", "/run/secrets/etcd"}},
            Machine("n"), flags);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->etcd.user, "baton");
  EXPECT_EQ(o->etcd.password_file, "/run/secrets/etcd");
  std::vector<std::string> tls = flags;
  tls.insert(tls.end(), {"--rdzv_conf", "cacert=/ca.pem,cert=/c.pem,key=/k.pem,protocol=https"});
  o = Parse({}, Machine("n"), tls);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->etcd.tls.ca_file, "/ca.pem");
  EXPECT_EQ(o->etcd.tls.key_file, "/k.pem");
  tls.back() = "cacert=/ca.pem";
  o = Parse({}, Machine("n"), tls);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("needs all of cacert=, cert= and key="));
  o = Parse({{"BATON_ETCD_INSECURE", "1"}}, Machine("n"), flags);
  ASSERT_TRUE(o.ok()) << o.status();
  o = Parse({{"BATON_ETCD_PASSWORD", "p"}}, Machine("n"), flags);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("BATON_ETCD_USER is not"));
}

}  // namespace
}  // namespace baton::launcher
