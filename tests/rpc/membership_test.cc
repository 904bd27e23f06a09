// Dynamic groups (rpc/agent.h, M1-M4): agents that join a running group one
// at a time and leave it alone, in one process over the loopback network
// transport and an in-memory store, as torch's init_rpc without a world
// size has them.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "rpc/agent.h"
#include "store/memory_store.h"
#include "testing/eventually.h"
#include "testing/rpc/loopback_transport.h"

namespace baton::rpc {
namespace {

using testing::LoopbackNetwork;

const Function<int64_t(int64_t)> echo_fn("echo");
const Function<int64_t(int64_t)> wait_fn("wait_for_release");

// One group: its store and network, and the agents that join it.
class Group {
 public:
  Group() : store_(std::make_shared<store::MemoryStore>()) {}

  AgentOptions Options(int rank, const std::string& name) const {
    AgentOptions o;
    o.name = name;
    o.rank = rank;
    o.dynamic_group = true;
    o.max_ranks = 16;
    o.store = store_;
    o.security.job_token = "membership-test";
    o.timeouts.rpc = absl::Seconds(20);
    o.timeouts.init = absl::Seconds(20);
    o.timeouts.shutdown = absl::Seconds(10);
    o.transport.same_host_shm = false;
    o.transport.local_transport = AgentOptions::LocalTransport::kNetwork;
    return o;
  }

  absl::StatusOr<std::unique_ptr<RpcAgent>> Join(AgentOptions o) {
    auto registry = std::make_shared<FunctionRegistry>();
    EXPECT_TRUE(registry->Register(echo_fn, [](int64_t v) { return v; }).ok());
    EXPECT_TRUE(registry
                    ->Register(wait_fn,
                               [this](int64_t v) {
                                 running_.Notify();
                                 release_.WaitForNotificationWithTimeout(absl::Seconds(20));
                                 return v;
                               })
                    .ok());
    AgentCollaborators c;
    c.network_transport = network_.Factory();
    return RpcAgent::Create(std::move(o), std::move(registry), std::move(c));
  }
  absl::StatusOr<std::unique_ptr<RpcAgent>> Join(int rank, const std::string& name) {
    return Join(Options(rank, name));
  }

  std::shared_ptr<store::MemoryStore> store() const { return store_; }
  absl::Notification& running() { return running_; }
  absl::Notification& release() { return release_; }

 private:
  // Declared first: destroyed after the agents that use it.
  LoopbackNetwork network_;
  std::shared_ptr<store::MemoryStore> store_;
  absl::Notification running_;
  absl::Notification release_;
};

std::vector<std::string> Names(const RpcAgent& agent) {
  std::vector<std::string> out;
  for (const WorkerInfo& w : agent.workers()) out.push_back(w.name);
  return out;
}

TEST(DynamicGroup, M1_AWorkerThatJoinsLaterIsCalledByNameByTheEarlierOnes) {
  Group g;
  // The first member starts alone: nobody else is expected.
  auto w0 = g.Join(0, "w0");
  ASSERT_TRUE(w0.ok()) << w0.status();
  EXPECT_EQ(Names(**w0), std::vector<std::string>{"w0"});
  auto w1 = g.Join(1, "w1");
  ASSERT_TRUE(w1.ok()) << w1.status();
  auto w5 = g.Join(5, "w5");  // ranks need not be contiguous
  ASSERT_TRUE(w5.ok()) << w5.status();
  // Once a member's Create() returned, every earlier one knows it.
  const std::vector<std::string> all{"w0", "w1", "w5"};
  for (auto* a : {w0->get(), w1->get(), w5->get()}) {
    EXPECT_EQ(Names(*a), all);
    for (const std::string& to : all) {
      EXPECT_EQ(a->rpc_sync(to, echo_fn, 7), 7) << a->self().name << " -> " << to;
    }
  }
  auto info = (*w0)->worker("w5");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->id, 5);
  // An id that never joined is named as such.
  auto none = (*w0)->worker(3);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "never joined")) << none.status();
  for (auto* a : {w5->get(), w1->get(), w0->get()}) EXPECT_TRUE(a->Shutdown().ok());
}

TEST(DynamicGroup, M2_ARankOrANameInUseFailsTheJoinAndARankKeepsItsName) {
  Group g;
  auto w0 = g.Join(0, "w0");
  ASSERT_TRUE(w0.ok()) << w0.status();
  auto same_rank = g.Join(0, "other");
  ASSERT_FALSE(same_rank.ok());
  EXPECT_EQ(same_rank.status().code(), absl::StatusCode::kAlreadyExists) << same_rank.status();
  auto same_name = g.Join(2, "w0");
  ASSERT_FALSE(same_name.ok());
  EXPECT_EQ(same_name.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(absl::StrContains(same_name.status().message(), "'w0' is not unique"))
      << same_name.status();
  // A rank that left may join again, under its name only.
  {
    auto w1 = g.Join(1, "w1");
    ASSERT_TRUE(w1.ok()) << w1.status();
    EXPECT_EQ((*w1)->runtime().incarnation(), 1);
    ASSERT_TRUE((*w1)->Shutdown().ok());
  }
  auto renamed = g.Join(1, "w1b");
  ASSERT_FALSE(renamed.ok());
  EXPECT_EQ(renamed.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(absl::StrContains(renamed.status().message(), "keeps its name")) << renamed.status();
  auto again = g.Join(1, "w1");
  ASSERT_TRUE(again.ok()) << again.status();
  // A new incarnation of the rank (each attempt to join takes one).
  EXPECT_GT((*again)->runtime().incarnation(), 1);
  EXPECT_EQ((*w0)->rpc_sync("w1", echo_fn, 11), 11);
  EXPECT_EQ((*again)->rpc_sync("w0", echo_fn, 12), 12);
  EXPECT_TRUE((*again)->Shutdown().ok());
  EXPECT_TRUE((*w0)->Shutdown().ok());
}

TEST(DynamicGroup, M3_ALeaverIsCalledNoMoreAndItsRunningCallsComplete) {
  Group g;
  auto w0 = g.Join(0, "w0");
  ASSERT_TRUE(w0.ok()) << w0.status();
  auto w1 = g.Join(1, "w1");
  ASSERT_TRUE(w1.ok()) << w1.status();
  auto w2 = g.Join(2, "w2");
  ASSERT_TRUE(w2.ok()) << w2.status();
  // w0's call runs on w1 while w1 leaves.
  Future<int64_t> running = (*w0)->rpc_async("w1", wait_fn, 42);
  ASSERT_TRUE(g.running().WaitForNotificationWithTimeout(absl::Seconds(20)));
  absl::Status left;
  std::thread leaver([&] { left = (*w1)->Shutdown(); });
  // The leave notice reaches the others before w1 drains.
  ASSERT_TRUE(baton::testing::Eventually(
      [&] { return !(*w0)->worker("w1").ok() && !(*w2)->worker("w1").ok(); }));
  EXPECT_EQ(Names(**w0), (std::vector<std::string>{"w0", "w2"}));
  // A worker that joins while w1 drains finds it gone already.
  auto w3 = g.Join(3, "w3");
  ASSERT_TRUE(w3.ok()) << w3.status();
  EXPECT_EQ(Names(**w3), (std::vector<std::string>{"w0", "w2", "w3"}));
  auto refused = (*w2)->rpc_async(1, echo_fn, 1).result();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "left the group")) << refused.status();
  // The call that was running when w1 left completes with its value.
  g.release().Notify();
  EXPECT_EQ(running.value(), 42);
  leaver.join();
  EXPECT_TRUE(left.ok()) << left;
  EXPECT_EQ((*w0)->rpc_sync("w2", echo_fn, 5), 5);
  EXPECT_EQ((*w3)->rpc_sync("w0", echo_fn, 6), 6);
  EXPECT_TRUE((*w3)->Shutdown().ok());
  EXPECT_TRUE((*w2)->Shutdown().ok());
  EXPECT_TRUE((*w0)->Shutdown().ok());
}

TEST(DynamicGroup, M4_FixedAndDynamicWorkersNeverMeet) {
  Group g;
  auto dynamic = g.Join(0, "w0");
  ASSERT_TRUE(dynamic.ok()) << dynamic.status();
  AgentOptions fixed = g.Options(1, "w1");
  fixed.dynamic_group = false;
  fixed.world_size = 2;
  auto refused = g.Join(fixed);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "RPC group mixes statically and dynamically initialized members "
                                "which is not supported."))
      << refused.status();
  EXPECT_TRUE((*dynamic)->Shutdown().ok());
}

TEST(DynamicGroup, OptionsADynamicGroupCannotTakeAreRefusedByName) {
  Group g;
  AgentOptions o = g.Options(16, "w16");
  auto outside = g.Join(o);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(outside.status().message(), "max_ranks")) << outside.status();
  o = g.Options(0, "w0");
  o.restarts.rejoin = true;
  EXPECT_EQ(g.Join(o).status().code(), absl::StatusCode::kFailedPrecondition);
  o = g.Options(0, "w0");
  o.devices.maps["w1"] = {{0, 0}};
  EXPECT_EQ(g.Join(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::rpc
