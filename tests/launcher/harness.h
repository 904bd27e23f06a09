// Test harness for the launcher's multi-process tests: runs baton-run as a
// child process with a unique marker in its environment, bounded in time,
// and on teardown kills every process that carries the marker (so a failing
// test leaves nothing behind).
//
// Thread-safety: not thread-safe; one test thread.
#ifndef BATON_TESTS_LAUNCHER_HARNESS_H_
#define BATON_TESTS_LAUNCHER_HARNESS_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "testing/ports.h"
#include "testing/temp_dir.h"

namespace baton::launcher::testing {

// Paths of the binaries under test (from the test's runfiles).
std::string Runfile(const std::string& path);  // relative to the workspace
std::string BatonRunPath();
std::string WorkerScriptPath();

// From the project's test toolkit (//testing).
using ::baton::testing::FreePort;
using ::baton::testing::MakeTempDir;

std::string ReadFile(const std::string& path);
bool FileExists(const std::string& path);
// "KEY=value" lines -> map.
std::map<std::string, std::string> ReadEnvFile(const std::string& path);
// Waits until `path` exists, at most `timeout`.
bool WaitForFile(const std::string& path, absl::Duration timeout);
// Waits until 127.0.0.1:`port` accepts a TCP connection, at most `timeout`.
bool WaitForPort(int port, absl::Duration timeout);

// Pids of live processes whose environment contains BATON_TEST_MARKER=marker
// (zombies excluded).
std::vector<pid_t> ProcessesWithMarker(const std::string& marker);

// One baton-run process.
class Launcher {
 public:
  // `prefix` runs before baton-run (e.g. {"ip", "netns", "exec", "ns0"}).
  Launcher(const std::string& marker, std::vector<std::string> args,
           std::map<std::string, std::string> extra_env = {}, std::vector<std::string> prefix = {});
  ~Launcher();

  pid_t pid() const { return pid_; }
  // Waits for the exit, at most `timeout`; on timeout kills the launcher's
  // process group and returns -1. Otherwise the exit code, or 128+signal.
  int Wait(absl::Duration timeout);
  void Signal(int sig);
  // stdout and stderr of baton-run, interleaved.
  std::string Output() const;

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int code_ = -1;
  std::string output_path_;
};

// Kills (SIGKILL) every process carrying `marker` and waits up to 5 s for
// them to disappear. Returns the pids that were still alive.
std::vector<pid_t> KillMarked(const std::string& marker);

// A unique marker for one test.
std::string NewMarker();

}  // namespace baton::launcher::testing

#endif  // BATON_TESTS_LAUNCHER_HARNESS_H_
