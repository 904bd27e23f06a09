#include "comm/internal/serial_executor.h"

#include <utility>

namespace baton::comm::internal {

SerialExecutor::SerialExecutor() : thread_([this] { Loop(); }) {}

SerialExecutor::~SerialExecutor() {
  Drain(absl::ZeroDuration());
  Join();
}

bool SerialExecutor::Submit(Task task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  queue_.push_back(std::move(task));
  return true;
}

bool SerialExecutor::Drain(absl::Duration drain) {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !running_task_; };
  const bool drained = mu_.AwaitWithTimeout(absl::Condition(&idle), drain);
  if (!drained) cancel_rest_ = true;
  return drained;
}

void SerialExecutor::Join() {
  if (thread_.joinable()) thread_.join();
}

void SerialExecutor::Loop() {
  for (;;) {
    Task task;
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stopping_; };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      running_task_ = true;
      cancelled = cancel_rest_;
    }
    task(cancelled);
    absl::MutexLock lock(&mu_);
    running_task_ = false;
  }
}

}  // namespace baton::comm::internal
