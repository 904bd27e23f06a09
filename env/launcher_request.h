// A worker's request to baton-run about a worker of its job: stop it so
// that its restart policy starts it again (restart), or stop it for good
// and go on without it (drop). This is how a group's supervisor
// (group/group.h, Supervisor::Restart and Drop) acts on a member it found
// dead or hung.
//
// Contract (the guarantees are labelled LR; tests in
// tests/launcher/unit_test.cc and, through baton-run,
// tests/group/supervision_test.sh):
// LR1 Every worker gets $BATON_LAUNCHER_REQUESTS from baton-run: a
//     directory of its node's baton-run, private to the job's user (0700). A
//     request is one file there, written under a temporary name and then
//     renamed to "*.req", so that baton-run never reads part of one.
// LR2 Each request is taken by baton-run at its next monitor tick
//     (--monitor_interval), removes the file, and carries it out on the node
//     that runs the worker it names, forwarding it through the rendezvous
//     store when that is another node. A request that cannot be read is
//     removed and logged, never carried out.
// LR3 Restart: the worker gets SIGTERM (SIGKILL after --stop_timeout) and
//     its end is a failure, whatever its exit code, handled by its role's
//     --restart_policy (worker: it alone starts again and rejoins; role: its
//     role; group: every worker). It takes one of --max_restarts.
// LR4 Drop: the worker gets SIGTERM (SIGKILL after --stop_timeout), and its
//     end is neither a failure nor a restart: the round goes on without it,
//     and it counts as done when baton-run decides whether every worker
//     succeeded. A drop lasts for the round (a group restart starts every
//     worker again).
// LR5 A request about a worker that is not running (already stopped,
//     restarting, or no worker of the job) is logged and does nothing.
//
// Thread-safety: stateless functions; SendLauncherRequest() may be called
// from any thread.
#ifndef BATON_ENV_LAUNCHER_REQUEST_H_
#define BATON_ENV_LAUNCHER_REQUEST_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

// The directory of a worker's requests (LR1).
inline constexpr char kEnvLauncherRequests[] = "BATON_LAUNCHER_REQUESTS";
// The suffix of a complete request's file.
inline constexpr char kLauncherRequestSuffix[] = ".req";

struct LauncherRequest {
  enum class Action { kRestart, kDrop };
  Action action = Action::kRestart;
  // The worker to act on (its global rank), and the one asking.
  int rank = -1;
  int from = -1;
  // Why, in words, for baton-run's log and the failure summary (one line;
  // line breaks are turned into spaces).
  std::string reason;
  // Unique to the request (SendLauncherRequest sets it): two alike requests
  // are two.
  std::string id;
};

absl::string_view ActionName(LauncherRequest::Action action);

// "action=restart\nrank=3\nfrom=0\nreason=...\nid=...\n".
std::string EncodeLauncherRequest(const LauncherRequest& request);
// INVALID_ARGUMENT naming the field that is missing or malformed.
absl::StatusOr<LauncherRequest> DecodeLauncherRequest(absl::string_view text);

// Writes `request` into `dir` (LR1), with a fresh id. INTERNAL with the path
// and errno text if it cannot.
absl::Status SendLauncherRequest(const std::string& dir, const LauncherRequest& request);
// The same into $BATON_LAUNCHER_REQUESTS; FAILED_PRECONDITION when it is not
// set (the process was not started by baton-run).
absl::Status SendLauncherRequest(const LauncherRequest& request);

}  // namespace baton

#endif  // BATON_ENV_LAUNCHER_REQUEST_H_
