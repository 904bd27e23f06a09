// WorkerGroup: this node's workers for one rendezvous round — their ranks,
// environment, processes, logs and exit status.
//
// Ranks are assigned role by role over the whole job: role i has
// count_i * nodes workers; its role ranks are group_rank * count_i + j on
// each node, and its global ranks follow those of the roles before it. With
// one role ("default") this is the usual RANK = group_rank *
// nproc_per_node + LOCAL_RANK.
//
// Thread-safety: not thread-safe; owned and used by the agent's main thread
// (Start() forks, which must happen on the main thread).
#ifndef BATON_LAUNCHER_INTERNAL_WORKER_GROUP_H_
#define BATON_LAUNCHER_INTERNAL_WORKER_GROUP_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "launcher/internal/output_pump.h"
#include "launcher/internal/process.h"
#include "launcher/options.h"
#include "launcher/rendezvous.h"

namespace baton::launcher::internal {

struct Worker {
  // Fixed for a round.
  int role_index = 0;
  int local_rank = 0;
  int rank = 0;
  int role_rank = 0;
  int role_world_size = 1;
  std::string log_path;    // empty without --log_dir
  std::string error_file;  // BATON_ERROR_FILE
  // Per incarnation.
  int restart_count = 0;
  bool rejoin = false;  // restarted with its role only
  pid_t pid = -1;
  int64_t stream = -1;
  bool running = false;
  absl::Time start_time;
  ExitInfo exit;
  // Stopped at a worker's request (env/launcher_request.h): why, in words
  // (empty: not), whether for good (LR4: its end is no failure), and when
  // SIGKILL follows the SIGTERM it got.
  std::string stop_reason;
  bool dropped = false;
  absl::Time kill_at = absl::InfiniteFuture();
};

// Settings that stay the same for the whole job.
struct WorkerGroupConfig {
  const LaunchOptions* options = nullptr;  // outlives the group
  std::string run_id;
  std::string job_token;
  std::string master_addr;
  // Directory for error files (the log dir, or a private temporary one).
  std::string error_dir;
  // Where workers serve their state (internal/state_report.h); empty: none.
  std::string state_dir;
  // Where workers leave their requests (env/launcher_request.h); empty: none.
  std::string requests_dir;
};

class WorkerGroup {
 public:
  WorkerGroup(WorkerGroupConfig config, OutputPump* pump);
  ~WorkerGroup();

  // Lays out this node's workers for `round`. REQUIRES: none running.
  void Configure(const RoundInfo& round);

  // Starts the workers of `role` (-1: every role) with BATON_RESTART_COUNT
  // `restart_count`; a role's restart leaves out its workers dropped in
  // this round (LR4). On error, workers already started keep running (the
  // caller stops the group).
  absl::Status Start(int role, int restart_count);

  // Starts worker `i` again, alone (BATON_REJOIN=1). REQUIRES: it ended.
  absl::Status StartWorker(int i, int restart_count);

  // Reaps workers that ended; returns the indices of those that ended since
  // the last call, in order of their exit.
  std::vector<int> Poll();

  // Stops the running workers of `role` (-1: every role): `signal` to each
  // process group, SIGKILL after `grace`, and reaps them. Bounded.
  void Stop(int role, int signal, absl::Duration grace);

  // Stops running worker `i` at a request (env/launcher_request.h, LR3 and
  // LR4): SIGTERM now, SIGKILL once `kill_at` has passed (EscalateStops).
  // `drop`: for good. A worker already being stopped on request keeps the
  // first request (a drop stays a drop); one that exited (reaped or not) is
  // not running.
  enum class StopOutcome { kStopping, kAlreadyStopping, kNotRunning };
  StopOutcome StopOnRequest(int i, bool drop, std::string reason, absl::Time kill_at);
  // SIGKILL to the workers stopped on request that outlived their kill_at.
  void EscalateStops(absl::Time now);
  // The index of this node's worker of global rank `rank`, or -1.
  int IndexOfRank(int rank) const;

  // Whether every worker's last incarnation exited with code 0 (or was
  // dropped, LR4).
  bool AllSucceeded() const;
  bool AnyRunning() const;

  const std::vector<Worker>& workers() const { return workers_; }
  const Worker& worker(int i) const { return workers_[i]; }

  // The last lines of worker `i`'s output (waits briefly for its pipes to
  // drain) and the content of its error file, if it wrote one.
  std::string Tail(int i, int max_lines);
  std::string ErrorFileContent(int i) const;

 private:
  std::vector<std::string> Environment(const Worker& w) const;
  void Reaped(Worker& w);
  absl::Status StartOne(int i, int restart_count, bool rejoin);

  const WorkerGroupConfig config_;
  OutputPump* const pump_;
  RoundInfo round_;
  std::vector<Worker> workers_;
};

}  // namespace baton::launcher::internal

#endif  // BATON_LAUNCHER_INTERNAL_WORKER_GROUP_H_
