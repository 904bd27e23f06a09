// rpc::AgentOptions::FromEnv: the one place the RPC core reads the
// environment (through env/env.h's parser).
#include <cstdlib>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "rpc/agent.h"

namespace baton::rpc {
namespace {

class FromEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "BATON_JOB_TOKEN",
                          "BATON_TRANSPORT", "BATON_SHM", "BATON_WORKER_NAME", "BATON_ROLE",
                          "BATON_ELASTIC_LAUNCHED", "BATON_REJOIN", "BATON_RESTART_WAIT"}) {
      unsetenv(v);
    }
  }
};

TEST_F(FromEnvTest, DefaultsWithoutTheLauncher) {
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "3", 1);
  auto o = AgentOptions::FromEnv("w");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->world_size, 3);
  EXPECT_EQ(o->master_addr, "127.0.0.1");
  EXPECT_EQ(o->master_port, 29500);
  EXPECT_EQ(o->name, "w1");
  EXPECT_EQ(o->transport.local_transport, AgentOptions::LocalTransport::kShm);
  EXPECT_TRUE(o->transport.same_host_shm);
}

TEST_F(FromEnvTest, TransportAndBulkChannelSwitches) {
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("BATON_TRANSPORT", "grpc", 1);
  setenv("BATON_SHM", "0", 1);
  auto o = AgentOptions::FromEnv();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->transport.local_transport, AgentOptions::LocalTransport::kGrpc);
  EXPECT_FALSE(o->transport.same_host_shm);
  setenv("BATON_TRANSPORT", "carrier-pigeon", 1);
  auto bad = AgentOptions::FromEnv();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "BATON_TRANSPORT")) << bad.status();
}

// baton-run's BATON_RESTART_WAIT becomes AgentOptions::restarts.wait (P7,
// P8); unset keeps the default (zero: fail at once).
TEST_F(FromEnvTest, RestartWaitComesFromBatonRun) {
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  auto o = AgentOptions::FromEnv();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->restarts.wait, absl::ZeroDuration());
  setenv("BATON_RESTART_WAIT", "60", 1);
  o = AgentOptions::FromEnv();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->restarts.wait, absl::Seconds(60));
  setenv("BATON_RESTART_WAIT", "0.25", 1);
  EXPECT_EQ(AgentOptions::FromEnv()->restarts.wait, absl::Milliseconds(250));
  for (const char* bad : {"-1", "soon", "nan"}) {
    setenv("BATON_RESTART_WAIT", bad, 1);
    auto b = AgentOptions::FromEnv();
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(
        absl::StrContains(b.status().message(), absl::StrCat("BATON_RESTART_WAIT is '", bad, "'")))
        << b.status();
  }
}

TEST_F(FromEnvTest, MissingOrInconsistentVariablesNameTheVariable) {
  auto missing = AgentOptions::FromEnv();
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "RANK")) << missing.status();
  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "2", 1);
  auto out_of_range = AgentOptions::FromEnv();
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(out_of_range.status().message(), "RANK=5"))
      << out_of_range.status();
  setenv("RANK", "x", 1);
  EXPECT_TRUE(absl::StrContains(AgentOptions::FromEnv().status().message(), "not an integer"));
}

}  // namespace
}  // namespace baton::rpc
