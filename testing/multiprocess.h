// Multi-process test helper: runs the same test binary again as N worker
// processes on loopback, each executing a named scenario.
//
//   BATON_SCENARIO(echo_job) { ... return 0; }         // in the test file
//   auto results = RunWorkers("echo_job", 3, absl::Seconds(60));
//   ExpectAllSucceeded(results);
//
// Contract: workers get RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a
// MASTER_PORT that was free when chosen; when another process took it first
// (rank 0 reports that its store server could not listen), the whole run is
// repeated on a new port, at most twice. RunWorkers always reaps every child:
// past the timeout it appends every live worker's thread stacks to that
// worker's output (through gdb, when installed), then SIGKILLs the whole group
// and marks the run timed out.
// Each worker's stdout+stderr is captured. The test binary's main must call
// MaybeRunScenario first (testing/multiprocess_main.cc does).
//
// Thread-safety: call RunWorkers from the test thread only.
#ifndef BATON_TESTING_MULTIPROCESS_H_
#define BATON_TESTING_MULTIPROCESS_H_

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "testing/ports.h"  // FreePort

namespace baton::testing {

struct WorkerResult {
  int rank = -1;
  int exit_code = -1;  // valid when signal == 0
  int signal = 0;      // terminating signal, or 0
  bool timed_out = false;
  std::string output;
};

using Scenario = std::function<int()>;
bool RegisterScenario(const std::string& name, Scenario fn);

#define BATON_SCENARIO(name)                                            \
  static int BatonScenario_##name();                                    \
  static const bool baton_scenario_registered_##name =                  \
      ::baton::testing::RegisterScenario(#name, &BatonScenario_##name); \
  static int BatonScenario_##name()

std::vector<WorkerResult> RunWorkers(const std::string& scenario, int world_size,
                                     absl::Duration timeout,
                                     const std::map<std::string, std::string>& extra_env = {});

// Runs the scenario named by --baton_scenario=NAME if present; returns the
// exit code to use, or -1 to run the tests normally.
int MaybeRunScenario(int argc, char** argv);

// Describes every result, for failure messages.
std::string Describe(const std::vector<WorkerResult>& results);

// Ends a worker that found a failure with `code`, after flushing stdout and
// stderr: std::_Exit skips the flush, and a worker's buffered output is what
// explains the failure.
[[noreturn]] inline void ExitWorker(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace baton::testing

// Scenario-side assertion: prints the failure and exits the worker with 1.
#define WCHECK(cond)                                                                \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ::baton::testing::ExitWorker(1);                                              \
    }                                                                               \
  } while (0)

#define WCHECK_OK(expr)                                                         \
  do {                                                                          \
    const auto& _s = (expr);                                                    \
    if (!_s.ok()) {                                                             \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, \
                   _s.ToString().c_str());                                      \
      ::baton::testing::ExitWorker(1);                                          \
    }                                                                           \
  } while (0)

#endif  // BATON_TESTING_MULTIPROCESS_H_
