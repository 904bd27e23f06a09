// Network partitions between workers, in one process over the loopback
// network: a partition is a rule that drops every frame between two workers,
// and LoopbackNetwork::TimeOutStreams ends their streams as TCP does when the
// partition outlasts the connection ("Partitions" in docs/peer_failures.md).
// The same scenario between real hosts (network namespaces, baton-run) is
// tests/launcher/partition_test.cc.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/agent.h"
#include "testing/eventually.h"
#include "testing/rpc/loopback_job.h"

namespace baton {
namespace {

using baton::testing::Eventually;
using rpc::CallOptions;
using rpc::Function;
using rpc::FunctionRegistry;
using rpc::PeerFailure;
using rpc::testing::Fate;
using rpc::testing::FrameInfo;
using rpc::testing::LoopbackJob;
using rpc::testing::LoopbackJobOptions;
using ::testing::HasSubstr;

const Function<int64_t(int64_t)> echo_fn("echo");
// Counts its runs on the callee.
const Function<int64_t()> count_fn("count");
constexpr char kPing[] = "__baton.ping";

// Two workers; worker 0 records the peer failures its agent reports, and a
// partition between them can be turned on and off. Frames of the probe
// function crossing the partition are counted.
struct Job {
  std::unique_ptr<LoopbackJob> job;
  std::atomic<bool> cut{false};
  std::atomic<int> probes_dropped{0};
  std::atomic<int> probes_delivered{0};
  std::atomic<int> count_runs{0};
  absl::Mutex mu;
  std::vector<PeerFailure> failures ABSL_GUARDED_BY(mu);
  std::vector<absl::Time> failure_times ABSL_GUARDED_BY(mu);

  explicit Job(absl::Duration tolerance) {
    LoopbackJobOptions o;
    o.world_size = 2;
    o.rpc_timeout = absl::Seconds(20);
    o.shutdown_timeout = absl::Seconds(5);
    o.configure = [tolerance](int, rpc::AgentOptions& a) {
      a.timeouts.partition_tolerance = tolerance;
    };
    o.install = [this](int, FunctionRegistry& r) {
      (void)r.Register(echo_fn, [](int64_t v) { return v; });
      (void)r.Register(count_fn, [this]() -> int64_t { return count_runs.fetch_add(1) + 1; });
    };
    o.attach = [this](int rank, rpc::RpcAgent& agent) {
      if (rank != 0) return;
      agent.runtime().AddPeerFailureListener([this](const PeerFailure& f) {
        absl::MutexLock lock(&mu);
        failures.push_back(f);
        failure_times.push_back(absl::Now());
      });
    };
    auto started = LoopbackJob::Start(o);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return;
    job = *std::move(started);
    job->network().SetRule([this](const FrameInfo& f) {
      const bool ping = f.function == kPing;
      if (!cut.load()) {
        if (ping) probes_delivered.fetch_add(1);
        return Fate::Deliver();
      }
      if (ping) probes_dropped.fetch_add(1);
      return Fate::Drop();
    });
  }
  ~Job() {
    if (job != nullptr) (void)job->ShutdownAll(/*graceful=*/false);
  }

  // Both ways, so that each worker has a stream to the other.
  void Connect() {
    ASSERT_EQ(job->agent(0).rpc_sync(1, echo_fn, int64_t{1}), 1);
    ASSERT_EQ(job->agent(1).rpc_sync(0, echo_fn, int64_t{2}), 2);
  }
  // The partition starts, and outlasts the connections.
  void Partition() {
    cut = true;
    ASSERT_TRUE(job->network().TimeOutStreams(0, 1).ok());
  }
  size_t failure_count() {
    absl::MutexLock lock(&mu);
    return failures.size();
  }
};

TEST(Partition, Q1_ASilentPeerIsNotReportedDeadWithinTheTolerance) {
  Job j(absl::Seconds(30));
  ASSERT_NE(j.job, nullptr);
  j.Connect();
  j.Partition();
  // Worker 0 suspects worker 1 (its stream timed out) and probes it: the
  // probes go unanswered, which is silence, not death.
  ASSERT_TRUE(Eventually([&] { return j.probes_dropped.load() >= 3; }, absl::Seconds(20)));
  EXPECT_EQ(j.failure_count(), 0u);
  // The partition heals: the next probe gets through, and calls do.
  j.cut = false;
  ASSERT_TRUE(Eventually([&] { return j.probes_delivered.load() >= 1; }, absl::Seconds(10)));
  EXPECT_EQ(j.job->agent(0).rpc_sync(1, echo_fn, int64_t{3}), 3);
  EXPECT_EQ(j.job->agent(1).rpc_sync(0, echo_fn, int64_t{4}), 4);
  EXPECT_EQ(j.failure_count(), 0u);
}

TEST(Partition, Q1_APeerSilentPastTheToleranceIsReportedDeadNamingThePartition) {
  const absl::Duration tolerance = absl::Seconds(3);
  Job j(tolerance);
  ASSERT_NE(j.job, nullptr);
  j.Connect();
  const absl::Time start = absl::Now();
  j.Partition();
  ASSERT_TRUE(Eventually([&] { return j.failure_count() > 0; }, absl::Seconds(20)));
  absl::MutexLock lock(&j.mu);
  ASSERT_EQ(j.failures.size(), 1u);
  EXPECT_EQ(j.failures[0].peer, 1);
  EXPECT_TRUE(absl::IsUnavailable(j.failures[0].cause));
  EXPECT_THAT(j.failures[0].cause.message(), HasSubstr("worker 'w1'"));
  EXPECT_THAT(j.failures[0].cause.message(), HasSubstr("past the partition tolerance (3s"));
  EXPECT_GE(j.failure_times[0] - start, tolerance);
}

TEST(Partition, Q6_AWorkerReportedDeadIsRefusedWhenItCallsAgain) {
  Job j(absl::Seconds(2));
  ASSERT_NE(j.job, nullptr);
  j.Connect();
  j.Partition();
  ASSERT_TRUE(Eventually([&] { return j.failure_count() > 0; }, absl::Seconds(20)));
  j.cut = false;
  // Worker 0 released what worker 1 held; worker 1, back, may not act.
  auto r =
      j.job->agent(1).rpc_async(CallOptions{absl::Seconds(5)}, 0, echo_fn, int64_t{5}).result();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("it was reported dead"));
}

TEST(Partition, Q2_CallsDuringThePartitionFailAtTheirDeadlinesNamingTheCallee) {
  Job j(absl::Seconds(30));
  ASSERT_NE(j.job, nullptr);
  j.Connect();
  j.cut = true;  // no stream ended yet: the call waits for its answer
  const absl::Time start = absl::Now();
  auto r =
      j.job->agent(0).rpc_async(CallOptions{absl::Seconds(1)}, 1, echo_fn, int64_t{6}).result();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("worker 'w1'"));
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));
  j.cut = false;
  EXPECT_EQ(j.job->agent(0).rpc_sync(1, echo_fn, int64_t{7}), 7);
}

TEST(Partition, Q3_AnIdempotentCallInFlightGoesAgainAfterTheHeal) {
  Job j(absl::Seconds(30));
  ASSERT_NE(j.job, nullptr);
  j.Connect();
  j.cut = true;
  CallOptions idempotent{absl::Seconds(20)};
  idempotent.idempotent = true;
  auto call = j.job->agent(0).rpc_async(idempotent, 1, count_fn);
  // The request was lost with the partition, and then the connection.
  ASSERT_TRUE(j.job->network().TimeOutStreams(0, 1).ok());
  ASSERT_TRUE(Eventually([&] { return j.probes_dropped.load() >= 1; }, absl::Seconds(10)));
  EXPECT_FALSE(call.ready());
  j.cut = false;
  auto r = call.result();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 1);
  EXPECT_EQ(j.count_runs.load(), 1);
  EXPECT_EQ(j.failure_count(), 0u);
}

TEST(Partition, Q2_ACallThatMayHaveRunFailsWhenItsStreamTimesOut) {
  Job j(absl::Seconds(30));
  ASSERT_NE(j.job, nullptr);
  j.Connect();
  j.cut = true;
  auto call = j.job->agent(0).rpc_async(CallOptions{absl::Seconds(20)}, 1, count_fn);
  ASSERT_TRUE(j.job->network().TimeOutStreams(0, 1).ok());
  auto r = call.result();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("worker 'w1'"));
  EXPECT_THAT(r.status().message(), HasSubstr("a network partition or a hung host"));
  j.cut = false;
  EXPECT_EQ(j.job->agent(0).rpc_sync(1, echo_fn, int64_t{8}), 8);
}

}  // namespace
}  // namespace baton
