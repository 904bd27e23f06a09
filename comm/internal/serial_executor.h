// SerialExecutor: one thread that runs submitted tasks in FIFO order. The
// Gloo backend runs collectives on one (so they reach the wire in issue
// order while the caller goes on) and p2p completion waits on another.
//
// Thread-safety: Submit and Shutdown are safe for concurrent use. Tasks run
// on the executor's thread; a task gets `cancelled == true` when it runs
// after Shutdown gave up waiting, and must then return at once.
#ifndef BATON_COMM_INTERNAL_SERIAL_EXECUTOR_H_
#define BATON_COMM_INTERNAL_SERIAL_EXECUTOR_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton::comm::internal {

class SerialExecutor {
 public:
  using Task = std::function<void(bool cancelled)>;

  SerialExecutor();
  // Shuts down with a zero drain timeout if still running.
  ~SerialExecutor();

  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // False once shut down (the task is not run).
  bool Submit(Task task);

  // Stops taking tasks and waits at most `drain` for queued ones to finish.
  // Returns true if everything finished; otherwise the remaining queued tasks
  // are run with cancelled == true. Does not join: call Join after aborting
  // whatever the running task is blocked on.
  bool Drain(absl::Duration drain);
  // Joins the thread. REQUIRES: Drain was called.
  void Join();

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool running_task_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool cancel_rest_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace baton::comm::internal

#endif  // BATON_COMM_INTERNAL_SERIAL_EXECUTOR_H_
