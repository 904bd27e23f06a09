// The fork server of the multi-process tests (testing/multiprocess.h): starts
// scenario workers by forking a copy of the test binary that has already
// loaded its libraries, instead of executing the binary anew for each worker.
//
// Why: a process that links LibTorch spends about 0.5 s of CPU before main()
// (symbol lookups over some 340 shared objects, then LibTorch registering
// its operators). The multi-process suites start hundreds of workers, and
// on the 2-core machine that start-up was most of their CPU time.
//
// How: the first RunWorkers() of a test process spawns `/proc/self/exe
// --baton_fork_server` once, with one end of a socket pair as fd 3. That
// process does nothing but static initialization before its loop, so a child
// forked from it starts as a freshly executed worker would: the same
// binary, the environment and log file of the request (stdout and stderr),
// default signal dispositions and mask, no other open descriptors. The child
// runs the scenario and exits with its code through std::exit, as main()
// returning would (static destructors, LeakSanitizer).
//
// Guarantees:
// - Every child is reaped: by the server, which reports each exit status;
//   when the test process goes away (the socket closes) the server kills and
//   reaps every child it still has, then exits; a child whose server dies is
//   killed by the kernel (PR_SET_PDEATHSIG), and so is a server whose test
//   process dies.
// - Fork is only used where it is safe: a server that finds more than one
//   thread in itself (a sanitizer runtime's, a library's) refuses every
//   request, and the caller starts its workers with posix_spawn as before.
//   BATON_TEST_NO_FORK_SERVER=1 makes the caller do so always.
//
// Thread-safety: a ForkServer is used from one thread (RunWorkers' rule).
#ifndef BATON_TESTING_FORK_SERVER_H_
#define BATON_TESTING_FORK_SERVER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace baton::testing {

inline constexpr char kForkServerFlag[] = "--baton_fork_server";

class ForkServer {
 public:
  // Spawns the server process. UNAVAILABLE when it cannot be started.
  static absl::StatusOr<std::unique_ptr<ForkServer>> Start();
  ~ForkServer();  // closes the socket: the server kills its children and exits

  ForkServer(const ForkServer&) = delete;
  ForkServer& operator=(const ForkServer&) = delete;

  // Forks a worker running `scenario` with exactly `env` as its environment
  // and `log` as its stdout and stderr. Returns its pid. FAILED_PRECONDITION
  // when the server refuses to fork (see above); UNAVAILABLE when the server
  // is gone.
  absl::StatusOr<pid_t> Spawn(const std::string& scenario, const std::string& log,
                              const std::map<std::string, std::string>& env);

  // Asks the server to SIGKILL `pid` if that child has not been reaped yet.
  absl::Status Kill(pid_t pid);

  // Waits until `deadline` for the next child's exit. Returns false at the
  // deadline; an error when the server is gone.
  absl::StatusOr<bool> WaitExit(absl::Time deadline, pid_t* pid, int* wait_status);

 private:
  ForkServer(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  // Reads the reply to a request, keeping exit reports that come before it.
  absl::StatusOr<std::string> ReadReply(absl::Time deadline);

  pid_t pid_;
  int fd_;
  std::map<pid_t, int> early_exits_;  // exit reports read while waiting for a reply
};

// The server's side: runs the loop on fd 3 and exits. `run_scenario` runs a
// scenario by name in the forked child and returns its exit code.
[[noreturn]] void RunForkServer(int (*run_scenario)(const std::string& name));

}  // namespace baton::testing

#endif  // BATON_TESTING_FORK_SERVER_H_
