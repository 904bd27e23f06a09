// DeadlineTimer: one thread that runs callbacks at their deadlines. The agent
// uses a single timer for every pending call instead of a thread per call.
//
// Contract: a callback runs at most once, on the timer thread, at or after its
// deadline, unless Cancel() removed it first. Callbacks must be short and must
// not block (they typically fail a promise). Stop() drops callbacks that have
// not run. Deadlines are times of the timer's clock (base/clock.h): the real
// one unless the timer was given another, and code that computes a deadline
// for it reads clock().Now(), so that a test on a fake clock moves every such
// deadline at once.
//
// Thread-safety: safe for concurrent use. Cancel() from inside a callback is
// allowed.
#ifndef BATON_RPC_TIMER_H_
#define BATON_RPC_TIMER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"

namespace baton::rpc {

class DeadlineTimer {
 public:
  using Id = uint64_t;

  // `clock` null: the real clock. Otherwise it must outlive the timer.
  explicit DeadlineTimer(const Clock* clock = nullptr);
  ~DeadlineTimer();  // Stop()

  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // Returns an id for Cancel(). An infinite deadline schedules nothing and
  // returns 0.
  Id Schedule(absl::Time deadline, absl::AnyInvocable<void()> callback);
  // Returns true if the callback was removed before it ran.
  bool Cancel(Id id);
  void Stop();
  size_t pending() const;
  // The clock its deadlines are times of.
  const Clock& clock() const { return *clock_; }
  // The time of the timer's clock at which a real-time deadline (e.g.
  // CallContext::deadline) is as far away as it is now; infinite ones stay
  // infinite. The identity on the real clock, up to the two readings.
  absl::Time FromRealTime(absl::Time deadline) const {
    if (deadline == absl::InfiniteFuture() || deadline == absl::InfinitePast()) return deadline;
    return clock_->Now() + (deadline - absl::Now());
  }

 private:
  void Loop();
  static constexpr absl::Duration kMaxSleep = absl::Milliseconds(50);

  const RealClock real_clock_;
  const Clock* const clock_;
  std::atomic<int64_t> waker_{0};  // the clock's waker (Clock::AddWaker)

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<std::pair<absl::Time, Id>, absl::AnyInvocable<void()>> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Id, absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // When the timer thread will wake next (a time of the clock). It never
  // sleeps longer than kMaxSleep, so Schedule() wakes it only for a deadline
  // before that: calls with ordinary (seconds-long) deadlines cost no thread
  // wake-up. A clock that jumps (a fake one) wakes it through its waker.
  absl::Time wake_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread thread_;
};

}  // namespace baton::rpc

#endif  // BATON_RPC_TIMER_H_
