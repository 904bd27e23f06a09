// torchrun's environment, as cluster engines set it for baton-run.
//
// torchrun takes the default of every flag from PET_<FLAG> (an explicit flag
// wins). The Kubeflow training operator's PyTorchJob (v1) and Kubeflow
// Trainer's TrainJob (v2, on JobSet) start pods with those variables, and
// PyTorchJob also with MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK
// (docs/kubernetes.md lists what each sets). This file turns them into
// baton-run's flags and resolves the values that depend on the machine.
//
// Contract:
// - TorchrunEnvFlags() maps each PET_* variable that is set to the baton-run
//   flag with torchrun's meaning, in a fixed order; the variables of torchrun
//   flags baton-run has no use for are listed, not applied.
// - The parsers return INVALID_ARGUMENT naming the flag and the value.
//
// Thread-safety: stateless functions; MachineInfo::Detect reads /proc and
// the host name.
#ifndef BATON_LAUNCHER_TORCHRUN_ENV_H_
#define BATON_LAUNCHER_TORCHRUN_ENV_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "env/env.h"

namespace baton::launcher {

// What the environment's values resolve against (injected in tests).
struct MachineInfo {
  // gethostname(): a pod's name under Kubernetes.
  std::string hostname;
  // Logical CPUs, as Python's os.cpu_count() counts them.
  int cpu_count = 1;
  // NVIDIA GPUs visible to the workers: CUDA_VISIBLE_DEVICES's entries when
  // it is set, else the driver's (/proc/driver/nvidia/gpus); 0 without one.
  int gpu_count = 0;

  static MachineInfo Detect(const EnvLookup& env);
};

// One flag default that a variable supplies.
struct EnvFlag {
  std::string variable;  // e.g. "PET_NNODES"
  std::string flag;      // baton-run's flag, e.g. "nnodes"
  std::string value;
};

// The PET_* variables that are set, as baton-run flags. Variables of torchrun
// flags that have no meaning for baton-run (PET_START_METHOD, PET_MODULE,
// PET_NO_PYTHON, PET_RUN_PATH, PET_REDIRECTS, PET_LOCAL_RANKS_FILTER,
// PET_LOCAL_ADDR, PET_LOGS_SPECS, and PET_ROLE, which torchrun uses as a
// label while baton-run's --role declares NAME:COUNT) go to `ignored`.
std::vector<EnvFlag> TorchrunEnvFlags(const EnvLookup& env, std::vector<std::string>* ignored);

// --nproc_per_node: a count, or torchrun's "cpu" (the logical CPUs), "gpu"
// (the GPUs; an error without one) or "auto" (the GPUs if any, else the
// CPUs).
absl::StatusOr<int> ResolveNprocPerNode(absl::string_view value, const MachineInfo& machine);

// --rdzv_endpoint: HOST[:PORT], [IPV6]:PORT; torchrun's default port is
// 29400.
struct RdzvEndpoint {
  std::string host;
  int port = 29400;
  bool port_given = false;  // else the backend's default (etcd: 2379)
};
absl::StatusOr<RdzvEndpoint> ParseRdzvEndpoint(absl::string_view value);

// Whether `host` is "localhost" or a loopback address.
bool IsLoopback(absl::string_view host);

// Whether `host` names this machine as torchrun's rendezvous decides which
// node hosts: a loopback address or "localhost", or the host name (its first
// label compared, so "job-worker-0.job" matches the pod "job-worker-0").
bool IsThisMachine(absl::string_view host, const MachineInfo& machine);

// --rdzv_conf KEY=VALUE,...: what baton-run takes from torchrun's keys.
struct RdzvConf {
  // join_timeout (c10d) or timeout (static, etcd): --rdzv_timeout.
  std::optional<absl::Duration> join_timeout;
  // last_call_timeout: --rdzv_last_call.
  std::optional<absl::Duration> last_call_timeout;
  // torchrun's etcd keys: cacert, cert, key (TLS to etcd, paths made
  // absolute) and protocol (http or https).
  std::string etcd_ca_file;
  std::string etcd_cert_file;
  std::string etcd_key_file;
  std::string protocol;
  // torchrun's keys that baton-run accepts and has no use for.
  std::vector<std::string> ignored;
};
absl::StatusOr<RdzvConf> ParseRdzvConf(absl::string_view value);

}  // namespace baton::launcher

#endif  // BATON_LAUNCHER_TORCHRUN_ENV_H_
