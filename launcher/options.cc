#include "launcher/options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "launcher/internal/parse_state.h"

namespace baton::launcher {
namespace internal {

absl::Status FlagError(absl::string_view flag, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", why));
}

absl::StatusOr<int> ParseInt(absl::string_view flag, absl::string_view value, int min, int max) {
  int v = 0;
  if (!absl::SimpleAtoi(value, &v)) {
    return FlagError(flag, absl::StrCat("'", value, "' is not an integer"));
  }
  if (v < min || v > max) {
    return FlagError(flag, absl::StrCat(v, " is out of range [", min, ", ", max, "]"));
  }
  return v;
}

std::optional<std::string> GivenBy(const ParseState& st, const std::string& flag) {
  auto it = st.given_by.find(flag);
  if (it == st.given_by.end()) return std::nullopt;
  return it->second;
}

bool OnCommandLine(const ParseState& st, const std::string& flag) {
  return GivenBy(st, flag) == std::optional<std::string>("");
}

}  // namespace internal

namespace {

using internal::FlagError;
using internal::GivenBy;
using internal::OnCommandLine;
using internal::ParseInt;
using internal::ParseState;

// Seconds as a decimal number ("0.5", "30").
absl::StatusOr<absl::Duration> ParseSeconds(absl::string_view flag, absl::string_view value,
                                            bool allow_zero) {
  double s = 0;
  if (!absl::SimpleAtod(value, &s) || !(s >= 0) || s > 1e7) {
    return FlagError(flag, absl::StrCat("'", value, "' is not a number of seconds"));
  }
  if (s == 0 && !allow_zero) return FlagError(flag, "must be positive");
  return absl::Seconds(s);
}

absl::StatusOr<bool> ParseBool(absl::string_view flag, absl::string_view value) {
  std::string v = absl::AsciiStrToLower(value);
  if (v == "1" || v == "true" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "no") return false;
  return FlagError(flag, absl::StrCat("'", value, "' is not a boolean"));
}

// "NAME:COUNT" or "NAME:COUNT:PROGRAM [ARGS...]".
absl::StatusOr<RoleSpec> ParseRole(absl::string_view value) {
  std::vector<std::string> parts = absl::StrSplit(value, absl::MaxSplits(':', 2));
  if (parts.size() < 2) {
    return FlagError("role", absl::StrCat("'", value, "' is not NAME:COUNT[:PROGRAM]"));
  }
  RoleSpec role;
  role.name = parts[0];
  if (role.name.empty() || !std::all_of(role.name.begin(), role.name.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '_' || c == '-';
      })) {
    return FlagError("role", absl::StrCat("role name '", role.name, "' must be [A-Za-z0-9_-]+"));
  }
  ASSIGN_OR_RETURN(auto count, ParseInt("role", parts[1], 1, 4096));
  role.count = count;
  if (parts.size() == 3) {
    role.argv = absl::StrSplit(parts[2], absl::ByAnyChar(" \t"), absl::SkipEmpty());
  }
  return role;
}

}  // namespace

int LaunchOptions::local_world_size() const {
  int n = 0;
  for (const RoleSpec& r : roles) n += r.count;
  return n;
}

absl::Duration LaunchOptions::PartitionTolerance() const {
  if (partition_tolerance.has_value()) return *partition_tolerance;
  if (heartbeat_timeout.has_value()) return *heartbeat_timeout;
  return kDefaultPartitionTolerance;
}

absl::Duration LaunchOptions::HeartbeatTimeout() const {
  if (heartbeat_timeout.has_value()) return *heartbeat_timeout;
  return PartitionTolerance() + kLostNodeMargin;
}

absl::Duration LaunchOptions::RestartWait() const {
  if (restart_wait.has_value()) return *restart_wait;
  if (max_restarts == 0) return absl::ZeroDuration();
  for (const RoleSpec& r : roles) {
    if (r.policy != RestartPolicy::kGroup) return kDefaultRestartWait;
  }
  return absl::ZeroDuration();
}

namespace {

using Handler = std::function<absl::Status(const std::string&)>;

Handler SetInt(int* out, const char* flag, int min, int max) {
  return [=](const std::string& v) {
    auto n = ParseInt(flag, v, min, max);
    if (n.ok()) *out = *n;
    return n.status();
  };
}

// A file path, made absolute (workers may run elsewhere in the tree).
Handler SetPath(std::string* out, const char* flag) {
  return [=](const std::string& v) -> absl::Status {
    if (v.empty()) return FlagError(flag, "is empty");
    if (v[0] == '/') {
      *out = v;
    } else {
      char cwd[4096];
      if (::getcwd(cwd, sizeof(cwd)) == nullptr) return FlagError(flag, "cannot resolve the path");
      *out = absl::StrCat(cwd, "/", v);
    }
    return absl::OkStatus();
  };
}

// Seconds, into a Duration or an optional one (set only when given).
template <typename Out>
Handler SetSeconds(Out* out, const char* flag, bool zero) {
  return [=](const std::string& v) {
    auto d = ParseSeconds(flag, v, zero);
    if (d.ok()) *out = *d;
    return d.status();
  };
}

// A non-empty string.
Handler SetString(std::string* out, const char* flag, bool* set = nullptr) {
  return [=](const std::string& v) -> absl::Status {
    if (v.empty()) return FlagError(flag, "is empty");
    *out = v;
    if (set != nullptr) *set = true;
    return absl::OkStatus();
  };
}

// Flags that take a value ("--flag=v" or "--flag v"), writing into `st`.
std::map<std::string, Handler> ValuedFlags(ParseState& st) {
  LaunchOptions& o = st.o;
  return {
      {"nproc_per_node",
       [&st](const std::string& v) -> absl::Status {
         st.nproc_set = true;
         auto n = ResolveNprocPerNode(v, st.machine);
         if (n.ok()) st.o.nproc_per_node = *n;
         return n.status();
       }},
      {"nnodes",
       [&st](const std::string& v) -> absl::Status {
         st.nnodes_set = true;
         std::vector<std::string> mm = absl::StrSplit(v, ':');
         if (mm.size() > 2) return FlagError("nnodes", "expected N or MIN:MAX");
         ASSIGN_OR_RETURN(auto lo, ParseInt("nnodes", mm[0], 1, 65536));
         auto hi = ParseInt("nnodes", mm.back(), 1, 65536);
         if (!hi.ok()) return hi.status();
         if (lo > *hi) {
           return FlagError("nnodes", absl::StrCat("MIN ", lo, " is above MAX ", *hi));
         }
         st.o.min_nodes = lo;
         st.o.max_nodes = *hi;
         return absl::OkStatus();
       }},
      {"node_rank",
       [&o](const std::string& v) -> absl::Status {
         int node_rank = 0;
         absl::Status s = SetInt(&node_rank, "node_rank", 0, 65535)(v);
         if (s.ok()) o.node_rank = node_rank;
         return s;
       }},
      {"master_addr", SetString(&o.master_addr, "master_addr", &st.addr_set)},
      {"master_port", SetInt(&o.master_port, "master_port", 0, 65535)},
      {"rdzv_port", SetInt(&o.rdzv_port, "rdzv_port", 1, 65535)},
      {"max_restarts", SetInt(&o.max_restarts, "max_restarts", 0, 1000000)},
      {"metrics_port", SetInt(&o.metrics_port, "metrics_port", 1, 65535)},
      {"node_metrics_port", SetInt(&o.node_metrics_port, "node_metrics_port", 1, 65535)},
      {"hang_timeout", SetSeconds(&o.hang_timeout, "hang_timeout", true)},
      {"dump", SetString(&o.dump_run_id, "dump")},
      {"monitor_interval", SetSeconds(&o.monitor_interval, "monitor_interval", false)},
      {"run_id", SetString(&o.run_id, "run_id", &st.run_id_set)},
      // torchrun's name for the run id.
      {"rdzv_id", SetString(&o.run_id, "rdzv_id", &st.run_id_set)},
      {"rdzv_backend",
       [&o](const std::string& v) -> absl::Status {
         const std::string b = absl::AsciiStrToLower(v);
         if (b == "c10d" || b == "static" || b == "etcd") {
           o.rdzv_backend = b;
           return absl::OkStatus();
         }
         if (b == "etcd-v2") {  // torchrun's name for its etcd v3 backend
           o.rdzv_backend = "etcd";
           return absl::OkStatus();
         }
         return FlagError("rdzv_backend", absl::StrCat("'", v, "' is not c10d, static or etcd"));
       }},
      {"rdzv_endpoint",
       [&o](const std::string& v) -> absl::Status {
         auto e = ParseRdzvEndpoint(v);
         if (e.ok()) o.rdzv_endpoint = *e;
         return e.status();
       }},
      {"rdzv_conf",
       [&o](const std::string& v) -> absl::Status {
         ASSIGN_OR_RETURN(auto conf, ParseRdzvConf(v));
         if (conf.join_timeout.has_value()) o.rdzv_timeout = *conf.join_timeout;
         if (conf.last_call_timeout.has_value()) o.rdzv_last_call = *conf.last_call_timeout;
         if (!conf.etcd_ca_file.empty()) o.etcd.tls.ca_file = conf.etcd_ca_file;
         if (!conf.etcd_cert_file.empty()) o.etcd.tls.cert_file = conf.etcd_cert_file;
         if (!conf.etcd_key_file.empty()) o.etcd.tls.key_file = conf.etcd_key_file;
         if (conf.protocol == "https" && o.etcd.tls.ca_file.empty()) {
           return FlagError("rdzv_conf", "protocol=https needs cacert=, cert= and key=");
         }
         return absl::OkStatus();
       }},
      {"job_token_file", SetString(&o.job_token_file, "job_token_file")},
      {"tls_ca", SetPath(&o.tls.ca_file, "tls_ca")},
      {"tls_cert", SetPath(&o.tls.cert_file, "tls_cert")},
      {"tls_key", SetPath(&o.tls.key_file, "tls_key")},
      {"tls_server_name", SetString(&o.tls.server_name, "tls_server_name")},
      {"log_dir", SetString(&o.log_dir, "log_dir")},
      {"rdzv_timeout", SetSeconds(&o.rdzv_timeout, "rdzv_timeout", false)},
      {"rdzv_last_call", SetSeconds(&o.rdzv_last_call, "rdzv_last_call", true)},
      {"heartbeat_timeout", SetSeconds(&o.heartbeat_timeout, "heartbeat_timeout", false)},
      {"partition_tolerance", SetSeconds(&o.partition_tolerance, "partition_tolerance", false)},
      {"stop_timeout", SetSeconds(&o.stop_timeout, "stop_timeout", true)},
      {"restart_wait", SetSeconds(&o.restart_wait, "restart_wait", true)},
      {"role",
       [&o](const std::string& v) -> absl::Status {
         ASSIGN_OR_RETURN(auto role, ParseRole(v));
         for (const RoleSpec& r : o.roles) {
           if (r.name == role.name) {
             return FlagError("role", absl::StrCat("role '", r.name, "' given twice"));
           }
         }
         o.roles.push_back(std::move(role));
         return absl::OkStatus();
       }},
      {"restart_policy",
       [&st](const std::string& v) -> absl::Status {
         std::vector<std::string> kv = absl::StrSplit(v, absl::MaxSplits('=', 1));
         if (kv.size() != 2 || (kv[1] != "group" && kv[1] != "role" && kv[1] != "worker")) {
           return FlagError("restart_policy",
                            absl::StrCat("'", v, "' is not ROLE=group, ROLE=role or ROLE=worker"));
         }
         st.policies.emplace_back(kv[0], kv[1]);
         return absl::OkStatus();
       }},
  };
}

// Step 1: the flags, up to the program. Returns the index of PROGRAM in
// `args` (args.size() if none); sets o.help and stops at --help.
absl::StatusOr<size_t> ParseFlags(const std::vector<std::string>& args, ParseState& st) {
  const std::map<std::string, Handler> valued = ValuedFlags(st);
  // Boolean flags: "--flag" or "--flag=v".
  const std::map<std::string, bool*> booleans = {{"standalone", &st.o.standalone},
                                                 {"tee", &st.o.tee}};
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") return i + 1;
    if (!absl::StartsWith(arg, "-") || arg == "-") break;
    if (arg == "-h" || arg == "--help") {
      st.o.help = true;
      return args.size();
    }
    std::string name = std::string(absl::StripPrefix(absl::StripPrefix(arg, "-"), "-"));
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    // torchrun spells flags both ways.
    absl::StrReplaceAll({{"-", "_"}}, &name);
    if (auto b = booleans.find(name); b != booleans.end()) {
      st.given_by[name] = "";
      if (!value.has_value()) {
        *b->second = true;
        continue;
      }
      ASSIGN_OR_RETURN(auto v, ParseBool(name, *value));
      *b->second = v;
      continue;
    }
    auto h = valued.find(name);
    if (h == valued.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", arg, "' (see --help)"));
    }
    if (!value.has_value()) {
      if (i + 1 >= args.size()) return FlagError(name, "needs a value");
      value = args[++i];
    }
    RETURN_IF_ERROR(h->second(*value));
    st.given_by[name] = "";
  }
  return i;
}

// Step 0: torchrun's PET_<FLAG> variables, as defaults of the flags parsed
// next (torchrun_env.h).
absl::Status ApplyTorchrunEnv(const EnvLookup& env, ParseState& st) {
  const std::map<std::string, Handler> valued = ValuedFlags(st);
  for (const EnvFlag& f : TorchrunEnvFlags(env, &st.o.env_ignored)) {
    absl::Status s;
    if (f.flag == "standalone") {
      // The training operator sets PET_STANDALONE to "" to turn it on.
      absl::StatusOr<bool> b = f.value.empty() ? true : ParseBool(f.flag, f.value);
      if (b.ok()) st.o.standalone = *b;
      s = b.status();
    } else if (f.flag == "tee") {
      // torchrun's --tee names streams: "0" none, "1" stdout, "2" stderr,
      // "3" both, or per local rank ("0:3,1:1"); baton-run tees both or none.
      if (f.value.empty() || f.value.find_first_not_of("0123:,") != std::string::npos) {
        s = FlagError("tee", absl::StrCat("'", f.value, "' is not torchrun's 0, 1, 2, 3 or a ",
                                          "per-rank map such as 0:3,1:1"));
      } else {
        st.o.tee = f.value.find_first_of("123") != std::string::npos;
      }
    } else {
      s = valued.at(f.flag)(f.value);
    }
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.variable, "='", f.value, "' (torchrun's default of --", f.flag, "): ", s.message()));
    }
    st.given_by[f.flag] = f.variable;
    st.o.from_env.push_back(absl::StrCat(f.variable, "=", f.value));
  }
  return absl::OkStatus();
}

// Step 2: the roles. Without --role, one "default" role runs the command;
// with roles, each runs its own program or the command, and their counts
// make --nproc_per_node.
absl::Status ResolveRoles(const std::vector<std::string>& command, ParseState& st) {
  LaunchOptions& o = st.o;
  if (o.roles.empty()) {
    if (command.empty()) {
      return absl::InvalidArgumentError("missing PROGRAM: baton-run [options] PROGRAM [ARGS...]");
    }
    o.roles.push_back(RoleSpec{"default", o.nproc_per_node, command, RestartPolicy::kGroup});
    return absl::OkStatus();
  }
  bool all_have_programs = true;
  for (RoleSpec& r : o.roles) {
    if (r.argv.empty()) {
      all_have_programs = false;
      if (command.empty()) {
        return FlagError(
            "role", absl::StrCat("role '", r.name, "' names no program and no PROGRAM is given"));
      }
      r.argv = command;
    }
  }
  if (all_have_programs && !command.empty()) {
    return FlagError("role", absl::StrCat("every role names its own program; unexpected PROGRAM '",
                                          command[0], "'"));
  }
  if (st.nproc_set && o.nproc_per_node != o.local_world_size()) {
    return FlagError(
        "nproc_per_node",
        absl::StrCat(o.nproc_per_node, " does not match the sum of the --role counts (",
                     o.local_world_size(), ")"));
  }
  o.nproc_per_node = o.local_world_size();
  return absl::OkStatus();
}

// Step 3: --restart_policy ROLE=..., now that every role is known.
absl::Status ApplyRestartPolicies(ParseState& st) {
  for (const auto& [role, policy] : st.policies) {
    const std::string& wanted = role;  // a structured binding: not capturable in C++17
    auto it = std::find_if(st.o.roles.begin(), st.o.roles.end(),
                           [&](const RoleSpec& r) { return r.name == wanted; });
    if (it == st.o.roles.end()) {
      return FlagError("restart_policy", absl::StrCat("no role named '", role, "'"));
    }
    it->policy = policy == "role"     ? RestartPolicy::kRole
                 : policy == "worker" ? RestartPolicy::kWorker
                                      : RestartPolicy::kGroup;
  }
  return absl::OkStatus();
}

// Step 4a: --standalone is one node on loopback with ports chosen at start.
absl::Status ApplyStandalone(ParseState& st) {
  LaunchOptions& o = st.o;
  if (st.nnodes_set && o.max_nodes != 1) {
    return FlagError("standalone", "runs one node; drop --nnodes");
  }
  if (o.node_rank.value_or(0) != 0) {
    return FlagError("standalone", "runs one node; drop --node_rank");
  }
  o.min_nodes = o.max_nodes = 1;
  o.node_rank = 0;
  o.master_addr = "127.0.0.1";
  o.master_port = 0;
  o.rdzv_port = 0;
  return absl::OkStatus();
}

// Step 5: this node's rank against the node count.
absl::Status CheckNodeRank(LaunchOptions& o) {
  if (o.max_nodes > 1 && !o.elastic() && !o.node_rank.has_value()) {
    return FlagError("node_rank", absl::StrCat("is required with --nnodes ", o.max_nodes));
  }
  if (!o.node_rank.has_value() && o.max_nodes == 1) o.node_rank = 0;
  if (o.node_rank.has_value() && !o.elastic() && *o.node_rank >= o.max_nodes) {
    return FlagError("node_rank",
                     absl::StrCat(*o.node_rank, " is not below --nnodes ", o.max_nodes));
  }
  return absl::OkStatus();
}

// Step 6: the rendezvous port, by default the workers' store port + 1.
absl::Status ResolvePorts(LaunchOptions& o) {
  if (o.standalone) return absl::OkStatus();  // both chosen at start
  // On etcd no node serves a rendezvous: MASTER_PORT 0 is chosen per round.
  if (!o.etcd.endpoint.empty()) return absl::OkStatus();
  if (o.master_port == 0 && o.max_nodes > 1 && o.rdzv_port == 0) {
    return FlagError("master_port", "0 (a free port) needs --rdzv_port for a multi-node job");
  }
  if (o.rdzv_port == 0 && o.master_port != 0) {
    if (o.master_port == 65535) {
      return FlagError("master_port",
                       "65535 leaves no room for the rendezvous port; pass --rdzv_port");
    }
    o.rdzv_port = o.master_port + 1;
  }
  if (o.rdzv_port != 0 && o.rdzv_port == o.master_port) {
    return FlagError("rdzv_port",
                     "must differ from --master_port (the workers' store uses that one)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LaunchOptions> ParseLaunchOptions(const std::vector<std::string>& args,
                                                 const EnvLookup& env, const MachineInfo& machine) {
  ParseState st;
  st.machine = machine;
  absl::Status s = ApplyTorchrunEnv(env, st);
  if (!s.ok()) return s;
  ASSIGN_OR_RETURN(size_t program, ParseFlags(args, st));
  if (st.o.help || !st.o.dump_run_id.empty()) return std::move(st.o);
  s = ApplyOperatorEnv(env, st);
  const std::vector<std::string> command(args.begin() + program, args.end());
  if (s.ok()) s = ResolveRoles(command, st);
  if (s.ok()) s = ApplyRestartPolicies(st);
  if (s.ok() && st.o.standalone) {
    s = ApplyStandalone(st);
  } else if (s.ok() && env("SLURM_JOB_ID").has_value() && env("SLURM_NODEID").has_value()) {
    s = ApplySlurm(env, st);
  }
  if (s.ok()) s = CheckOperatorWorldSize(env, st);
  if (s.ok()) s = st.o.rdzv_backend == "etcd" ? ApplyEtcd(env, st) : ApplyRdzvEndpoint(st);
  if (s.ok()) s = CheckNodeRank(st.o);
  if (s.ok()) s = ResolvePorts(st.o);
  if (!s.ok()) return s;
  return std::move(st.o);
}

absl::StatusOr<LaunchOptions> ParseLaunchOptions(const std::vector<std::string>& args,
                                                 const EnvLookup& env) {
  return ParseLaunchOptions(args, env, MachineInfo::Detect(env));
}

std::string LaunchUsage() {
  return R"(usage: baton-run [options] PROGRAM [ARGS...]

Starts --nproc_per_node workers on this node, rendezvous with the other
nodes, restarts the group on failure. Flags accept --flag=v or --flag v.

  --nproc_per_node N     workers on this node (default 1); auto, cpu or gpu
                         as in torchrun
  --nnodes N | MIN:MAX   node count; MIN:MAX makes the job elastic
  --node_rank R          this node's rank; node 0 hosts the rendezvous store
  --master_addr HOST     address of node 0 (default 127.0.0.1)
  --master_port P        MASTER_PORT for the workers' store (default 29500;
                         0 = a free port each round)
  --rdzv_port P          port of the node agents' store on node 0
                         (default master_port + 1)
  --standalone           one node, free ports, no other flags needed
  --job_token_file PATH  the job token (a secret shared by every node, e.g.
                         from Slurm or Kubernetes; mode 600); else
                         BATON_JOB_TOKEN. Required when the job spans nodes;
                         a one-node job makes its own
  --max_restarts N       group restarts after failures (default 0)
  --metrics_port P       each worker serves Prometheus metrics (GET /metrics)
                         on port P + its local rank
  --node_metrics_port P  serve every worker's metrics on this node on one
                         port (GET /metrics, each sample labelled rank)
  --monitor_interval S   seconds between worker checks (default 0.1)
  --hang_timeout S       when no worker on this node made progress for S
                         seconds while some wait, write the state report
                         (who waits on whom) on its own; 0 = off (default)
  --dump RUN_ID          print the state report of the running job RUN_ID's
                         workers on this node (as SIGUSR1 to its baton-run
                         does), write it as JSON beside its logs, and exit
  --run_id ID            job id, equal on every node (torchrun: --rdzv_id)
  --rdzv_endpoint HOST[:PORT]
                         the rendezvous: HOST is the master node, PORT
                         (default 29400) the rendezvous port. In an elastic
                         job the node HOST names hosts it
  --rdzv_backend c10d|static|etcd
                         c10d and static use baton-run's store on the master
                         node; etcd keeps the job's keys in etcd at
                         --rdzv_endpoint (default port 2379; needs --rdzv_id),
                         so no node and no rank is special. etcd's TLS:
                         --rdzv_conf cacert=F,cert=F,key=F; its user:
                         BATON_ETCD_USER and BATON_ETCD_PASSWORD(_FILE)
  --rdzv_conf K=V,...    join_timeout (or timeout) and last_call_timeout
                         set --rdzv_timeout and --rdzv_last_call
  --tls_ca FILE          mutual TLS for the rendezvous store and the
  --tls_cert FILE        workers' store and RPC streams: the job's CA, this
  --tls_key FILE         node's certificate and key (PEM; all three)
  --tls_server_name N    the name every certificate carries (default: the
                         address dialled)
  --log_dir DIR          one log per rank: DIR/rank_<R>.log
  --tee                  print worker output prefixed with "[rank R]"
  --role NAME:COUNT[:PROGRAM [ARGS]]
                         a kind of worker with COUNT workers per node;
                         ranks are assigned role by role (repeatable)
  --restart_policy ROLE=group|role|worker
                         on a failure of ROLE, restart every worker (group,
                         the default), only that role's workers (role), or
                         only the worker that failed (worker)
  --rdzv_timeout S       bound on each rendezvous wait (default 300)
  --rdzv_last_call S     elastic: wait for more nodes after MIN (default 5)
  --partition_tolerance S
                         how long a node may be cut off from the job's
                         store, and a worker from a peer, before they give
                         up: a shorter partition costs only the calls whose
                         deadlines pass during it; past it, the cut-off
                         node stops its workers (default 30)
  --heartbeat_timeout S  declare a silent node lost after S (default: the
                         partition tolerance + 10)
  --stop_timeout S       grace period before SIGKILL (default 10)
  --restart_wait S       how long a worker's call to a peer found dead waits
                         for that peer's restart (default 60 when a role
                         restarts alone and --max_restarts > 0, else 0)

Every flag torchrun also has takes its default from PET_<FLAG> (PET_NNODES,
PET_NODE_RANK, PET_RDZV_ENDPOINT, ...); MASTER_ADDR and MASTER_PORT, and RANK
as the node rank (checked against WORLD_SIZE), are read as the Kubeflow
training operator sets them. Flags given win (docs/kubernetes.md).

Workers get RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, BATON_RUN_ID,
BATON_RESTART_COUNT, BATON_MAX_RESTARTS, BATON_JOB_TOKEN, BATON_ROLE,
BATON_ROLE_RANK, BATON_ROLE_WORLD_SIZE, BATON_ERROR_FILE, BATON_RESTART_WAIT
and BATON_ELASTIC_LAUNCHED=1. Exit code: 0 on success, 1 when the job failed,
2 on bad flags, 128+N when stopped by signal N.
)";
}

absl::StatusOr<std::string> ResolveJobToken(const LaunchOptions& options, const char* env_token) {
  const std::string from_env = env_token == nullptr ? "" : env_token;
  std::string token = from_env;
  if (!options.job_token_file.empty()) {
    const std::string& path = options.job_token_file;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      const int err = errno;
      return absl::Status(
          err == EACCES ? absl::StatusCode::kPermissionDenied : absl::StatusCode::kNotFound,
          absl::StrCat("--job_token_file ", path, ": ", std::strerror(err)));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job_token_file ", path, " is not a regular file"));
    }
    if ((st.st_mode & 077) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
      return absl::FailedPreconditionError(
          absl::StrCat("--job_token_file ", path, " is readable by group or others (mode ", mode,
                       "); a secret must not be: chmod 600 ", path));
    }
    std::ifstream in(path);
    if (!in) {
      return absl::PermissionDeniedError(
          absl::StrCat("--job_token_file ", path, ": cannot read it"));
    }
    std::stringstream buf;
    buf << in.rdbuf();
    token = std::string(absl::StripTrailingAsciiWhitespace(buf.str()));
    if (token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--job_token_file ", path, " is empty"));
    }
    if (!from_env.empty() && from_env != token) {
      return absl::InvalidArgumentError(absl::StrCat("BATON_JOB_TOKEN and --job_token_file ", path,
                                                     " hold different tokens; give only one"));
    }
  }
  if (options.max_nodes > 1) {
    if (token.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this job spans nodes (--nnodes ",
          options.min_nodes == options.max_nodes
              ? absl::StrCat(options.max_nodes)
              : absl::StrCat(options.min_nodes, ":", options.max_nodes),
          "), so every node needs the same job token from outside the job: it is what "
          "keeps anyone else who can reach --master_addr out of the rendezvous store and "
          "the workers. Set BATON_JOB_TOKEN to a secret (e.g. from `openssl rand -hex 16`, "
          "handed out by your scheduler's secret store) or pass --job_token_file PATH "
          "(mode 600) on every node"));
    }
    if (token.size() < 16) {
      return absl::FailedPreconditionError(
          absl::StrCat("the job token has ", token.size(),
                       " characters; a job that spans nodes needs at least 16 random characters "
                       "(e.g. `openssl rand -hex 16`)"));
    }
  }
  return token;
}

}  // namespace baton::launcher
