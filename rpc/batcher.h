// Batcher<In, Out>: collects requests from many callers and runs them as one
// batch, e.g. one forward pass of a policy for every observer waiting for an
// action.
//
//   auto batcher = rpc::Batcher<at::Tensor, int64_t>::Create(
//       {/*max_batch=*/32, /*max_delay=*/absl::Milliseconds(2)},
//       [&](std::vector<at::Tensor> obs) -> absl::StatusOr<std::vector<int64_t>> {
//         return SelectActions(policy, at::stack(obs));      // one forward pass
//       },
//       agent->executor(), timer);
//   registry->Register(act_fn, [batcher, timer](const rpc::CallContext& ctx, at::Tensor obs) {
//     return batcher->Submit(std::move(obs), timer->FromRealTime(ctx.deadline));
//   });
//
// Contract:
// - A batch runs when max_batch requests are queued or when the oldest
//   queued request has waited max_delay, whichever comes first. Requests
//   run in submission order, and each caller's future completes with the
//   output at its own position.
// - A request whose deadline passes while it is queued fails with
//   DEADLINE_EXCEEDED and is left out; the others go on without it. Once its
//   batch started, a request completes with the batch.
// - The batch function runs on `executor`, never under a lock and never on
//   the submitting thread. If it throws or returns an error, exactly the
//   callers of that batch fail: UNKNOWN with the exception's message, or its
//   status. A result of the wrong length fails them with INTERNAL.
// - No thread waits for a batch to fill: queued requests hold only their
//   promise; the timer and the executor are used only when there is work.
// - Close() fails every queued request with CANCELLED; later Submits fail
//   the same way. Batches already running complete.
// - set_max_batch(n) changes the batch size for what is queued and what
//   comes (e.g. to the number of observers alive); if n requests are already
//   queued, they run at once.
//
// REQUIRES: Out is not void (a batch returns one value per request).
//
// Thread-safety: safe for concurrent use. `executor` and `timer` must
// outlive every batch (they are the agent's in the usual use); the batcher
// keeps itself alive while its timers and batches are pending.
#ifndef BATON_RPC_BATCHER_H_
#define BATON_RPC_BATCHER_H_

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/executor.h"
#include "rpc/future.h"
#include "rpc/timer.h"

namespace baton::rpc {

struct BatcherOptions {
  int max_batch = 32;
  absl::Duration max_delay = absl::Milliseconds(2);
};

struct BatcherStats {
  int64_t batches = 0;   // batches run (or running)
  int64_t requests = 0;  // requests that went into a batch
  int64_t expired = 0;   // requests that failed their deadline while queued
  int64_t largest = 0;   // largest batch so far
  int64_t queued = 0;    // waiting now
};

template <typename In, typename Out>
class Batcher : public std::enable_shared_from_this<Batcher<In, Out>> {
 public:
  using BatchFn = std::function<absl::StatusOr<std::vector<Out>>(std::vector<In>)>;

  // REQUIRES: options.max_batch >= 1, options.max_delay >= 0, executor and
  // timer non-null.
  static std::shared_ptr<Batcher> Create(BatcherOptions options, BatchFn fn, Executor* executor,
                                         DeadlineTimer* timer) {
    return std::shared_ptr<Batcher>(new Batcher(options, std::move(fn), executor, timer));
  }

  ~Batcher() { Close(); }

  // `deadline`: a time of the timer's clock (DeadlineTimer::FromRealTime
  // turns a CallContext::deadline into one).
  Future<Out> Submit(In in, absl::Time deadline = absl::InfiniteFuture()) {
    Promise<Out> promise(executor_);
    Future<Out> future = promise.future();
    std::vector<Pending> batch;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) {
        promise.SetError(absl::CancelledError("batcher: closed"));
        return future;
      }
      const uint64_t id = next_id_++;
      Pending& p = queue_[id];
      p.in = std::move(in);
      p.promise = promise;
      p.arrival = timer_->clock().Now();
      if (deadline != absl::InfiniteFuture()) {
        std::weak_ptr<Batcher> weak = this->weak_from_this();
        p.deadline_timer = timer_->Schedule(deadline, [weak, id] {
          if (auto self = weak.lock()) self->Expire(id);
        });
      }
      if (static_cast<int>(queue_.size()) >= max_batch_) {
        batch = TakeLocked();
      } else if (queue_.size() == 1) {
        ScheduleFlushLocked(p.arrival + options_.max_delay);
      }
    }
    if (!batch.empty()) Dispatch(std::move(batch));
    return future;
  }

  void Close() {
    std::map<uint64_t, Pending> queued;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      queued.swap(queue_);
      if (flush_timer_ != 0) timer_->Cancel(flush_timer_);
      flush_timer_ = 0;
    }
    for (auto& [id, p] : queued) {
      if (p.deadline_timer != 0) timer_->Cancel(p.deadline_timer);
      p.promise.SetError(absl::CancelledError("batcher: closed with the request queued"));
    }
  }

  // REQUIRES: n >= 1.
  void set_max_batch(int n) {
    std::vector<Pending> batch;
    {
      absl::MutexLock lock(&mu_);
      max_batch_ = std::max(1, n);
      if (!closed_ && static_cast<int>(queue_.size()) >= max_batch_) batch = TakeLocked();
    }
    if (!batch.empty()) Dispatch(std::move(batch));
  }

  int max_batch() const {
    absl::MutexLock lock(&mu_);
    return max_batch_;
  }

  BatcherStats stats() const {
    absl::MutexLock lock(&mu_);
    BatcherStats s = stats_;
    s.queued = static_cast<int64_t>(queue_.size());
    return s;
  }

 private:
  struct Pending {
    In in;
    Promise<Out> promise;
    absl::Time arrival;
    DeadlineTimer::Id deadline_timer = 0;
  };

  Batcher(BatcherOptions options, BatchFn fn, Executor* executor, DeadlineTimer* timer)
      : options_(options),
        fn_(std::move(fn)),
        executor_(executor),
        timer_(timer),
        max_batch_(std::max(1, options.max_batch)) {}

  // Removes the oldest max_batch requests and reschedules the flush timer
  // for what remains.
  std::vector<Pending> TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Pending> batch;
    while (!queue_.empty() && static_cast<int>(batch.size()) < max_batch_) {
      auto it = queue_.begin();
      batch.push_back(std::move(it->second));
      queue_.erase(it);
    }
    if (flush_timer_ != 0) timer_->Cancel(flush_timer_);
    flush_timer_ = 0;
    if (!queue_.empty()) {
      ScheduleFlushLocked(queue_.begin()->second.arrival + options_.max_delay);
    }
    ++stats_.batches;
    stats_.requests += static_cast<int64_t>(batch.size());
    stats_.largest = std::max<int64_t>(stats_.largest, static_cast<int64_t>(batch.size()));
    return batch;
  }

  void ScheduleFlushLocked(absl::Time at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (flush_timer_ != 0) timer_->Cancel(flush_timer_);
    std::weak_ptr<Batcher> weak = this->weak_from_this();
    flush_timer_ = timer_->Schedule(at, [weak] {
      if (auto self = weak.lock()) self->Flush();
    });
  }

  // Timer thread: runs what is queued once the oldest waited max_delay.
  void Flush() {
    std::vector<Pending> batch;
    {
      absl::MutexLock lock(&mu_);
      flush_timer_ = 0;
      if (queue_.empty()) return;
      const absl::Time due = queue_.begin()->second.arrival + options_.max_delay;
      if (timer_->clock().Now() < due) {
        ScheduleFlushLocked(due);
        return;
      }
      batch = TakeLocked();
    }
    Dispatch(std::move(batch));
  }

  // Timer thread: a queued request's deadline passed.
  void Expire(uint64_t id) {
    Promise<Out> promise;
    absl::Duration waited;
    {
      absl::MutexLock lock(&mu_);
      auto it = queue_.find(id);
      if (it == queue_.end()) return;  // already in a batch
      promise = it->second.promise;
      waited = timer_->clock().Now() - it->second.arrival;
      queue_.erase(it);
      ++stats_.expired;
    }
    promise.SetError(absl::DeadlineExceededError(
        absl::StrCat("batcher: the request's deadline passed after ", absl::FormatDuration(waited),
                     " in the queue, before a batch took it")));
  }

  void Dispatch(std::vector<Pending> batch) {
    for (auto& p : batch) {
      if (p.deadline_timer != 0) timer_->Cancel(p.deadline_timer);
    }
    std::vector<Promise<Out>> promises;
    for (const auto& p : batch) promises.push_back(p.promise);
    auto self = this->shared_from_this();
    auto run = [self, batch = std::move(batch)]() mutable { self->Run(std::move(batch)); };
    if (!executor_->Submit(std::move(run))) {
      for (auto& p : promises) {
        p.SetError(absl::CancelledError("batcher: the executor is closed (shutting down)"));
      }
    }
  }

  void Run(std::vector<Pending> batch) {
    std::vector<In> inputs;
    inputs.reserve(batch.size());
    for (auto& p : batch) inputs.push_back(std::move(p.in));
    absl::StatusOr<std::vector<Out>> outs;
    try {
      outs = fn_(std::move(inputs));
    } catch (const std::exception& e) {
      outs = absl::UnknownError(absl::StrCat("batcher: the batch function threw: ", e.what()));
    } catch (...) {
      outs = absl::UnknownError("batcher: the batch function threw a non-std exception");
    }
    if (outs.ok() && outs->size() != batch.size()) {
      outs = absl::InternalError(absl::StrCat("batcher: the batch function returned ", outs->size(),
                                              " results for ", batch.size(), " requests"));
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!outs.ok()) {
        batch[i].promise.SetError(outs.status());
      } else {
        batch[i].promise.SetValue(std::move((*outs)[i]));
      }
    }
  }

  const BatcherOptions options_;
  const BatchFn fn_;
  Executor* const executor_;
  DeadlineTimer* const timer_;

  mutable absl::Mutex mu_;
  std::map<uint64_t, Pending> queue_ ABSL_GUARDED_BY(mu_);  // by submission order
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int max_batch_ ABSL_GUARDED_BY(mu_);
  DeadlineTimer::Id flush_timer_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  BatcherStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::rpc

#endif  // BATON_RPC_BATCHER_H_
