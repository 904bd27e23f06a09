// The environment contract between baton-run and the processes it starts.
//
// Contract: baton-run sets the variables below on every worker it starts.
// Programs (and the RPC agent's init-from-environment) read them through
// ReadLaunchEnv(), which fails with INVALID_ARGUMENT naming the variable when
// a value is malformed or out of range, and with NOT_FOUND naming the
// variable when a required one is missing. is_elastic_launched() tells a
// program whether baton-run started it at all.
//
// A worker may describe why it failed by writing a structured error file
// (JSON) at $BATON_ERROR_FILE with WriteErrorFile(); baton-run prints its
// content in the failure summary.
//
// This library depends only on Abseil (no gRPC, no LibTorch) so that anything
// may link it cheaply.
//
// Thread-safety: stateless functions. ReadLaunchEnv() reads the process
// environment with getenv() and must not race with setenv()/putenv().
#ifndef BATON_ENV_ENV_H_
#define BATON_ENV_ENV_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

// Names of the variables baton-run sets on each worker.
inline constexpr char kEnvRank[] = "RANK";
inline constexpr char kEnvLocalRank[] = "LOCAL_RANK";
inline constexpr char kEnvWorldSize[] = "WORLD_SIZE";
inline constexpr char kEnvLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kEnvGroupRank[] = "GROUP_RANK";
inline constexpr char kEnvGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kEnvMasterAddr[] = "MASTER_ADDR";
inline constexpr char kEnvMasterPort[] = "MASTER_PORT";
inline constexpr char kEnvRunId[] = "BATON_RUN_ID";
inline constexpr char kEnvRestartCount[] = "BATON_RESTART_COUNT";
inline constexpr char kEnvMaxRestarts[] = "BATON_MAX_RESTARTS";
inline constexpr char kEnvJobToken[] = "BATON_JOB_TOKEN";
// Mutual TLS between hosts (base/tls.h), set only when baton-run has --tls_*.
inline constexpr char kEnvTlsCa[] = "BATON_TLS_CA";
inline constexpr char kEnvTlsCert[] = "BATON_TLS_CERT";
inline constexpr char kEnvTlsKey[] = "BATON_TLS_KEY";
inline constexpr char kEnvTlsServerName[] = "BATON_TLS_SERVER_NAME";
// The job's store on etcd (store/etcd_store.h) instead of one served by rank
// 0, set by baton-run --rdzv_backend etcd: the endpoint (host:port), the key
// prefix of this round's workers, and etcd's own credentials and TLS files.
inline constexpr char kEnvStoreEtcd[] = "BATON_STORE_ETCD";
inline constexpr char kEnvStorePrefix[] = "BATON_STORE_PREFIX";
inline constexpr char kEnvEtcdUser[] = "BATON_ETCD_USER";
inline constexpr char kEnvEtcdPassword[] = "BATON_ETCD_PASSWORD";
inline constexpr char kEnvEtcdPasswordFile[] = "BATON_ETCD_PASSWORD_FILE";
inline constexpr char kEnvEtcdCa[] = "BATON_ETCD_CA";
inline constexpr char kEnvEtcdCert[] = "BATON_ETCD_CERT";
inline constexpr char kEnvEtcdKey[] = "BATON_ETCD_KEY";
inline constexpr char kEnvRole[] = "BATON_ROLE";
inline constexpr char kEnvRoleRank[] = "BATON_ROLE_RANK";
inline constexpr char kEnvRoleWorldSize[] = "BATON_ROLE_WORLD_SIZE";
inline constexpr char kEnvErrorFile[] = "BATON_ERROR_FILE";
// "1" when only this worker or its role was restarted (--restart_policy
// ROLE=worker or ROLE=role):
// the other workers kept running, so it rejoins their job instead of
// rendezvousing anew.
inline constexpr char kEnvRejoin[] = "BATON_REJOIN";
// Seconds a call to a worker found dead waits for its restarted successor
// (rpc::AgentOptions::restarts.wait, P7-P8 of docs/peer_failures.md).
// baton-run sets it for jobs that restart a worker or a role alone
// (--restart_wait); "0" or unset: such calls fail at once.
inline constexpr char kEnvRestartWait[] = "BATON_RESTART_WAIT";
// Seconds a peer may stay silent (a network partition) before it is
// reported dead (rpc::AgentOptions::timeouts.partition_tolerance, "Partitions" in
// docs/peer_failures.md); baton-run sets it from --partition_tolerance.
inline constexpr char kEnvPartitionTolerance[] = "BATON_PARTITION_TOLERANCE";
// Set to "1" by baton-run; its presence is what is_elastic_launched() checks.
inline constexpr char kEnvLaunched[] = "BATON_ELASTIC_LAUNCHED";

// What baton-run told this worker.
struct LaunchEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  // The node's rank in this rendezvous round and the number of nodes.
  int group_rank = 0;
  int group_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  std::string run_id;
  int restart_count = 0;
  int max_restarts = 0;
  // Empty when the launcher did not pass one (never the case for baton-run).
  std::string job_token;
  // Role name ("default" without --role), rank within the role, role size.
  std::string role = "default";
  int role_rank = 0;
  int role_world_size = 1;
  // Where this worker may write its structured error file; may be empty.
  std::string error_file;
  // BATON_REJOIN: this worker alone (its role) was restarted.
  bool rejoin = false;
};

// True when baton-run started this process (BATON_ELASTIC_LAUNCHED=1).
bool is_elastic_launched();

// Returns the value of a variable, or nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(absl::string_view)>;

// Reads and validates the variables. RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT are required; the others default to the values a single
// process would have (local rank = rank, role "default", ...).
// Checks: integers are decimal, 0 <= rank < world_size, 0 <= local_rank <
// local_world_size, 0 <= role_rank < role_world_size, 1 <= port <= 65535,
// 0 <= restart_count.
absl::StatusOr<LaunchEnv> ReadLaunchEnv(const EnvLookup& lookup);
// The same, from the process environment.
absl::StatusOr<LaunchEnv> ReadLaunchEnv();

// The structured error file a worker may leave behind.
struct ErrorReport {
  std::string message;
  // A short category, e.g. the exception type; optional.
  std::string error_type;
  // Free text, e.g. a stack trace; optional.
  std::string details;
};

// Writes `report` as JSON to `path` (atomically: a temporary file, then
// rename), adding the rank, role and time from the environment when known:
//   {"message": ..., "error_type": ..., "details": ..., "rank": 3,
//    "role": "trainer", "pid": 1234, "timestamp": "2024-...Z"}
// Fails with the path and errno text if the file cannot be written.
absl::Status WriteErrorFile(const std::string& path, const ErrorReport& report);
// Writes to $BATON_ERROR_FILE; FAILED_PRECONDITION when it is not set.
absl::Status WriteErrorFile(const ErrorReport& report);

// JSON string literal for `s` (quotes included), escaping per RFC 8259.
std::string JsonQuote(absl::string_view s);

}  // namespace baton

#endif  // BATON_ENV_ENV_H_
