// AgentOptionsFrom (python/src/agent_options.h): what init_rpc's options
// become in rpc::AgentOptions. Unset fields keep the environment's value or
// the default; timeouts <= 0 are no limit; restart_wait 0 is no wait and a
// negative one is refused; the config's rank and address win over the
// environment's; FromEnv's errors say they came from init_rpc.
#include "python/src/agent_options.h"

#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace baton::python {
namespace {

// A fixed environment; nothing of the process's leaks in.
EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](absl::string_view var) -> std::optional<std::string> {
    auto it = vars.find(std::string(var));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

const std::map<std::string, std::string> kJob = {
    {"RANK", "1"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29555"}};

TEST(AgentOptionsFrom, UnsetFieldsKeepTheEnvironmentAndTheDefaults) {
  absl::StatusOr<rpc::AgentOptions> o = AgentOptionsFrom(AgentConfig{}, Env(kJob));
  ASSERT_TRUE(o.ok()) << o.status();
  const rpc::AgentOptions defaults;
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->world_size, 3);
  EXPECT_EQ(o->master_addr, "10.0.0.7");
  EXPECT_EQ(o->master_port, 29555);
  EXPECT_EQ(o->name, "worker1");
  EXPECT_EQ(o->timeouts.rpc, defaults.timeouts.rpc);
  EXPECT_EQ(o->timeouts.init, defaults.timeouts.init);
  EXPECT_EQ(o->timeouts.shutdown, defaults.timeouts.shutdown);
  EXPECT_EQ(o->timeouts.shutdown_wait_for_peers, defaults.timeouts.shutdown_wait_for_peers);
  EXPECT_EQ(o->restarts.wait, defaults.restarts.wait);
  EXPECT_EQ(o->front_ends, std::vector<std::string>{"python"});
}

TEST(AgentOptionsFrom, TheConfigWinsOverTheEnvironment) {
  AgentConfig c;
  c.name = "trainer";
  c.rank = 2;
  c.world_size = 4;
  c.master_addr = "127.0.0.1";
  c.master_port = 30001;
  c.parallelism = 6;
  c.device_maps = {{"ps", {{0, 1}}}};
  absl::StatusOr<rpc::AgentOptions> o = AgentOptionsFrom(c, Env(kJob));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->name, "trainer");
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->world_size, 4);
  EXPECT_EQ(o->master_addr, "127.0.0.1");
  EXPECT_EQ(o->master_port, 30001);
  EXPECT_EQ(o->threads.parallelism, 6);
  EXPECT_EQ(o->devices.maps, c.device_maps);
}

TEST(AgentOptionsFrom, TimeoutsAreSecondsAndAtMostZeroIsNoLimit) {
  AgentConfig c;
  c.rpc_timeout = 2.5;
  c.init_timeout = 0;
  c.shutdown_timeout = -1;
  c.shutdown_wait_for_peers = 0;
  absl::StatusOr<rpc::AgentOptions> o = AgentOptionsFrom(c, Env(kJob));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->timeouts.rpc, absl::Milliseconds(2500));
  EXPECT_EQ(o->timeouts.init, absl::InfiniteDuration());
  EXPECT_EQ(o->timeouts.shutdown, absl::InfiniteDuration());
  EXPECT_EQ(o->timeouts.shutdown_wait_for_peers, absl::InfiniteDuration());
}

TEST(AgentOptionsFrom, RestartWaitZeroIsNoWaitAndNegativeIsRefused) {
  AgentConfig c;
  c.restart_wait = 0;
  absl::StatusOr<rpc::AgentOptions> o = AgentOptionsFrom(c, Env(kJob));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->restarts.wait, absl::ZeroDuration());

  c.restart_wait = 12;
  o = AgentOptionsFrom(c, Env(kJob));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->restarts.wait, absl::Seconds(12));

  c.restart_wait = -1;
  o = AgentOptionsFrom(c, Env(kJob));
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("restart_wait is -1"), absl::string_view::npos) << o.status();
}

TEST(AgentOptionsFrom, AnEnvironmentErrorSaysItCameFromInitRpc) {
  std::map<std::string, std::string> bad = kJob;
  bad["WORLD_SIZE"] = "many";
  absl::StatusOr<rpc::AgentOptions> o = AgentOptionsFrom(AgentConfig{}, Env(bad));
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(o.status().message().rfind("init_rpc: ", 0), 0u) << o.status();
  EXPECT_NE(o.status().message().find("WORLD_SIZE"), absl::string_view::npos) << o.status();
}

// init_rpc without a world size (and no WORLD_SIZE): a dynamic group, whose
// ranks are below AgentOptions::max_ranks, said so without naming a
// WORLD_SIZE the user never set.
TEST(AgentOptionsFrom, NoWorldSizeIsADynamicGroupWithRanksBelowItsBound) {
  AgentConfig c;
  c.dynamic_group = true;
  c.rank = 5;
  const std::map<std::string, std::string> no_size = {{"MASTER_ADDR", "127.0.0.1"},
                                                      {"MASTER_PORT", "29555"}};
  absl::StatusOr<rpc::AgentOptions> o = AgentOptionsFrom(c, Env(no_size));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->dynamic_group);
  EXPECT_EQ(o->world_size, -1);
  EXPECT_EQ(o->rank, 5);
  c.rank = rpc::AgentOptions().max_ranks;
  o = AgentOptionsFrom(c, Env(no_size));
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("the group is dynamic"), absl::string_view::npos)
      << o.status();
  EXPECT_EQ(o.status().message().find("WORLD_SIZE"), absl::string_view::npos) << o.status();
}

}  // namespace
}  // namespace baton::python
