// Starting and stopping worker processes.
//
// Every worker is started with fork+exec as the leader of its own process
// group, with PR_SET_PDEATHSIG(SIGKILL) so that it dies if the launcher
// thread that forked it dies (the launcher forks only from its main thread,
// which lives as long as the process). Stopping signals the whole process
// group, so grandchildren the worker left behind are stopped too.
//
// Thread-safety: these are plain functions over process ids; the caller
// serializes calls for one process. Spawn() must be called from the main
// thread (see above); everything else from any thread.
#ifndef BATON_LAUNCHER_INTERNAL_PROCESS_H_
#define BATON_LAUNCHER_INTERNAL_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace baton::launcher::internal {

struct SpawnRequest {
  // argv[0] is looked up in PATH (from `env`) unless it contains a '/'.
  std::vector<std::string> argv;
  // The complete environment, "NAME=value".
  std::vector<std::string> env;
};

struct SpawnedProcess {
  pid_t pid = -1;
  // Read ends of the child's stdout and stderr; the caller owns them.
  int stdout_fd = -1;
  int stderr_fd = -1;
};

// Starts the process. Fails with NOT_FOUND naming the program when it
// cannot be found or is not executable; other errors carry errno text.
absl::StatusOr<SpawnedProcess> Spawn(const SpawnRequest& request);

// How a process ended.
struct ExitInfo {
  bool exited = false;  // false: killed by `signal`
  int exit_code = 0;
  int signal = 0;
  absl::Time time;

  bool success() const { return exited && exit_code == 0; }
  // "exit code 3" or "signal 9 (SIGKILL)".
  std::string Describe() const;
};

// Non-blocking reap: returns true and fills `info` if `pid` has ended.
bool TryReap(pid_t pid, ExitInfo* info);

// Sends `signal` to the process group of `pgid` (a worker's pid); ignores a
// group that is already gone.
void SignalGroup(pid_t pgid, int signal);

// Name of a signal, e.g. "SIGTERM".
std::string SignalName(int signal);

}  // namespace baton::launcher::internal

#endif  // BATON_LAUNCHER_INTERNAL_PROCESS_H_
