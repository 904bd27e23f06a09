// The hang report (obs/state.h, H1-H4): the merge of worker snapshots into a
// wait-for graph, and real stalls built on purpose in a loopback job (a
// cycle of nested calls, a PS trainer that stops, an RRef fork whose
// confirmation the network holds), each named by the report.
#include "obs/state.h"

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/optimizer_options.h"
#include "ps/client.h"
#include "ps/server.h"
#include "ps/spec.h"
#include "rpc/agent.h"
#include "rref/rref.h"
#include "testing/eventually.h"
#include "testing/rpc/loopback_job.h"

namespace baton::obs {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

proto::WorkerState Worker(int rank, std::vector<int> calls_to) {
  proto::WorkerState w;
  w.set_rank(rank);
  w.set_name(absl::StrCat("w", rank));
  double age = 1;
  for (int to : calls_to) {
    auto* c = w.add_outgoing();
    c->set_peer(to);
    c->set_function(absl::StrCat("f", rank, to));
    c->set_age_s(age++);
  }
  return w;
}

std::map<std::string, std::string> Fields(
    const google::protobuf::RepeatedPtrField<proto::Field>& f) {
  std::map<std::string, std::string> out;
  for (const auto& x : f) out[x.key()] = x.value();
  return out;
}

TEST(StateReport, H1_H2_H3_EdgesCyclesAndChainEnds) {
  // 0 -> 1 -> 2 -> 0 and 1 -> 0: two cycles; 3 -> 4, 4 waits for nobody;
  // 5 waits (a protocol's wait) on 4.
  std::vector<proto::WorkerState> ws = {Worker(0, {1}), Worker(1, {2, 0}), Worker(2, {0}),
                                        Worker(3, {4}), Worker(4, {}),     Worker(5, {})};
  StateWriter w5(&ws[5], absl::Now());
  w5.AddWait(4, "ps", "pull at clock 3", absl::Now() - absl::Seconds(50));
  const proto::StateReport r = BuildReport("job", "test", ws, {}, absl::Now());
  // H1: every outgoing call and every protocol wait is an edge, oldest first.
  ASSERT_EQ(r.edges_size(), 6);
  EXPECT_EQ(r.edges(0).kind(), "ps");
  EXPECT_EQ(r.edges(0).from(), 5);
  EXPECT_EQ(r.oldest().what(), "pull at clock 3");
  EXPECT_THAT(r.edges(1).what(), HasSubstr("call of 'f"));
  // H2: each cycle once, from its smallest rank.
  EXPECT_THAT(r.cycles(), ElementsAre("0 -> 1 -> 0", "0 -> 1 -> 2 -> 0"));
  // H3: where each waiting rank's chains end.
  auto ends = Fields(r.chain_ends());
  EXPECT_EQ(ends["0"], "cycle");
  EXPECT_EQ(ends["1"], "cycle");
  EXPECT_EQ(ends["3"], "4");
  EXPECT_EQ(ends["5"], "4");
  EXPECT_EQ(ends.count("4"), 0u);
  EXPECT_THAT(r.summary(), HasSubstr("cycle: w0 (rank 0) -> w1 (rank 1) -> w0 (rank 0)"));
  EXPECT_THAT(r.summary(), HasSubstr("w3 (rank 3) waits, in the end, for w4 (rank 4)"));
  // The JSON round-trips.
  proto::StateReport back;
  ASSERT_TRUE(FromJson(ToJson(r), &back).ok());
  EXPECT_EQ(back.cycles_size(), 2);
  EXPECT_FALSE(FromJson("{not json", &back).ok());
}

TEST(StateReport, H4_AWorkerThatDoesNotAnswerEndsTheChainsThatReachIt) {
  std::vector<proto::WorkerState> ws = {Worker(0, {1}), Worker(1, {2})};
  const proto::StateReport r =
      BuildReport("job", "test", ws, {{2, "connection refused"}}, absl::Now());
  auto ends = Fields(r.chain_ends());
  EXPECT_EQ(ends["0"], "2");
  EXPECT_EQ(ends["1"], "2");
  EXPECT_EQ(Fields(r.unanswered())["2"], "connection refused");
  EXPECT_THAT(r.summary(), HasSubstr("no answer from rank 2 (connection refused)"));
  EXPECT_THAT(r.summary(), HasSubstr("waits, in the end, for rank 2 (no answer)"));
  EXPECT_TRUE(r.cycles().empty());
}

TEST(StateReport, NoWaitsSaysSo) {
  const proto::StateReport r =
      BuildReport("job", "test", {Worker(0, {}), Worker(1, {})}, {}, absl::Now());
  EXPECT_THAT(r.summary(), HasSubstr("no worker waits for another"));
  EXPECT_TRUE(r.edges().empty());
}

// Every agent's snapshot, merged.
proto::StateReport Snapshot(rpc::testing::LoopbackJob& job) {
  std::vector<proto::WorkerState> ws;
  for (int r = 0; r < job.world_size(); ++r) {
    proto::WorkerState w;
    EXPECT_TRUE(FromJson(job.agent(r).StateJson(), &w).ok());
    ws.push_back(std::move(w));
  }
  return BuildReport("loopback", "test", std::move(ws), {}, absl::Now());
}

const proto::StateSection* SectionOf(const proto::StateReport& r, int rank,
                                     const std::string& name) {
  for (const auto& w : r.workers()) {
    if (w.rank() != rank) continue;
    for (const auto& s : w.sections()) {
      if (s.name() == name) return &s;
    }
  }
  return nullptr;
}

TEST(HangReport, ACycleOfNestedCallsIsNamed) {
  static const rpc::Function<int64_t(int64_t)> outer_fn("outer");
  static const rpc::Function<int64_t(int64_t)> inner_fn("inner");
  auto entered = std::make_shared<absl::Notification>();
  auto release = std::make_shared<absl::Notification>();
  rpc::testing::LoopbackJobOptions o;
  o.install = [&](int, rpc::FunctionRegistry& r) {
    // w1's outer calls back into w0, whose inner waits for the test.
    ASSERT_TRUE(r.Register(outer_fn, [](const rpc::CallContext& ctx, int64_t v) {
                   return ctx.agent->rpc_sync(0, inner_fn, v) + 1;
                 }).ok());
    ASSERT_TRUE(r.Register(inner_fn, [entered, release](int64_t v) {
                   entered->Notify();
                   release->WaitForNotificationWithTimeout(absl::Seconds(30));
                   return v * 2;
                 }).ok());
  };
  auto job = rpc::testing::LoopbackJob::Start(o);
  ASSERT_TRUE(job.ok()) << job.status();
  auto call = (*job)->agent(0).rpc_async(1, outer_fn, int64_t{5});
  ASSERT_TRUE(entered->WaitForNotificationWithTimeout(absl::Seconds(20)));
  const proto::StateReport r = Snapshot(**job);
  EXPECT_THAT(r.cycles(), ElementsAre("0 -> 1 -> 0"));
  ASSERT_EQ(r.edges_size(), 2);
  EXPECT_EQ(r.edges(0).from(), 0);  // the outer call is older
  EXPECT_THAT(r.edges(0).what(), HasSubstr("call of 'outer'"));
  EXPECT_THAT(r.edges(1).what(), HasSubstr("call of 'inner'"));
  // Both sides of each call: w1 runs outer for w0, w0 runs inner for w1.
  ASSERT_EQ(r.workers(1).incoming_size(), 1);
  EXPECT_EQ(r.workers(1).incoming(0).function(), "outer");
  EXPECT_EQ(r.workers(1).incoming(0).state(), "running");
  EXPECT_EQ(r.workers(0).incoming(0).caller_name(), "w1");
  EXPECT_GE(r.workers(0).executor().busy(), 1);
  EXPECT_THAT(r.summary(), HasSubstr("cycle: w0 (rank 0) -> w1 (rank 1) -> w0 (rank 0)"));
  release->Notify();
  EXPECT_EQ(call.result().value(), 11);
  // Once it ends, nothing waits, and the progress counters moved.
  const proto::StateReport after = Snapshot(**job);
  EXPECT_TRUE(after.edges().empty());
  EXPECT_GT(TotalProgress(after.workers(0)), TotalProgress(r.workers(0)));
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

TEST(HangReport, APsTrainerThatStopsIsTheEndOfTheChain) {
  ps::PsSpec spec;
  spec.tables = {ps::TableSpec::Dense("w", {4}, at::kFloat, dist_optim::OptimizerOptions::SGD(1))};
  spec.consistency = ps::Consistency::Sync();
  spec.num_trainers = 2;
  std::unique_ptr<ps::PsServer> server;
  rpc::testing::LoopbackJobOptions o;
  o.world_size = 3;
  o.install = [&](int rank, rpc::FunctionRegistry& r) {
    if (rank != 0) return;
    auto s = ps::PsServer::Create(spec, ps::ServerOptions{}, r);
    ASSERT_TRUE(s.ok()) << s.status();
    server = *std::move(s);
  };
  auto job = rpc::testing::LoopbackJob::Start(o);
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<std::unique_ptr<ps::PsClient>> clients;
  for (int t = 0; t < 2; ++t) {
    auto c = ps::PsClient::Create((*job)->agent(1 + t), spec, {t, {"w0"}, absl::Seconds(30)});
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  ASSERT_TRUE(clients[0]->InitDense({"w"}, {at::zeros({4})}).ok());
  // Trainer 0 (w1) ends its first step and pulls; trainer 1 (w2) stops.
  ASSERT_TRUE(clients[0]->Push("w", at::ones({4}), /*end_step=*/true).result().ok());
  auto pull = clients[0]->Pull("w");
  ASSERT_TRUE(testing::Eventually([&] { return server->shard().Stats().parked_pulls == 1; },
                                  absl::Seconds(20)));
  const proto::StateReport r = Snapshot(**job);
  // w1 waits for the server (its pull), the server for w2 (the clock).
  bool rpc_edge = false, ps_edge = false;
  for (const auto& e : r.edges()) {
    rpc_edge |= e.from() == 1 && e.to() == 0 && e.kind() == "rpc";
    ps_edge |= e.from() == 0 && e.to() == 2 && e.kind() == "ps";
  }
  EXPECT_TRUE(rpc_edge && ps_edge) << r.summary();
  EXPECT_EQ(Fields(r.chain_ends())["1"], "2") << r.summary();
  const proto::StateSection* s = SectionOf(r, 0, "ps server 0");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(Fields(s->fields())["parked_pulls"], "1");
  EXPECT_THAT(s->lines(), Contains(HasSubstr("trainer 1 (rank 2): finished clock 0")));
  EXPECT_THAT(s->lines(), Contains(HasSubstr("pull of trainer 0 (rank 1) at clock 1 parked, "
                                             "waiting for trainer 1 (rank 2)")));
  // Trainer 1 catches up: the pull completes and the waits go.
  ASSERT_TRUE(clients[1]->Push("w", at::ones({4}), /*end_step=*/true).result().ok());
  ASSERT_TRUE(pull.result().ok()) << pull.result().status();
  EXPECT_TRUE(Snapshot(**job).edges().empty());
  clients.clear();
  EXPECT_TRUE((*job)->ShutdownAll().ok());
  EXPECT_TRUE(server->Stop().ok());
}

TEST(HangReport, AnRRefForkWhoseConfirmationIsHeldIsNamed) {
  static const rpc::Function<at::Tensor(at::Tensor)> make_fn("make");
  static const rpc::Function<at::Tensor(rref::RRef<at::Tensor>)> fetch_fn("fetch");
  std::vector<std::shared_ptr<rref::RRefService>> rrefs(3);
  rpc::testing::LoopbackJobOptions o;
  o.world_size = 3;
  o.install = [&](int rank, rpc::FunctionRegistry& r) {
    rrefs[rank] = rref::RRefService::Install(r);
    ASSERT_TRUE(r.Register(make_fn, [](at::Tensor x) { return x * 10; }).ok());
    ASSERT_TRUE(
        r.Register(fetch_fn, [](rref::RRef<at::Tensor> ref) { return ref.to_here(); }).ok());
  };
  o.attach = [&](int rank, rpc::RpcAgent& agent) { rrefs[rank]->Attach(&agent); };
  auto job = rpc::testing::LoopbackJob::Start(o);
  ASSERT_TRUE(job.ok()) << job.status();
  // The owner's (w1's) protocol messages to w0 are parked: w0's fork for w2
  // stays unconfirmed.
  (*job)->network().SetRule([](const rpc::testing::FrameInfo& f) {
    return f.request && f.from == 1 && f.to == 0 && f.function == rref::kControlFn
               ? rpc::testing::Fate::Hold()
               : rpc::testing::Fate::Deliver();
  });
  {
    rref::RRef<at::Tensor> r = rref::remote((*job)->agent(0), 1, make_fn, at::ones({2}));
    auto v = (*job)->agent(0).rpc_sync(2, fetch_fn, r);
    EXPECT_DOUBLE_EQ(v.sum().item<double>(), 20.0);
  }
  const proto::StateReport r = Snapshot(**job);
  bool named = false;
  for (const auto& e : r.edges()) {
    if (e.from() == 0 && e.to() == 1 && e.kind() == "rref") {
      named = true;
      EXPECT_THAT(e.what(), HasSubstr("confirmation of 1 fork(s)"));
      EXPECT_THAT(e.what(), HasSubstr("(sent to worker 2)"));
    }
  }
  EXPECT_TRUE(named) << r.summary();
  const proto::StateSection* s = SectionOf(r, 0, "rref");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(Fields(s->fields())["forks_unconfirmed"], "1");
  // Delivered, the confirmation ends the wait.
  (*job)->network().SetRule(nullptr);
  (*job)->network().ReleaseHeld(/*reverse=*/false);
  ASSERT_TRUE(testing::Eventually([&] { return rrefs[0]->DebugState().unconfirmed.empty(); },
                                  absl::Seconds(20)));
  const proto::StateReport settled = Snapshot(**job);
  for (const auto& e : settled.edges()) EXPECT_NE(e.kind(), "rref");
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

}  // namespace
}  // namespace baton::obs
