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
#include <memory>
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
  // returned DEADLINE_EXCEEDED status; they finish their task (and whatever
  // is queued) later without touching the Executor object, which may be
  // destroyed meanwhile (tests/future_test.cc checks this under ASan).
  absl::Status Join(absl::Duration timeout);

  // True when called from one of this pool's threads.
  bool InPool() const;

  int num_threads() const;
  int busy_threads() const;

 private:
  // Everything a pool thread touches. Threads hold it by shared_ptr, so a
  // thread that Join() detached (its task outlived the timeout) finishes
  // against this state even after the Executor is destroyed.
  struct State {
    mutable absl::Mutex mu;
    absl::CondVar work;
    std::deque<absl::AnyInvocable<void()>> queue ABSL_GUARDED_BY(mu);
    std::vector<std::thread::id> thread_ids ABSL_GUARDED_BY(mu);
    int idle ABSL_GUARDED_BY(mu) = 0;
    int running ABSL_GUARDED_BY(mu) = 0;
    int exited ABSL_GUARDED_BY(mu) = 0;
    bool closed ABSL_GUARDED_BY(mu) = false;
  };
  static void WorkerLoop(std::shared_ptr<State> state);
  void StartThreadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu);

  const Options options_;
  const std::shared_ptr<State> state_;
  // Only the owner's threads (Submit, Join) touch these, under state_->mu.
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(state_->mu);
  bool joined_ ABSL_GUARDED_BY(state_->mu) = false;
};

}  // namespace baton::rpc

#endif  // BATON_RPC_EXECUTOR_H_
