// Executor: the agent's thread pool for user functions and callbacks.
//
// Contract:
// - Tasks start in FIFO order of submission on pool threads, never on the
//   caller's thread.
// - E1 CPU-bound work runs on about as many threads as cores: at most
//   `parallelism` tasks run at once, not counting threads that wait inside a
//   BlockingScope (every baton wait on a pool thread is one: futures, room
//   in a flow-control window, the pipeline's and the store's waits). A flood
//   of CPU-heavy requests therefore queues instead of time-slicing hundreds
//   of threads, and a request of another caller starts after a few tasks.
// - E2 A blocked thread lends its place: entering a BlockingScope lets the
//   next queued task start, on an idle thread or a new one (up to
//   `max_threads`). This is what keeps nested RPCs (A calls B calls A) from
//   deadlocking: a thread waiting for a nested call is not counted.
// - E3 No starvation by foreign waits: if tasks are queued and none has
//   started for `starvation_interval` (running tasks block in a wait the
//   pool cannot see, e.g. a user's own lock or sleep), one more task is
//   allowed to run, and again after each further interval without a start,
//   up to `max_threads`; the allowance resets once the queue is empty.
// - E4 Hand-offs without a wake-up: after its task, one idle worker at a
//   time spins (adaptively, at most Options::spin, yielding the CPU as it
//   goes) for the next task before it sleeps, so a task submitted within
//   that time starts without waking a thread. While a worker spins, a
//   submission wakes no other.
// - Past `max_threads` tasks queue; every RPC wait has a deadline, so a
//   saturated pool degrades into timeouts, never a hang.
//
// Thread-safety: safe for concurrent use. Close() and Join() may be called
// from any thread except a pool thread (Join from a pool thread would wait
// for itself; it returns FAILED_PRECONDITION instead).
#ifndef BATON_RPC_EXECUTOR_H_
#define BATON_RPC_EXECUTOR_H_

#include <cstdint>
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
    // Tasks running at once outside a BlockingScope (E1); 0: the number of
    // hardware threads, at least 2.
    int parallelism = 0;
    // With tasks queued and none started for this long, one more task may
    // run, and again after each further interval (E3).
    absl::Duration starvation_interval = absl::Milliseconds(10);
    // E4: the longest an idle worker spins for the next task before it
    // sleeps; zero: never spin.
    absl::Duration spin = absl::Microseconds(50);
  };

  // Marks the calling thread, if it is a pool thread of some Executor, as
  // waiting (E2) for the scope's lifetime. A no-op on any other thread.
  // Scopes nest.
  class BlockingScope {
   public:
    BlockingScope();
    ~BlockingScope();
    BlockingScope(const BlockingScope&) = delete;
    BlockingScope& operator=(const BlockingScope&) = delete;

   private:
    void* state_;  // the pool's State, or null
  };

  explicit Executor(Options options);
  // Closes and joins (bounded by 10s, see Join).
  ~Executor();

  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `task`. Returns false (and drops the task) after Close().
  bool Submit(absl::AnyInvocable<void()> task);

  // Stops accepting tasks. Already queued tasks still run (without the
  // parallelism limit).
  void Close();

  // Waits until the queue is empty and every thread has exited. Threads
  // still running a task at the deadline are detached and reported in the
  // returned DEADLINE_EXCEEDED status; they finish their task (and whatever
  // is queued) later without touching the Executor object, which may be
  // destroyed meanwhile (tests/rpc/future_test.cc checks this under ASan).
  absl::Status Join(absl::Duration timeout);

  // True when called from one of this pool's threads.
  bool InPool() const;

  int num_threads() const;
  int busy_threads() const;     // running a task, blocked or not
  int blocked_threads() const;  // inside a BlockingScope
  int64_t sleeps() const;       // times an idle worker went to sleep (E4)
  int parallelism() const { return parallelism_; }

 private:
  struct State;
  static void WorkerLoop(std::shared_ptr<State> state);
  static void MonitorLoop(std::shared_ptr<State> state);

  const int parallelism_;
  // Shared with the threads, which may outlive a Join that timed out.
  const std::shared_ptr<State> state_;
};

}  // namespace baton::rpc

#endif  // BATON_RPC_EXECUTOR_H_
