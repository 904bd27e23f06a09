// Futures, the executor and the deadline timer.
#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "rpc/executor.h"
#include "rpc/future.h"
#include "rpc/timer.h"
#include "testing/eventually.h"
#include "testing/fake_clock.h"

namespace baton::rpc {
namespace {

TEST(Future, ValueAndError) {
  Promise<int> p;
  Future<int> f = p.future();
  EXPECT_FALSE(f.ready());
  EXPECT_TRUE(p.SetValue(5));
  EXPECT_FALSE(p.SetValue(6));  // completes once
  EXPECT_EQ(f.value(), 5);
  Promise<int> e;
  e.SetError(absl::NotFoundError("gone"));
  EXPECT_EQ(e.future().status().code(), absl::StatusCode::kNotFound);
  EXPECT_THROW(e.future().value(), Error);
  try {
    e.future().value();
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), absl::StatusCode::kNotFound);
  }
}

TEST(Future, WaitTimesOut) {
  Promise<void> p;
  const absl::Time t0 = absl::Now();
  absl::Status s = p.future().Wait(absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(45));
  // A wait that is under way when the value arrives returns with it. The
  // wait runs on a pool thread, where it enters a BlockingScope (E2) after
  // finding the future not ready: once the pool counts the thread as
  // blocked, the wait is past its check and the value comes after it.
  absl::Status waited = absl::UnknownError("never waited");
  absl::Notification returned;
  Executor ex({1, 2});  // joined before the two above go
  ASSERT_TRUE(ex.Submit([&] {
    waited = p.future().Wait(absl::Seconds(5));
    returned.Notify();
  }));
  ASSERT_TRUE(baton::testing::Eventually([&] { return ex.blocked_threads() == 1; }));
  EXPECT_TRUE(p.SetValue());
  ASSERT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST(Future, ThenRunsOnExecutorAndChains) {
  Executor ex({2, 4});
  Promise<int> p(&ex);
  std::atomic<bool> on_pool{false};
  Future<std::string> f =
      p.future()
          .Then([&](const Future<int>& in) {
            on_pool = ex.InPool();
            return in.value() * 2;
          })
          .Then([](const Future<int>& in) { return std::to_string(in.value()); });
  p.SetValue(21);
  EXPECT_EQ(f.value(), "42");
  EXPECT_TRUE(on_pool);
}

TEST(Future, ThenPropagatesErrorsAndExceptions) {
  Promise<int> p;
  auto f = p.future().Then([](const Future<int>& in) -> absl::StatusOr<int> {
    if (!in.status().ok()) return in.status();
    return 1;
  });
  p.SetError(absl::UnavailableError("peer died"));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kUnavailable);
  Promise<int> q;
  auto g = q.future().Then([](const Future<int>&) -> int { throw std::runtime_error("bad"); });
  q.SetValue(1);
  EXPECT_TRUE(absl::StrContains(g.status().message(), "bad"));
}

TEST(Future, WaitAll) {
  std::vector<Promise<int>> ps(4);
  std::vector<Future<int>> fs;
  for (auto& p : ps) fs.push_back(p.future());
  ps[0].SetValue(1);
  ps[1].SetValue(2);
  absl::Status s = WaitAll(fs, absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(s.message(), "2 of 4")) << s;
  ps[2].SetError(absl::InternalError("x"));
  ps[3].SetValue(4);
  EXPECT_EQ(WaitAll(fs, absl::Seconds(1)).code(), absl::StatusCode::kInternal);
}

TEST(Executor, GrowsWhenThreadsBlock) {
  Executor ex({1, 8});
  // Four tasks that each wait for the last one: only possible if the pool
  // grows past its one initial thread.
  absl::Notification release;
  std::atomic<int> done{0};
  for (int i = 0; i < 3; ++i) {
    ex.Submit([&] {
      release.WaitForNotificationWithTimeout(absl::Seconds(10));
      ++done;
    });
  }
  ex.Submit([&] { release.Notify(); });
  ex.Close();
  EXPECT_TRUE(ex.Join(absl::Seconds(10)).ok());
  EXPECT_EQ(done, 3);
  EXPECT_LE(ex.num_threads(), 8);
  EXPECT_FALSE(ex.Submit([] {}));
}

// Two tasks submitted back to back while one thread is idle: the second must
// get a thread of its own even though the idle thread has not woken yet, or
// a first task that waits for the second deadlocks (found by the loopback
// RRef test: owners' threads waited for a creation queued behind them).
TEST(Executor, BackToBackSubmitsNeverShareOneIdleThread) {
  for (int round = 0; round < 300; ++round) {
    Executor ex({/*min_threads=*/1, /*max_threads=*/8});
    // The one thread is idle: it went to sleep waiting for work (E4 counts
    // it just before its wait, under the lock the submissions take).
    ASSERT_TRUE(baton::testing::Eventually([&] { return ex.sleeps() >= 1; })) << "round " << round;
    absl::Notification second_ran, first_saw;
    ASSERT_TRUE(ex.Submit([&] {
      if (second_ran.WaitForNotificationWithTimeout(absl::Seconds(5))) first_saw.Notify();
    }));
    ASSERT_TRUE(ex.Submit([&] { second_ran.Notify(); }));
    ASSERT_TRUE(first_saw.WaitForNotificationWithTimeout(absl::Seconds(10))) << "round " << round;
    ex.Close();
    ASSERT_TRUE(ex.Join(absl::Seconds(5)).ok());
  }
}

// E1: CPU-bound tasks run `parallelism` at a time, however many are
// queued: the pool does not grow a thread per waiting task.
TEST(Executor, E1_CpuBoundTasksRunOnlyParallelismAtOnce) {
  // E3's allowance far beyond the test: on a loaded machine a task can be
  // descheduled for more than the default 10 ms, which E3 (rightly) takes
  // for a foreign wait and answers with one more running task.
  Executor ex(Executor::Options{/*min_threads=*/1, /*max_threads=*/64, /*parallelism=*/2,
                                /*starvation_interval=*/absl::Seconds(600)});
  std::atomic<int> now{0}, most{0}, done{0};
  absl::Notification all_done;
  constexpr int kTasks = 40;
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_TRUE(ex.Submit([&] {
      const int n = now.fetch_add(1) + 1;
      int m = most.load();
      while (n > m && !most.compare_exchange_weak(m, n)) {
      }
      const absl::Time until = absl::Now() + absl::Milliseconds(2);  // CPU work
      while (absl::Now() < until) {
      }
      now.fetch_sub(1);
      if (done.fetch_add(1) + 1 == kTasks) all_done.Notify();
    }));
  }
  ASSERT_TRUE(all_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_LE(most.load(), 2);
  EXPECT_LE(ex.num_threads(), 3);  // never a thread per queued task
  ex.Close();
  EXPECT_TRUE(ex.Join(absl::Seconds(10)).ok());
}

// E2: a task that waits for a future lends its place at once: the task that
// completes the future runs though parallelism is 1, without the
// starvation allowance (E3 is set far beyond the test's deadline).
TEST(Executor, E2_ATaskWaitingOnAFutureLetsTheNextTaskRun) {
  Executor ex(Executor::Options{1, 8, /*parallelism=*/1, absl::Seconds(600)});
  Promise<int> promise(&ex);
  Future<int> future = promise.future();
  absl::Notification first_done;
  std::atomic<int> seen{0};
  ASSERT_TRUE(ex.Submit([&] {
    EXPECT_TRUE(future.WaitFor(absl::Seconds(20)));
    seen = future.value();
    first_done.Notify();
  }));
  ASSERT_TRUE(ex.Submit([&] { promise.SetValue(7); }));
  ASSERT_TRUE(first_done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(seen.load(), 7);
  // Nested: each level waits for the next, 5 deep, on a pool of 1.
  std::function<Future<int>(int)> nest = [&](int depth) -> Future<int> {
    Promise<int> p(&ex);
    Future<int> f = p.future();
    EXPECT_TRUE(ex.Submit([&nest, depth, p]() mutable {
      if (depth == 0) {
        p.SetValue(0);
        return;
      }
      auto inner = nest(depth - 1).result();
      p.SetValue(inner.ok() ? *inner + 1 : -100);
    }));
    return f;
  };
  auto r = nest(5).result();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 5);
  ex.Close();
  EXPECT_TRUE(ex.Join(absl::Seconds(10)).ok());
}

// E3: a task blocked in a wait the pool cannot see (here a Notification)
// does not starve the queue: after the starvation interval without a start,
// one more task may run.
TEST(Executor, E3_AForeignWaitDoesNotStarveTheQueue) {
  Executor ex(Executor::Options{1, 8, /*parallelism=*/1, absl::Milliseconds(20)});
  absl::Notification second_ran, first_saw;
  ASSERT_TRUE(ex.Submit([&] {
    if (second_ran.WaitForNotificationWithTimeout(absl::Seconds(20))) first_saw.Notify();
  }));
  ASSERT_TRUE(ex.Submit([&] { second_ran.Notify(); }));
  ASSERT_TRUE(first_saw.WaitForNotificationWithTimeout(absl::Seconds(20)));
  ex.Close();
  EXPECT_TRUE(ex.Join(absl::Seconds(10)).ok());
}

// E4: after its task, an idle worker spins for the next one, so a task
// submitted meanwhile starts without any worker going to sleep (and so
// without a wake-up). Without the spin, the worker sleeps between tasks.
TEST(Executor, E4_ATaskSubmittedWhileAWorkerSpinsStartsWithoutAWakeUp) {
  for (const bool spin : {true, false}) {
    Executor::Options o{/*min_threads=*/1, /*max_threads=*/4, /*parallelism=*/1};
    // Long enough that the spin cannot end before the test submits.
    o.spin = spin ? absl::Seconds(60) : absl::ZeroDuration();
    Executor ex(o);
    for (int task = 0; task < 3; ++task) {
      absl::Notification ran;
      ASSERT_TRUE(ex.Submit([&ran] { ran.Notify(); }));
      ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
      if (!spin) {
        // The worker goes to sleep after each task.
        EXPECT_TRUE(baton::testing::Eventually([&] { return ex.sleeps() >= task + 1; }));
      }
    }
    if (spin) {
      EXPECT_EQ(ex.sleeps(), 0);
    }
    ex.Close();  // ends the spin at once
    const absl::Time closing = absl::Now();
    EXPECT_TRUE(ex.Join(absl::Seconds(10)).ok());
    EXPECT_LT(absl::Now() - closing, absl::Seconds(5));
  }
}

TEST(Executor, JoinIsBoundedWhenATaskHangs) {
  auto ex = std::make_unique<Executor>(Executor::Options{1, 2});
  // Owned by the task too: the task outlives the executor below.
  auto never = std::make_shared<absl::Notification>();
  auto started = std::make_shared<absl::Notification>();
  auto finished = std::make_shared<absl::Notification>();
  ex->Submit([never, started, finished] {
    started->Notify();
    never->WaitForNotificationWithTimeout(absl::Seconds(3));
    finished->Notify();
  });
  started->WaitForNotification();
  ex->Close();
  absl::Status s = ex->Join(absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(ex->Submit([] {}));  // closed
  // The executor goes away while its detached thread still runs the task:
  // the thread finishes against the pool's shared state, never the
  // destroyed object (no use after free; run under ASan to check).
  ex.reset();
  never->Notify();
  EXPECT_TRUE(finished->WaitForNotificationWithTimeout(absl::Seconds(5)));
}

TEST(DeadlineTimer, FiresInOrderAndCancels) {
  DeadlineTimer timer;
  std::vector<int> order;
  absl::Mutex mu;
  const absl::Time now = absl::Now();
  timer.Schedule(now + absl::Milliseconds(60), [&] {
    absl::MutexLock l(&mu);
    order.push_back(3);
  });
  timer.Schedule(now + absl::Milliseconds(20), [&] {
    absl::MutexLock l(&mu);
    order.push_back(1);
  });
  auto id = timer.Schedule(now + absl::Milliseconds(40), [&] {
    absl::MutexLock l(&mu);
    order.push_back(2);
  });
  EXPECT_TRUE(timer.Cancel(id));
  EXPECT_FALSE(timer.Cancel(id));
  EXPECT_EQ(timer.Schedule(absl::InfiniteFuture(), [] {}), 0u);
  // Wait (bounded; a loaded machine may run them late) for the last one,
  // 3. Callbacks run one at a time on the timer thread in deadline order, so
  // once 3 ran, the cancelled 2 (due before it) would have run too: its
  // absence below is the cancel's doing, not a timer that never got there.
  absl::MutexLock l(&mu);
  auto last_ran = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return std::find(order.begin(), order.end(), 3) != order.end();
  };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&last_ran), absl::Seconds(10)));
  EXPECT_EQ(order, (std::vector<int>{1, 3}));
  EXPECT_EQ(timer.pending(), 0u);
  EXPECT_GE(absl::Now() - now, absl::Milliseconds(60));
}

// On a fake clock, a callback runs when the clock passes its deadline, not
// before, however long the test takes: deadlines are times of the timer's
// clock (DeadlineTimer::clock()).
TEST(DeadlineTimer, RunsOnItsClocksTimeNotRealTime) {
  baton::testing::FakeClock clock;
  DeadlineTimer timer(&clock);
  EXPECT_EQ(&timer.clock(), &clock);
  absl::Notification first, second;
  const absl::Time start = clock.Now();
  timer.Schedule(start + absl::Hours(1), [&] { first.Notify(); });
  timer.Schedule(start + absl::Hours(2), [&] { second.Notify(); });
  // Real time passes (the timer's own longest sleep, many times over) and
  // the clock does not: nothing is due, both stay on the timer.
  EXPECT_FALSE(first.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  EXPECT_EQ(timer.pending(), 2u);
  clock.Advance(absl::Minutes(59));
  EXPECT_EQ(timer.pending(), 2u);
  clock.Advance(absl::Minutes(1));
  ASSERT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(second.HasBeenNotified());
  EXPECT_EQ(timer.pending(), 1u);
  clock.Advance(absl::Hours(5));  // one jump past it
  ASSERT_TRUE(second.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(timer.pending(), 0u);
}

// A timer on a fake clock stops cleanly while the clock is moved from
// another thread (the clock's waker is removed before the timer is gone).
TEST(DeadlineTimer, StopsWhileItsClockMoves) {
  baton::testing::FakeClock clock;
  std::atomic<bool> done{false};
  std::thread mover([&] {
    while (!done.load()) clock.Advance(absl::Milliseconds(1));
  });
  for (int i = 0; i < 200; ++i) {
    DeadlineTimer timer(&clock);
    timer.Schedule(clock.Now() + absl::Milliseconds(1), [] {});
  }
  done = true;
  mover.join();
}

}  // namespace
}  // namespace baton::rpc
