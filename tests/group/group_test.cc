// Group calls (group/group.h, GC1-GC5) over the loopback transport: real
// agents in one process, with the network's rules counting and dropping
// frames and Kill() taking a forwarder away.
#include "group/group.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "proto/group.pb.h"
#include "testing/eventually.h"
#include "testing/rpc/loopback_job.h"

namespace baton::group {
namespace {

using rpc::CallContext;
using rpc::Function;
using rpc::testing::Fate;
using rpc::testing::FrameInfo;
using rpc::testing::LoopbackJob;
using rpc::testing::LoopbackJobOptions;

// The member's rank times 100 plus the argument, and who called.
const Function<std::string(int)> kWhoFn("who");
// Throws on the rank given.
const Function<int(int)> kFailOnFn("fail_on");
// Blocks on the rank given until the test releases it.
const Function<int(int)> kBlockOnFn("block_on");
// The tensor times the member's rank.
const Function<torch::Tensor(torch::Tensor)> kScaleFn("scale");
// Counts its calls.
const Function<void(int)> kCountFn("count");
// A tensor of `n` elements, each the member's rank; on the rank given, a
// tensor of another shape.
const Function<torch::Tensor(int64_t, int)> kRankTensorFn("rank_tensor");
// 100 in each of `n` int8 elements.
const Function<torch::Tensor(int64_t)> kHundredFn("hundred");
// Blocks on the rank given until the test releases it; else the rank as a
// one-element double tensor.
const Function<torch::Tensor(int)> kBlockTensorFn("block_tensor");

struct Fixture {
  absl::Notification release;
  std::atomic<int> counted{0};
};

std::unique_ptr<LoopbackJob> StartJob(int n, Fixture& f,
                                      absl::Duration rpc_timeout = absl::Seconds(20)) {
  LoopbackJobOptions o;
  o.world_size = n;
  o.rpc_timeout = rpc_timeout;
  o.install = [&f](int rank, rpc::FunctionRegistry& r) {
    ASSERT_TRUE(Install(r).ok());
    ASSERT_TRUE(r.Register(kWhoFn, [rank](const CallContext& ctx, int x) {
                   return absl::StrCat(rank * 100 + x, " from ", ctx.caller->name);
                 }).ok());
    ASSERT_TRUE(r.Register(kFailOnFn, [rank](int bad) -> absl::StatusOr<int> {
                   if (rank == bad) return absl::FailedPreconditionError("refused on purpose");
                   return rank;
                 }).ok());
    ASSERT_TRUE(r.Register(kBlockOnFn, [rank, &f](int slow) {
                   if (rank == slow) f.release.WaitForNotification();
                   return rank;
                 }).ok());
    ASSERT_TRUE(r.Register(kScaleFn, [rank](torch::Tensor t) { return t * rank; }).ok());
    ASSERT_TRUE(r.Register(kCountFn, [&f](int) { f.counted.fetch_add(1); }).ok());
    ASSERT_TRUE(r.Register(kRankTensorFn, [rank](int64_t n, int odd) {
                   return torch::full({rank == odd ? n + 1 : n}, static_cast<double>(rank));
                 }).ok());
    ASSERT_TRUE(
        r.Register(kHundredFn, [](int64_t n) { return torch::full({n}, 100, torch::kInt8); }).ok());
    ASSERT_TRUE(r.Register(kBlockTensorFn, [rank, &f](int slow) {
                   if (rank == slow) f.release.WaitForNotification();
                   return torch::full({1}, static_cast<double>(rank), torch::kFloat64);
                 }).ok());
  };
  auto job = LoopbackJob::Start(o);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *std::move(job) : nullptr;
}

std::vector<rpc::WorkerRef> Ranks(int begin, int end) {
  std::vector<rpc::WorkerRef> out;
  for (int r = begin; r < end; ++r) out.emplace_back(r);
  return out;
}

// Every worker but 0, called from 0 through a tree of fanout 2: [1..n) in
// two parts, each split in two again.
absl::StatusOr<Group> WorkersAfterTheFirst(LoopbackJob& job,
                                           absl::Duration timeout = absl::ZeroDuration()) {
  GroupOptions opts;
  opts.fanout = 2;
  opts.timeout = timeout;
  return Group::Of(job.agent(0), Ranks(1, job.world_size()), opts);
}

// GC4, and the tree's shapes: every member's value, in member order, for
// trees from a chain (fanout 1) to one hop (fanout >= members).
TEST(Group, GC4_ResultsComeInMemberOrderWhateverTheTreesShape) {
  Fixture f;
  auto job = StartJob(9, f);
  ASSERT_NE(job, nullptr);
  for (int fanout : {1, 2, 3, 8, 64}) {
    GroupOptions opts;
    opts.fanout = fanout;
    // Not in rank order, and without the caller.
    auto g = Group::Of(job->agent(0), {5, 1, 8, 2, 7, 3, 6, 4}, opts);
    ASSERT_TRUE(g.ok()) << g.status();
    GroupResult<std::string> r = g->call(kWhoFn, 7).value();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r.size(), 8u);
    const std::vector<int> order = {5, 1, 8, 2, 7, 3, 6, 4};
    for (size_t i = 0; i < order.size(); ++i) {
      EXPECT_EQ(r.members[i].id, order[i]);
      // The members' function sees the caller as its caller, not the
      // member that forwarded the request.
      EXPECT_EQ(*r.results[i], absl::StrCat(order[i] * 100 + 7, " from w0")) << "fanout " << fanout;
    }
  }
  // The caller may be a member itself.
  auto all = Group::WithPrefix(job->agent(4), "w");
  ASSERT_TRUE(all.ok());
  std::vector<std::string> values = all->call(kWhoFn, 1).value().values();
  ASSERT_EQ(values.size(), 9u);
  EXPECT_EQ(values[4], "401 from w4");
  EXPECT_TRUE(job->ShutdownAll().ok());
}

// GC3: the caller sends at most `fanout` requests, and so does each member.
TEST(Group, GC3_EachWorkerSendsAtMostFanoutRequests) {
  Fixture f;
  auto job = StartJob(16, f);
  ASSERT_NE(job, nullptr);
  absl::Mutex mu;
  std::map<int, int> sent;  // forward requests by sender
  job->network().SetRule([&](const FrameInfo& info) {
    if (info.request && info.function == kForwardFn) {
      absl::MutexLock lock(&mu);
      ++sent[info.from];
    }
    return Fate::Deliver();
  });
  GroupOptions opts;
  opts.fanout = 3;
  auto g = Group::Of(job->agent(0), Ranks(1, 16), opts);
  ASSERT_TRUE(g.ok());
  GroupResult<void> r = g->broadcast(kCountFn, 1).value();
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(f.counted.load(), 15);
  absl::MutexLock lock(&mu);
  int total = 0;
  for (const auto& [from, n] : sent) {
    EXPECT_LE(n, 3) << "worker " << from;
    total += n;
  }
  EXPECT_EQ(sent[0], 3);
  EXPECT_EQ(total, 15);  // one request per member, whoever sends it
  job->network().SetRule(nullptr);
  EXPECT_TRUE(job->ShutdownAll().ok());
}

// GC1: a member that does not answer in time costs its own entry only.
TEST(Group, GC1_ASlowMemberTimesOutAloneAndTheOthersArrive) {
  Fixture f;
  auto job = StartJob(8, f);
  ASSERT_NE(job, nullptr);
  // [1..7] in two parts, [1, 2, 3, 4] through 1 and [5, 6, 7] through 5;
  // 1 splits [2, 3, 4] into [2, 3] and [4]: member 2 forwards to 3, then
  // its own function blocks. Its part's answer must still arrive.
  auto g = WorkersAfterTheFirst(*job, absl::Seconds(2));
  ASSERT_TRUE(g.ok());
  const absl::Time start = absl::Now();
  GroupResult<int> r = g->call(kBlockOnFn, 2).value();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (size_t i = 0; i < r.size(); ++i) {
    const int rank = r.members[i].id;
    if (rank == 2) {
      EXPECT_EQ(r.results[i].status().code(), absl::StatusCode::kDeadlineExceeded);
      EXPECT_NE(r.results[i].status().message().find("worker 'w2'"), std::string::npos)
          << r.results[i].status();
    } else {
      ASSERT_TRUE(r.results[i].ok()) << r.results[i].status();
      EXPECT_EQ(*r.results[i], rank);
    }
  }
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("1 of 7 members failed"), std::string::npos) << r.status();
  f.release.Notify();
  EXPECT_TRUE(job->ShutdownAll().ok());
}

// GC4: a member's error is its own, and names it.
TEST(Group, GC4_AMembersErrorNamesItAndLeavesTheOthers) {
  Fixture f;
  auto job = StartJob(6, f);
  ASSERT_NE(job, nullptr);
  auto g = WorkersAfterTheFirst(*job);
  ASSERT_TRUE(g.ok());
  Group::Call<int> call = g->call_each(kFailOnFn, 1);  // member 1 forwards for others
  GroupResult<int> r = call.all.value();
  ASSERT_EQ(call.each.size(), 5u);
  EXPECT_EQ(call.each[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(call.each[0].status().message().find("worker 'w1'"), std::string::npos);
  EXPECT_NE(call.each[0].status().message().find("refused on purpose"), std::string::npos);
  for (int i = 1; i < 5; ++i) EXPECT_EQ(call.each[i].value(), i + 1);
  EXPECT_THROW(r.values(), Error);
  EXPECT_TRUE(job->ShutdownAll().ok());
}

// GC2: a forwarder that died does not lose its part silently.
TEST(Group, GC2_AForwarderThatDiedLeavesAnErrorForEachMemberOfItsPart) {
  Fixture f;
  auto job = StartJob(8, f, absl::Seconds(5));
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(job->Kill(1).ok());
  // [1..7] in two parts: [1, 2, 3, 4] through 1 (dead), [5, 6, 7] through 5.
  auto g = WorkersAfterTheFirst(*job, absl::Seconds(3));
  ASSERT_TRUE(g.ok());
  GroupResult<std::string> r = g->call(kWhoFn, 0).value();
  for (size_t i = 0; i < r.size(); ++i) {
    const int rank = r.members[i].id;
    if (rank <= 4) {
      ASSERT_FALSE(r.results[i].ok()) << rank;
      const std::string m(r.results[i].status().message());
      EXPECT_NE(m.find(absl::StrCat("worker 'w", rank, "'")), std::string::npos) << m;
      if (rank > 1) {
        EXPECT_NE(m.find("no answer through worker 'w1', which was to forward the call"),
                  std::string::npos)
            << m;
      }
    } else {
      ASSERT_TRUE(r.results[i].ok()) << r.results[i].status();
      EXPECT_EQ(*r.results[i], absl::StrCat(rank * 100, " from w0"));
    }
  }
  EXPECT_TRUE(job->ShutdownAll(/*graceful=*/false).ok());
}

// GC2 below the first level: a forwarder that never answers (its requests
// are lost) costs its own entry and names itself in those of its part; the
// member above it answers for them by the deadline.
TEST(Group, GC2_ASilentForwarderBelowTheTopIsNamedInItsPartsErrors) {
  Fixture f;
  auto job = StartJob(8, f);
  ASSERT_NE(job, nullptr);
  // [1..7] in two parts, [1, 2, 3, 4] through 1 and [5, 6, 7] through 5;
  // 1 sends [2, 3] to 2 (lost) and [4] to 4.
  job->network().SetRule([](const FrameInfo& info) {
    return info.request && info.to == 2 && info.function == kForwardFn ? Fate::Drop()
                                                                       : Fate::Deliver();
  });
  auto g = WorkersAfterTheFirst(*job, absl::Seconds(2));
  ASSERT_TRUE(g.ok());
  GroupResult<std::string> r = g->call(kWhoFn, 0).value();
  for (size_t i = 0; i < r.size(); ++i) {
    const int rank = r.members[i].id;
    if (rank == 2 || rank == 3) {
      EXPECT_EQ(r.results[i].status().code(), absl::StatusCode::kDeadlineExceeded) << rank;
      const std::string m(r.results[i].status().message());
      EXPECT_NE(m.find(absl::StrCat("worker 'w", rank, "'")), std::string::npos) << m;
      if (rank == 3) {
        EXPECT_NE(m.find("through worker 'w2', which was to forward the call"), std::string::npos)
            << m;
      }
    } else {
      ASSERT_TRUE(r.results[i].ok()) << rank << ": " << r.results[i].status();
    }
  }
  job->network().SetRule(nullptr);
  EXPECT_TRUE(job->ShutdownAll().ok());
}

// Tensors travel down the tree once per hop and come back per member.
TEST(Group, TensorsReachEveryMemberAndComeBackInOrder) {
  Fixture f;
  auto job = StartJob(7, f);
  ASSERT_NE(job, nullptr);
  auto g = WorkersAfterTheFirst(*job);
  ASSERT_TRUE(g.ok());
  torch::Tensor x = torch::arange(1000, torch::kFloat32);
  GroupResult<torch::Tensor> r = g->call(kScaleFn, x).value();
  ASSERT_TRUE(r.ok()) << r.status();
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_TRUE(torch::equal(*r.results[i], x * r.members[i].id)) << i;
  }
  EXPECT_TRUE(job->ShutdownAll().ok());
}

// A reduce: the members' tensors summed on the way up, whatever the tree's
// shape; the mean divides by the members that contributed.
TEST(Group, AReduceSumsEveryMembersTensorOnTheWayUp) {
  Fixture f;
  auto job = StartJob(11, f);
  ASSERT_NE(job, nullptr);
  for (int fanout : {1, 2, 3, 64}) {
    GroupOptions opts;
    opts.fanout = fanout;
    auto g = Group::Of(job->agent(0), Ranks(1, 11), opts);
    ASSERT_TRUE(g.ok()) << g.status();
    Reduced sum = g->reduce(kRankTensorFn, ReduceOp::kSum, int64_t{1000}, -1).value();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(sum.contributors.size(), 10u);
    for (size_t i = 0; i < sum.contributors.size(); ++i) {
      EXPECT_EQ(sum.contributors[i].id, static_cast<int>(i) + 1);
    }
    // 1 + 2 + ... + 10 in each of the 1000 elements.
    EXPECT_TRUE(torch::equal(sum.value, torch::full({1000}, 55.0))) << "fanout " << fanout;
    Reduced mean = g->reduce(kRankTensorFn, ReduceOp::kMean, int64_t{3}, -1).value();
    EXPECT_TRUE(torch::allclose(mean.value, torch::full({3}, 5.5))) << "fanout " << fanout;
    // Integers are summed as int64: ten int8 hundreds do not wrap.
    Reduced ints = g->reduce(kHundredFn, ReduceOp::kSum, int64_t{3}).value();
    ASSERT_TRUE(ints.ok()) << ints.status();
    EXPECT_TRUE(torch::equal(ints.value, torch::full({3}, 1000, torch::kInt64)))
        << ints.value << " fanout " << fanout;
  }
  EXPECT_TRUE(job->ShutdownAll().ok());
}

// GC1 and GC2 in a reduce: a member whose tensor does not fit the others',
// and one that answers late, are left out, each named with why; the sum of
// the others arrives by the deadline.
TEST(Group, AReduceLeavesOutAndNamesTheMembersThatFailedOrWereLate) {
  Fixture f;
  auto job = StartJob(8, f);
  ASSERT_NE(job, nullptr);
  auto g = WorkersAfterTheFirst(*job);
  ASSERT_TRUE(g.ok());
  Reduced odd = g->reduce(kRankTensorFn, ReduceOp::kSum, int64_t{4}, 6).value();
  ASSERT_EQ(odd.failures.size(), 1u);
  EXPECT_EQ(odd.failures[0].first.id, 6);
  EXPECT_EQ(odd.failures[0].second.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(odd.failures[0].second.message().find("worker 'w6'"), std::string::npos)
      << odd.failures[0].second;
  EXPECT_NE(odd.failures[0].second.message().find(
                "its tensor, [5] Float, does not add to the others' sum, [4] Float"),
            std::string::npos)
      << odd.failures[0].second;
  EXPECT_EQ(odd.contributors.size(), 6u);
  EXPECT_TRUE(torch::equal(odd.value, torch::full({4}, 1.0 + 2 + 3 + 4 + 5 + 7)));
  EXPECT_NE(odd.status().message().find("1 of 7 members failed"), std::string::npos)
      << odd.status();

  // Member 2 forwards to 3 (the tree of WorkersAfterTheFirst), then blocks.
  auto timed = WorkersAfterTheFirst(*job, absl::Seconds(2));
  ASSERT_TRUE(timed.ok());
  const absl::Time start = absl::Now();
  Reduced late = timed->reduce(kBlockTensorFn, ReduceOp::kSum, 2).value();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_EQ(late.failures.size(), 1u);
  EXPECT_EQ(late.failures[0].first.id, 2);
  EXPECT_EQ(late.failures[0].second.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(torch::equal(late.value, torch::full({1}, 1.0 + 3 + 4 + 5 + 6 + 7, torch::kFloat64)));
  f.release.Notify();
  EXPECT_TRUE(job->ShutdownAll().ok());
}

// GC2 in a reduce: a forwarder that died leaves each member of its part
// out, named, and the other parts' sum arrives.
TEST(Group, AReduceWhoseForwarderDiedNamesEachMemberOfItsPart) {
  Fixture f;
  auto job = StartJob(8, f, absl::Seconds(5));
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(job->Kill(5).ok());  // the forwarder of [5, 6, 7]
  auto g = WorkersAfterTheFirst(*job, absl::Seconds(3));
  ASSERT_TRUE(g.ok());
  Reduced r = g->reduce(kRankTensorFn, ReduceOp::kSum, int64_t{2}, -1).value();
  ASSERT_EQ(r.failures.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.failures[i].first.id, static_cast<int>(i) + 5);
    if (i > 0) {
      EXPECT_NE(r.failures[i].second.message().find("through worker 'w5'"), std::string::npos)
          << r.failures[i].second;
    }
  }
  EXPECT_TRUE(torch::equal(r.value, torch::full({2}, 1.0 + 2 + 3 + 4)));
  EXPECT_TRUE(job->ShutdownAll(/*graceful=*/false).ok());
}

// GC5, and the options refused.
TEST(Group, GC5_UnknownOrRepeatedMembersAreRefusedWhenTheGroupIsMade) {
  Fixture f;
  auto job = StartJob(3, f);
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(Group::Of(job->agent(0), {"w1", "nobody"}).status().code(),
            absl::StatusCode::kNotFound);
  auto twice = Group::Of(job->agent(0), {"w1", 1});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("'w1' is listed twice"), std::string::npos);
  EXPECT_EQ(Group::Of(job->agent(0), {}).status().code(), absl::StatusCode::kInvalidArgument);
  GroupOptions bad;
  bad.fanout = 0;
  EXPECT_EQ(Group::Of(job->agent(0), {1}, bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Group::WithPrefix(job->agent(0), "observer").status().code(),
            absl::StatusCode::kNotFound);
  auto all = Group::WithPrefix(job->agent(0), "w");
  ASSERT_TRUE(all.ok());
  auto slice = all->Slice(1, 3);
  ASSERT_TRUE(slice.ok());
  EXPECT_EQ(slice->members()[0].name, "w1");
  EXPECT_EQ(slice->size(), 2);
  EXPECT_EQ(all->Slice(2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(job->ShutdownAll().ok());
}

// Bad input: a forged hop request is refused with what was wrong.
TEST(Group, AForgedRequestIsRefusedNamingWhatIsWrong) {
  Fixture f;
  auto job = StartJob(3, f);
  ASSERT_NE(job, nullptr);
  auto send = [&](const proto::GroupRequest& r) {
    rpc::Payload p;
    p.bytes = r.SerializeAsString();
    return job->agent(0).runtime().CallRaw(1, kForwardFn, "", std::move(p)).status();
  };
  proto::GroupRequest r;
  r.set_function("who");
  r.set_fanout(2);
  r.set_root(0);
  r.add_members(2);  // not the receiver
  EXPECT_EQ(send(r).code(), absl::StatusCode::kInvalidArgument);
  r.clear_members();
  r.add_members(1);
  r.add_members(1);
  absl::Status twice = send(r);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("twice"), std::string::npos) << twice;
  r.clear_members();
  r.add_members(1);
  r.add_members(77);
  EXPECT_EQ(send(r).code(), absl::StatusCode::kNotFound);
  r.clear_members();
  r.add_members(1);
  r.set_fanout(1000);
  EXPECT_EQ(send(r).code(), absl::StatusCode::kInvalidArgument);
  r.set_fanout(2);
  r.set_function(kForwardFn);  // would nest without bound
  EXPECT_EQ(send(r).code(), absl::StatusCode::kInvalidArgument);
  rpc::Payload garbage;
  garbage.bytes = "\xff\xff\xff";
  EXPECT_EQ(job->agent(0).runtime().CallRaw(1, kForwardFn, "", std::move(garbage)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_TRUE(job->ShutdownAll().ok());
}

// A member that answers a reduce with a sum that does not account for its
// part (a member it was not sent, one it leaves out) is not trusted: each
// member of its part is left out with DATA_LOSS, and the rest arrives.
TEST(Group, AReducedReplyThatDoesNotAccountForItsPartLeavesThatPartOut) {
  LoopbackJobOptions o;
  o.world_size = 5;
  o.install = [](int rank, rpc::FunctionRegistry& r) {
    if (rank == 3) {
      // Worker 3 forges its part's answer: a sum from worker 1, who is not
      // in its part.
      ASSERT_TRUE(
          r.RegisterRaw(kForwardFn, "", [](const CallContext&, rpc::Payload, rpc::Responder done) {
             proto::GroupReply reply;
             reply.mutable_reduced()->add_contributors(1);
             reply.mutable_reduced()->set_value("forged");
             rpc::Payload p;
             p.bytes = reply.SerializeAsString();
             done(std::move(p));
           }).ok());
    } else {
      ASSERT_TRUE(Install(r).ok());
    }
    ASSERT_TRUE(r.Register(kRankTensorFn, [rank](int64_t n, int) {
                   return torch::full({n}, static_cast<double>(rank));
                 }).ok());
  };
  auto job = LoopbackJob::Start(o);
  ASSERT_TRUE(job.ok()) << job.status();
  GroupOptions opts;
  opts.fanout = 2;  // [1, 2] through 1, [3, 4] through 3
  auto g = Group::Of((*job)->agent(0), Ranks(1, 5), opts);
  ASSERT_TRUE(g.ok());
  Reduced r = g->reduce(kRankTensorFn, ReduceOp::kSum, int64_t{2}, -1).value();
  ASSERT_EQ(r.failures.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(r.failures[i].first.id, static_cast<int>(i) + 3);
    EXPECT_EQ(r.failures[i].second.code(), absl::StatusCode::kDataLoss) << r.failures[i].second;
  }
  ASSERT_EQ(r.contributors.size(), 2u);
  EXPECT_TRUE(torch::equal(r.value, torch::full({2}, 1.0 + 2)));
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

}  // namespace
}  // namespace baton::group
