// What ParseLaunchOptions (launcher/options.h) builds up while it reads the
// flags and the environment, and the steps that read the environment
// (launcher/options_env.cc). Internal to the launcher.
//
// Each Apply* step fills only what the flags left unset (GivenBy says who set
// what), and fails with INVALID_ARGUMENT naming the flag or the variable
// that was wrong.
//
// Thread-safety: none; one parse on one thread.
#ifndef BATON_LAUNCHER_INTERNAL_PARSE_STATE_H_
#define BATON_LAUNCHER_INTERNAL_PARSE_STATE_H_

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "launcher/options.h"
#include "launcher/torchrun_env.h"

namespace baton::launcher::internal {

// What the flags said, beyond the options themselves: which defaults they
// override, and the restart policies to apply once every role is known.
struct ParseState {
  LaunchOptions o;
  MachineInfo machine;
  // Who gave each flag: "" for the command line, else the variable's name.
  std::map<std::string, std::string> given_by;
  bool nproc_set = false;
  bool nnodes_set = false;
  bool addr_set = false;
  bool run_id_set = false;
  std::vector<std::pair<std::string, std::string>> policies;
};

// INVALID_ARGUMENT "--<flag>: <why>".
absl::Status FlagError(absl::string_view flag, absl::string_view why);
// An integer in [min, max], or FlagError.
absl::StatusOr<int> ParseInt(absl::string_view flag, absl::string_view value, int min, int max);
// Who gave `flag`: "" for the command line, a variable's name, or nullopt.
std::optional<std::string> GivenBy(const ParseState& st, const std::string& flag);
bool OnCommandLine(const ParseState& st, const std::string& flag);

// Step 1b: a PyTorchJob's MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK.
absl::Status ApplyOperatorEnv(const EnvLookup& env, ParseState& st);
// Step 2b: WORLD_SIZE as the training operator sets it, against the nodes
// and processes.
absl::Status CheckOperatorWorldSize(const EnvLookup& env, const ParseState& st);
// Step 4b: under Slurm, what the flags left unset comes from the job.
absl::Status ApplySlurm(const EnvLookup& env, ParseState& st);
// Step 4c (etcd): the job's keys live in etcd at --rdzv_endpoint.
absl::Status ApplyEtcd(const EnvLookup& env, ParseState& st);
// Step 4c: --rdzv_endpoint HOST:PORT is the master node's rendezvous.
absl::Status ApplyRdzvEndpoint(ParseState& st);

}  // namespace baton::launcher::internal

#endif  // BATON_LAUNCHER_INTERNAL_PARSE_STATE_H_
