// NodeAgent's implementation (launcher/node_agent.h), shared by the files
// that define it: node_agent.cc (set-up, the rounds, the summary) and
// node_agent_recovery.cc (failures, restarts, the host's claim and checks).
// Internal to the launcher; the contract is node_agent.h's.
//
// Thread-safety: as NodeAgent's: Run() on the main thread; RequestStop()
// and RequestStateReport() from any thread (they take mu_).
#ifndef BATON_LAUNCHER_INTERNAL_NODE_AGENT_IMPL_H_
#define BATON_LAUNCHER_INTERNAL_NODE_AGENT_IMPL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "env/launcher_request.h"
#include "launcher/internal/output_pump.h"
#include "launcher/internal/state_report.h"
#include "launcher/internal/worker_group.h"
#include "launcher/node_agent.h"
#include "launcher/options.h"
#include "launcher/rendezvous.h"
#include "obs/http_server.h"
#include "store/etcd_store.h"
#include "store/store_server.h"

namespace baton::launcher {
namespace internal {

// etcd, elastic: the job's host key; its value names the node that hosts.
inline constexpr char kHostKey[] = "rdzv/host";
// Lines of a failed worker's output shown in the summary.
inline constexpr int kSummaryTailLines = 30;
// How long the master node keeps the store up for the others to read the
// final outcome.
inline constexpr absl::Duration kExitAckTimeout = absl::Seconds(10);
// Bound on reading a key that its writer sets right after another one.
inline constexpr absl::Duration kFollowUpTimeout = absl::Seconds(30);
// The longest pause between two heart-beats of a node.
inline constexpr absl::Duration kHeartbeatPeriodMax = absl::Seconds(1);

// "baton-run: <text>" on stderr, in one write.
void Log(absl::string_view text);
std::string HostName();
// A store read that timed out: the key is not there (yet).
bool IsMissingKey(const absl::Status& s);

}  // namespace internal

// How one round ended, as seen by this node.
struct RoundOutcome {
  // "success", "failure", "node_lost", "node_joined", "node_left",
  // "shutdown"; "error" when this node lost the store or could not go on.
  std::string kind;
  Record record;
  // Failures: the restart number the failure consumed; final when it is
  // above --max_restarts.
  int restart = 0;
  bool final = false;
  // Set when this node itself was signalled.
  int local_signal = 0;
  absl::Status error;
};

class NodeAgent::Impl {
 public:
  Impl(LaunchOptions options, std::string job_token)
      : o_(std::move(options)), env_token_(std::move(job_token)) {}

  ~Impl();

  void RequestStop(int signal) {
    absl::MutexLock lock(&mu_);
    if (stop_signal_ == 0) stop_signal_ = signal;
  }

  void RequestStateReport(std::string reason) {
    absl::MutexLock lock(&mu_);
    if (watcher_ != nullptr) {
      watcher_->RequestReport(std::move(reason));
    } else {
      internal::Log("no state report yet: the workers have not started");
    }
  }

  int Run();

 private:
  int PendingSignal() {
    absl::MutexLock lock(&mu_);
    return stop_signal_;
  }
  // Sleeps for `d` or until a stop is requested.
  void Tick(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    auto requested = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_signal_ != 0; };
    mu_.AwaitWithTimeout(absl::Condition(&requested), d);
  }

  absl::Status Setup();
  absl::StatusOr<int> PickMasterPort();
  RoundOutcome RunRound(const RoundInfo& round);
  // A worker of a group-policy role failed: propose the end of the round.
  absl::Status ReportFailure(const RoundInfo& round, int worker);
  Record FailureRecord(const RoundInfo& round, int worker);
  // Role-policy failures: propose and, when seen, carry out a role restart.
  absl::Status ReportRoleFailure(const RoundInfo& round, int role, int gen, int worker);
  // --restart_policy ROLE=worker: restarts worker `i` alone, or ends the
  // round with its failure when no restart is left.
  absl::Status RestartWorker(const RoundInfo& round, int i);
  absl::StatusOr<bool> MaybeRestartRole(const RoundInfo& round, int role, int* gen,
                                        bool* reported_done);
  // The workers' requests (env/launcher_request.h): those left in this
  // node's directory and those forwarded through the store (LR2), then
  // SIGKILL for stops that outlived --stop_timeout.
  absl::Status HandleRequests(const RoundInfo& round);
  // Carries out a request about a worker of this node, if it is one (LR5).
  void CarryOut(const LauncherRequest& request);
  // Removes the requests left from an earlier round, before it starts.
  void DiscardRequests();
  absl::Status HostChecks(const RoundInfo& round);
  absl::Status WatchHost(const RoundInfo& round);
  absl::StatusOr<bool> ClaimHost();
  absl::StatusOr<RoundOutcome> ReadEnd(const RoundInfo& round);
  // A node other than the host read the job's outcome.
  void AckExit(int64_t round);
  // The host, at the end: waits (bounded) until the other nodes read the
  // outcome, then stops the served store or revokes the job's etcd keys.
  void FinishAsHost(int64_t round, int others);
  absl::StatusOr<std::unique_ptr<store::EtcdStore>> ConnectEtcd();
  void PrintSummary(const RoundOutcome& outcome);
  // A store failure of RunRound's `doing`; for a node that reaches the
  // rendezvous store over the network and got no answer within the
  // partition tolerance, the error says that this node is cut off and
  // fences itself.
  absl::Status CutOff(const absl::Status& s, absl::string_view doing) const;
  // The bound on a store call over the network (built-in store or etcd).
  absl::Duration StoreCallTimeout() const;

  const LaunchOptions o_;
  // --node_rank, or 0 once this node won the rendezvous port
  // (rdzv_host_by_bind); -1: an elastic node without one.
  int node_rank_ = o_.node_rank.value_or(-1);
  const std::string env_token_;
  std::string run_id_;
  std::string job_token_;
  std::string temp_dir_;
  std::string state_dir_;     // internal/state_report.h; empty: none
  std::string requests_dir_;  // env/launcher_request.h
  // The next slot of the round's forwarded requests to read, and when the
  // store was last read for them.
  int64_t next_request_slot_ = 0;
  absl::Time last_request_poll_ = absl::InfinitePast();
  std::string host_name_ = internal::HostName();
  int last_master_port_ = 0;

  std::unique_ptr<store::StoreServer> server_;
  std::unique_ptr<store::Store> own_store_;
  store::EtcdStore* etcd_ = nullptr;  // own_store_, on --rdzv_backend etcd
  // Host failover (etcd, elastic nodes without ranks): the host is whoever
  // holds the job's "host" key; this node's claim value.
  bool dynamic_host_ = false;
  std::string host_claim_;

  store::Store* store_ = nullptr;
  std::unique_ptr<Rendezvous> rdzv_;
  internal::OutputPump pump_;
  std::unique_ptr<internal::WorkerGroup> group_;

  // Host: heartbeat value and when it last changed, per group rank.
  std::vector<std::pair<int64_t, absl::Time>> heartbeats_;
  absl::Time last_heartbeat_sent_ = absl::InfinitePast();

  absl::Mutex mu_;
  int stop_signal_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<internal::StateWatcher> watcher_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<obs::HttpServer> node_metrics_;  // --node_metrics_port
};

}  // namespace baton::launcher

#endif  // BATON_LAUNCHER_INTERNAL_NODE_AGENT_IMPL_H_
