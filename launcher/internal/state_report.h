// baton-run's side of the hang report (obs/state.h): where the workers of a
// run serve their state on this node, how baton-run collects and merges
// the snapshots, and the watcher that writes a report on SIGUSR1 or when
// the node stops making progress (--hang_timeout).
//
// Layout: the workers of run R on this node serve GET /state on Unix
// sockets "<StateDir(R)>/rank<N>.sock" (BATON_STATE_SOCKET); the directory
// also holds "report_dir", the directory reports are written to (the log
// dir, or the state dir's "reports" beside it). `baton-run --dump R` from
// another shell finds everything there. The directory is private (0700).
//
// Thread-safety: the free functions are thread-compatible; StateWatcher's
// RequestReport may be called from any thread.
#ifndef BATON_LAUNCHER_INTERNAL_STATE_REPORT_H_
#define BATON_LAUNCHER_INTERNAL_STATE_REPORT_H_

#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/state.pb.h"

namespace baton::launcher::internal {

std::string StateDir(const std::string& run_id);
std::string StateSocket(const std::string& state_dir, int rank);
// Creates the directory (0700) and records where reports go.
absl::Status PrepareStateDir(const std::string& state_dir, const std::string& report_dir);
// The directory reports of the run go to.
std::string ReportDirOf(const std::string& state_dir);
// The sockets in the directory, by rank.
std::vector<std::pair<int, std::string>> StateSockets(const std::string& state_dir);

// Asks every socket in the directory for its worker's state (in parallel,
// each within `timeout`) and merges the answers (obs::BuildReport); a
// worker that does not answer is listed with the reason. With `whole_job`,
// the ranks of the job that serve no socket here (they run on other nodes)
// are asked for by one local worker through RPC (GET /job_state), so the
// report covers the job; those it cannot reach are listed as unanswered.
proto::StateReport CollectReport(const std::string& run_id, const std::string& reason,
                                 const std::string& state_dir, absl::Duration timeout,
                                 bool whole_job = true);

// Writes the report as JSON ("state_report_<time>.json") into `dir`;
// returns the path.
absl::StatusOr<std::string> WriteReport(const proto::StateReport& report, const std::string& dir);

// The metrics of every worker serving in the directory, merged into one
// exposition with a `rank` label (--node_metrics_port), plus baton-run's
// own gauges of how many answered.
std::string ScrapeNode(const std::string& state_dir, absl::Duration timeout);

// `baton-run --dump RUN_ID`: prints the report of the run's workers on this
// node to stdout, writes its JSON, and returns the exit code (1 when no
// worker of the run is found here).
int DumpState(const std::string& run_id);

class StateWatcher {
 public:
  struct Options {
    std::string run_id;
    std::string state_dir;
    absl::Duration hang_timeout = absl::ZeroDuration();  // zero: reports on request only
    std::function<void(const std::string&)> log;
  };
  explicit StateWatcher(Options options);
  ~StateWatcher();  // stops and joins
  StateWatcher(const StateWatcher&) = delete;
  StateWatcher& operator=(const StateWatcher&) = delete;

  // Writes a report soon, on the watcher's thread.
  void RequestReport(std::string reason);

 private:
  void Loop();
  void Report(const proto::StateReport& report);

  const Options o_;
  absl::Mutex mu_;
  std::vector<std::string> requests_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace baton::launcher::internal

#endif  // BATON_LAUNCHER_INTERNAL_STATE_REPORT_H_
