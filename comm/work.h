// Work: the handle of one asynchronous operation of a ProcessGroup.
//
// Contract: a Work completes exactly once, with OK or an error status that
// names the op and the group. Wait(timeout) blocks until completion or the
// timeout; a timed-out Wait does not cancel the op (the op has its own
// deadline, the group's timeout). Wait first spins for up to kWaitSpin on
// the completion flag before it sleeps, so a short op (a GPU all-reduce of
// tens of microseconds) is not charged a thread wake-up. Callbacks added with OnComplete run
// exactly once, on the thread that completes the work (or inline if already done); they must not
// block.
//
// Thread-safety: safe for concurrent use. Backends call MarkCompleted.
#ifndef BATON_COMM_WORK_H_
#define BATON_COMM_WORK_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton::comm {

class Work {
 public:
  // `description` names the op for errors ("all_reduce #12 on group 'default'").
  explicit Work(std::string description);
  // How long Wait spins before it sleeps.
  static constexpr absl::Duration kWaitSpin = absl::Microseconds(50);
  virtual ~Work() = default;

  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // A Work that is already complete with `status`.
  static std::shared_ptr<Work> Completed(std::string description, absl::Status status);

  // Waits for completion, at most `timeout`. Returns the op's status, or
  // DEADLINE_EXCEEDED naming the op if it is still running.
  virtual absl::Status Wait(absl::Duration timeout);
  // Makes the calling thread's current CUDA stream wait for a GPU op without
  // blocking the host (what torch's Work.wait() does for NCCL): work queued
  // on that stream afterwards sees the op's result. OK once the stream
  // waits, or if the op already completed OK; the op's error if it already
  // failed; UNIMPLEMENTED for ops with no GPU end event (the CPU backends):
  // call Wait instead. A failure after this returns surfaces on the next op
  // of the group, which fails fast once the group is aborted.
  virtual absl::Status WaitOnStream();
  bool IsCompleted() const;
  // The final status; OK while still running.
  absl::Status status() const;
  const std::string& description() const { return description_; }

  // Runs `fn(status)` once the work completes.
  void OnComplete(std::function<void(const absl::Status&)> fn);

  // Completes the work; later calls are ignored. Called by backends.
  void MarkCompleted(absl::Status status);

 private:
  const std::string description_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> done_hint_{false};  // set after done_, read without mu_
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(const absl::Status&)>> callbacks_ ABSL_GUARDED_BY(mu_);
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace baton::comm

#endif  // BATON_COMM_WORK_H_
