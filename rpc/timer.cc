#include "rpc/timer.h"

namespace baton::rpc {

DeadlineTimer::DeadlineTimer(const Clock* clock) : clock_(clock != nullptr ? clock : &real_clock_) {
  // The waker takes mu_, so that a jump between the loop's reading of the
  // clock and its wait is not lost: the loop holds mu_ from one to the other.
  waker_ = clock_->AddWaker([this] {
    absl::MutexLock lock(&mu_);
    changed_.Signal();
  });
  thread_ = std::thread([this] { Loop(); });
}

DeadlineTimer::~DeadlineTimer() { Stop(); }

DeadlineTimer::Id DeadlineTimer::Schedule(absl::Time deadline,
                                          absl::AnyInvocable<void()> callback) {
  if (deadline == absl::InfiniteFuture()) return 0;
  absl::MutexLock lock(&mu_);
  if (stopped_) return 0;
  const Id id = next_id_++;
  queue_.emplace(std::make_pair(deadline, id), std::move(callback));
  deadlines_.emplace(id, deadline);
  if (deadline < wake_at_) changed_.Signal();
  return id;
}

bool DeadlineTimer::Cancel(Id id) {
  if (id == 0) return false;
  absl::AnyInvocable<void()> dropped;  // destroyed outside the lock
  absl::MutexLock lock(&mu_);
  auto it = deadlines_.find(id);
  if (it == deadlines_.end()) return false;
  auto qit = queue_.find(std::make_pair(it->second, id));
  dropped = std::move(qit->second);
  queue_.erase(qit);
  deadlines_.erase(it);
  return true;
}

void DeadlineTimer::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopped_) {
    const absl::Time now = clock_->Now();
    const absl::Time next = queue_.empty() ? absl::InfiniteFuture() : queue_.begin()->first.first;
    if (now < next) {
      wake_at_ = std::min(next, now + kMaxSleep);
      changed_.WaitWithTimeout(&mu_, wake_at_ - now);
      wake_at_ = absl::InfinitePast();  // awake: Schedule need not signal
      continue;
    }
    auto node = queue_.extract(queue_.begin());
    deadlines_.erase(node.key().second);
    mu_.Unlock();
    node.mapped()();
    node = {};
    mu_.Lock();
  }
}

void DeadlineTimer::Stop() {
  decltype(queue_) dropped;
  // Outside mu_: the clock's waker takes mu_ while the clock holds its own
  // lock.
  if (const int64_t waker = waker_.exchange(0); waker != 0) clock_->RemoveWaker(waker);
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    dropped.swap(queue_);
    deadlines_.clear();
    changed_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

size_t DeadlineTimer::pending() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

}  // namespace baton::rpc
