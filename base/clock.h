// Clock: where code that keeps time reads "now", injected so that tests run
// it on fake time (testing/fake_clock.h) instead of sleeping through it.
//
// Contract:
// - Now() never goes back for either clock here. RealClock reads
//   absl::Now(); a fake clock moves only when its test moves it.
// - A thread that sleeps until a time of a clock (DeadlineTimer) registers
//   a waker with AddWaker: a clock whose Now() jumps other than by real time
//   passing (a fake clock's Advance) calls every waker after the jump, so the
//   sleeper looks again at once. RealClock never calls them (real time
//   passing is what the sleeper's own timed wait measures).
// - Who holds a Clock* does not own it; the clock outlives its users.
//   Components take `const Clock*` (null: a RealClock of their own), so
//   nothing in the library reaches a process-wide clock.
//
// Thread-safety: Now(), AddWaker and RemoveWaker are safe for concurrent
// use. A waker runs on the thread that moved the clock; it must not block
// and must not add or remove wakers.
#ifndef BATON_BASE_CLOCK_H_
#define BATON_BASE_CLOCK_H_

#include <cstdint>
#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace baton {

class Clock {
 public:
  virtual ~Clock() = default;

  virtual absl::Time Now() const = 0;

  // Calls `wake` after each jump of Now() (see the contract) until
  // RemoveWaker(id). Returns the id.
  virtual int64_t AddWaker(std::function<void()> wake) const = 0;
  // After it returns, the waker is not running and will not run again.
  virtual void RemoveWaker(int64_t id) const = 0;
};

// absl::Now(). Stateless: components that were given no clock own one.
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  int64_t AddWaker(std::function<void()>) const override { return 0; }
  void RemoveWaker(int64_t) const override {}
};

}  // namespace baton

#endif  // BATON_BASE_CLOCK_H_
