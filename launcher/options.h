// baton-run's command line: parsing and validation into LaunchOptions.
//
// Contract: ParseLaunchOptions() never exits or prints; a bad flag yields
// INVALID_ARGUMENT whose message names the flag (baton-run prints it with the
// usage and exits with code 2). Defaults, weakest first:
// - baton-run's own;
// - under Slurm (SLURM_JOB_ID and SLURM_NODEID set, no --standalone), the
//   node count, node rank, master address and run id from Slurm;
// - as the Kubeflow operators set them (docs/kubernetes.md): MASTER_ADDR and
//   MASTER_PORT, and RANK as the node rank, checked against WORLD_SIZE;
// - torchrun's PET_<FLAG> for every flag torchrun also has (torchrun_env.h);
//   a bad value names the variable;
// - the flags given, which always win.
// With --rdzv_endpoint HOST:PORT the rendezvous runs there: HOST is the
// master address. In an elastic job, the node HOST names hosts it (a loopback
// HOST: whichever node binds PORT first), whatever node rank it was given.
//
// Thread-safety: stateless functions.
#ifndef BATON_LAUNCHER_OPTIONS_H_
#define BATON_LAUNCHER_OPTIONS_H_

#include <optional>
#include <string>
#include <vector>

#include "base/tls.h"

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "env/env.h"
#include "launcher/torchrun_env.h"

namespace baton::launcher {

// What happens when a worker of a role fails.
enum class RestartPolicy {
  // Stop every worker on every node and rendezvous again (the default).
  kGroup,
  // Stop and restart only this role's workers, on every node; the other
  // roles keep running.
  kRole,
  // Restart only the worker that failed; every other worker keeps running
  // (e.g. RL observers, which the agent drops and admits again).
  kWorker,
};

// One kind of worker. Without --role there is one role, "default", running
// PROGRAM ARGS with --nproc_per_node workers per node.
struct RoleSpec {
  std::string name;
  // Workers of this role on each node.
  int count = 1;
  // Program and arguments; argv[0] is resolved through PATH at launch.
  std::vector<std::string> argv;
  RestartPolicy policy = RestartPolicy::kGroup;
};

struct LaunchOptions {
  int nproc_per_node = 1;
  // --nnodes N gives min_nodes == max_nodes == N; MIN:MAX is elastic.
  int min_nodes = 1;
  int max_nodes = 1;
  // Required for a static multi-node job; node rank 0 hosts the rendezvous
  // store. Elastic nodes other than the host may omit it.
  std::optional<int> node_rank;
  std::string master_addr = "127.0.0.1";
  // MASTER_PORT handed to workers. 0: a free port chosen per round.
  int master_port = 29500;
  // Port of the node agents' rendezvous store on the master node; never
  // handed to workers. Default: master_port + 1.
  int rdzv_port = 0;
  bool standalone = false;
  // A file holding the job token (a scheduler's secret, e.g. a Slurm or
  // Kubernetes secret mounted into the job). Read by baton-run's main; must
  // not be readable by group or others. Else BATON_JOB_TOKEN is used.
  std::string job_token_file;
  // Mutual TLS for the rendezvous store and the workers (--tls_ca,
  // --tls_cert, --tls_key, --tls_server_name; base/tls.h). Workers get them
  // as BATON_TLS_* with absolute paths.
  TlsFiles tls;
  int max_restarts = 0;
  absl::Duration monitor_interval = absl::Milliseconds(100);
  std::string run_id;
  std::string log_dir;
  bool tee = false;
  // Bound on each rendezvous wait (all nodes arriving, a round closing).
  absl::Duration rdzv_timeout = absl::Seconds(300);
  // Elastic jobs: after MIN nodes arrived, how long to wait for more.
  absl::Duration rdzv_last_call = absl::Seconds(5);
  // --partition_tolerance: how long a node may be cut off from the job's
  // store, and a worker from a peer, before either gives up (see
  // docs/peer_failures.md, "Partitions"). Unset: --heartbeat_timeout if
  // given (its old meaning), else kDefaultPartitionTolerance.
  std::optional<absl::Duration> partition_tolerance;
  // --heartbeat_timeout: the master node declares a node lost once its
  // heart-beat stood still this long. Unset: the partition tolerance plus
  // kLostNodeMargin, so a node cut off that long has fenced itself first.
  std::optional<absl::Duration> heartbeat_timeout;
  absl::Duration PartitionTolerance() const;
  absl::Duration HeartbeatTimeout() const;
  // Grace period between the stop signal and SIGKILL.
  absl::Duration stop_timeout = absl::Seconds(10);
  // --restart_wait: how long a worker's call to a peer found dead waits for
  // the peer's restart (BATON_RESTART_WAIT). Unset: kDefaultRestartWait
  // when some role restarts alone (policy role or worker) and restarts are
  // allowed, else zero (RestartWait()).
  std::optional<absl::Duration> restart_wait;
  // --rdzv_backend: torchrun's "c10d" (the default) or "static", which use
  // baton-run's own store on the master node, or "etcd".
  std::string rdzv_backend = "c10d";
  // --rdzv_backend etcd: every key of the job (the node agents' rendezvous
  // and the workers' store) lives in etcd at --rdzv_endpoint (default port
  // 2379), under /baton/<run id>/, so no process of the job serves it.
  struct Etcd {
    std::string endpoint;  // host:port; empty: not etcd
    // TLS to etcd: --rdzv_conf cacert=...,cert=...,key=... (torchrun's keys).
    TlsFiles tls;
    // etcd's authentication, from the environment only (never a flag):
    // BATON_ETCD_USER, and BATON_ETCD_PASSWORD or BATON_ETCD_PASSWORD_FILE.
    std::string user;
    std::string password;
    std::string password_file;
  } etcd;
  // An elastic node without a node rank on etcd: it hosts the rendezvous if
  // it claims the job's host key first.
  bool rdzv_host_by_claim = false;
  // --rdzv_endpoint: where the rendezvous runs (master_addr:rdzv_port).
  std::optional<RdzvEndpoint> rdzv_endpoint;
  // An elastic node whose endpoint is a loopback address: it hosts the
  // rendezvous if it binds the port first (torchrun does the same).
  bool rdzv_host_by_bind = false;
  // --metrics_port P: each worker serves its metrics (Prometheus's format,
  // GET /metrics) on port P + its local rank (BATON_METRICS_PORT); 0: off.
  int metrics_port = 0;
  // --node_metrics_port P: baton-run serves GET /metrics on port P, the
  // metrics of every worker on this node in one exposition (label rank);
  // workers then collect metrics (BATON_METRICS=1) without a port of their
  // own. 0: off.
  int node_metrics_port = 0;
  // --hang_timeout S: when no worker on this node made progress for S
  // seconds while some wait, baton-run writes the state report on its own
  // (docs/observability.md); zero: off.
  absl::Duration hang_timeout = absl::ZeroDuration();
  // --dump RUN_ID: instead of running a job, report the state of the
  // workers of the running job RUN_ID on this node, and exit.
  std::string dump_run_id;
  std::vector<RoleSpec> roles;
  // True when defaults came from Slurm variables (for the log line).
  bool from_slurm = false;
  // The variables that supplied defaults ("PET_NNODES=2", "RANK=1"), and the
  // PET_* variables set for torchrun flags baton-run has no use for; for the
  // log line.
  std::vector<std::string> from_env;
  std::vector<std::string> env_ignored;
  // --help was given (before PROGRAM); nothing else is filled in.
  bool help = false;

  bool elastic() const { return min_nodes != max_nodes; }
  // What workers get as BATON_RESTART_WAIT (see restart_wait).
  absl::Duration RestartWait() const;
  // Workers this node starts: the sum of the role counts.
  int local_world_size() const;
};

// Default of --restart_wait for jobs that restart a worker or a role alone:
// long enough for baton-run to notice a failure and start the successor,
// which rejoins without a rendezvous; each call's own deadline still bounds
// its wait.
inline constexpr absl::Duration kDefaultRestartWait = absl::Seconds(60);
// --partition_tolerance's default, and what the master node waits beyond
// it before it declares a silent node lost (HeartbeatTimeout()): by then
// the node, cut off for the tolerance, stopped its workers.
inline constexpr absl::Duration kDefaultPartitionTolerance = absl::Seconds(30);
inline constexpr absl::Duration kLostNodeMargin = absl::Seconds(10);

// Parses `args` (without argv[0]). `env` supplies the SLURM_*, PET_* and
// operator variables; `machine` resolves --nproc_per_node auto|cpu|gpu and
// the rendezvous host.
absl::StatusOr<LaunchOptions> ParseLaunchOptions(const std::vector<std::string>& args,
                                                 const EnvLookup& env, const MachineInfo& machine);
// The same on this machine (MachineInfo::Detect).
absl::StatusOr<LaunchOptions> ParseLaunchOptions(const std::vector<std::string>& args,
                                                 const EnvLookup& env);

// The --help text.
std::string LaunchUsage();

// The job token baton-run uses and hands to its workers (BATON_JOB_TOKEN):
// the contents of --job_token_file (trailing whitespace dropped), else
// `env_token` (BATON_JOB_TOKEN from baton-run's environment; may be null).
// - A job that spans nodes (max_nodes > 1) must get one from outside the
//   job, of at least 16 characters: FAILED_PRECONDITION saying how to
//   provide it otherwise. The rendezvous store then checks it on every call.
// - A one-node job may have none: returns "" and the node agent makes one,
//   which reaches the workers through their environment only.
// Errors: the file missing or unreadable (NOT_FOUND / PERMISSION_DENIED),
// readable by group or others (FAILED_PRECONDITION, "chmod 600"), empty, or
// different from a BATON_JOB_TOKEN that is also set (INVALID_ARGUMENT).
absl::StatusOr<std::string> ResolveJobToken(const LaunchOptions& options, const char* env_token);

// First host of a Slurm node list: "gpu[03-05,9],cpu1" -> "gpu03".
absl::StatusOr<std::string> FirstSlurmHost(absl::string_view nodelist);

}  // namespace baton::launcher

#endif  // BATON_LAUNCHER_OPTIONS_H_
