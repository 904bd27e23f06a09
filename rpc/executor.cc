#include "rpc/executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace baton::rpc {

Executor::Executor(Options options)
    : options_(options), state_(std::make_shared<State>()) {
  absl::MutexLock lock(&state_->mu);
  const int n = std::max(1, std::min(options_.min_threads, options_.max_threads));
  for (int i = 0; i < n; ++i) StartThreadLocked();
}

Executor::~Executor() {
  Close();
  (void)Join(absl::Seconds(10));
}

void Executor::StartThreadLocked() {
  threads_.emplace_back([state = state_] { WorkerLoop(state); });
  state_->thread_ids.push_back(threads_.back().get_id());
}

bool Executor::Submit(absl::AnyInvocable<void()> task) {
  absl::MutexLock lock(&state_->mu);
  if (state_->closed) return false;
  state_->queue.push_back(std::move(task));
  // Every queued task needs an idle thread of its own: a woken thread counts
  // as idle until it takes its task, so two quick submits must not both
  // count on it (the second would wait behind a task that may block on it).
  if (state_->queue.size() > static_cast<size_t>(state_->idle) &&
      static_cast<int>(threads_.size()) < options_.max_threads) {
    StartThreadLocked();
  } else {
    state_->work.Signal();
  }
  return true;
}

void Executor::WorkerLoop(std::shared_ptr<State> state) {
  State& s = *state;
  while (true) {
    absl::AnyInvocable<void()> task;
    {
      absl::MutexLock lock(&s.mu);
      while (s.queue.empty() && !s.closed) {
        ++s.idle;
        s.work.Wait(&s.mu);
        --s.idle;
      }
      if (s.queue.empty()) {  // closed and drained
        ++s.exited;
        return;
      }
      task = std::move(s.queue.front());
      s.queue.pop_front();
      ++s.running;
    }
    task();
    task = nullptr;  // destroy captures outside the lock
    absl::MutexLock lock(&s.mu);
    --s.running;
  }
}

void Executor::Close() {
  absl::MutexLock lock(&state_->mu);
  state_->closed = true;
  state_->work.SignalAll();
}

bool Executor::InPool() const {
  absl::MutexLock lock(&state_->mu);
  return std::find(state_->thread_ids.begin(), state_->thread_ids.end(),
                   std::this_thread::get_id()) != state_->thread_ids.end();
}

absl::Status Executor::Join(absl::Duration timeout) {
  if (InPool()) {
    return absl::FailedPreconditionError("Executor::Join called from one of its own threads");
  }
  std::vector<std::thread> threads;
  int stuck = 0;
  {
    absl::MutexLock lock(&state_->mu);
    if (joined_) return absl::OkStatus();
    const int started = static_cast<int>(threads_.size());
    auto all_exited = [this, started]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
      return state_->exited == started;
    };
    state_->mu.AwaitWithDeadline(absl::Condition(&all_exited), absl::Now() + timeout);
    joined_ = true;
    threads.swap(threads_);
    stuck = started - state_->exited;
  }
  if (stuck > 0) {
    // They hold the shared state; nothing of this object is touched again.
    for (auto& t : threads) t.detach();
    return absl::DeadlineExceededError(
        absl::StrCat("executor: ", stuck, " thread(s) still running a task after ",
                     absl::FormatDuration(timeout), "; detached"));
  }
  for (auto& t : threads) t.join();
  return absl::OkStatus();
}

int Executor::num_threads() const {
  absl::MutexLock lock(&state_->mu);
  return static_cast<int>(threads_.size());
}

int Executor::busy_threads() const {
  absl::MutexLock lock(&state_->mu);
  return state_->running;
}

}  // namespace baton::rpc
