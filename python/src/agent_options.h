// What init_rpc's options become on the C++ side, without Python: the
// config the Python layer fills (python/baton/rpc/api.py) and its one
// conversion into rpc::AgentOptions.
//
// Contract: durations are seconds as Python gives them; Seconds() and
// AgentOptionsFrom state each field's rule for a value <= 0 once.
//
// Thread-safety: plain values and a pure function.
#ifndef BATON_PYTHON_SRC_AGENT_OPTIONS_H_
#define BATON_PYTHON_SRC_AGENT_OPTIONS_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "env/env.h"
#include "rpc/agent.h"
#include "rpc/function.h"

namespace baton::python {

// A timeout from Python: None is `fallback`; a value <= 0 is no limit
// (torch's convention).
absl::Duration Seconds(std::optional<double> s, absl::Duration fallback);

// Something installed on an agent's registry before the agent starts, and
// stopped once the agent stopped serving.
class RegistryInstaller {
 public:
  virtual ~RegistryInstaller() = default;
  virtual absl::Status Install(rpc::FunctionRegistry& registry) = 0;
  virtual absl::Status Stop() { return absl::OkStatus(); }
};

// What init_rpc's options set; unset (None) fields come from the
// environment or rpc::AgentOptions' defaults (AgentOptionsFrom).
struct AgentConfig {
  // Installed before the agent starts (a hosted PsServer).
  std::vector<std::shared_ptr<RegistryInstaller>> installers;
  std::string name;
  // tcp://host:port in init_method, in front of MASTER_ADDR and MASTER_PORT.
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  std::optional<int> rank;
  std::optional<int> world_size;
  // A dynamic group (torch's init_rpc without a world size):
  // rpc::AgentOptions::dynamic_group; world_size is then not read.
  bool dynamic_group = false;
  // Seconds; <= 0: no limit (torch's convention). shutdown_wait_for_peers
  // <= 0 waits as long as the missing workers live (torch's shutdown()).
  std::optional<double> rpc_timeout;
  std::optional<double> init_timeout;
  std::optional<double> shutdown_timeout;
  std::optional<double> shutdown_wait_for_peers;
  // Seconds; 0: no wait (calls to a dead worker fail at once); negative:
  // INVALID_ARGUMENT.
  std::optional<double> restart_wait;
  std::optional<int> parallelism;
  // TensorPipeRpcBackendOptions.device_maps and .devices, as device
  // indexes (-1: the host, rpc::kCpuDevice).
  std::map<std::string, std::map<int, int>> device_maps;
  std::vector<int> devices;
  // Drop-in mode: torch's agent starts right after the rendezvous (what
  // TorchScript's requests need; one that arrives first waits for it).
  bool torch_agent = false;
};

// The agent's options: `config`'s fields, the rest through FromEnv with
// `env` (MASTER_ADDR, RANK, ... where the config has none; null: the
// process environment); every Python-side option reaches rpc::AgentOptions
// here and nowhere else. INVALID_ARGUMENT for a negative restart_wait, and
// FromEnv's errors, annotated "init_rpc".
absl::StatusOr<rpc::AgentOptions> AgentOptionsFrom(const AgentConfig& config, const EnvLookup& env);

}  // namespace baton::python

#endif  // BATON_PYTHON_SRC_AGENT_OPTIONS_H_
