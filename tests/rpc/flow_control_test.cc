// Flow control (rpc/internal/flow_control.h): the caller's window and the
// callee's gate, alone and inside agents over the loopback transport. Tests
// are named after the guarantees F1-F4.
#include "rpc/internal/flow_control.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "rpc/agent.h"
#include "testing/eventually.h"
#include "testing/rpc/loopback_job.h"

namespace baton::rpc {
namespace {

using ::baton::testing::Eventually;
using internal::CallWindow;
using internal::FlowLimits;
using internal::RequestGate;

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// ---- CallWindow ----

TEST(CallWindow, F1_CallsBeyondTheWindowWaitForRoom) {
  CallWindow window({FlowLimits{2, 1 << 20}, FlowLimits{2, 1 << 20}});
  ASSERT_TRUE(window.Acquire(0, 10, In(absl::Seconds(1)), true).ok());
  ASSERT_TRUE(window.Acquire(0, 10, In(absl::Seconds(1)), true).ok());
  // The other peer has its own window.
  ASSERT_TRUE(window.Acquire(1, 10, In(absl::Seconds(1)), true).ok());
  // The reply comes once the third call waits (it counts itself as waiting
  // under the window's lock, which it gives up only inside its wait).
  std::atomic<bool> released{false};
  std::thread replier([&] {
    if (Eventually([&] { return window.stats().calls_waited == 1; })) {
      released = true;
      window.Release(0, 10);
    }
  });
  EXPECT_TRUE(window.Acquire(0, 10, In(absl::Seconds(20)), true).ok());
  replier.join();
  EXPECT_TRUE(released.load()) << "the third call never waited";
  const CallWindow::Stats s = window.stats();
  EXPECT_EQ(s.calls_in_flight, 3);
  EXPECT_EQ(s.bytes_in_flight, 30);
  EXPECT_EQ(s.calls_waited, 1);
  EXPECT_EQ(s.calls_refused, 0);
}

TEST(CallWindow, F1_NoRoomByTheDeadlineIsResourceExhaustedNamingTheLimits) {
  CallWindow window({FlowLimits{1, 1 << 20}});
  ASSERT_TRUE(window.Acquire(0, 10, In(absl::Seconds(1)), true).ok());
  const absl::Time start = absl::Now();
  absl::Status s = window.Acquire(0, 10, In(absl::Milliseconds(150)), true);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(140));
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "1 calls (10 request bytes) already in flight")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "max_calls_in_flight=1")) << s;
  EXPECT_EQ(window.stats().calls_refused, 1);
  EXPECT_EQ(window.stats().calls_in_flight, 1);  // the refused call took nothing
}

TEST(CallWindow, F1_BytesAreBoundedAndAnOversizedCallGoesAlone) {
  CallWindow window({FlowLimits{100, 1000}});
  ASSERT_TRUE(window.Acquire(0, 600, In(absl::Seconds(1)), true).ok());
  EXPECT_EQ(window.Acquire(0, 500, In(absl::Milliseconds(20)), true).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(window.Acquire(0, 400, In(absl::Seconds(1)), true).ok());
  window.Release(0, 600);
  window.Release(0, 400);
  // Larger than the whole byte window: it goes when nothing else is in flight,
  ASSERT_TRUE(window.Acquire(0, 5000, In(absl::Seconds(1)), true).ok());
  // and nothing goes beside it.
  EXPECT_EQ(window.Acquire(0, 1, In(absl::Milliseconds(20)), true).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(CallWindow, F4_AThreadThatMayNotWaitFailsAtOnceAndCloseWakesWaiters) {
  CallWindow window({FlowLimits{1, 1 << 20}});
  ASSERT_TRUE(window.Acquire(0, 1, In(absl::Seconds(1)), true).ok());
  const absl::Time start = absl::Now();
  absl::Status s = window.Acquire(0, 1, In(absl::Seconds(30)), /*may_wait=*/false);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "may not wait")) << s;

  absl::Status waited;
  absl::Notification returned;
  std::thread waiter([&] {
    waited = window.Acquire(0, 1, In(absl::Seconds(30)), true);
    returned.Notify();
  });
  // The waiter counts itself under the window's lock, which it gives up
  // only inside its wait: once counted, it waits (or is about to).
  EXPECT_TRUE(Eventually([&] { return window.stats().calls_waited >= 2; }));
  EXPECT_EQ(window.stats().calls_waited, 2);
  window.Close();
  // Close wakes it: it returns long before its own 30 s deadline.
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(5)));
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled) << waited;
  EXPECT_EQ(window.Acquire(1, 1, In(absl::Seconds(1)), true).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- RequestGate ----

// Blocks every task until Open().
class Latch {
 public:
  void Wait() { opened_.WaitForNotificationWithTimeout(absl::Seconds(30)); }
  void Open() { opened_.Notify(); }

 private:
  absl::Notification opened_;
};

TEST(RequestGate, F2_ACallerOverItsLimitIsRefusedAndNothingIsQueued) {
  Executor executor(Executor::Options{2, 8});
  RequestGate gate(2, FlowLimits{3, 1 << 20}, &executor);
  Latch latch;
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(gate.Submit(0, 100,
                            [&] {
                              latch.Wait();
                              ++ran;
                            })
                    .ok());
  }
  bool refused_task_ran = false;
  absl::Status s = gate.Submit(0, 100, [&] { refused_task_ran = true; });
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "already has 3 requests (300 bytes)")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "max_calls_in_flight=3")) << s;
  // Another caller is not affected.
  ASSERT_TRUE(gate.Submit(1, 100, [&] { ++ran; }).ok());
  EXPECT_EQ(gate.stats().refused, 1);
  EXPECT_EQ(gate.stats().held, 4);
  // Replies free the caller's room.
  latch.Open();
  for (int i = 0; i < 3; ++i) gate.Finish(0, 100);
  gate.Finish(1, 100);
  ASSERT_TRUE(gate.Submit(0, 100, [&] { ++ran; }).ok());
  gate.Finish(0, 100);
  executor.Close();
  ASSERT_TRUE(executor.Join(absl::Seconds(10)).ok());
  EXPECT_EQ(ran.load(), 5);
  EXPECT_FALSE(refused_task_ran);
  EXPECT_EQ(gate.stats().held, 0);
}

TEST(RequestGate, F2_BytesAreBoundedAndAnOversizedRequestIsHeldAlone) {
  Executor executor(Executor::Options{2, 8});
  RequestGate gate(1, FlowLimits{100, 1000}, &executor);
  Latch latch;
  ASSERT_TRUE(gate.Submit(0, 5000, [&] { latch.Wait(); }).ok());
  EXPECT_EQ(gate.Submit(0, 1, [] {}).code(), absl::StatusCode::kResourceExhausted);
  latch.Open();
  gate.Finish(0, 5000);
  ASSERT_TRUE(gate.Submit(0, 600, [] {}).ok());
  EXPECT_EQ(gate.Submit(0, 500, [] {}).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(gate.Submit(0, 400, [] {}).ok());
  executor.Close();
  ASSERT_TRUE(executor.Join(absl::Seconds(10)).ok());
}

TEST(RequestGate, F3_AFloodingPeerDelaysAnotherPeerByAtMostItsFanout) {
  // One thread: a flood of 400 requests from peer 0 queues up, and starts
  // are strictly sequential, so their order is observable.
  Executor executor(Executor::Options{1, 1});
  const int fanout = 4;
  RequestGate gate(2, FlowLimits{1000, 1 << 20}, &executor, fanout);
  absl::Mutex mu;
  std::vector<int> order;  // peer 0: 0..399 in order; peer 1: -1
  for (int i = 0; i < 400; ++i) {
    ASSERT_TRUE(gate.Submit(0, 1,
                            [&, i] {
                              // The request's work (it takes a while, so the
                              // flood stays queued); not synchronization.
                              absl::SleepFor(absl::Microseconds(500));
                              absl::MutexLock lock(&mu);
                              order.push_back(i);
                            })
                    .ok());
  }
  // Some of peer 0's requests have started.
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return !order.empty();
  }));
  // Counted and submitted under `mu`, which every request takes to record
  // itself: none of peer 0's can finish between the count and the
  // submission, however long this thread is descheduled there (on a loaded
  // machine it was, and the requests that finished meanwhile were counted
  // as delaying peer 1's).
  size_t started_before;
  absl::Notification done;
  {
    absl::MutexLock lock(&mu);
    started_before = order.size();
    ASSERT_TRUE(gate.Submit(1, 1,
                            [&] {
                              absl::MutexLock lock(&mu);
                              order.push_back(-1);
                              done.Notify();
                            })
                    .ok());
  }
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // Where peer 1's request recorded itself (peer 0's go on meanwhile: the
  // size of `order` now says nothing).
  size_t position;
  {
    absl::MutexLock lock(&mu);
    position = static_cast<size_t>(std::find(order.begin(), order.end(), -1) - order.begin());
  }
  // Behind peer 0's runners already in the executor's queue (<= fanout) and
  // the one running (waiting for `mu` to record itself), with one to spare.
  EXPECT_LE(position - started_before, static_cast<size_t>(fanout + 2))
      << "peer 1's request waited behind " << position - started_before << " of peer 0's";
  EXPECT_LT(position, 100u);
  executor.Close();
  ASSERT_TRUE(executor.Join(absl::Seconds(30)).ok());
  // Peer 0's requests started in arrival order.
  std::vector<int> peer0;
  for (int v : order) {
    if (v >= 0) peer0.push_back(v);
  }
  ASSERT_EQ(peer0.size(), 400u);
  for (size_t i = 0; i < peer0.size(); ++i) ASSERT_EQ(peer0[i], static_cast<int>(i));
}

TEST(RequestGate, F4_AfterCloseSubmitIsUnavailableAndQueuedRequestsStillRun) {
  Executor executor(Executor::Options{1, 1});
  RequestGate gate(1, FlowLimits{100, 1 << 20}, &executor, /*fanout=*/1);
  Latch latch;
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(gate.Submit(0, 1,
                            [&] {
                              latch.Wait();
                              ++ran;
                            })
                    .ok());
  }
  gate.Close();
  EXPECT_EQ(gate.Submit(0, 1, [] {}).code(), absl::StatusCode::kUnavailable);
  executor.Close();
  latch.Open();
  ASSERT_TRUE(executor.Join(absl::Seconds(10)).ok());
  EXPECT_EQ(ran.load(), 10);  // admitted requests are never dropped
  EXPECT_EQ(gate.stats().queued, 0);
}

// ---- Inside agents (loopback transport) ----

const Function<void(int64_t)> sleep_ms_fn("sleep_ms");
const Function<int64_t(int64_t)> echo_fn("echo");
// Runs until the test opens the job's latch (at most 30 s).
const Function<void()> held_fn("held");

testing::LoopbackJobOptions Job(int64_t calls_w0, int64_t calls_w1,
                                std::shared_ptr<Latch> latch = std::make_shared<Latch>()) {
  testing::LoopbackJobOptions o;
  o.world_size = 2;
  o.configure = [calls_w0, calls_w1](int rank, AgentOptions& a) {
    a.transport.max_calls_in_flight = rank == 0 ? calls_w0 : calls_w1;
  };
  o.install = [latch](int, FunctionRegistry& r) {
    // Slow work for the callee to run; not synchronization.
    ASSERT_TRUE(
        r.Register(sleep_ms_fn, [](int64_t ms) { absl::SleepFor(absl::Milliseconds(ms)); }).ok());
    ASSERT_TRUE(r.Register(held_fn, [latch] { latch->Wait(); }).ok());
    ASSERT_TRUE(r.Register(echo_fn, [](int64_t v) { return v; }).ok());
  };
  return o;
}

TEST(FlowControlAgents, F1_ACallerFiringWithoutWaitingIsHeldToTheCalleesLimit) {
  // w0 would allow 64 calls in flight, w1 holds 4 per caller: the window is 4.
  auto job = testing::LoopbackJob::Start(Job(64, 4));
  ASSERT_TRUE(job.ok()) << job.status();
  RpcAgent& w0 = (*job)->agent(0);
  std::vector<Future<void>> calls;
  int64_t most_held = 0;
  for (int i = 0; i < 40; ++i) {
    calls.push_back(w0.rpc_async(1, sleep_ms_fn, 5));
    most_held = std::max(most_held, w0.stats().pending_outgoing);
  }
  for (auto& c : calls) EXPECT_TRUE(c.result().ok()) << c.result().status();
  EXPECT_LE(most_held, 4);
  EXPECT_GT(w0.stats().calls_waited_for_window, 0);
  EXPECT_EQ(w0.stats().calls_refused_by_window, 0);
  EXPECT_EQ((*job)->agent(1).stats().requests_refused, 0);
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

TEST(FlowControlAgents, F1_AFullWindowFailsTheCallAtItsDeadlineWithResourceExhausted) {
  auto job = testing::LoopbackJob::Start(Job(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  RpcAgent& w0 = (*job)->agent(0);
  auto a = w0.rpc_async(1, sleep_ms_fn, 600);
  auto b = w0.rpc_async(1, sleep_ms_fn, 600);
  CallOptions quick;
  quick.timeout = absl::Milliseconds(100);
  auto c = w0.rpc_async(quick, 1, echo_fn, 1).result();
  ASSERT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "worker 'w1' (id 1), function 'echo'"))
      << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "max_calls_in_flight=2")) << c.status();
  EXPECT_TRUE(a.result().ok());
  EXPECT_TRUE(b.result().ok());
  EXPECT_EQ(w0.rpc_sync(1, echo_fn, 7), 7);  // room again
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

TEST(FlowControlAgents, F2_CallsThatTimedOutStillCountAtTheCalleeWhichRefusesTheExcess) {
  auto latch = std::make_shared<Latch>();
  auto job = testing::LoopbackJob::Start(Job(3, 3, latch));
  ASSERT_TRUE(job.ok()) << job.status();
  RpcAgent& w0 = (*job)->agent(0);
  CallOptions quick;
  quick.timeout = absl::Milliseconds(50);
  // Three calls time out at the caller (freeing its window) but keep
  // running at the callee until the latch opens.
  std::vector<Future<void>> slow;
  for (int i = 0; i < 3; ++i) slow.push_back(w0.rpc_async(quick, 1, held_fn));
  for (auto& f : slow) {
    EXPECT_EQ(f.result().status().code(), absl::StatusCode::kDeadlineExceeded);
  }
  auto r = w0.rpc_async(1, echo_fn, 5).result();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "worker 'w1'")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "already has 3 requests")) << r.status();
  EXPECT_EQ((*job)->agent(1).stats().requests_refused, 1);
  EXPECT_EQ((*job)->agent(1).stats().running_incoming, 3);
  // Once the callee finished them, calls go through again.
  latch->Open();
  ASSERT_TRUE(Eventually([&] { return (*job)->agent(1).stats().running_incoming == 0; }));
  EXPECT_EQ(w0.rpc_sync(1, echo_fn, 6), 6);
  EXPECT_TRUE((*job)->ShutdownAll().ok());
}

TEST(FlowControlAgents, F4_ShutdownWakesACallerWaitingForRoom) {
  auto latch = std::make_shared<Latch>();
  auto job = testing::LoopbackJob::Start(Job(1, 1, latch));
  ASSERT_TRUE(job.ok()) << job.status();
  RpcAgent& w0 = (*job)->agent(0);
  auto busy = w0.rpc_async(1, held_fn);  // takes the window of 1
  absl::StatusOr<int64_t> waited;
  std::thread caller([&] { waited = w0.rpc_async(0 + 1, echo_fn, 3).result(); });
  ASSERT_TRUE(Eventually([&] { return w0.stats().calls_waited_for_window == 1; }));
  // w0's own shutdown (w1 still holds the call) wakes its waiting caller.
  const absl::Time start = absl::Now();
  EXPECT_TRUE(w0.Shutdown(/*graceful=*/false).ok());
  caller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The window never opened: the shutdown released the caller.
  ASSERT_FALSE(waited.ok());
  EXPECT_TRUE(waited.status().code() == absl::StatusCode::kFailedPrecondition ||
              waited.status().code() == absl::StatusCode::kCancelled ||
              waited.status().code() == absl::StatusCode::kUnavailable)
      << waited.status();
  latch->Open();
  (void)busy.result();
  (void)(*job)->ShutdownAll(/*graceful=*/false);
}

TEST(FlowControlAgents, LimitsBelowOneAreRejectedAtCreate) {
  AgentOptions o;
  o.name = "w0";
  o.rank = 0;
  o.world_size = 1;
  o.transport.max_calls_in_flight = 0;
  auto agent = RpcAgent::Create(o, nullptr);
  ASSERT_EQ(agent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(agent.status().message(), "max_calls_in_flight (0)"))
      << agent.status();
}

}  // namespace
}  // namespace baton::rpc
