// Executor: the agent's thread pool for user functions and callbacks.
//
// Contract: tasks run in FIFO order of submission on pool threads, never on
// the caller's thread. The pool starts with `min_threads` and grows by one
// thread whenever a task is queued while no thread is idle, up to
// `max_threads`. This is what keeps nested RPCs (A calls B calls A) from
// deadlocking: a thread blocked in a nested call is busy, so the next request
// gets a new thread. Past `max_threads` tasks queue; every RPC wait has a
// deadline, so a saturated pool degrades into timeouts, never a hang.
//
// Thread-safety: safe for concurrent use. Close() and Join() may be called
// from any thread except a pool thread (Join from a pool thread would wait
// for itself; it returns FAILED_PRECONDITION instead).
#ifndef BATON_RPC_EXECUTOR_H_
#define BATON_RPC_EXECUTOR_H_

#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton::rpc {

class Executor {
 public:
  struct Options {
    int min_threads = 2;
    int max_threads = 256;
  };

  explicit Executor(Options options);
  // Closes and joins (bounded by 10s, see Join).
  ~Executor();

  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `task`. Returns false (and drops the task) after Close().
  bool Submit(absl::AnyInvocable<void()> task);

  // Stops accepting tasks. Already queued tasks still run.
  void Close();

  // Waits until the queue is empty and every thread has exited. Threads
  // still running a task at the deadline are detached and reported in the
  // returned DEADLINE_EXCEEDED status.
  absl::Status Join(absl::Duration timeout);

  // True when called from one of this pool's threads.
  bool InPool() const;

  int num_threads() const;
  int busy_threads() const;

 private:
  void WorkerLoop();

  const Options options_;
  mutable absl::Mutex mu_;
  absl::CondVar work_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::AnyInvocable<void()>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> thread_ids_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int exited_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::rpc

#endif  // BATON_RPC_EXECUTOR_H_
