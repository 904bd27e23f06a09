#include "launcher/torchrun_env.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace baton::launcher {
namespace {

absl::Status FlagError(absl::string_view flag, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", why));
}

// torchrun's flags that baton-run has, by their PET_ name's suffix.
struct Mapped {
  const char* variable;
  const char* flag;
};
constexpr Mapped kMapped[] = {
    {"PET_NNODES", "nnodes"},
    {"PET_NPROC_PER_NODE", "nproc_per_node"},
    {"PET_NODE_RANK", "node_rank"},
    {"PET_MASTER_ADDR", "master_addr"},
    {"PET_MASTER_PORT", "master_port"},
    {"PET_RDZV_BACKEND", "rdzv_backend"},
    {"PET_RDZV_ENDPOINT", "rdzv_endpoint"},
    {"PET_RDZV_ID", "rdzv_id"},
    {"PET_RDZV_CONF", "rdzv_conf"},
    {"PET_STANDALONE", "standalone"},
    {"PET_MAX_RESTARTS", "max_restarts"},
    {"PET_MONITOR_INTERVAL", "monitor_interval"},
    {"PET_LOG_DIR", "log_dir"},
    {"PET_TEE", "tee"},
};

constexpr const char* kIgnored[] = {
    "PET_START_METHOD",       "PET_MODULE",     "PET_NO_PYTHON",  "PET_RUN_PATH", "PET_REDIRECTS",
    "PET_LOCAL_RANKS_FILTER", "PET_LOCAL_ADDR", "PET_LOGS_SPECS", "PET_ROLE",
};

int GpusFromDriver() {
  DIR* dir = ::opendir("/proc/driver/nvidia/gpus");
  if (dir == nullptr) return 0;
  int n = 0;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n;
}

// CUDA_VISIBLE_DEVICES: the devices listed before the first invalid entry
// (CUDA stops there); "" or "-1" hides every device.
int GpusFromVisibleDevices(absl::string_view value) {
  int n = 0;
  for (absl::string_view entry : absl::StrSplit(value, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    int index = 0;
    if (entry.empty() || (absl::SimpleAtoi(entry, &index) && index < 0)) break;
    ++n;
  }
  return n;
}

}  // namespace

MachineInfo MachineInfo::Detect(const EnvLookup& env) {
  MachineInfo m;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) == 0) m.hostname = name;
  const long cpus = ::sysconf(_SC_NPROCESSORS_CONF);
  m.cpu_count = cpus > 0 ? static_cast<int>(cpus)
                         : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (std::optional<std::string> visible = env("CUDA_VISIBLE_DEVICES"); visible.has_value()) {
    m.gpu_count = std::min(GpusFromVisibleDevices(*visible), GpusFromDriver());
  } else {
    m.gpu_count = GpusFromDriver();
  }
  return m;
}

std::vector<EnvFlag> TorchrunEnvFlags(const EnvLookup& env, std::vector<std::string>* ignored) {
  std::vector<EnvFlag> out;
  for (const Mapped& m : kMapped) {
    std::optional<std::string> v = env(m.variable);
    if (v.has_value()) out.push_back({m.variable, m.flag, *v});
  }
  if (ignored != nullptr) {
    for (const char* name : kIgnored) {
      if (env(name).has_value()) ignored->push_back(name);
    }
  }
  return out;
}

absl::StatusOr<int> ResolveNprocPerNode(absl::string_view value, const MachineInfo& machine) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  int n = 0;
  if (absl::SimpleAtoi(v, &n)) {
    if (n < 1 || n > 4096) {
      return FlagError("nproc_per_node", absl::StrCat(n, " is out of range [1, 4096]"));
    }
    return n;
  }
  if (v == "cpu") return std::max(1, machine.cpu_count);
  if (v == "gpu") {
    if (machine.gpu_count < 1) {
      return FlagError("nproc_per_node",
                       "'gpu' asks for one worker per GPU, and this node has no visible GPU "
                       "(CUDA_VISIBLE_DEVICES, /proc/driver/nvidia/gpus)");
    }
    return machine.gpu_count;
  }
  if (v == "auto") {
    return machine.gpu_count > 0 ? machine.gpu_count : std::max(1, machine.cpu_count);
  }
  return FlagError("nproc_per_node",
                   absl::StrCat("'", value, "' is not a count, 'auto', 'cpu' or 'gpu'"));
}

absl::StatusOr<RdzvEndpoint> ParseRdzvEndpoint(absl::string_view value) {
  RdzvEndpoint e;
  absl::string_view port;
  if (absl::StartsWith(value, "[")) {  // [IPv6]:port
    const size_t close = value.find(']');
    if (close == absl::string_view::npos) {
      return FlagError("rdzv_endpoint", absl::StrCat("'", value, "' has no closing ']'"));
    }
    e.host = std::string(value.substr(1, close - 1));
    absl::string_view rest = value.substr(close + 1);
    if (!rest.empty()) {
      if (!absl::ConsumePrefix(&rest, ":")) {
        return FlagError("rdzv_endpoint", absl::StrCat("'", value, "' is not [HOST]:PORT"));
      }
      port = rest;
    }
  } else {
    const size_t colon = value.rfind(':');
    if (colon != absl::string_view::npos && value.find(':') != colon) {
      return FlagError("rdzv_endpoint",
                       absl::StrCat("'", value, "': write an IPv6 address as [ADDRESS]:PORT"));
    }
    e.host = std::string(value.substr(0, colon));
    if (colon != absl::string_view::npos) port = value.substr(colon + 1);
  }
  if (e.host.empty()) {
    return FlagError("rdzv_endpoint", absl::StrCat("'", value, "' names no host"));
  }
  if (!port.empty() || absl::EndsWith(value, ":")) {
    e.port_given = true;
    if (!absl::SimpleAtoi(port, &e.port) || e.port < 1 || e.port > 65535) {
      return FlagError("rdzv_endpoint",
                       absl::StrCat("'", value, "': port '", port, "' is not in [1, 65535]"));
    }
  }
  return e;
}

bool IsLoopback(absl::string_view host) {
  if (absl::AsciiStrToLower(host) == "localhost") return true;
  const std::string h(host);
  in_addr v4;
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (::inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    return std::memcmp(&v6, &in6addr_loopback, sizeof(v6)) == 0;
  }
  return false;
}

bool IsThisMachine(absl::string_view host, const MachineInfo& machine) {
  if (IsLoopback(host)) return true;
  const std::string h(host);
  in_addr v4;
  in6_addr v6;
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1 || ::inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    return false;  // another address; interfaces are not compared
  }
  if (machine.hostname.empty()) return false;
  auto first_label = [](absl::string_view name) {
    return absl::AsciiStrToLower(name.substr(0, name.find('.')));
  };
  return first_label(host) == first_label(machine.hostname);
}

absl::StatusOr<RdzvConf> ParseRdzvConf(absl::string_view value) {
  // torchrun's keys with no meaning here: its own store's and heartbeat's.
  constexpr const char* kAccepted[] = {
      "close_timeout", "heartbeat", "keep_alive_interval", "keep_alive_max_attempt",
      "read_timeout",  "is_host",   "use_agent_store",     "store_type",
      "protocol",      "cacert",    "ssl_cert_file",       "ssl_key_file"};
  auto accepted = [&](const std::string& key) {
    return std::find(std::begin(kAccepted), std::end(kAccepted), key) != std::end(kAccepted);
  };
  RdzvConf conf;
  for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string key(absl::StripAsciiWhitespace(kv[0]));
    if (kv.size() != 2 || key.empty()) {
      return FlagError("rdzv_conf", absl::StrCat("'", item, "' is not KEY=VALUE"));
    }
    const absl::string_view v = absl::StripAsciiWhitespace(kv[1]);
    if (key == "join_timeout" || key == "timeout" || key == "last_call_timeout") {
      double s = 0;
      if (!absl::SimpleAtod(v, &s) || !(s >= 0) || s > 1e7 ||
          (s == 0 && key != "last_call_timeout")) {
        return FlagError("rdzv_conf", absl::StrCat(key, "='", v, "' is not a number of seconds"));
      }
      (key == "last_call_timeout" ? conf.last_call_timeout : conf.join_timeout) = absl::Seconds(s);
      continue;
    }
    if (key == "cacert" || key == "cert" || key == "key") {
      if (v.empty()) return FlagError("rdzv_conf", absl::StrCat(key, " is empty"));
      std::string path(v);
      if (path[0] != '/') {
        char cwd[4096];
        if (::getcwd(cwd, sizeof(cwd)) != nullptr) path = absl::StrCat(cwd, "/", path);
      }
      (key == "cacert" ? conf.etcd_ca_file
       : key == "cert" ? conf.etcd_cert_file
                       : conf.etcd_key_file) = path;
      continue;
    }
    if (key == "protocol") {
      if (v != "http" && v != "https") {
        return FlagError("rdzv_conf", absl::StrCat("protocol='", v, "' is not http or https"));
      }
      conf.protocol = std::string(v);
      continue;
    }
    if (accepted(key)) {
      conf.ignored.push_back(key);
      continue;
    }
    return FlagError(
        "rdzv_conf",
        absl::StrCat("unknown key '", key,
                     "' (baton-run uses join_timeout, timeout, last_call_timeout, and for etcd "
                     "cacert, cert, key and protocol, "
                     "and accepts torchrun's ",
                     absl::StrJoin(kAccepted, ", "), ")"));
  }
  return conf;
}

}  // namespace baton::launcher
