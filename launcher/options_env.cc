// The environment's part of baton-run's options (launcher/options.h): what
// a Kubeflow PyTorchJob, a Slurm allocation and etcd's endpoints set beside
// the flags, applied by ParseLaunchOptions in the order options.cc gives.
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "launcher/internal/parse_state.h"
#include "launcher/options.h"
#include "launcher/torchrun_env.h"

namespace baton::launcher {

absl::StatusOr<std::string> FirstSlurmHost(absl::string_view nodelist) {
  // The first entry ends at a comma outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    char c = nodelist[end];
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
  }
  absl::string_view first = nodelist.substr(0, end);
  size_t open = first.find('[');
  if (open == absl::string_view::npos) {
    if (first.empty()) {
      return absl::InvalidArgumentError("empty Slurm node list");
    }
    return std::string(first);
  }
  size_t close = first.find(']', open);
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("malformed Slurm node list '", nodelist, "'"));
  }
  absl::string_view range = first.substr(open + 1, close - open - 1);
  range = range.substr(0, range.find_first_of(",-"));
  if (range.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("malformed Slurm node list '", nodelist, "'"));
  }
  return absl::StrCat(first.substr(0, open), range, first.substr(close + 1));
}

namespace internal {

// Step 1b: what a PyTorchJob sets besides PET_*: MASTER_ADDR and
// MASTER_PORT, WORLD_SIZE, and RANK, which is the pod's index (so this
// node's rank), not a process's. Only with MASTER_ADDR: RANK and
// WORLD_SIZE alone are no operator's.
absl::Status ApplyOperatorEnv(const EnvLookup& env, ParseState& st) {
  LaunchOptions& o = st.o;
  const std::optional<std::string> addr = env(kEnvMasterAddr);
  if (!addr.has_value() || addr->empty()) return absl::OkStatus();
  auto note = [&](const char* variable, const std::string& value, const char* flag) {
    o.from_env.push_back(absl::StrCat(variable, "=", value));
    st.given_by[flag] = variable;
  };
  if (!GivenBy(st, "master_addr").has_value()) {
    o.master_addr = *addr;
    st.addr_set = true;
    note(kEnvMasterAddr, *addr, "master_addr");
  }
  if (std::optional<std::string> port = env(kEnvMasterPort);
      port.has_value() && !GivenBy(st, "master_port").has_value()) {
    auto p = ParseInt("master_port", *port, 1, 65535);
    if (!p.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MASTER_PORT='", *port, "' (the default of --master_port): ", p.status().message()));
    }
    o.master_port = *p;
    note(kEnvMasterPort, *port, "master_port");
  }
  const std::optional<std::string> rank = env(kEnvRank);
  if (!rank.has_value()) return absl::OkStatus();
  auto r = ParseInt("node_rank", *rank, 0, 65535);
  if (!r.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK='", *rank,
                     "' (the pod's index, the default of --node_rank): ", r.status().message()));
  }
  if (!o.node_rank.has_value()) {
    o.node_rank = *r;
    note(kEnvRank, *rank, "node_rank");
  } else if (*o.node_rank != *r && GivenBy(st, "node_rank") == "PET_NODE_RANK") {
    return absl::InvalidArgumentError(absl::StrCat("RANK=", *r, " and PET_NODE_RANK=", *o.node_rank,
                                                   " disagree; both are this pod's index"));
  }
  return absl::OkStatus();
}

// Step 2b: WORLD_SIZE as the training operator sets it, a count of
// processes (pods × nproc_per_node; pods alone when nproc_per_node is not a
// number, and in operators before 1.7), checked once the roles made
// nproc_per_node. RANK must then index a pod.
absl::Status CheckOperatorWorldSize(const EnvLookup& env, const ParseState& st) {
  const LaunchOptions& o = st.o;
  const std::optional<std::string> addr = env(kEnvMasterAddr);
  const std::optional<std::string> rank = env(kEnvRank);
  if (!addr.has_value() || addr->empty() || !rank.has_value()) return absl::OkStatus();
  const std::optional<std::string> world = env(kEnvWorldSize);
  const int pods = o.max_nodes;
  int r = 0;  // parsed by ApplyOperatorEnv
  if (absl::SimpleAtoi(*rank, &r) && r >= pods) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK=", r, " is the pod's index under a PyTorchJob, and the job has ", pods,
                     " node(s); RANK is not a process rank here"));
  }
  if (!world.has_value() || o.elastic()) return absl::OkStatus();
  int w = 0;
  if (!absl::SimpleAtoi(*world, &w) || w < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("WORLD_SIZE='", *world, "' is not a positive count of processes"));
  }
  if (w != pods && w != pods * o.nproc_per_node) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WORLD_SIZE=", w, " (processes, as the training operator counts them) is neither the ",
        pods, " node(s) nor ", pods, " node(s) x ", o.nproc_per_node,
        " worker(s) per node; check --nnodes and --nproc_per_node against the job"));
  }
  return absl::OkStatus();
}

// Step 4b: under Slurm, what the flags left unset comes from the job.
absl::Status ApplySlurm(const EnvLookup& env, ParseState& st) {
  LaunchOptions& o = st.o;
  o.from_slurm = true;
  auto num = [&](const char* name) -> absl::StatusOr<int> {
    std::optional<std::string> v = env(name);
    int n = 0;
    if (!v.has_value() || !absl::SimpleAtoi(*v, &n) || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Slurm variable ", name, "='", v.value_or(""),
                                                     "' is missing or not a number"));
    }
    return n;
  };
  if (!st.nnodes_set) {
    std::optional<std::string> nn = env("SLURM_JOB_NUM_NODES");
    ASSIGN_OR_RETURN(auto n, num(nn.has_value() ? "SLURM_JOB_NUM_NODES" : "SLURM_NNODES"));
    o.min_nodes = o.max_nodes = std::max(1, n);
  }
  if (!o.node_rank.has_value()) {
    ASSIGN_OR_RETURN(auto n, num("SLURM_NODEID"));
    o.node_rank = n;
  }
  if (!st.addr_set) {
    std::optional<std::string> list = env("SLURM_JOB_NODELIST");
    if (!list.has_value()) list = env("SLURM_NODELIST");
    if (!list.has_value()) {
      return absl::InvalidArgumentError(
          "under Slurm: SLURM_JOB_NODELIST is not set; pass --master_addr");
    }
    ASSIGN_OR_RETURN(auto host, FirstSlurmHost(*list));
    o.master_addr = host;
  }
  if (!st.run_id_set) o.run_id = *env("SLURM_JOB_ID");
  return absl::OkStatus();
}

// Step 4c (etcd): the job's keys live in etcd at --rdzv_endpoint.
absl::Status ApplyEtcd(const EnvLookup& env, ParseState& st) {
  LaunchOptions& o = st.o;
  if (!o.rdzv_endpoint.has_value()) {
    return FlagError("rdzv_backend", "etcd needs --rdzv_endpoint HOST[:PORT], etcd's endpoint");
  }
  if (!st.run_id_set) {
    return FlagError("rdzv_id",
                     "is required with --rdzv_backend etcd: every node names the job the same "
                     "way (a PyTorchJob's rdzvId, a Slurm job id, ...), and it keys the job in "
                     "etcd");
  }
  RdzvEndpoint e = *o.rdzv_endpoint;
  if (!e.port_given) e.port = 2379;
  o.etcd.endpoint = e.host.find(':') != std::string::npos ? absl::StrCat("[", e.host, "]:", e.port)
                                                          : absl::StrCat(e.host, ":", e.port);
  if (o.etcd.tls.enabled() &&
      (o.etcd.tls.ca_file.empty() || o.etcd.tls.cert_file.empty() || o.etcd.tls.key_file.empty())) {
    return FlagError("rdzv_conf", "TLS to etcd needs all of cacert=, cert= and key=");
  }
  o.etcd.user = env(kEnvEtcdUser).value_or("");
  o.etcd.password = env(kEnvEtcdPassword).value_or("");
  o.etcd.password_file = env(kEnvEtcdPasswordFile).value_or("");
  if (o.etcd.user.empty() && (!o.etcd.password.empty() || !o.etcd.password_file.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat("an etcd password is set but ", kEnvEtcdUser, " is not"));
  }
  if (!IsLoopback(e.host) && !o.etcd.tls.enabled() && o.etcd.user.empty() &&
      env("BATON_ETCD_INSECURE").value_or("") != "1") {
    return FlagError(
        "rdzv_endpoint",
        absl::StrCat("etcd at ", o.etcd.endpoint,
                     " is not on this host, and neither TLS (--rdzv_conf "
                     "cacert=...,cert=...,key=...) nor an etcd user (",
                     kEnvEtcdUser,
                     ") is configured: whoever reaches etcd could read and change "
                     "the job's keys. Configure one, or set BATON_ETCD_INSECURE=1 to accept that"));
  }
  if (o.elastic() && !o.node_rank.has_value()) o.rdzv_host_by_claim = true;
  return absl::OkStatus();
}

// Step 4c: --rdzv_endpoint HOST:PORT is the master node's rendezvous.
absl::Status ApplyRdzvEndpoint(ParseState& st) {
  LaunchOptions& o = st.o;
  if (!o.rdzv_endpoint.has_value()) return absl::OkStatus();
  const RdzvEndpoint& e = *o.rdzv_endpoint;
  if (o.standalone) {
    return FlagError("rdzv_endpoint", "--standalone runs its own rendezvous; drop one of them");
  }
  if (OnCommandLine(st, "master_addr") && o.master_addr != e.host) {
    return FlagError("master_addr",
                     absl::StrCat("'", o.master_addr, "' differs from --rdzv_endpoint's host '",
                                  e.host, "': the rendezvous runs on the master node"));
  }
  if (OnCommandLine(st, "rdzv_port") && o.rdzv_port != e.port) {
    return FlagError("rdzv_port",
                     absl::StrCat(o.rdzv_port, " differs from --rdzv_endpoint's port ", e.port));
  }
  // The endpoint wins over an address from the environment: under a
  // PyTorchJob with a master and an elastic policy, MASTER_ADDR names the
  // master pod and PET_RDZV_ENDPOINT the rendezvous, as torchrun reads them.
  o.master_addr = e.host;
  o.rdzv_port = e.port;
  const std::optional<std::string> port_by = GivenBy(st, "master_port");
  if (!port_by.has_value() || (!port_by->empty() && o.master_port == o.rdzv_port)) {
    o.master_port = 0;  // a free port on the master node, told through the rendezvous
  }
  // An elastic job's host is the node the endpoint names, as in torchrun.
  if (o.elastic() && !OnCommandLine(st, "node_rank")) {
    if (IsLoopback(e.host)) {
      o.node_rank.reset();
      o.rdzv_host_by_bind = true;
    } else if (IsThisMachine(e.host, st.machine)) {
      o.node_rank = 0;
    } else {
      o.node_rank.reset();
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace baton::launcher
