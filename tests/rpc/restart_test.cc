// Restarted workers, in one process over the loopback network: a worker is
// killed (or only taken for dead) and a new incarnation of its rank rejoins
// the running job (AgentOptions::restarts.rejoin through LoopbackJob::Restart), as
// baton-run restarts a role. Tests are named after the agent's peer-failure
// guarantees P1-P8 (docs/peer_failures.md), D4 of distributed autograd and
// G7 of RRefs. The soak test (tests/soak) runs the same on real processes.
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_autograd/internal/container.h"
#include "rpc/agent.h"
#include "rref/rref.h"
#include "testing/eventually.h"
#include "testing/rpc/loopback_job.h"

namespace baton {
namespace {

using baton::testing::Eventually;
using rpc::CallContext;
using rpc::CallOptions;
using rpc::Function;
using rpc::FunctionRegistry;
using rpc::PeerFailure;
using rpc::RpcAgent;
using rpc::testing::LoopbackJob;
using rpc::testing::LoopbackJobOptions;
using rref::RRef;
using rref::RRefService;

const Function<int64_t()> whoami_fn("whoami");
const Function<at::Tensor(int64_t)> zeros_fn("zeros");
const Function<at::Tensor(at::Tensor)> echo_fn("echo");
const Function<at::Tensor(at::Tensor)> make_fn("make");
const Function<at::Tensor(at::Tensor)> square_fn("square");
// Counts its runs, says it started, and returns once released.
const Function<int64_t()> hold_fn("hold");
std::atomic<int> g_hold_runs{0};
absl::Notification* g_hold_started = nullptr;
absl::Notification* g_hold_release = nullptr;

// Three workers with RRefs, distributed autograd and the test's functions;
// worker 0 records the peer failures its agent reports.
struct Job {
  std::vector<std::shared_ptr<RRefService>> rrefs;
  std::unique_ptr<LoopbackJob> job;
  absl::Mutex mu;
  std::vector<PeerFailure> failures ABSL_GUARDED_BY(mu);

  explicit Job(bool shm = false, absl::Duration restart_wait = absl::ZeroDuration(),
               bool wait_for_peers = false) {
    rrefs.resize(3);
    LoopbackJobOptions o;
    o.world_size = 3;
    o.rpc_timeout = absl::Seconds(10);
    o.shutdown_timeout = absl::Seconds(10);
    o.configure = [shm, restart_wait, wait_for_peers](int, rpc::AgentOptions& a) {
      a.transport.same_host_shm = shm;
      a.restarts.wait = restart_wait;
      if (wait_for_peers) a.timeouts.shutdown_wait_for_peers = absl::InfiniteDuration();
    };
    o.install = [this](int rank, FunctionRegistry& r) {
      ASSERT_TRUE(dist_autograd::Install(r).ok());
      rrefs[rank] = RRefService::Install(r);
      (void)r.Register(whoami_fn,
                       [](const CallContext& ctx) { return ctx.runtime->incarnation(); });
      (void)r.Register(zeros_fn, [](int64_t n) { return at::zeros({n}, at::kFloat); });
      (void)r.Register(echo_fn, [](at::Tensor x) { return x; });
      (void)r.Register(make_fn, [](at::Tensor x) { return x * 10; });
      (void)r.Register(square_fn, [](at::Tensor x) { return x * x; });
      (void)r.Register(hold_fn, []() -> int64_t {
        const int run = g_hold_runs.fetch_add(1) + 1;
        if (g_hold_started != nullptr) g_hold_started->Notify();
        if (g_hold_release != nullptr) {
          g_hold_release->WaitForNotificationWithTimeout(absl::Seconds(30));
        }
        return run;
      });
    };
    o.attach = [this](int rank, RpcAgent& agent) {
      rrefs[rank]->Attach(&agent);
      if (rank != 0) return;
      agent.runtime().AddPeerFailureListener([this](const PeerFailure& f) {
        absl::MutexLock lock(&mu);
        failures.push_back(f);
      });
    };
    auto started = LoopbackJob::Start(std::move(o));
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) job = *std::move(started);
  }
  RpcAgent& agent(int r) { return job->agent(r); }
  std::vector<PeerFailure> Failures() {
    absl::MutexLock lock(&mu);
    return failures;
  }
};

// P1, P4: a restarted incarnation that calls a peer is known there at once;
// the peer reports its predecessor dead (once), sends its own calls to the
// new address, and refuses the replaced process's requests.
TEST(Restart, P1_P4_P6_ANewIncarnationThatCallsReplacesItsPredecessor) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  EXPECT_EQ(j.agent(2).runtime().incarnation(), 1);
  EXPECT_EQ(j.agent(0).runtime().peer_incarnation(2), 1);
  EXPECT_EQ(j.agent(0).rpc_sync(2, whoami_fn), 1);
  RpcAgent* replaced = &j.agent(2);
  // The old process keeps running: it was only taken for dead.
  ASSERT_TRUE(j.job->Restart(2, /*kill_first=*/false).ok());
  RpcAgent& now = j.agent(2);
  EXPECT_EQ(now.runtime().incarnation(), 2);
  EXPECT_EQ(now.rpc_sync(0, whoami_fn), 1);
  EXPECT_EQ(j.agent(0).runtime().peer_incarnation(2), 2);
  ASSERT_TRUE(Eventually([&] { return j.Failures().size() == 1; }));
  const PeerFailure f = j.Failures()[0];
  EXPECT_EQ(f.peer, 2);
  EXPECT_EQ(f.incarnation, 1);
  EXPECT_EQ(f.cause.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(f.cause.message(), "incarnation 2 of its rank rejoined"))
      << f.cause;
  // Worker 0's calls to rank 2 reach the new incarnation, the first one
  // included (P6: it follows the registration before sending).
  auto first = j.agent(0).rpc_async(2, whoami_fn).result();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 2);
  // P4: the replaced process can no longer act for its rank.
  auto refused = replaced->rpc_async(0, whoami_fn).result();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(
      absl::StrContains(refused.status().message(), "a newer incarnation of that rank rejoined"))
      << refused.status();
  EXPECT_EQ(j.agent(0).stats().peer_failures, 1);
  EXPECT_EQ(j.Failures().size(), 1u);
  EXPECT_TRUE(j.job->ShutdownAll().ok());
}

// P2: a killed worker is confirmed dead once, however much evidence about
// it follows (calls to its old address, their failing streams); its
// successor is found through the store and never reported dead.
TEST(Restart, P2_AKilledWorkerIsReportedOnceAndItsSuccessorNever) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  EXPECT_EQ(j.agent(0).rpc_sync(2, whoami_fn), 1);  // a stream to rank 2
  ASSERT_TRUE(j.job->Kill(2).ok());
  ASSERT_TRUE(Eventually([&] { return j.Failures().size() == 1; }));
  EXPECT_EQ(j.Failures()[0].incarnation, 1);
  for (int i = 0; i < 5; ++i) {
    auto r = j.agent(0).rpc_async(2, whoami_fn).result();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  }
  ASSERT_TRUE(j.job->Restart(2).ok());
  // The new incarnation has not called worker 0: worker 0 finds it in the
  // store when its calls to the old address fail.
  EXPECT_TRUE(
      Eventually([&] { return j.agent(0).rpc_async(2, whoami_fn).result().value_or(0) == 2; }));
  EXPECT_EQ(j.agent(0).runtime().peer_incarnation(2), 2);
  // Every suspicion has been settled by its probe (a report can only come
  // from one), and none reported the successor.
  ASSERT_TRUE(Eventually([&] { return j.agent(0).stats().peer_probes_in_flight == 0; }));
  EXPECT_EQ(j.Failures().size(), 1u);
  EXPECT_EQ(j.agent(0).stats().peer_failures, 1);
  EXPECT_TRUE(j.job->ShutdownAll().ok());
}

// P3: with the same-host shared-memory channel on, a restarted incarnation
// (which opened no probe) gets large replies, and sends and receives large
// arguments, over the stream: nothing fails with DATA_LOSS and no segment
// stays busy.
TEST(Restart, P3_ARestartedWorkerGetsLargeTensorsOverTheStream) {
  Job j(/*shm=*/true);
  ASSERT_NE(j.job, nullptr);
  ASSERT_TRUE(j.agent(2).runtime().uses_shm(0));
  constexpr int64_t kBig = 1 << 16;  // 256 KiB of floats
  EXPECT_EQ(j.agent(2).rpc_sync(0, zeros_fn, kBig).numel(), kBig);
  ASSERT_TRUE(j.job->Restart(2).ok());
  EXPECT_FALSE(j.agent(2).runtime().uses_shm(0));
  for (int i = 0; i < 3; ++i) {
    auto r = j.agent(2).rpc_async(0, zeros_fn, kBig).result();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->numel(), kBig);
  }
  // Worker 0 learnt of the restart from those calls: it no longer sends
  // rank 2 blobs through shared memory.
  EXPECT_FALSE(j.agent(0).runtime().uses_shm(2));
  at::Tensor big = at::arange(kBig, at::kFloat);
  EXPECT_TRUE(Eventually([&] {
    auto r = j.agent(0).rpc_async(2, echo_fn, big).result();
    return r.ok() && r->equal(big);
  }));
  EXPECT_TRUE(Eventually([&] { return j.agent(0).stats().shm_busy_segments == 0; }));
  EXPECT_TRUE(j.job->ShutdownAll().ok());
}

// D4: a restarted creator's contexts have ids of their own, and when its
// predecessor's death is reported only the predecessor's contexts go.
TEST(Restart, D4_ARestartedCreatorKeepsItsContextsWhenItsPredecessorsAreReleased) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  at::Tensor x = at::randn({2, 2}, at::kDouble).requires_grad_(true);
  auto old_ctx = std::make_unique<dist_autograd::Context>(j.agent(2));
  (void)j.agent(2).rpc_sync(0, square_fn, x);
  const int64_t old_id = old_ctx->id();
  ASSERT_EQ(dist_autograd::LiveContexts(j.agent(0)), std::vector<int64_t>{old_id});
  ASSERT_TRUE(j.job->Restart(2).ok());
  {
    dist_autograd::Context ctx(j.agent(2));
    EXPECT_NE(ctx.id(), old_id);
    EXPECT_EQ(dist_autograd::internal::CreatorOf(ctx.id()), 2);
    at::Tensor y = j.agent(2).rpc_sync(0, square_fn, x);
    // Worker 0 learnt of incarnation 2 from that call, and released the
    // context of incarnation 1 only.
    EXPECT_TRUE(Eventually(
        [&] { return dist_autograd::LiveContexts(j.agent(0)) == std::vector<int64_t>{ctx.id()}; }));
    ASSERT_TRUE(dist_autograd::Backward(j.agent(2), ctx.id(), {y.sum()}).ok());
    auto grad = dist_autograd::GetGradient(j.agent(2), ctx.id(), x);
    ASSERT_TRUE(grad.ok()) << grad.status();
    EXPECT_TRUE(grad->allclose(2 * x));
  }
  old_ctx.reset();  // on the dead incarnation's agent
  EXPECT_TRUE(j.job->ShutdownAll(/*graceful=*/false).ok());
}

// G7: an owner lets go of the forks a killed worker held, and the worker's
// restarted incarnation makes RRefs with ids of its own.
TEST(Restart, G7_AnOwnerReleasesTheForksOfAKilledWorker) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  RRef<at::Tensor> held = rref::remote(j.agent(2), 0, make_fn, at::ones({2}));
  ASSERT_TRUE(held.to_here().equal(at::full({2}, 10.0)));
  ASSERT_EQ(j.rrefs[0]->DebugState().owned.size(), 1u);
  const std::string old_id = held.id();
  ASSERT_TRUE(j.job->Kill(2).ok());
  EXPECT_TRUE(Eventually([&] { return j.rrefs[0]->DebugState().owned.empty(); }))
      << j.rrefs[0]->DebugState().ToString();
  ASSERT_TRUE(j.job->Restart(2).ok());
  {
    RRef<at::Tensor> fresh = rref::remote(j.agent(2), 0, make_fn, at::full({2}, 2.0));
    EXPECT_NE(fresh.id(), old_id);
    EXPECT_TRUE(fresh.to_here().equal(at::full({2}, 20.0)));
  }
  EXPECT_TRUE(j.rrefs[0]->WaitUntilEmpty(absl::Seconds(10)).ok());
  EXPECT_TRUE(j.rrefs[2]->WaitUntilEmpty(absl::Seconds(10)).ok());
  EXPECT_TRUE(j.job->ShutdownAll(/*graceful=*/false).ok());
}

// G10: a user of an RRef whose owner died and was restarted fails at once,
// naming the owner and both incarnations, instead of asking the new
// incarnation for a value it never had (which waited until the deadline).
TEST(Restart, G10_AUserOfARestartedOwnersRRefFailsAtOnceByName) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  RRef<at::Tensor> r = rref::remote(j.agent(0), 1, make_fn, at::ones({2}));
  // The remote() call itself answered (a to_here() may answer first; the
  // kill would then fail the creation, and the RRef with its error).
  ASSERT_TRUE(r.created().Wait(absl::Seconds(10)).ok());
  ASSERT_TRUE(r.to_here_async().result().ok());
  ASSERT_TRUE(j.job->Restart(1).ok());
  // The new incarnation calls w0, which learns of it (P1).
  ASSERT_TRUE(j.agent(1).rpc_async(0, whoami_fn).result().ok());
  EXPECT_EQ(j.agent(0).runtime().peer_incarnation(1), 2);
  const absl::Time start = absl::Now();
  auto v = r.to_here_async(absl::Seconds(20)).result();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  ASSERT_EQ(v.status().code(), absl::StatusCode::kUnavailable) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(),
                                "its owner, worker 'w1' (id 1, incarnation 1), died with its "
                                "value; "
                                "incarnation 2 of that rank rejoined the job without it"))
      << v.status();
  EXPECT_TRUE(j.job->ShutdownAll(/*graceful=*/false).ok());
}

// P7: with AgentOptions::restarts.wait, a call to a rank whose incarnation
// was confirmed dead waits for the rank's next incarnation to register and
// goes to it, instead of failing at once; a rank that does not come back
// fails the call by its deadline.
TEST(Restart, P7_ACallToADeadRankWaitsForItsSuccessor) {
  Job j(/*shm=*/false, /*restart_wait=*/absl::Seconds(30));
  ASSERT_NE(j.job, nullptr);
  ASSERT_TRUE(j.job->Kill(2).ok());
  // The first call is the evidence of the death, which a probe confirms
  // (P2); it waits for a successor too (P8), until its short deadline.
  EXPECT_FALSE(
      j.agent(0).rpc_async(CallOptions{absl::Milliseconds(300)}, 2, whoami_fn).result().ok());
  ASSERT_TRUE(Eventually([&] { return j.Failures().size() == 1; }));
  absl::StatusOr<int64_t> waited = absl::UnknownError("not run");
  std::thread caller([&] {
    waited = j.agent(0).rpc_async(CallOptions{absl::Seconds(30)}, 2, whoami_fn).result();
  });
  // The call waits for rank 2's successor (the event: the agent counts it).
  ASSERT_TRUE(Eventually([&] { return j.agent(0).stats().calls_waiting_for_restart == 1; }));
  ASSERT_TRUE(j.job->Restart(2).ok());
  caller.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(*waited, 2);  // the new incarnation answered
  // Every waiter ends: this call's, and the first call's, which may still be
  // in its last store wait (bounded by its deadline) when this one returns.
  EXPECT_TRUE(Eventually([&] { return j.agent(0).stats().calls_waiting_for_restart == 0; }));

  // Rank 1 dies for good: a call waits until its own deadline, then fails.
  ASSERT_TRUE(j.job->Kill(1).ok());
  EXPECT_FALSE(
      j.agent(0).rpc_async(CallOptions{absl::Milliseconds(300)}, 1, whoami_fn).result().ok());
  ASSERT_TRUE(Eventually([&] { return j.Failures().size() == 2; }));
  const absl::Time start = absl::Now();
  auto lost = j.agent(0).rpc_async(CallOptions{absl::Milliseconds(500)}, 1, whoami_fn).result();
  EXPECT_FALSE(lost.ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(450));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(j.job->ShutdownAll(/*graceful=*/false).ok());
}

// P9: a graceful shutdown that finds a missing rank dead waits, within
// restart_wait, for its successor, which then reaches shutdown like any
// worker; a rank that does not come back fails the shutdown by name.
TEST(Restart, P9_AShutdownDuringARestartWaitsForTheSuccessor) {
  Job j(/*shm=*/false, /*restart_wait=*/absl::Seconds(30), /*wait_for_peers=*/true);
  ASSERT_NE(j.job, nullptr);
  ASSERT_TRUE(j.job->Kill(2).ok());
  // Worker 0 learns of the death by calling it, as a worker would.
  EXPECT_FALSE(
      j.agent(0).rpc_async(CallOptions{absl::Milliseconds(300)}, 2, whoami_fn).result().ok());
  ASSERT_TRUE(Eventually([&] { return j.Failures().size() == 1; }));
  absl::Status stopped[2] = {absl::UnknownError("not run"), absl::UnknownError("not run")};
  std::thread t0([&] { stopped[0] = j.agent(0).Shutdown(); });
  std::thread t1([&] { stopped[1] = j.agent(1).Shutdown(); });
  // Worker 0's shutdown waits for rank 2's successor (the agent counts it).
  // (Without P9 it fails at once instead; the threads are joined either way.)
  const bool waiting =
      Eventually([&] { return j.agent(0).stats().calls_waiting_for_restart >= 1; });
  EXPECT_TRUE(waiting);
  if (waiting) {
    ASSERT_TRUE(j.job->Restart(2).ok());
    const absl::Status last = j.agent(2).Shutdown();
    EXPECT_TRUE(last.ok()) << last;
  }
  t0.join();
  t1.join();
  for (const absl::Status& s : stopped) EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(j.job->ShutdownAll().ok());
}

TEST(Restart, P9_AShutdownFailsByNameWhenNoSuccessorRegisters) {
  Job j(/*shm=*/false, /*restart_wait=*/absl::Milliseconds(500), /*wait_for_peers=*/true);
  ASSERT_NE(j.job, nullptr);
  ASSERT_TRUE(j.job->Kill(2).ok());
  EXPECT_FALSE(
      j.agent(0).rpc_async(CallOptions{absl::Milliseconds(300)}, 2, whoami_fn).result().ok());
  ASSERT_TRUE(Eventually([&] { return j.Failures().size() == 1; }));
  absl::Status stopped[2];
  std::thread t1([&] { stopped[1] = j.agent(1).Shutdown(); });
  const absl::Time start = absl::Now();
  stopped[0] = j.agent(0).Shutdown();
  t1.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (const absl::Status& s : stopped) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "worker 2 (w2) died before it reached shutdown"))
        << s;
  }
  EXPECT_TRUE(absl::StrContains(stopped[0].message(),
                                "no successor registered within restart_wait (500ms)"))
      << stopped[0];
  // Named once: Shutdown() adds the worker's name to what went wrong.
  EXPECT_TRUE(absl::StartsWith(stopped[0].message(), "shutdown of worker 'w0': worker 2 (w2)"))
      << stopped[0];
  EXPECT_TRUE(j.job->ShutdownAll(/*graceful=*/false).ok());
}

// P8: with restart_wait, a call that reveals a death (its request could not
// be delivered: the rank's process is gone) is not failed: it goes to the
// rank's successor once that registers. Before P8 it failed with
// UNAVAILABLE, as did every call until the death was confirmed.
TEST(Restart, P8_AnUndeliveredCallThatRevealsADeathGoesToTheSuccessor) {
  Job j(/*shm=*/false, /*restart_wait=*/absl::Seconds(30));
  ASSERT_NE(j.job, nullptr);
  // Worker 0 has no stream to rank 2 yet (so no stream's end tells it of
  // the death): its call is the first evidence.
  ASSERT_TRUE(j.job->Kill(2).ok());
  absl::StatusOr<int64_t> first = absl::UnknownError("not run");
  absl::StatusOr<int64_t> second = absl::UnknownError("not run");
  std::thread caller(
      [&] { first = j.agent(0).rpc_async(CallOptions{absl::Seconds(30)}, 2, whoami_fn).result(); });
  ASSERT_TRUE(Eventually([&] { return j.agent(0).stats().calls_waiting_for_restart >= 1; }));
  std::thread later([&] {
    second = j.agent(0).rpc_async(CallOptions{absl::Seconds(30)}, 2, whoami_fn).result();
  });
  ASSERT_TRUE(j.job->Restart(2).ok());
  caller.join();
  later.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 2);  // the successor answered
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, 2);
  EXPECT_EQ(j.agent(0).stats().calls_waiting_for_restart, 0);
  EXPECT_TRUE(j.job->ShutdownAll(/*graceful=*/false).ok());
}

// P8: a request that may have been delivered is never sent again: a call
// whose function was running when its callee died fails with UNAVAILABLE
// at once, even with restart_wait, and the successor never runs it.
TEST(Restart, P8_ACallThatMayHaveBeenDeliveredFailsAndIsNotSentAgain) {
  absl::Notification started, release;
  g_hold_runs = 0;
  g_hold_started = &started;
  g_hold_release = &release;
  {
    Job j(/*shm=*/false, /*restart_wait=*/absl::Seconds(30));
    ASSERT_NE(j.job, nullptr);
    absl::StatusOr<int64_t> held = absl::UnknownError("not run");
    std::thread caller(
        [&] { held = j.agent(0).rpc_async(CallOptions{absl::Seconds(30)}, 2, hold_fn).result(); });
    ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
    const absl::Time killed = absl::Now();
    ASSERT_TRUE(j.job->Kill(2).ok());
    caller.join();
    EXPECT_LT(absl::Now() - killed, absl::Seconds(5));
    ASSERT_FALSE(held.ok());
    EXPECT_EQ(held.status().code(), absl::StatusCode::kUnavailable) << held.status();
    release.Notify();
    ASSERT_TRUE(j.job->Restart(2).ok());
    EXPECT_EQ(j.agent(0).rpc_sync(2, whoami_fn), 2);
    EXPECT_EQ(g_hold_runs.load(), 1);
    EXPECT_TRUE(j.job->ShutdownAll(/*graceful=*/false).ok());
  }
  g_hold_started = nullptr;
  g_hold_release = nullptr;
}

// P5: a worker that dies at any step of the job's start-up (before it
// reached the store, after it took its init round, after it registered,
// before and after the init barrier) is started again with rejoin, as
// baton-run's per-role restart does; it joins, the job starts, and every
// worker calls every other. Before P5, a worker that died before taking its
// round failed every restart with FAILED_PRECONDITION "never joined".
class StartupKill : public ::testing::TestWithParam<rpc::RendezvousStep> {};

TEST_P(StartupKill, P5_AWorkerKilledDuringStartUpJoinsOnRestart) {
  const rpc::RendezvousStep die_at = GetParam();
  std::atomic<int> died{0};
  LoopbackJobOptions o;
  o.world_size = 3;
  o.rpc_timeout = absl::Seconds(10);
  o.init_timeout = absl::Seconds(20);
  o.install = [](int, FunctionRegistry& r) {
    (void)r.Register(whoami_fn, [](const CallContext& ctx) { return ctx.runtime->incarnation(); });
  };
  o.max_restarts = 1;
  o.rendezvous_observer = [&](int rank, int start, rpc::RendezvousStep step) {
    if (rank != 2 || start != 0 || step != die_at) return absl::OkStatus();
    died.fetch_add(1);
    return absl::UnavailableError("killed at this step");
  };
  auto job = LoopbackJob::Start(o);
  ASSERT_TRUE(job.ok()) << rpc::RendezvousStepName(die_at) << ": " << job.status();
  EXPECT_EQ(died.load(), 1);
  // Its successor took the predecessor's round (incarnation 2), or, if the
  // predecessor never took one, started as a first start (incarnation 1).
  const int64_t expected = die_at == rpc::RendezvousStep::kConnectingStore ? 1 : 2;
  EXPECT_EQ((*job)->agent(2).runtime().incarnation(), expected);
  // The restarted worker calls everyone first: they learn of it (P1).
  for (int to = 0; to < 3; ++to) {
    auto r = (*job)->agent(2).rpc_async(to, whoami_fn).result();
    ASSERT_TRUE(r.ok()) << "w2 -> w" << to << ": " << r.status();
  }
  for (int from = 0; from < 3; ++from) {
    for (int to = 0; to < 3; ++to) {
      auto r = (*job)->agent(from).rpc_async(to, whoami_fn).result();
      ASSERT_TRUE(r.ok()) << "w" << from << " -> w" << to << ": " << r.status();
      EXPECT_EQ(*r, to == 2 ? expected : 1);
    }
  }
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

INSTANTIATE_TEST_SUITE_P(EveryStep, StartupKill,
                         ::testing::Values(rpc::RendezvousStep::kConnectingStore,
                                           rpc::RendezvousStep::kRoundTaken,
                                           rpc::RendezvousStep::kRegistered,
                                           rpc::RendezvousStep::kBeforeInitBarrier,
                                           rpc::RendezvousStep::kAfterInitBarrier),
                         [](const ::testing::TestParamInfo<rpc::RendezvousStep>& info) {
                           switch (info.param) {
                             case rpc::RendezvousStep::kConnectingStore:
                               return std::string("BeforeTheStore");
                             case rpc::RendezvousStep::kRoundTaken:
                               return std::string("AfterTakingItsRound");
                             case rpc::RendezvousStep::kRegistered:
                               return std::string("AfterRegistering");
                             case rpc::RendezvousStep::kBeforeInitBarrier:
                               return std::string("BeforeTheInitBarrier");
                             case rpc::RendezvousStep::kAfterInitBarrier:
                               return std::string("AfterTheInitBarrier");
                           }
                           return std::string("Unknown");
                         });

}  // namespace
}  // namespace baton
