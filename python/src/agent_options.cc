// AgentOptionsFrom and Seconds (agent_options.h).
#include "python/src/agent_options.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status.h"

namespace baton::python {

absl::Duration Seconds(std::optional<double> s, absl::Duration fallback) {
  if (!s.has_value()) return fallback;
  if (*s <= 0) return absl::InfiniteDuration();
  return absl::Seconds(*s);
}

absl::StatusOr<rpc::AgentOptions> AgentOptionsFrom(const AgentConfig& config,
                                                   const EnvLookup& env) {
  const int max_ranks = rpc::AgentOptions().max_ranks;
  if (config.dynamic_group && config.rank.has_value() &&
      (*config.rank < 0 || *config.rank >= max_ranks)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init_rpc: rank ", *config.rank, " is outside [0, ", max_ranks,
        "): without a world size the group is dynamic, and its ranks are below ", max_ranks));
  }
  auto lookup = [&](absl::string_view var) -> std::optional<std::string> {
    if (var == kEnvRank && config.rank.has_value()) return std::to_string(*config.rank);
    if (var == kEnvWorldSize && config.world_size.has_value()) {
      return std::to_string(*config.world_size);
    }
    // A dynamic group has no size: the parser checks the rank against the
    // bound of its ranks instead.
    if (var == kEnvWorldSize && config.dynamic_group) return std::to_string(max_ranks);
    if (var == "BATON_WORKER_NAME" && !config.name.empty()) return config.name;
    if (var == kEnvMasterAddr && config.master_addr.has_value()) return *config.master_addr;
    if (var == kEnvMasterPort && config.master_port.has_value()) {
      return std::to_string(*config.master_port);
    }
    if (env) return env(var);
    const char* v = std::getenv(std::string(var).c_str());
    return v == nullptr ? std::nullopt : std::optional<std::string>(v);
  };
  absl::StatusOr<rpc::AgentOptions> options = rpc::AgentOptions::FromEnv("worker", lookup);
  if (!options.ok()) return Annotate(options.status(), "init_rpc");
  if (config.dynamic_group) {
    options->dynamic_group = true;
    options->world_size = -1;
  }
  // Each duration's rule for a value <= 0, here and nowhere else.
  for (auto [seconds, into] : {std::pair{&config.rpc_timeout, &options->timeouts.rpc},
                               std::pair{&config.init_timeout, &options->timeouts.init},
                               std::pair{&config.shutdown_timeout, &options->timeouts.shutdown}}) {
    *into = Seconds(*seconds, *into);
  }
  // Waits as long as the missing workers live (torch's shutdown()).
  options->timeouts.shutdown_wait_for_peers =
      Seconds(config.shutdown_wait_for_peers, options->timeouts.shutdown_wait_for_peers);
  if (config.restart_wait.has_value()) {
    // Zero: calls to a dead worker fail at once.
    if (*config.restart_wait < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init_rpc: restart_wait is ", *config.restart_wait, " s; it must be >= 0 seconds"));
    }
    options->restarts.wait = absl::Seconds(*config.restart_wait);
  }
  if (config.parallelism.has_value()) options->threads.parallelism = *config.parallelism;
  options->devices.maps = config.device_maps;
  options->devices.devices = config.devices;
  options->front_ends = {"python"};
  return options;
}

}  // namespace baton::python
