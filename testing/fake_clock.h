// FakeClock: a Clock (base/clock.h) that moves only when the test moves it,
// so that timeouts and deadlines are tested without sleeping through them.
// A DeadlineTimer on a FakeClock runs a callback once Advance() passes its
// deadline, on the timer's thread (Advance wakes it): a test waits for the
// callback's own signal (a Notification), bounded, and before advancing can
// check that nothing ran because the deadline has not come.
//
// Thread-safety: safe for concurrent use. Wakers run on the thread that
// calls Advance()/AdvanceTo(), outside the clock's lock.
#ifndef BATON_TESTING_FAKE_CLOCK_H_
#define BATON_TESTING_FAKE_CLOCK_H_

#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"

namespace baton::testing {

class FakeClock final : public Clock {
 public:
  // Starts at `start`: by default a fixed date (tests print the same times
  // on every run) far in the past, so that a real-time deadline handed to a
  // timer on this clock by mistake never fires instead of firing at once.
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'000'000'000));

  absl::Time Now() const override;
  int64_t AddWaker(std::function<void()> wake) const override;
  void RemoveWaker(int64_t id) const override;

  // Moves the clock forward by `d` and wakes every sleeper. A negative `d`
  // moves nothing (the clock never goes back) but still wakes them.
  void Advance(absl::Duration d);
  // Moves the clock forward to `t` (nothing if it is there or past it).
  void AdvanceTo(absl::Time t);

 private:
  // Sets Now() to max(Now(), to(Now())), then runs the wakers.
  void Move(absl::FunctionRef<absl::Time(absl::Time)> to);

  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  mutable int64_t next_waker_ ABSL_GUARDED_BY(mu_) = 1;
  mutable std::map<int64_t, std::function<void()>> wakers_ ABSL_GUARDED_BY(mu_);
  // Held while wakers run, so that RemoveWaker returns only once its waker
  // is not running (the contract of Clock::RemoveWaker).
  mutable absl::Mutex waking_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace baton::testing

#endif  // BATON_TESTING_FAKE_CLOCK_H_
