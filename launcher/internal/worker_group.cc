#include "launcher/internal/worker_group.h"

#include "launcher/internal/state_report.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "env/env.h"
#include "env/launcher_request.h"

extern char** environ;

namespace baton::launcher::internal {
namespace {

// Error files larger than this are cut in the summary.
constexpr size_t kMaxErrorFileBytes = 64 << 10;
// After SIGKILL, how long to wait for the kernel to let the process go.
constexpr absl::Duration kKillReapTimeout = absl::Seconds(5);
// Poll period while waiting for processes to end.
constexpr absl::Duration kReapPeriod = absl::Milliseconds(10);

}  // namespace

WorkerGroup::WorkerGroup(WorkerGroupConfig config, OutputPump* pump)
    : config_(std::move(config)), pump_(pump) {}

WorkerGroup::~WorkerGroup() {
  if (AnyRunning()) Stop(-1, SIGKILL, absl::ZeroDuration());
  for (Worker& w : workers_) {
    if (w.stream >= 0) pump_->Remove(w.stream);
  }
}

void WorkerGroup::Configure(const RoundInfo& round) {
  for (Worker& w : workers_) {
    if (w.stream >= 0) pump_->Remove(w.stream);
  }
  round_ = round;
  workers_.clear();
  const auto& roles = config_.options->roles;
  const int nodes = round.group_world_size;
  int offset = 0, local = 0;
  for (int r = 0; r < static_cast<int>(roles.size()); ++r) {
    for (int j = 0; j < roles[r].count; ++j) {
      Worker w;
      w.role_index = r;
      w.local_rank = local++;
      w.role_world_size = roles[r].count * nodes;
      w.role_rank = round.group_rank * roles[r].count + j;
      w.rank = offset + w.role_rank;
      if (!config_.options->log_dir.empty()) {
        w.log_path = absl::StrCat(config_.options->log_dir, "/rank_", w.rank, ".log");
      }
      w.error_file = absl::StrCat(config_.error_dir, "/error_rank_", w.rank, ".json");
      workers_.push_back(std::move(w));
    }
    offset += roles[r].count * nodes;
  }
}

std::vector<std::string> WorkerGroup::Environment(const Worker& w) const {
  const LaunchOptions& o = *config_.options;
  const std::vector<std::pair<const char*, std::string>> vars = {
      {kEnvRank, absl::StrCat(w.rank)},
      {kEnvLocalRank, absl::StrCat(w.local_rank)},
      {kEnvWorldSize, absl::StrCat(o.local_world_size() * round_.group_world_size)},
      {kEnvLocalWorldSize, absl::StrCat(o.local_world_size())},
      {kEnvGroupRank, absl::StrCat(round_.group_rank)},
      {kEnvGroupWorldSize, absl::StrCat(round_.group_world_size)},
      {kEnvMasterAddr, config_.master_addr},
      {kEnvMasterPort, absl::StrCat(round_.master_port)},
      {kEnvRunId, config_.run_id},
      {kEnvRestartCount, absl::StrCat(w.restart_count)},
      {kEnvMaxRestarts, absl::StrCat(o.max_restarts)},
      {kEnvRestartWait, absl::StrCat(absl::ToDoubleSeconds(o.RestartWait()))},
      {kEnvPartitionTolerance, absl::StrCat(absl::ToDoubleSeconds(o.PartitionTolerance()))},
      {kEnvJobToken, config_.job_token},
      {kEnvRole, o.roles[w.role_index].name},
      {kEnvRoleRank, absl::StrCat(w.role_rank)},
      {kEnvRoleWorldSize, absl::StrCat(w.role_world_size)},
      {kEnvErrorFile, w.error_file},
      {kEnvLaunched, "1"},
      {kEnvRejoin, w.rejoin ? "1" : "0"},
  };
  std::vector<std::pair<const char*, std::string>> all = vars;
  if (o.metrics_port > 0) {
    all.emplace_back("BATON_METRICS_PORT", absl::StrCat(o.metrics_port + w.local_rank));
  }
  if (!config_.requests_dir.empty()) {
    all.emplace_back(kEnvLauncherRequests, config_.requests_dir);
  }
  if (!config_.state_dir.empty()) {
    all.emplace_back("BATON_STATE_SOCKET", StateSocket(config_.state_dir, w.rank));
    if (o.node_metrics_port > 0) all.emplace_back("BATON_METRICS", "1");
  }
  if (o.tls.enabled()) {
    all.insert(
        all.end(),
        {{kEnvTlsCa, o.tls.ca_file}, {kEnvTlsCert, o.tls.cert_file}, {kEnvTlsKey, o.tls.key_file}});
    if (!o.tls.server_name.empty()) all.emplace_back(kEnvTlsServerName, o.tls.server_name);
  }
  if (!o.etcd.endpoint.empty()) {
    // The workers' store on etcd, fresh for each round: a worker restarted
    // alone rejoins its round's keys, a new round starts from none.
    all.emplace_back(kEnvStoreEtcd, o.etcd.endpoint);
    all.emplace_back(kEnvStorePrefix,
                     absl::StrCat("/baton/", config_.run_id, "/w/", round_.round, "/"));
    if (o.etcd.tls.enabled()) {
      all.insert(all.end(), {{kEnvEtcdCa, o.etcd.tls.ca_file},
                             {kEnvEtcdCert, o.etcd.tls.cert_file},
                             {kEnvEtcdKey, o.etcd.tls.key_file}});
    }
  }
  std::set<std::string> ours;
  for (const auto& [k, v] : all) ours.insert(k);
  // Nor are etcd's (its user and password pass on from baton-run's own
  // environment, where they came from).
  for (const char* k : {kEnvStoreEtcd, kEnvStorePrefix, kEnvEtcdCa, kEnvEtcdCert, kEnvEtcdKey}) {
    ours.insert(k);
  }
  // TLS variables from baton-run's own environment are never passed on
  // half-set: a worker gets baton-run's TLS settings or none.
  for (const char* k : {kEnvTlsCa, kEnvTlsCert, kEnvTlsKey, kEnvTlsServerName}) ours.insert(k);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view kv(*e);
    std::string name(kv.substr(0, kv.find('=')));
    if (!ours.count(name)) env.emplace_back(kv);
  }
  for (const auto& [k, v] : all) env.push_back(absl::StrCat(k, "=", v));
  return env;
}

absl::Status WorkerGroup::Start(int role, int restart_count) {
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    if (role >= 0 && (workers_[i].role_index != role || workers_[i].dropped)) continue;
    RETURN_IF_ERROR(StartOne(i, restart_count, role >= 0 && restart_count > 0));
  }
  return absl::OkStatus();
}

absl::Status WorkerGroup::StartWorker(int i, int restart_count) {
  return StartOne(i, restart_count, /*rejoin=*/true);
}

absl::Status WorkerGroup::StartOne(int i, int restart_count, bool rejoin) {
  const LaunchOptions& o = *config_.options;
  Worker& w = workers_[i];
  w.restart_count = restart_count;
  w.rejoin = rejoin;
  w.exit = ExitInfo();
  w.stop_reason.clear();
  w.dropped = false;
  w.kill_at = absl::InfiniteFuture();
  ::unlink(w.error_file.c_str());
  OutputSink sink;
  if (!w.log_path.empty()) {
    sink.log_fd = ::open(w.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (sink.log_fd < 0) {
      return absl::InternalError(
          absl::StrCat("cannot open log file ", w.log_path, ": ", std::strerror(errno)));
    }
    const std::string header =
        absl::StrCat("=== baton-run: run ", config_.run_id, ", rank ", w.rank, ", restart ",
                     restart_count, ", round ", round_.round, " ===\n");
    (void)!::write(sink.log_fd, header.data(), header.size());
  }
  // Without --log_dir output goes to the terminal; --tee adds it there even
  // with a log dir, with a rank prefix.
  sink.echo = o.tee || o.log_dir.empty();
  if (o.tee) sink.prefix = absl::StrCat("[rank ", w.rank, "] ");
  auto proc = Spawn({o.roles[w.role_index].argv, Environment(w)});
  if (!proc.ok()) {
    if (sink.log_fd >= 0) ::close(sink.log_fd);
    return Annotate(proc.status(), absl::StrCat("starting rank ", w.rank, " (role ",
                                                o.roles[w.role_index].name, ")"));
  }
  if (w.stream >= 0) pump_->Remove(w.stream);
  w.pid = proc->pid;
  w.stream = pump_->Add(proc->stdout_fd, proc->stderr_fd, std::move(sink));
  w.running = true;
  w.start_time = absl::Now();
  return absl::OkStatus();
}

void WorkerGroup::Reaped(Worker& w) {
  w.running = false;
  // Whatever the worker left in its process group goes with it. The group
  // id cannot have been reused: a live member keeps it reserved.
  SignalGroup(w.pid, SIGKILL);
}

std::vector<int> WorkerGroup::Poll() {
  std::vector<std::pair<absl::Time, int>> ended;
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    Worker& w = workers_[i];
    if (w.running && TryReap(w.pid, &w.exit)) {
      Reaped(w);
      ended.emplace_back(w.exit.time, i);
    }
  }
  std::sort(ended.begin(), ended.end());
  std::vector<int> out;
  for (const auto& e : ended) out.push_back(e.second);
  return out;
}

void WorkerGroup::Stop(int role, int signal, absl::Duration grace) {
  std::vector<Worker*> targets;
  for (Worker& w : workers_) {
    if (w.running && (role < 0 || w.role_index == role)) targets.push_back(&w);
  }
  if (targets.empty()) return;
  auto reap_all = [&](absl::Duration limit) {
    const absl::Time deadline = absl::Now() + limit;
    while (true) {
      bool any = false;
      for (Worker* w : targets) {
        if (w->running && TryReap(w->pid, &w->exit)) Reaped(*w);
        any = any || w->running;
      }
      if (!any || absl::Now() >= deadline) return !any;
      absl::SleepFor(kReapPeriod);
    }
  };
  if (signal != SIGKILL) {
    for (Worker* w : targets) SignalGroup(w->pid, signal);
    if (reap_all(grace)) return;
  }
  for (Worker* w : targets) {
    if (w->running) SignalGroup(w->pid, SIGKILL);
  }
  if (!reap_all(kKillReapTimeout)) {
    for (Worker* w : targets) {
      if (w->running) {
        // Uninterruptible sleep in the kernel; nothing more can be done.
        Logger("baton-run")
            .Error(absl::StrCat("rank ", w->rank, " (pid ", w->pid, ") did not die after SIGKILL"));
      }
    }
  }
}

WorkerGroup::StopOutcome WorkerGroup::StopOnRequest(int i, bool drop, std::string reason,
                                                    absl::Time kill_at) {
  Worker& w = workers_[i];
  if (!w.running) return StopOutcome::kNotRunning;
  if (!w.stop_reason.empty()) return StopOutcome::kAlreadyStopping;
  // Ended but not reaped yet: Poll() reports it as it ended (a look that
  // leaves it to be reaped).
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
      info.si_pid == w.pid) {
    return StopOutcome::kNotRunning;
  }
  w.stop_reason = std::move(reason);
  w.dropped = drop;
  w.kill_at = kill_at;
  SignalGroup(w.pid, SIGTERM);
  return StopOutcome::kStopping;
}

void WorkerGroup::EscalateStops(absl::Time now) {
  for (Worker& w : workers_) {
    if (w.running && w.kill_at <= now) {
      SignalGroup(w.pid, SIGKILL);
      w.kill_at = absl::InfiniteFuture();
    }
  }
}

int WorkerGroup::IndexOfRank(int rank) const {
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    if (workers_[i].rank == rank) return i;
  }
  return -1;
}

bool WorkerGroup::AllSucceeded() const {
  for (const Worker& w : workers_) {
    if (w.running || !(w.exit.success() || w.dropped)) return false;
  }
  return true;
}

bool WorkerGroup::AnyRunning() const {
  for (const Worker& w : workers_) {
    if (w.running) return true;
  }
  return false;
}

std::string WorkerGroup::Tail(int i, int max_lines) {
  const Worker& w = workers_[i];
  if (w.stream < 0) return "";
  pump_->WaitDrained(w.stream, absl::Milliseconds(500));
  return pump_->Tail(w.stream, max_lines);
}

std::string WorkerGroup::ErrorFileContent(int i) const {
  std::ifstream in(workers_[i].error_file, std::ios::binary);
  if (!in) return "";
  std::string content(kMaxErrorFileBytes, '\0');
  in.read(content.data(), content.size());
  content.resize(static_cast<size_t>(in.gcount()));
  if (!content.empty() && content.back() == '\n') content.pop_back();
  return content;
}

}  // namespace baton::launcher::internal
