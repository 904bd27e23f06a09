// Several RpcAgents in one process over the loopback network transport
// (testing/rpc/loopback_transport.h), with faults injected at the transport:
// delayed, dropped and reordered frames, and a killed worker. These run the
// agent's call protocol (deadlines, error codes, pending-call bookkeeping,
// shutdown) without processes or sockets.
#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "rpc/agent.h"
#include "testing/eventually.h"
#include "testing/fake_clock.h"
#include "testing/rpc/loopback_job.h"

namespace baton::rpc {
namespace {

using testing::Fate;
using testing::FrameInfo;
using testing::LoopbackJob;
using testing::LoopbackJobOptions;

const Function<int64_t(int64_t)> echo_fn("echo");
const Function<void(int64_t)> sleep_ms_fn("sleep_ms");
const Function<int64_t(int64_t, int64_t)> relay_fn("relay");

LoopbackJobOptions Options(int world) {
  LoopbackJobOptions o;
  o.world_size = world;
  o.install = [](int, FunctionRegistry& r) {
    ASSERT_TRUE(r.Register(echo_fn, [](int64_t v) { return v; }).ok());
    // Slow work for the callee to run; not synchronization.
    ASSERT_TRUE(
        r.Register(sleep_ms_fn, [](int64_t ms) { absl::SleepFor(absl::Milliseconds(ms)); }).ok());
    // Calls `target` from inside a remote function.
    ASSERT_TRUE(r.Register(relay_fn, [](const CallContext& ctx, int64_t target, int64_t v) {
                   return ctx.agent->rpc_sync(static_cast<int>(target), echo_fn, v + 1);
                 }).ok());
  };
  return o;
}

TEST(LoopbackAgents, EveryWorkerCallsEveryWorkerInOneProcess) {
  auto job = LoopbackJob::Start(Options(3));
  ASSERT_TRUE(job.ok()) << job.status();
  for (int from = 0; from < 3; ++from) {
    EXPECT_TRUE(absl::StartsWith((*job)->agent(from).self().address, "loopback:"));
    for (int to = 0; to < 3; ++to) {
      EXPECT_EQ((*job)->agent(from).rpc_sync(to, echo_fn, from * 10 + to), from * 10 + to);
      EXPECT_FALSE((*job)->agent(from).runtime().uses_shm_transport(to));
    }
  }
  // Nested: w0 -> w1 -> w2 and back.
  EXPECT_EQ((*job)->agent(0).rpc_sync(1, relay_fn, 2, 41), 42);
  EXPECT_GE((*job)->network().stats().delivered, 9 * 2 + 4);
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

// A call's timeout is a time of the agent's timer's clock
// (AgentCollaborators::timer): on a fake clock, a ten-minute timeout passes when
// the clock does, and not before, with no real wait.
TEST(LoopbackAgents, CallTimeoutRunsOnTheTimersClock) {
  baton::testing::FakeClock clock;  // outlives the job
  LoopbackJobOptions o = Options(2);
  o.clock = &clock;
  auto job = LoopbackJob::Start(o);
  ASSERT_TRUE(job.ok()) << job.status();
  (*job)->network().SetRule([](const FrameInfo& f) {
    return !f.request && f.function == "echo" ? Fate::Drop() : Fate::Deliver();
  });
  CallOptions opts;
  opts.timeout = absl::Minutes(10);
  auto call = (*job)->agent(0).rpc_async(opts, 1, echo_fn, 7);
  // The callee answered and the network lost the reply: only the timeout
  // can end the call now.
  ASSERT_TRUE(baton::testing::Eventually([&] { return (*job)->network().stats().dropped == 1; }));
  clock.Advance(absl::Minutes(10) - absl::Seconds(1));
  EXPECT_EQ((*job)->agent(0).stats().pending_outgoing, 1);
  EXPECT_FALSE(call.ready());
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(call.WaitFor(absl::Seconds(10)));
  EXPECT_EQ(call.status().code(), absl::StatusCode::kDeadlineExceeded) << call.status();
  EXPECT_TRUE(absl::StrContains(call.status().message(), "RPC ran for more than its timeout"))
      << call.status();
  (*job)->network().SetRule(nullptr);
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

TEST(LoopbackAgents, ReplyDelayedPastTheDeadlineIsDeadlineExceededAndIgnoredLater) {
  auto job = LoopbackJob::Start(Options(2));
  ASSERT_TRUE(job.ok()) << job.status();
  (*job)->network().SetRule([](const FrameInfo& f) {
    return !f.request && f.from == 1 && f.function == "echo" ? Fate::Delay(absl::Milliseconds(400))
                                                             : Fate::Deliver();
  });
  CallOptions opts;
  opts.timeout = absl::Milliseconds(100);
  auto r = (*job)->agent(0).rpc_async(opts, 1, echo_fn, 7).result();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "worker 'w1' (id 1), function 'echo'"))
      << r.status();
  // The late reply arrives and finds no call: nothing pends, nothing breaks.
  // (WaitIdle returns once the delayed reply, queued until its due time,
  // was delivered.)
  ASSERT_TRUE((*job)->network().WaitIdle(absl::Seconds(5)));
  EXPECT_EQ((*job)->agent(0).stats().pending_outgoing, 0);
  EXPECT_EQ((*job)->network().stats().delayed, 1);
  (*job)->network().SetRule(nullptr);
  EXPECT_EQ((*job)->agent(0).rpc_sync(1, echo_fn, 8), 8);
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

TEST(LoopbackAgents, DroppedRequestEndsAtItsDeadline) {
  auto job = LoopbackJob::Start(Options(2));
  ASSERT_TRUE(job.ok()) << job.status();
  (*job)->network().SetRule([](const FrameInfo& f) {
    return f.request && f.to == 1 && f.function == "echo" ? Fate::Drop() : Fate::Deliver();
  });
  CallOptions opts;
  opts.timeout = absl::Milliseconds(150);
  const absl::Time start = absl::Now();
  auto r = (*job)->agent(0).rpc_async(opts, 1, echo_fn, 1).result();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ((*job)->network().stats().dropped, 1);
  EXPECT_EQ((*job)->agent(1).stats().running_incoming, 0);
  (*job)->network().SetRule(nullptr);
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

TEST(LoopbackAgents, RepliesDeliveredInReverseOrderReachTheirOwnCalls) {
  auto job = LoopbackJob::Start(Options(2));
  ASSERT_TRUE(job.ok()) << job.status();
  (*job)->network().SetRule([](const FrameInfo& f) {
    return !f.request && f.function == "echo" ? Fate::Hold() : Fate::Deliver();
  });
  std::vector<Future<int64_t>> calls;
  for (int64_t v = 0; v < 8; ++v) calls.push_back((*job)->agent(0).rpc_async(1, echo_fn, v * v));
  ASSERT_TRUE(baton::testing::Eventually([&] { return (*job)->network().stats().held == 8; }))
      << (*job)->network().stats().held;
  EXPECT_EQ((*job)->agent(0).stats().pending_outgoing, 8);
  EXPECT_EQ((*job)->network().ReleaseHeld(/*reverse=*/true), 8u);
  for (int64_t v = 0; v < 8; ++v) {
    auto r = calls[v].result();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, v * v);
  }
  (*job)->network().SetRule(nullptr);
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

// Each peer's calls are its own (rpc/internal/peer.h): a reply is looked up
// only among the calls made to the peer whose stream brought it, so a
// peer that answers with another call's id completes nothing.
TEST(LoopbackAgents, AReplyCompletesOnlyACallMadeToItsSender) {
  auto job = LoopbackJob::Start(Options(3));
  ASSERT_TRUE(job.ok()) << job.status();
  std::atomic<uint64_t> to_w1{0};
  (*job)->network().SetRule([&to_w1](const FrameInfo& f) {
    if (f.function != "echo") return Fate::Deliver();
    if (f.request && f.to == 1) to_w1 = f.call_id;
    if (!f.request && f.from == 1) return Fate::Hold();
    // w2 answers with the id of w0's call to w1.
    if (!f.request && f.from == 2) return Fate::Readdress(to_w1.load());
    return Fate::Deliver();
  });
  Future<int64_t> one = (*job)->agent(0).rpc_async(1, echo_fn, 1);
  ASSERT_TRUE(baton::testing::Eventually([&] { return (*job)->network().stats().held == 1; }));
  CallOptions opts;
  opts.timeout = absl::Milliseconds(300);
  Future<int64_t> two = (*job)->agent(0).rpc_async(opts, 2, echo_fn, 2);
  // The misaddressed reply was delivered, and the call to w1 is untouched.
  auto r2 = two.result();
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kDeadlineExceeded) << r2.status();
  ASSERT_TRUE((*job)->network().WaitIdle(absl::Seconds(5)));
  EXPECT_FALSE(one.ready());
  EXPECT_EQ((*job)->agent(0).stats().pending_outgoing, 1);
  // Its own reply completes it, with its own value.
  EXPECT_EQ((*job)->network().ReleaseHeld(/*reverse=*/false), 1u);
  auto r1 = one.result();
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(*r1, 1);
  (*job)->network().SetRule(nullptr);
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

TEST(LoopbackAgents, KilledWorkerFailsPendingCallsWithUnavailableNamingIt) {
  auto job = LoopbackJob::Start(Options(3));
  ASSERT_TRUE(job.ok()) << job.status();
  CallOptions opts;
  opts.timeout = absl::Seconds(30);
  Future<void> pending = (*job)->agent(0).rpc_async(opts, 2, sleep_ms_fn, 1500);
  // The request is running on w2.
  ASSERT_TRUE(
      baton::testing::Eventually([&] { return (*job)->agent(2).stats().running_incoming == 1; }));
  const absl::Time kill = absl::Now();
  ASSERT_TRUE((*job)->Kill(2).ok());
  auto r = pending.result();
  EXPECT_LT(absl::Now() - kill, absl::Seconds(2));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "worker 'w2' (id 2)")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "was killed")) << r.status();
  // New calls fail at once; the survivors still talk.
  auto again = (*job)->agent(1).rpc_async(2, echo_fn, 1).result();
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable) << again.status();
  EXPECT_EQ((*job)->agent(0).rpc_sync(1, echo_fn, 5), 5);
  EXPECT_EQ((*job)->agent(0).stats().pending_outgoing, 0);
  EXPECT_TRUE((*job)->network().killed(2));
  EXPECT_TRUE((*job)->ShutdownAll(/*graceful=*/false).ok());
}

TEST(LoopbackAgents, GracefulShutdownDrainsDelayedCalls) {
  auto job = LoopbackJob::Start(Options(2));
  ASSERT_TRUE(job.ok()) << job.status();
  (*job)->network().SetRule([](const FrameInfo& f) {
    return f.function == "echo" ? Fate::Delay(absl::Milliseconds(50)) : Fate::Deliver();
  });
  std::vector<Future<int64_t>> calls;
  for (int64_t v = 0; v < 20; ++v)
    calls.push_back((*job)->agent(v % 2).rpc_async(1 - v % 2, echo_fn, v));
  EXPECT_TRUE((*job)->ShutdownAll().ok());
  for (int64_t v = 0; v < 20; ++v) {
    auto r = calls[v].result();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, v);
  }
}

TEST(LoopbackAgents, ConcurrentCallsWithRandomDelaysAllComplete) {
  auto job = LoopbackJob::Start(Options(3));
  ASSERT_TRUE(job.ok()) << job.status();
  std::atomic<uint64_t> seed{12345};
  (*job)->network().SetRule([&seed](const FrameInfo&) {
    uint64_t x = seed.fetch_add(0x9E3779B97F4A7C15ull);
    x ^= x >> 31;
    return Fate::Delay(absl::Microseconds(static_cast<int64_t>(x % 3000)));
  });
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int from = 0; from < 3; ++from) {
    threads.emplace_back([&, from] {
      for (int64_t i = 0; i < 100; ++i) {
        auto call = (*job)->agent(from).rpc_async(static_cast<int>(i % 3), echo_fn, i);
        const absl::StatusOr<int64_t>& r = call.result();
        if (!r.ok() || *r != i) failures.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT((*job)->network().stats().delayed, 500);
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

// AgentOptions::timeouts.shutdown_wait_for_peers: a worker done early waits at its
// Shutdown() for the others past shutdown_timeout, as torch's shutdown()
// does; a missing worker found dead ends that wait.
TEST(LoopbackAgents, ShutdownWaitsForABusyPeerPastShutdownTimeout) {
  LoopbackJobOptions o = Options(2);
  // Long enough for worker 0's own shutdown steps on a loaded machine (at
  // 300 ms one failed in a parallel run); the wait below outlasts it.
  o.shutdown_timeout = absl::Seconds(1);
  o.configure = [](int, AgentOptions& a) {
    a.timeouts.shutdown_wait_for_peers = absl::InfiniteDuration();
  };
  auto job = LoopbackJob::Start(o);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::Status early;
  absl::Notification early_done;
  ASSERT_EQ((*job)->store().waiting(), 0);
  std::thread idle([&] {
    early = (*job)->agent(1).Shutdown();
    early_done.Notify();
  });
  // Worker 0 still works for longer than shutdown_timeout (a call to the
  // worker waiting at its shutdown included), then stops too.
  EXPECT_EQ((*job)->agent(0).rpc_sync(1, echo_fn, 7), 7);
  // Worker 1 is in its shutdown's first step (it waits in the store for
  // worker 0), and stays there past shutdown_timeout.
  ASSERT_TRUE(baton::testing::Eventually([&] { return (*job)->store().waiting() == 1; }));
  EXPECT_FALSE(early_done.WaitForNotificationWithTimeout(absl::Milliseconds(1500)));
  const absl::Status late = (*job)->agent(0).Shutdown();
  EXPECT_TRUE(late.ok()) << late;
  idle.join();
  EXPECT_TRUE(early.ok()) << early;
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

TEST(LoopbackAgents, ShutdownWaitingForAPeerThatDiedEndsWithUnavailableNamingIt) {
  LoopbackJobOptions o = Options(3);
  o.configure = [](int, AgentOptions& a) {
    a.timeouts.shutdown_wait_for_peers = absl::InfiniteDuration();
  };
  auto job = LoopbackJob::Start(o);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::Status waiting[2];
  std::thread t1([&] { waiting[1] = (*job)->agent(1).Shutdown(); });
  ASSERT_TRUE((*job)->Kill(2).ok());
  // Worker 0 learns of the death by calling it, as a worker would.
  EXPECT_EQ((*job)->agent(0).rpc_async(2, echo_fn, 1).result().status().code(),
            absl::StatusCode::kUnavailable);
  const absl::Time start = absl::Now();
  waiting[0] = (*job)->agent(0).Shutdown();
  t1.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (const absl::Status& s : waiting) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "worker 2 (w2) died before it reached shutdown"))
        << s;
  }
  EXPECT_TRUE((*job)->ShutdownAll(/*graceful=*/false).ok());
}

// EnterShutdown(): the agreement on its own. Every worker returns once all
// entered; calls between it and Shutdown() still work (a front end's own
// steps run there), and Shutdown() does not wait again.
TEST(LoopbackAgents, EnterShutdownAgreesAndCallsStillWorkUntilShutdown) {
  auto job = LoopbackJob::Start(Options(2));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::Status entered1;
  absl::Notification one_entered;
  ASSERT_EQ((*job)->store().waiting(), 0);
  std::thread t1([&] {
    entered1 = (*job)->agent(1).runtime().EnterShutdown();
    one_entered.Notify();
  });
  // Worker 1 waits there (in the store) for worker 0, which is still at
  // work.
  ASSERT_TRUE(baton::testing::Eventually([&] { return (*job)->store().waiting() == 1; }));
  EXPECT_FALSE(one_entered.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  EXPECT_TRUE((*job)->agent(0).runtime().EnterShutdown().ok());
  t1.join();
  EXPECT_TRUE(entered1.ok()) << entered1;
  EXPECT_EQ((*job)->agent(0).rpc_sync(1, echo_fn, 11), 11);
  EXPECT_EQ((*job)->agent(1).rpc_sync(0, echo_fn, 12), 12);
  EXPECT_TRUE((*job)->agent(0).runtime().EnterShutdown().ok());  // the first outcome again
  absl::Status shut1;
  std::thread s1([&] { shut1 = (*job)->agent(1).Shutdown(); });
  EXPECT_TRUE((*job)->agent(0).Shutdown().ok());
  s1.join();
  EXPECT_TRUE(shut1.ok()) << shut1;
}

}  // namespace
}  // namespace baton::rpc
