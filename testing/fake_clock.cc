#include "testing/fake_clock.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace baton::testing {

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

int64_t FakeClock::AddWaker(std::function<void()> wake) const {
  absl::MutexLock lock(&mu_);
  const int64_t id = next_waker_++;
  wakers_.emplace(id, std::move(wake));
  return id;
}

void FakeClock::RemoveWaker(int64_t id) const {
  absl::MutexLock waking(&waking_);
  absl::MutexLock lock(&mu_);
  wakers_.erase(id);
}

void FakeClock::Advance(absl::Duration d) {
  Move([d](absl::Time now) { return now + d; });
}

void FakeClock::AdvanceTo(absl::Time t) {
  Move([t](absl::Time) { return t; });
}

void FakeClock::Move(absl::FunctionRef<absl::Time(absl::Time)> to) {
  absl::MutexLock waking(&waking_);
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    now_ = std::max(now_, to(now_));
    for (const auto& [id, w] : wakers_) wake.push_back(w);
  }
  for (const auto& w : wake) w();
}

}  // namespace baton::testing
