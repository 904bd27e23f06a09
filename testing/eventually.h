// Eventually: waits, bounded, for a condition that an event outside the
// test's reach makes true (a count the agent keeps, a file a child writes).
// Prefer a notification where the code under test offers one.
//
// Contract: polls `done()` every millisecond until it returns true (then
// true) or `timeout` passes (then false).
//
// Thread-safety: `done` is called on the calling thread only.
#ifndef BATON_TESTING_EVENTUALLY_H_
#define BATON_TESTING_EVENTUALLY_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace baton::testing {

template <typename F>
bool Eventually(F done, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time until = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace baton::testing

#endif  // BATON_TESTING_EVENTUALLY_H_
