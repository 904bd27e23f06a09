#include "rpc/executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace baton::rpc {

Executor::Executor(Options options) : options_(options) {
  absl::MutexLock lock(&mu_);
  const int n = std::max(1, std::min(options_.min_threads, options_.max_threads));
  for (int i = 0; i < n; ++i) {
    threads_.emplace_back([this] { WorkerLoop(); });
    thread_ids_.push_back(threads_.back().get_id());
  }
}

Executor::~Executor() {
  Close();
  (void)Join(absl::Seconds(10));
}

bool Executor::Submit(absl::AnyInvocable<void()> task) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  queue_.push_back(std::move(task));
  if (idle_ == 0 && static_cast<int>(threads_.size()) < options_.max_threads) {
    threads_.emplace_back([this] { WorkerLoop(); });
    thread_ids_.push_back(threads_.back().get_id());
  } else {
    work_.Signal();
  }
  return true;
}

void Executor::WorkerLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    while (queue_.empty() && !closed_) {
      ++idle_;
      work_.Wait(&mu_);
      --idle_;
    }
    if (queue_.empty()) break;  // closed and drained
    auto task = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    mu_.Unlock();
    task();
    task = nullptr;  // destroy captures outside the lock
    mu_.Lock();
    --running_;
  }
  ++exited_;
}

void Executor::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  work_.SignalAll();
}

bool Executor::InPool() const {
  absl::MutexLock lock(&mu_);
  return std::find(thread_ids_.begin(), thread_ids_.end(),
                   std::this_thread::get_id()) != thread_ids_.end();
}

absl::Status Executor::Join(absl::Duration timeout) {
  if (InPool()) {
    return absl::FailedPreconditionError(
        "Executor::Join called from one of its own threads");
  }
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    if (joined_) return absl::OkStatus();
    const absl::Time deadline = absl::Now() + timeout;
    auto all_exited = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return exited_ == static_cast<int>(threads_.size());
    };
    mu_.AwaitWithDeadline(absl::Condition(&all_exited), deadline);
    joined_ = true;
    threads.swap(threads_);
    if (exited_ != static_cast<int>(threads.size())) {
      const int stuck = static_cast<int>(threads.size()) - exited_;
      mu_.Unlock();
      for (auto& t : threads) t.detach();
      mu_.Lock();
      return absl::DeadlineExceededError(absl::StrCat(
          "executor: ", stuck, " thread(s) still running a task after ",
          absl::FormatDuration(timeout), "; detached"));
    }
  }
  for (auto& t : threads) t.join();
  return absl::OkStatus();
}

int Executor::num_threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

int Executor::busy_threads() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

}  // namespace baton::rpc
