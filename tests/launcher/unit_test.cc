// In-process tests of the launcher's pieces: flags, the worker environment
// contract, and the rendezvous protocol over an in-memory store.
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "env/env.h"
#include "env/launcher_request.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/options.h"
#include "launcher/rendezvous.h"
#include "store/memory_store.h"

namespace baton::launcher {
namespace {

using ::testing::HasSubstr;

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](absl::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

absl::StatusOr<LaunchOptions> Parse(std::vector<std::string> args,
                                    std::map<std::string, std::string> env = {}) {
  return ParseLaunchOptions(args, FakeEnv(env));
}

TEST(Options, DefaultsAndBothFlagSpellings) {
  auto o = Parse({"--nproc-per-node=4", "--max_restarts", "3", "prog", "-x"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->nproc_per_node, 4);
  EXPECT_EQ(o->max_restarts, 3);
  EXPECT_EQ(o->master_port, 29500);
  EXPECT_EQ(o->rdzv_port, 29501);
  ASSERT_EQ(o->roles.size(), 1u);
  EXPECT_EQ(o->roles[0].name, "default");
  EXPECT_EQ(o->roles[0].argv, (std::vector<std::string>{"prog", "-x"}));
}

TEST(Options, HelpAnywhereBeforeTheProgram) {
  auto o = Parse({"--nproc_per_node", "2", "--help"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->help);
  o = Parse({"prog", "--help"});  // The program's own flag.
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->help);
}

TEST(Options, ElasticRange) {
  auto o = Parse({"--nnodes", "2:4", "prog"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->elastic());
  EXPECT_EQ(o->min_nodes, 2);
  EXPECT_EQ(o->max_nodes, 4);
}

TEST(Options, BadFlagsNameTheFlag) {
  EXPECT_THAT(Parse({"--nnodes", "4:2", "p"}).status().message(), HasSubstr("--nnodes"));
  EXPECT_THAT(Parse({"--nnodes", "2", "p"}).status().message(), HasSubstr("--node_rank"));
  EXPECT_THAT(Parse({"--nnodes", "2", "--node_rank", "2", "p"}).status().message(),
              HasSubstr("--node_rank"));
  EXPECT_THAT(Parse({"--master_port", "70000", "p"}).status().message(),
              HasSubstr("--master_port"));
  EXPECT_THAT(Parse({"--tee=maybe", "p"}).status().message(), HasSubstr("--tee"));
  EXPECT_THAT(Parse({"--max_restarts"}).status().message(), HasSubstr("needs a value"));
  EXPECT_THAT(Parse({"--restart_policy", "x=role", "p"}).status().message(),
              HasSubstr("no role named 'x'"));
}

TEST(Options, RolesAndPolicies) {
  auto o = Parse({"--role", "ps:1:./ps_server --port 1", "--role", "trainer:4:./trainer",
                  "--restart_policy", "trainer=role"});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->roles.size(), 2u);
  EXPECT_EQ(o->roles[0].argv, (std::vector<std::string>{"./ps_server", "--port", "1"}));
  EXPECT_EQ(o->roles[0].policy, RestartPolicy::kGroup);
  EXPECT_EQ(o->roles[1].policy, RestartPolicy::kRole);
  EXPECT_EQ(o->nproc_per_node, 5);
  o = Parse(
      {"--role", "agent:1:./a", "--role", "observer:4:./o", "--restart_policy", "observer=worker"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->roles[1].policy, RestartPolicy::kWorker);
  EXPECT_THAT(Parse({"--role", "a:1:./a", "--restart_policy", "a=node"}).status().message(),
              HasSubstr("ROLE=worker"));
  // A role without a program runs PROGRAM.
  o = Parse({"--role", "a:2", "prog"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->roles[0].argv, (std::vector<std::string>{"prog"}));
  EXPECT_FALSE(Parse({"--role", "a:2"}).ok());
  EXPECT_FALSE(Parse({"--role", "a:1:x", "--role", "a:1:y"}).ok());
  EXPECT_FALSE(Parse({"--nproc_per_node", "3", "--role", "a:2", "p"}).ok());
}

// BATON_RESTART_WAIT: 60 s by default when a role restarts alone and
// restarts are allowed (calls to a dead peer wait for its successor), zero
// for group restarts or none; --restart_wait overrides either.
TEST(Options, RestartWaitFollowsThePolicies) {
  auto o = Parse({"--role", "ps:1", "--role", "trainer:2", "--restart_policy", "ps=role",
                  "--max_restarts", "3", "prog"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->RestartWait(), kDefaultRestartWait);
  o = Parse({"--role", "ps:1", "--role", "trainer:2", "--restart_policy", "ps=role", "prog"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->RestartWait(), absl::ZeroDuration());  // no restart allowed
  o = Parse({"--max_restarts", "3", "prog"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->RestartWait(), absl::ZeroDuration());  // group restarts
  o = Parse({"--max_restarts", "3", "--restart_wait", "7.5", "prog"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->RestartWait(), absl::Milliseconds(7500));
  o = Parse({"--role", "a:1", "--role", "o:2", "--restart_policy", "o=worker", "--max_restarts",
             "1", "--restart_wait", "0", "prog"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->RestartWait(), absl::ZeroDuration());
  EXPECT_THAT(Parse({"--restart_wait", "-2", "prog"}).status().message(),
              HasSubstr("--restart_wait"));
}

TEST(Options, StandaloneUsesFreePorts) {
  auto o = Parse({"--standalone", "prog"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->master_port, 0);
  EXPECT_EQ(o->max_nodes, 1);
}

TEST(Options, SlurmSuppliesNodesRankAndMaster) {
  std::map<std::string, std::string> slurm = {{"SLURM_JOB_ID", "777"},
                                              {"SLURM_NODEID", "2"},
                                              {"SLURM_JOB_NUM_NODES", "4"},
                                              {"SLURM_JOB_NODELIST", "gpu[07-10],cpu1"}};
  auto o = Parse({"prog"}, slurm);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->from_slurm);
  EXPECT_EQ(o->max_nodes, 4);
  EXPECT_EQ(*o->node_rank, 2);
  EXPECT_EQ(o->master_addr, "gpu07");
  EXPECT_EQ(o->run_id, "777");
  // Flags win.
  o = Parse({"--master_addr", "h", "--run_id", "r", "prog"}, slurm);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->master_addr, "h");
  EXPECT_EQ(o->run_id, "r");
}

TEST(Options, FirstSlurmHost) {
  EXPECT_EQ(*FirstSlurmHost("node1"), "node1");
  EXPECT_EQ(*FirstSlurmHost("a,b"), "a");
  EXPECT_EQ(*FirstSlurmHost("n[003-005]-ib"), "n003-ib");
  EXPECT_EQ(*FirstSlurmHost("n[8,9]"), "n8");
  EXPECT_FALSE(FirstSlurmHost("n[1-").ok());
}

std::map<std::string, std::string> GoodEnv() {
  return {{"RANK", "3"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "1"},
          {"GROUP_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"BATON_RUN_ID", "job"},
          {"BATON_RESTART_COUNT", "2"},
          {"BATON_MAX_RESTARTS", "3"},
          {"BATON_ROLE", "trainer"},
          {"BATON_ROLE_RANK", "1"},
          {"BATON_ROLE_WORLD_SIZE", "2"},
          {"BATON_JOB_TOKEN", "tok"},
          {"BATON_ERROR_FILE", "/tmp/e.json"}};
}

TEST(Env, ReadsEveryVariable) {
  auto env = ReadLaunchEnv(FakeEnv(GoodEnv()));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->group_rank, 1);
  EXPECT_EQ(env->master_addr, "10.0.0.1");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->restart_count, 2);
  EXPECT_EQ(env->role, "trainer");
  EXPECT_EQ(env->role_rank, 1);
  EXPECT_EQ(env->role_world_size, 2);
  EXPECT_EQ(env->job_token, "tok");
  EXPECT_EQ(env->error_file, "/tmp/e.json");
}

TEST(Env, MalformedValuesNameTheVariable) {
  auto with = [](const char* k, const char* v) {
    auto e = GoodEnv();
    e[k] = v;
    return ReadLaunchEnv(FakeEnv(e)).status();
  };
  EXPECT_THAT(with("RANK", "x").message(), HasSubstr("RANK='x'"));
  EXPECT_THAT(with("RANK", "4").message(), HasSubstr("RANK=4"));
  EXPECT_THAT(with("MASTER_PORT", "0").message(), HasSubstr("MASTER_PORT"));
  EXPECT_THAT(with("LOCAL_RANK", "2").message(), HasSubstr("LOCAL_RANK"));
  EXPECT_THAT(with("BATON_ROLE_RANK", "-1").message(), HasSubstr("BATON_ROLE_RANK"));
  auto e = GoodEnv();
  e.erase("WORLD_SIZE");
  auto s = ReadLaunchEnv(FakeEnv(e)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("WORLD_SIZE"));
}

TEST(Env, WritesTheErrorFileAsJson) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/error.json");
  ASSERT_TRUE(WriteErrorFile(path, {"bad \"thing\"\n", "ValueError", ""}).ok());
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_THAT(ss.str(), HasSubstr("\"message\": \"bad \\\"thing\\\"\\n\""));
  EXPECT_THAT(ss.str(), HasSubstr("\"error_type\": \"ValueError\""));
  EXPECT_THAT(ss.str(), HasSubstr("\"timestamp\": "));
  // A path under a regular file cannot be created, whoever runs the test (as
  // root outside a sandbox, a missing directory would simply be made).
  EXPECT_FALSE(WriteErrorFile(path + "/dir/e.json", {"x"}).ok());
  EXPECT_FALSE(is_elastic_launched());
}

TEST(Record, RoundTrips) {
  Record r = {{"a", "line1\nline2=x"}, {"b", ""}, {"c", "\\"}};
  auto back = DecodeRecord(EncodeRecord(r));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, r);
}

RendezvousConfig Config(int node_rank, int min, int max,
                        absl::Duration timeout = absl::Seconds(10)) {
  RendezvousConfig c;
  c.node_rank = node_rank;
  c.host_name = absl::StrCat("host", node_rank);
  c.min_nodes = min;
  c.max_nodes = max;
  c.timeout = timeout;
  c.last_call = absl::Milliseconds(200);
  c.pick_master_port = [] { return 1234; };
  return c;
}

TEST(Rendezvous, N2_EveryNodeSeesTheSameRound) {
  store::MemoryStore store;
  std::vector<absl::StatusOr<RoundInfo>> infos(3, absl::UnknownError(""));
  std::vector<std::thread> threads;
  // Nodes arrive in reverse order; group ranks still follow node ranks.
  for (int n = 2; n >= 0; --n) {
    threads.emplace_back([&, n] {
      Rendezvous r(&store, Config(n, 3, 3));
      infos[n] = r.Join(0);
    });
  }
  for (auto& t : threads) t.join();
  for (int n = 0; n < 3; ++n) {
    ASSERT_TRUE(infos[n].ok()) << infos[n].status();
    EXPECT_EQ(infos[n]->group_rank, n);
    EXPECT_EQ(infos[n]->group_world_size, 3);
    EXPECT_EQ(infos[n]->master_port, 1234);
    EXPECT_EQ(infos[n]->node_ranks, (std::vector<int>{0, 1, 2}));
  }
}

TEST(Rendezvous, N1_MissingNodeIsNamedOnEveryNode) {
  store::MemoryStore store;
  absl::Status host, other;
  std::thread t([&] {
    Rendezvous r(&store, Config(1, 3, 3, absl::Milliseconds(300)));
    other = r.Join(0).status();
  });
  Rendezvous r(&store, Config(0, 3, 3, absl::Milliseconds(300)));
  host = r.Join(0).status();
  t.join();
  EXPECT_EQ(host.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(host.message(), HasSubstr("missing node rank 2"));
  EXPECT_THAT(other.message(), HasSubstr("missing node rank 2"));
}

TEST(Rendezvous, N1_NodeWithOtherSettingsFailsEveryNodeAtOnce) {
  store::MemoryStore store;
  Rendezvous host(&store, Config(0, 2, 2, absl::Seconds(60)));
  ASSERT_TRUE(host.Publish({{"roles", "default:2:group"}}).ok());
  absl::Status other;
  std::thread t([&] {
    Rendezvous r(&store, Config(1, 2, 2, absl::Seconds(60)));
    other = r.FetchJob({{"roles", "default:1:group"}}).status();
  });
  const absl::Time t0 = absl::Now();
  absl::Status s = host.Join(0).status();
  t.join();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));  // not the 60 s timeout
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("node rank 1 cannot join"));
  EXPECT_THAT(s.message(), HasSubstr("'default:1:group' differs"));
}

TEST(Rendezvous, ElasticClosesWithWhoeverCameAfterLastCall) {
  store::MemoryStore store;
  absl::StatusOr<RoundInfo> second = absl::UnknownError("");
  std::thread t([&] {
    Rendezvous r(&store, Config(-1, 1, 3));
    second = r.Join(0);
  });
  Rendezvous host(&store, Config(0, 1, 3));
  auto info = host.Join(0);
  t.join();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(info->group_world_size, 2);
  EXPECT_EQ(second->group_rank, 1);
}

TEST(Rendezvous, DuplicateNodeRankIsRejected) {
  store::MemoryStore store;
  absl::Status other;
  std::thread t([&] {
    Rendezvous r(&store, Config(0 + 1, 2, 2));
    other = r.Join(0).status();
  });
  std::thread t2([&] {
    Rendezvous r(&store, Config(1, 2, 2));
    (void)r.Join(0);
  });
  // Both nodes claiming rank 1 have joined round 0 (each took a member
  // slot) before the host closes it.
  EXPECT_TRUE(
      store
          .Wait({Rendezvous::Key(0, "member/0"), Rendezvous::Key(0, "member/1")}, absl::Seconds(10))
          .ok());
  Rendezvous host(&store, Config(0, 2, 2));
  auto s = host.Join(0).status();
  t.join();
  t2.join();
  EXPECT_THAT(s.message(), HasSubstr("node rank 1"));
}

}  // namespace
// LR1-LR2: a request travels as text; what baton-run cannot read is named,
// never carried out.
TEST(LauncherRequest, LR2_ARequestRoundTripsAndOneBatonRunCannotReadIsNamed) {
  LauncherRequest r;
  r.action = LauncherRequest::Action::kDrop;
  r.rank = 7;
  r.from = 2;
  r.reason = "slow\nfor ten minutes";
  auto back = DecodeLauncherRequest(EncodeLauncherRequest(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->action, LauncherRequest::Action::kDrop);
  EXPECT_EQ(back->rank, 7);
  EXPECT_EQ(back->from, 2);
  EXPECT_EQ(back->reason, "slow for ten minutes");
  struct Case {
    const char* text;
    const char* names;
  };
  for (const Case& c :
       {Case{"rank=1\nfrom=0\n", "action"}, Case{"action=reboot\nrank=1\nfrom=0\n", "action"},
        Case{"action=restart\nfrom=0\n", "rank"}, Case{"action=restart\nrank=-3\nfrom=0\n", "rank"},
        Case{"action=restart\nrank=x\nfrom=0\n", "rank"}, Case{"action=restart\nrank=1\n", "from"},
        Case{"", "action"}}) {
    auto bad = DecodeLauncherRequest(c.text);
    ASSERT_FALSE(bad.ok()) << c.text;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(bad.status().message(), c.names)) << bad.status();
  }
}

}  // namespace baton::launcher
