// OutputPump: copies worker stdout/stderr pipes, line by line, to the
// worker's log file, to the launcher's own stdout/stderr (optionally with a
// "[rank R] " prefix) and into a bounded in-memory tail used by the failure
// summary.
//
// Threading: one pump thread runs poll() over every open pipe. Add(), Tail()
// and WaitDrained() may be called from any thread. Close() then the
// destructor join the thread; pipes still open at Close() are drained for at
// most the given grace and then closed.
#ifndef BATON_LAUNCHER_INTERNAL_OUTPUT_PUMP_H_
#define BATON_LAUNCHER_INTERNAL_OUTPUT_PUMP_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton::launcher::internal {

// Where one worker's output goes.
struct OutputSink {
  // Appended to; -1 for none. The pump owns and closes it.
  int log_fd = -1;
  // Echo to the launcher's stdout (for the stdout pipe) / stderr (stderr pipe).
  bool echo = true;
  // Put before each echoed line (empty: lines are echoed as they are).
  std::string prefix;
};

class OutputPump {
 public:
  OutputPump();
  ~OutputPump();
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;

  // Starts pumping the read ends of a worker's stdout and stderr pipes (the
  // pump takes ownership of both fds) and returns the stream id.
  int64_t Add(int stdout_fd, int stderr_fd, OutputSink sink);
  // Blocks until both pipes of `id` reached end of file, at most `timeout`
  // (a grandchild may hold a pipe open). Returns whether they did.
  bool WaitDrained(int64_t id, absl::Duration timeout);
  // The last lines of the stream's output (both pipes), at most `max_lines`.
  std::string Tail(int64_t id, int max_lines);
  // Forgets a finished stream (closing its pipes and log file).
  void Remove(int64_t id);
  // Stops the thread; pipes get at most `grace` to drain.
  void Close(absl::Duration grace = absl::Seconds(1));

 private:
  struct Stream;
  void Run();
  void HandleReadable(int64_t id, int which) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmitLine(Stream& s, int which, absl::string_view line) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Wake();

  int wake_read_ = -1;   // set at construction
  int wake_write_ = -1;  // set at construction
  absl::Mutex mu_;
  std::map<int64_t, std::unique_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace baton::launcher::internal

#endif  // BATON_LAUNCHER_INTERNAL_OUTPUT_PUMP_H_
