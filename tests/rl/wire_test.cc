// The agent/observer protocol on the wire (rl/internal/functions.h): every
// request and reply is a struct that travels as its named fields, and an
// observer plays through RpcAgentLink against a ReinforceAgent served by a
// real RpcAgent, in one process over the loopback transport.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "rl/cartpole.h"
#include "rl/internal/functions.h"
#include "rl/observer.h"
#include "rl/reinforce_agent.h"
#include "rpc/codec.h"
#include "rpc/executor.h"
#include "rpc/timer.h"
#include "testing/rpc/loopback_job.h"

namespace baton::rl {
namespace {

using internal::ActRequest;
using internal::ActResponse;
using internal::FinishRequest;
using internal::FinishResponse;
using internal::JoinRequest;
using internal::JoinResponse;
using internal::LeaveRequest;

TEST(Wire, EveryMessageIsAStructOfNamedFields) {
  EXPECT_EQ(rpc::TypeName<JoinRequest>(), "JoinRequest{string}");
  EXPECT_EQ(rpc::TypeName<JoinResponse>(), "JoinResponse{int64,int64,int64,bool}");
  EXPECT_EQ(rpc::TypeName<ActRequest>(), "ActRequest{int64,int64,int64,vector<float>}");
  EXPECT_EQ(rpc::TypeName<ActResponse>(), "ActResponse{int64}");
  EXPECT_EQ(rpc::TypeName<FinishRequest>(),
            "FinishRequest{int64,int64,vector<float>,vector<int32>}");
  EXPECT_EQ(rpc::TypeName<FinishResponse>(), "FinishResponse{int64,bool}");
  EXPECT_EQ(rpc::TypeName<LeaveRequest>(), "LeaveRequest{int64}");
  // The wire names stay.
  EXPECT_EQ(internal::kJoinFn.name(), "baton.rl.join");
  EXPECT_EQ(internal::kActFn.name(), "baton.rl.act");
  EXPECT_EQ(internal::kFinishFn.name(), "baton.rl.finish");
  EXPECT_EQ(internal::kLeaveFn.name(), "baton.rl.leave");
}

TEST(Wire, AFinishRequestRoundTripsAndABadFieldIsNamed) {
  const FinishRequest in{7, 3, {1.0f, 0.5f, 1.0f}, {1}};
  absl::StatusOr<rpc::Payload> p = rpc::EncodeMessage(in);
  ASSERT_TRUE(p.ok()) << p.status();
  FinishRequest out;
  ASSERT_TRUE(rpc::DecodeMessage(*p, &out).ok());
  EXPECT_EQ(out.session, 7);
  EXPECT_EQ(out.round, 3);
  EXPECT_EQ(out.rewards, (std::vector<float>{1.0f, 0.5f, 1.0f}));
  EXPECT_EQ(out.episode_ends, (std::vector<int32_t>{1}));
  // A reply cut after its first field names the one that is missing.
  rpc::Encoder enc;
  rpc::EncodeValue(int64_t{4}, enc);
  FinishResponse reply;
  absl::Status s = rpc::DecodeMessage(*std::move(enc).Finish(), &reply);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "FinishResponse.stop")) << s;
}

// An agent on w0, observers on w1 reaching it through RpcAgentLink.
class OverRpc : public ::testing::Test {
 protected:
  void Start(ReinforceOptions o) {
    auto a = ReinforceAgent::Create(o, &executor_, &timer_);
    ASSERT_TRUE(a.ok()) << a.status();
    agent_ = *a;
    agent_->set_log([](const std::string&) {});
    rpc::testing::LoopbackJobOptions jo;
    jo.world_size = 2;
    jo.install = [this](int rank, rpc::FunctionRegistry& r) {
      if (rank == 0) {
        ASSERT_TRUE(agent_->Register(r).ok());
      }
    };
    auto job = rpc::testing::LoopbackJob::Start(jo);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = std::move(*job);
  }
  void TearDown() override {
    if (job_ != nullptr) {
      EXPECT_TRUE(job_->ShutdownAll().ok());
    }
    if (agent_ != nullptr) agent_->Close();
  }
  std::unique_ptr<AgentLink> Link() {
    RpcLinkOptions lo;
    lo.agent = "w0";
    lo.act_timeout = absl::Seconds(20);
    lo.wait_timeout = absl::Seconds(30);
    return RpcAgentLink(job_->agent(1), lo);
  }

  rpc::Executor executor_{rpc::Executor::Options{2, 8}};
  rpc::DeadlineTimer timer_;
  std::shared_ptr<ReinforceAgent> agent_;
  std::unique_ptr<rpc::testing::LoopbackJob> job_;
};

TEST_F(OverRpc, AnObserverPlaysRoundsUntilTheAgentSaysStop) {
  ReinforceOptions o;
  o.steps_per_round = 25;
  o.max_episodes = 2;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  auto link = Link();
  CartPole env(3);
  absl::StatusOr<ObserverResult> r = RunObserver(*link, env, {"rpc-observer"});
  ASSERT_TRUE(r.ok()) << r.status();
  const ReinforceStats s = agent_->stats();
  EXPECT_TRUE(agent_->WaitStopped(absl::Seconds(5)));
  EXPECT_EQ(r->rounds, s.rounds);
  EXPECT_EQ(r->steps, s.rounds * 25);
  EXPECT_EQ(r->episodes, s.episodes);
  EXPECT_GE(s.episodes, 2);
  EXPECT_EQ(s.joined, 1);
  EXPECT_EQ(s.left, 1);
  EXPECT_TRUE(agent_->WaitAllLeft(absl::Seconds(5)));
}

TEST_F(OverRpc, RepliesAndErrorsTravelWhole) {
  ReinforceOptions o;
  o.steps_per_round = 2;
  o.batched = false;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  auto link = Link();
  absl::StatusOr<JoinReply> j = link->Join("alice");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->round, 0);
  EXPECT_EQ(j->steps_per_round, 2);
  EXPECT_FALSE(j->stop);
  // An error keeps its code and message across the wire.
  absl::StatusOr<int64_t> bad = link->Act(j->session, 0, 1, {0, 0, 0, 0});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "observer 'alice'")) << bad.status();
  for (int64_t t = 0; t < 2; ++t) {
    absl::StatusOr<int64_t> a = link->Act(j->session, 0, t, {0.01f, 0, 0, 0});
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(*a == 0 || *a == 1);
  }
  absl::StatusOr<RoundReply> f = link->Finish(j->session, 0, {1, 1}, {1});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->next_round, 1);
  EXPECT_FALSE(f->stop);
  EXPECT_EQ(agent_->stats().episodes, 1);
  EXPECT_TRUE(link->Leave(j->session).ok());
  EXPECT_EQ(link->Leave(12345).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(agent_->stats().left, 1);
}

}  // namespace
}  // namespace baton::rl
