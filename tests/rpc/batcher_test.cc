// rpc::Batcher in one process, with a real executor and a deadline timer on
// real time or on a fake clock (testing/fake_clock.h): ordering, full and
// partial batches, deadlines, errors, concurrent batches, and no thread held
// while requests wait.
#include "rpc/batcher.h"

#include <atomic>
#include <memory>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "testing/fake_clock.h"

namespace baton::rpc {
namespace {

class BatcherTest : public ::testing::Test {
 protected:
  // Records every batch's inputs; answers x -> 10 * x.
  // `timer`: the fixture's real-time timer unless a test passes &fake_timer_.
  std::shared_ptr<Batcher<int, int>> Make(BatcherOptions o, DeadlineTimer* timer = nullptr) {
    return Batcher<int, int>::Create(
        o,
        [this](std::vector<int> in) -> absl::StatusOr<std::vector<int>> {
          {
            absl::MutexLock lock(&mu_);
            batches_.push_back(in);
          }
          std::vector<int> out;
          for (int x : in) {
            if (x == 13) throw std::runtime_error("unlucky 13");
            if (x < 0) return absl::InvalidArgumentError("negative input");
            out.push_back(10 * x);
          }
          return out;
        },
        &executor_, timer != nullptr ? timer : &timer_);
  }
  std::vector<std::vector<int>> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }

  Executor executor_{Executor::Options{2, 8}};
  DeadlineTimer timer_;
  // Fake time: max_delay and deadlines pass when the test advances clock_.
  baton::testing::FakeClock clock_;
  DeadlineTimer fake_timer_{&clock_};
  absl::Mutex mu_;
  std::vector<std::vector<int>> batches_ ABSL_GUARDED_BY(mu_);
};

TEST_F(BatcherTest, FullBatchRunsAtOnceInSubmissionOrder) {
  auto b = Make({4, absl::Seconds(30)});
  std::vector<Future<int>> f;
  for (int i = 1; i <= 4; ++i) f.push_back(b->Submit(i));
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(f[i].WaitFor(absl::Seconds(5)));  // long before max_delay
    EXPECT_EQ(f[i].value(), 10 * (i + 1));
  }
  ASSERT_EQ(batches().size(), 1u);
  EXPECT_EQ(batches()[0], (std::vector<int>{1, 2, 3, 4}));
}

TEST_F(BatcherTest, PartialBatchRunsAfterMaxDelay) {
  auto b = Make({8, absl::Seconds(30)}, &fake_timer_);
  auto f1 = b->Submit(1), f2 = b->Submit(2), f3 = b->Submit(3);
  // A second short of max_delay: queued, its flush still on the timer.
  clock_.Advance(absl::Seconds(29));
  EXPECT_EQ(b->stats().queued, 3);
  EXPECT_EQ(fake_timer_.pending(), 1u);
  EXPECT_FALSE(f3.ready());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(f3.WaitFor(absl::Seconds(5)));
  EXPECT_EQ(f1.value() + f2.value() + f3.value(), 60);
  ASSERT_EQ(batches().size(), 1u);
  EXPECT_EQ(batches()[0], (std::vector<int>{1, 2, 3}));
  // More than max_batch: two batches, the second after the delay.
  auto b2 = Make({2, absl::Milliseconds(20)});
  std::vector<Future<int>> f;
  for (int i = 0; i < 5; ++i) f.push_back(b2->Submit(100 + i));
  for (auto& x : f) ASSERT_TRUE(x.WaitFor(absl::Seconds(5)));
  EXPECT_EQ(b2->stats().batches, 3);
  EXPECT_EQ(b2->stats().largest, 2);
}

TEST_F(BatcherTest, DeadlineExpiryFailsThatRequestAndTheBatchGoesOn) {
  auto b = Make({8, absl::Seconds(20)}, &fake_timer_);
  auto late = b->Submit(1, clock_.Now() + absl::Seconds(10));
  auto ok = b->Submit(2);
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(late.WaitFor(absl::Seconds(5)));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(late.status().message(), "deadline passed")) << late.status();
  EXPECT_EQ(b->stats().queued, 1);  // still waiting for its batch
  EXPECT_FALSE(ok.ready());
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(ok.value(), 20);
  ASSERT_EQ(batches().size(), 1u);
  EXPECT_EQ(batches()[0], (std::vector<int>{2}));
  EXPECT_EQ(b->stats().expired, 1);
}

TEST_F(BatcherTest, AnErrorFailsExactlyThatBatchWithItsMessage) {
  auto b = Make({2, absl::Seconds(30)});
  auto a1 = b->Submit(13), a2 = b->Submit(1);  // batch 1 throws
  auto c1 = b->Submit(2), c2 = b->Submit(3);   // batch 2 is fine
  auto d1 = b->Submit(-1), d2 = b->Submit(4);  // batch 3 returns an error
  EXPECT_EQ(a1.status().code(), absl::StatusCode::kUnknown);
  EXPECT_TRUE(absl::StrContains(a2.status().message(), "unlucky 13")) << a2.status();
  EXPECT_EQ(c1.value(), 20);
  EXPECT_EQ(c2.value(), 30);
  EXPECT_EQ(d1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d2.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BatcherTest, WrongResultLengthIsInternal) {
  auto b = Batcher<int, int>::Create(
      {2, absl::Seconds(30)},
      [](std::vector<int>) -> absl::StatusOr<std::vector<int>> { return std::vector<int>{1}; },
      &executor_, &timer_);
  auto f1 = b->Submit(1), f2 = b->Submit(2);
  EXPECT_EQ(f1.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(f2.status().message(), "returned 1 results for 2 requests"));
}

TEST_F(BatcherTest, ConcurrentCallersGetTheirOwnResults) {
  auto b = Make({16, absl::Milliseconds(2)});
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<int, Future<int>>> f;
      for (int i = 20; i < 120; ++i)
        f.emplace_back(1000 * t + i, b->Submit(1000 * t + i));  // no 13
      for (auto& [x, fut] : f) {
        if (fut.value() != 10 * x) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  size_t total = 0;
  for (const auto& batch : batches()) {
    EXPECT_LE(batch.size(), 16u);
    total += batch.size();
  }
  EXPECT_EQ(total, 800u);
  EXPECT_EQ(b->stats().requests, 800);
}

TEST_F(BatcherTest, NoThreadIsHeldWhileRequestsWait) {
  auto b = Make({1000, absl::Seconds(30)}, &fake_timer_);
  std::vector<Future<int>> f;
  for (int i = 20; i < 220; ++i) f.push_back(b->Submit(i));
  // Proof that whatever the 200 submissions handed the executor has
  // started: tasks start in submission order (rpc/executor.h), so when a
  // probe submitted after them runs, every earlier task has started, and
  // one that holds a thread while its request waits shows as busy beside
  // the probe. (The flush waits for the fake clock: nothing is due.)
  struct Probe {
    int busy = -1, threads = -1;
    absl::Notification ran;
  };
  auto probe = std::make_shared<Probe>();  // the task's too, should the wait time out
  ASSERT_TRUE(executor_.Submit([this, probe] {
    probe->busy = executor_.busy_threads();
    probe->threads = executor_.num_threads();
    probe->ran.Notify();
  }));
  ASSERT_TRUE(probe->ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(probe->busy, 1);     // the probe alone
  EXPECT_EQ(probe->threads, 2);  // the pool did not grow
  EXPECT_EQ(b->stats().queued, 200);
  clock_.Advance(absl::Seconds(30));
  for (auto& x : f) ASSERT_TRUE(x.WaitFor(absl::Seconds(5)));
  EXPECT_EQ(batches().size(), 1u);
}

TEST_F(BatcherTest, CloseFailsQueuedRequestsAndLaterSubmits) {
  auto b = Make({8, absl::Seconds(30)});
  auto queued = b->Submit(1);
  b->Close();
  EXPECT_EQ(queued.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(b->Submit(2).status().code(), absl::StatusCode::kCancelled);
}

TEST_F(BatcherTest, LoweringMaxBatchRunsWhatIsQueuedAtOnce) {
  auto b = Make({4, absl::Seconds(30)});
  auto f1 = b->Submit(1), f2 = b->Submit(2);
  // Both reached the queue (Submit queues before it returns), and 2 of 4
  // do not run.
  ASSERT_EQ(b->stats().queued, 2);
  EXPECT_FALSE(f1.WaitFor(absl::Milliseconds(50)));
  b->set_max_batch(2);  // e.g. two observers left
  ASSERT_TRUE(f2.WaitFor(absl::Seconds(5)));
  EXPECT_EQ(f1.value() + f2.value(), 30);
  EXPECT_EQ(b->max_batch(), 2);
  // Raising it: the next two wait for a third.
  b->set_max_batch(3);
  auto f3 = b->Submit(3), f4 = b->Submit(4);
  ASSERT_EQ(b->stats().queued, 2);
  EXPECT_FALSE(f3.WaitFor(absl::Milliseconds(50)));
  auto f5 = b->Submit(5);
  ASSERT_TRUE(f5.WaitFor(absl::Seconds(5)));
  ASSERT_EQ(batches().size(), 2u);
  EXPECT_EQ(batches()[1], (std::vector<int>{3, 4, 5}));
}

}  // namespace
}  // namespace baton::rpc
