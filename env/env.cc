#include "env/env.h"

#include <unistd.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/file_io.h"

namespace baton {
namespace {

std::optional<std::string> ProcessLookup(absl::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// Reads an integer variable. `required`: NOT_FOUND when unset; otherwise
// `fallback` is used.
absl::StatusOr<int> ReadInt(const EnvLookup& lookup, absl::string_view name, bool required,
                            int fallback) {
  std::optional<std::string> v = lookup(name);
  if (!v.has_value()) {
    if (required) {
      return absl::NotFoundError(
          absl::StrCat("environment variable ", name,
                       " is not set (start the program with baton-run, or set it)"));
    }
    return fallback;
  }
  int out = 0;
  if (!absl::SimpleAtoi(*v, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", *v, "' is not an integer"));
  }
  return out;
}

}  // namespace

bool is_elastic_launched() {
  std::optional<std::string> v = ProcessLookup(kEnvLaunched);
  return v.has_value() && *v == "1";
}

absl::StatusOr<LaunchEnv> ReadLaunchEnv(const EnvLookup& lookup) {
  LaunchEnv env;
#define BATON_READ_INT(field, name, required, fallback) \
  do {                                                  \
    auto v = ReadInt(lookup, name, required, fallback); \
    if (!v.ok()) return v.status();                     \
    env.field = *v;                                     \
  } while (0)
  BATON_READ_INT(rank, kEnvRank, true, 0);
  BATON_READ_INT(world_size, kEnvWorldSize, true, 1);
  BATON_READ_INT(master_port, kEnvMasterPort, true, 0);
  BATON_READ_INT(local_rank, kEnvLocalRank, false, env.rank);
  BATON_READ_INT(local_world_size, kEnvLocalWorldSize, false, env.world_size);
  BATON_READ_INT(group_rank, kEnvGroupRank, false, 0);
  BATON_READ_INT(group_world_size, kEnvGroupWorldSize, false, 1);
  BATON_READ_INT(restart_count, kEnvRestartCount, false, 0);
  BATON_READ_INT(max_restarts, kEnvMaxRestarts, false, 0);
  BATON_READ_INT(role_rank, kEnvRoleRank, false, env.rank);
  BATON_READ_INT(role_world_size, kEnvRoleWorldSize, false, env.world_size);
#undef BATON_READ_INT

  std::optional<std::string> addr = lookup(kEnvMasterAddr);
  if (!addr.has_value() || addr->empty()) {
    return absl::NotFoundError(
        absl::StrCat("environment variable ", kEnvMasterAddr,
                     " is not set (start the program with baton-run, or set it)"));
  }
  env.master_addr = *addr;
  env.run_id = lookup(kEnvRunId).value_or("");
  env.job_token = lookup(kEnvJobToken).value_or("");
  env.role = lookup(kEnvRole).value_or("default");
  env.rejoin = lookup(kEnvRejoin).value_or("") == "1";
  env.error_file = lookup(kEnvErrorFile).value_or("");

  auto pair = [](absl::string_view a, int av, absl::string_view b, int bv) {
    return absl::StrCat(a, "=", av, " and ", b, "=", bv);
  };
  const std::pair<bool, std::string> checks[] = {
      {env.world_size >= 1, absl::StrCat(kEnvWorldSize, "=", env.world_size, " is below 1")},
      {env.rank >= 0 && env.rank < env.world_size,
       pair(kEnvRank, env.rank, kEnvWorldSize, env.world_size)},
      {env.local_world_size >= 1 && env.local_world_size <= env.world_size,
       pair(kEnvLocalWorldSize, env.local_world_size, kEnvWorldSize, env.world_size)},
      {env.local_rank >= 0 && env.local_rank < env.local_world_size,
       pair(kEnvLocalRank, env.local_rank, kEnvLocalWorldSize, env.local_world_size)},
      {env.group_world_size >= 1 && env.group_rank >= 0 && env.group_rank < env.group_world_size,
       pair(kEnvGroupRank, env.group_rank, kEnvGroupWorldSize, env.group_world_size)},
      {env.role_world_size >= 1 && env.role_world_size <= env.world_size && env.role_rank >= 0 &&
           env.role_rank < env.role_world_size,
       pair(kEnvRoleRank, env.role_rank, kEnvRoleWorldSize, env.role_world_size)},
      {env.master_port >= 1 && env.master_port <= 65535,
       absl::StrCat(kEnvMasterPort, "=", env.master_port, " is not a TCP port")},
      {env.restart_count >= 0 && env.max_restarts >= 0,
       pair(kEnvRestartCount, env.restart_count, kEnvMaxRestarts, env.max_restarts)},
      {!env.role.empty(), absl::StrCat(kEnvRole, " is empty")},
  };
  for (const auto& [ok, what] : checks) {
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("inconsistent launcher environment: ", what));
    }
  }
  return env;
}

absl::StatusOr<LaunchEnv> ReadLaunchEnv() { return ReadLaunchEnv(ProcessLookup); }

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out += "\"";
  return out;
}

absl::Status WriteErrorFile(const std::string& path, const ErrorReport& report) {
  std::string json = absl::StrCat("{\"message\": ", JsonQuote(report.message));
  if (!report.error_type.empty()) {
    absl::StrAppend(&json, ", \"error_type\": ", JsonQuote(report.error_type));
  }
  if (!report.details.empty()) {
    absl::StrAppend(&json, ", \"details\": ", JsonQuote(report.details));
  }
  for (const char* name : {kEnvRank, kEnvRoleRank}) {
    std::optional<std::string> v = ProcessLookup(name);
    int n = 0;
    if (v.has_value() && absl::SimpleAtoi(*v, &n)) {
      absl::StrAppend(&json, ", \"", name == kEnvRank ? "rank" : "role_rank", "\": ", n);
    }
  }
  if (std::optional<std::string> role = ProcessLookup(kEnvRole)) {
    absl::StrAppend(&json, ", \"role\": ", JsonQuote(*role));
  }
  absl::StrAppend(&json, ", \"pid\": ", ::getpid(), ", \"timestamp\": ",
                  JsonQuote(absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone())),
                  "}\n");

  absl::Status s = WriteFileAtomically(path, {json});
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("cannot write error file ", path, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status WriteErrorFile(const ErrorReport& report) {
  std::optional<std::string> path = ProcessLookup(kEnvErrorFile);
  if (!path.has_value() || path->empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(kEnvErrorFile, " is not set: not started by baton-run"));
  }
  return WriteErrorFile(*path, report);
}

}  // namespace baton
