#include "comm/work.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace baton::comm {

Work::Work(std::string description) : description_(std::move(description)) {}

std::shared_ptr<Work> Work::Completed(std::string description, absl::Status status) {
  auto work = std::make_shared<Work>(std::move(description));
  work->MarkCompleted(std::move(status));
  return work;
}

absl::Status Work::Wait(absl::Duration timeout) {
  if (!done_hint_.load(std::memory_order_acquire)) {
    const auto spin_end =
        std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(std::min(kWaitSpin, timeout));
    while (!done_hint_.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < spin_end) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  }
  absl::MutexLock lock(&mu_);
  const bool done = mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
  if (!done) {
    return absl::DeadlineExceededError(
        absl::StrCat(description_, ": not complete after waiting ", DurationText(timeout)));
  }
  return status_;
}

absl::Status Work::WaitOnStream() {
  return absl::UnimplementedError(absl::StrCat(description_, ": has no GPU end event to wait on"));
}

bool Work::IsCompleted() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

absl::Status Work::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void Work::OnComplete(std::function<void(const absl::Status&)> fn) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (!done_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
    status = status_;
  }
  fn(status);
}

void Work::MarkCompleted(absl::Status status) {
  std::vector<std::function<void(const absl::Status&)>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (done_) return;
    done_ = true;
    status_ = std::move(status);
    done_hint_.store(true, std::memory_order_release);
    callbacks.swap(callbacks_);
    status = status_;
  }
  // Never call user code while holding mu_.
  for (auto& fn : callbacks) fn(status);
}

}  // namespace baton::comm
