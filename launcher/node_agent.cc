#include "launcher/node_agent.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/file_io.h"
#include "base/host.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "launcher/internal/node_agent_impl.h"
#include "launcher/internal/output_pump.h"
#include "launcher/internal/process.h"
#include "launcher/internal/state_report.h"
#include "launcher/internal/worker_group.h"
#include "launcher/rendezvous.h"
#include "obs/http_server.h"
#include "obs/metrics.h"
#include "store/etcd_store.h"
#include "store/memory_store.h"
#include "store/store_client.h"
#include "store/store_server.h"

namespace baton::launcher {
namespace internal {

void Log(absl::string_view text) {
  std::string line = absl::StrCat("baton-run: ", text, "\n");
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

bool IsMissingKey(const absl::Status& s) { return s.code() == absl::StatusCode::kDeadlineExceeded; }

}  // namespace internal

namespace {

using internal::IsMissingKey;
using internal::kExitAckTimeout;
using internal::kFollowUpTimeout;
using internal::kHeartbeatPeriodMax;
using internal::Log;
using internal::Worker;
using internal::WorkerGroup;

// Binds 0.0.0.0:port (SO_REUSEADDR, as gRPC does) and returns the bound
// port, or -1.
int TryBind(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  int bound = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      bound = ntohs(addr.sin_port);
    }
  }
  ::close(fd);
  return bound;
}

absl::Status MakeDirs(const std::string& path) {
  std::string prefix;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    absl::StrAppend(&prefix, part, "/");
    if (part.empty()) continue;
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InternalError(
          absl::StrCat("cannot create directory ", prefix, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

std::string Indent(absl::string_view text) {
  if (text.empty()) return "    (empty)";
  return absl::StrCat("    ", absl::StrJoin(absl::StrSplit(text, '\n'), "\n    "));
}

}  // namespace

NodeAgent::Impl::~Impl() {
  node_metrics_.reset();
  {
    absl::MutexLock lock(&mu_);
    watcher_.reset();
  }
  if (!state_dir_.empty() && group_ != nullptr) {
    // Sockets of workers that died without removing theirs.
    for (const auto& w : group_->workers()) {
      ::unlink(internal::StateSocket(state_dir_, w.rank).c_str());
    }
    ::unlink(absl::StrCat(state_dir_, "/report_dir").c_str());
    ::rmdir(state_dir_.c_str());  // unless another node's workers use it
  }
  group_.reset();
  pump_.Close();
  if (!temp_dir_.empty()) {
    if (DIR* d = ::opendir(temp_dir_.c_str())) {
      while (dirent* e = ::readdir(d)) {
        if (e->d_name[0] == '.') continue;
        ::unlink(absl::StrCat(temp_dir_, "/", e->d_name).c_str());
      }
      ::closedir(d);
    }
    ::rmdir(temp_dir_.c_str());
  }
  if (server_ != nullptr) server_->Shutdown();
}

absl::StatusOr<int> NodeAgent::Impl::PickMasterPort() {
  int port = -1;
  if (o_.master_port != 0 && TryBind(o_.master_port) == o_.master_port) {
    port = o_.master_port;
  } else {
    // A fresh free port; never the rendezvous port or last round's port.
    for (int tries = 0; tries < 20; ++tries) {
      port = TryBind(0);
      if (port > 0 && port != o_.rdzv_port && port != last_master_port_) break;
    }
    if (port <= 0) {
      return absl::ResourceExhaustedError("no free port for MASTER_PORT");
    }
    if (o_.master_port != 0) {
      Log(absl::StrCat("--master_port ", o_.master_port,
                       " is busy on the master node; workers get MASTER_PORT=", port));
    }
  }
  last_master_port_ = port;
  return port;
}

absl::StatusOr<std::unique_ptr<store::EtcdStore>> NodeAgent::Impl::ConnectEtcd() {
  auto tls = LoadTls(o_.etcd.tls);
  if (!tls.ok()) return Annotate(tls.status(), "etcd's TLS files (--rdzv_conf)");
  store::EtcdStoreOptions eo;
  eo.endpoint = o_.etcd.endpoint;
  eo.prefix = absl::StrCat("/baton/", o_.run_id, "/rdzv/");
  // etcd may come up after the nodes (within the rendezvous timeout); once
  // it answered, a partition from it may last the tolerance.
  eo.connect_timeout = o_.rdzv_timeout;
  eo.call_timeout = StoreCallTimeout();
  eo.user = o_.etcd.user;
  eo.password = o_.etcd.password;
  if (!o_.etcd.password_file.empty()) {
    auto password = ReadFile(o_.etcd.password_file);
    if (!password.ok()) return Annotate(password.status(), kEnvEtcdPasswordFile);
    eo.password = std::string(absl::StripTrailingAsciiWhitespace(*password));
  }
  eo.tls = *std::move(tls);
  auto store = store::EtcdStore::Connect(std::move(eo));
  if (!store.ok()) return Annotate(store.status(), "the job's rendezvous on etcd");
  return store;
}

absl::Status NodeAgent::Impl::Setup() {
  bool host = node_rank_ == 0;
  if (!o_.from_env.empty()) {
    Log(absl::StrCat("defaults from the environment: ", absl::StrJoin(o_.from_env, " ")));
  }
  if (!o_.env_ignored.empty()) {
    Log(absl::StrCat("ignored (torchrun flags with no meaning for baton-run): ",
                     absl::StrJoin(o_.env_ignored, " ")));
  }
  if (!o_.log_dir.empty()) {
    RETURN_IF_ERROR(MakeDirs(o_.log_dir));
  }
  std::string tmpl = absl::StrCat(::getenv("TMPDIR") != nullptr ? ::getenv("TMPDIR") : "/tmp",
                                  "/baton-run-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", tmpl, ": ", std::strerror(errno)));
  }
  temp_dir_ = tmpl;

  ASSIGN_OR_RETURN(auto tls, LoadTls(o_.tls));
  if (!o_.etcd.endpoint.empty()) {
    // etcd holds the rendezvous: no node serves it.
    auto etcd = ConnectEtcd();
    if (!etcd.ok()) return etcd.status();
    etcd_ = etcd->get();
    own_store_ = *std::move(etcd);
    store_ = own_store_.get();
    if (o_.rdzv_host_by_claim) {
      dynamic_host_ = true;
      host_claim_ = absl::StrCat(host_name_, "/", ::getpid(), "/", RandomHex(4));
      auto claimed = ClaimHost();
      if (!claimed.ok()) return Annotate(claimed.status(), "claiming the rendezvous host");
      host = *claimed;
    }
  } else if (o_.max_nodes == 1) {
    // One node: the rendezvous stays in this process.
    own_store_ = std::make_unique<store::MemoryStore>();
    store_ = own_store_.get();
  } else if (host || o_.rdzv_host_by_bind) {
    auto server =
        store::StoreServer::Start({absl::StrCat("0.0.0.0:", o_.rdzv_port), env_token_, tls});
    if (server.ok()) {
      host = true;
      node_rank_ = 0;
      server_ = *std::move(server);
      store_ = &server_->store();
    } else if (host) {
      return Annotate(server.status(), "starting the rendezvous store (--rdzv_port)");
    } else {
      // Another node on this machine bound the endpoint first: it hosts.
      Log(absl::StrCat("rendezvous port ", o_.rdzv_port, " is taken (", server.status().message(),
                       "); joining the node that hosts it"));
    }
  }
  if (store_ == nullptr) {  // another node hosts the rendezvous
    own_store_ = std::make_unique<store::StoreClient>(store::StoreClientOptions{
        absl::StrCat(o_.master_addr, ":", o_.rdzv_port), env_token_, StoreCallTimeout(), tls});
    store_ = own_store_.get();
  }

  RendezvousConfig rc;
  rc.node_rank = node_rank_;
  rc.host_name = host_name_;
  rc.min_nodes = o_.min_nodes;
  rc.max_nodes = o_.max_nodes;
  rc.timeout = o_.rdzv_timeout;
  rc.last_call = o_.elastic() ? o_.rdzv_last_call : absl::ZeroDuration();
  rc.pick_master_port = [this] { return PickMasterPort(); };
  rc.dynamic_host = dynamic_host_;
  rc.claim_host = [this] { return ClaimHost(); };
  rc.watch_period =
      std::max(o_.monitor_interval, std::min(absl::Seconds(1), o_.HeartbeatTimeout() / 4));
  rdzv_ = std::make_unique<Rendezvous>(store_, rc);

  std::vector<std::string> roles;
  for (const RoleSpec& r : o_.roles) {
    roles.push_back(absl::StrCat(r.name, ":", r.count, ":",
                                 r.policy == RestartPolicy::kRole     ? "role"
                                 : r.policy == RestartPolicy::kWorker ? "worker"
                                                                      : "group"));
  }
  Record job = {{"roles", absl::StrJoin(roles, ",")},
                {"max_restarts", absl::StrCat(o_.max_restarts)}};
  if (host) {
    run_id_ = o_.run_id.empty() ? RandomHex(6) : o_.run_id;
    job["run_id"] = run_id_;
    RETURN_IF_ERROR(rdzv_->Publish(job));
  } else {
    if (!o_.run_id.empty()) job["run_id"] = o_.run_id;
    auto published = rdzv_->FetchJob(job);
    if (!published.ok()) return published.status();
    run_id_ = (*published)["run_id"];
  }
  // The token never goes through the store: a multi-node job brings its own
  // (ResolveJobToken refuses to start without one, and the store checks
  // it); a one-node job without one makes it here, and it reaches the
  // workers through their environment only.
  job_token_ = env_token_.empty() ? RandomHex(16) : env_token_;
  // The hang report: workers serve their state in a private directory named
  // after the run, where `baton-run --dump RUN_ID` finds them.
  state_dir_ = internal::StateDir(run_id_);
  if (absl::Status s = internal::PrepareStateDir(state_dir_, o_.log_dir); !s.ok()) {
    Log(absl::StrCat("no state reports for this run: ", s.message()));
    state_dir_.clear();
  }
  // Workers' requests (env/launcher_request.h, LR1): in this node's private
  // temporary directory.
  requests_dir_ = absl::StrCat(temp_dir_, "/requests");
  if (::mkdir(requests_dir_.c_str(), 0700) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot create directory ", requests_dir_, ": ", std::strerror(errno)));
  }
  group_ = std::make_unique<WorkerGroup>(
      internal::WorkerGroupConfig{&o_, run_id_, job_token_, o_.master_addr,
                                  o_.log_dir.empty() ? temp_dir_ : o_.log_dir, state_dir_,
                                  requests_dir_},
      &pump_);
  if (!state_dir_.empty()) {
    absl::MutexLock lock(&mu_);
    watcher_ = std::make_unique<internal::StateWatcher>(internal::StateWatcher::Options{
        run_id_, state_dir_, o_.hang_timeout, [](const std::string& line) { Log(line); }});
  }
  if (o_.node_metrics_port > 0) {
    if (state_dir_.empty()) {
      return absl::FailedPreconditionError(
          "--node_metrics_port needs the workers' state sockets, which this node could not make");
    }
    auto server = obs::HttpServer::Start(
        absl::StrCat("0.0.0.0:", o_.node_metrics_port),
        {{"/metrics", {std::string(obs::kMetricsContentType), [dir = state_dir_] {
                         return internal::ScrapeNode(dir, absl::Seconds(2));
                       }}}});
    if (!server.ok()) return Annotate(server.status(), "--node_metrics_port");
    node_metrics_ = *std::move(server);
  }
  return absl::OkStatus();
}

int NodeAgent::Impl::Run() {
  if (absl::Status s = Setup(); !s.ok()) {
    Log(absl::StrCat("error: ", s.message()));
    return kExitFailure;
  }
  int64_t next_round = 0;
  if (!rdzv_->is_host()) {
    auto current = rdzv_->CurrentRound();
    if (!current.ok()) {
      Log(absl::StrCat("error: ", current.status().message()));
      return kExitFailure;
    }
    next_round = *current;
  }
  while (true) {
    if (int sig = PendingSignal(); sig != 0) {
      Log(absl::StrCat("stopped by ", internal::SignalName(sig), " before the workers started"));
      return 128 + sig;
    }
    auto round = rdzv_->Join(next_round);
    if (!round.ok()) {
      Log(absl::StrCat("error: rendezvous failed: ", round.status().message()));
      // The error reached the others through the round's "closed" key (or
      // is theirs too); the host gives them a moment to read it.
      if (rdzv_->is_host()) {
        auto arrived = store_->Add(Rendezvous::Key(next_round, "count"), 0);
        FinishAsHost(next_round, arrived.ok() ? static_cast<int>(*arrived) - 1 : 0);
      } else {
        AckExit(next_round);
      }
      return kExitFailure;
    }
    Log(absl::StrCat("run ", run_id_, " round ", round->round, ": node ", round->group_rank, " of ",
                     round->group_world_size, ", world size ",
                     o_.local_world_size() * round->group_world_size, ", MASTER_PORT ",
                     round->master_port, ", restart ", round->restart_count, "/", o_.max_restarts));
    RoundOutcome out = RunRound(*round);
    const std::string& kind = out.kind;
    // Outcomes that end the job on every node.
    const bool job_over =
        kind == "success" || kind == "shutdown" || (kind == "failure" && out.final);
    const bool last = job_over || kind == "error" || out.local_signal != 0;
    // Tell the master node this node has read the outcome before spending
    // the grace period on stopping workers: it keeps the store up for that.
    if (job_over && !rdzv_->is_host()) {
      AckExit(round->round);
    }
    if (group_->AnyRunning()) {
      group_->Stop(-1, out.local_signal != 0 ? out.local_signal : SIGTERM, o_.stop_timeout);
    }
    if (!last) {
      std::string why;
      if (kind == "failure") {
        why = absl::StrCat(": rank ", out.record["rank"], " ", out.record["reason"]);
      } else if (kind == "node_lost") {
        why = absl::StrCat(": node rank ", out.record["node_rank"], " (", out.record["host"],
                           ") sent no heart-beat for ", DurationText(o_.HeartbeatTimeout()),
                           ": it is cut off from the job by the network, hung, or dead");
      }
      Log(absl::StrCat("round ", round->round, " ended (", kind, why, "); rendezvous again",
                       kind == "node_lost" && o_.min_nodes == o_.max_nodes
                           ? absl::StrCat(", waiting up to ", DurationText(o_.rdzv_timeout),
                                          " (--rdzv_timeout) for every node to rejoin")
                           : ""));
      next_round = round->round + 1;
      continue;
    }
    if (rdzv_->is_host()) FinishAsHost(round->round, round->group_world_size - 1);
    if (kind == "success") {
      Log(absl::StrCat("run ", run_id_, ": all workers succeeded"));
      return kExitSuccess;
    }
    if (out.local_signal != 0) {
      Log(absl::StrCat("stopped by ", internal::SignalName(out.local_signal)));
      return 128 + out.local_signal;
    }
    if (kind == "error") {
      Log(absl::StrCat("error: ", out.error.message()));
      return kExitFailure;
    }
    if (kind == "shutdown") {
      Log(absl::StrCat("job stopped: node rank ", out.record["node_rank"], " (", out.record["host"],
                       ") received ", out.record["signal"]));
      return kExitFailure;
    }
    PrintSummary(out);
    return kExitFailure;
  }
}

void NodeAgent::Impl::AckExit(int64_t round) {
  // The n-th node to read the outcome says so; the host waits for the key
  // of the last one (FinishAsHost).
  auto n = store_->Add(Rendezvous::Key(round, "exit_acks"), 1);
  if (n.ok()) (void)store_->Set(Rendezvous::Key(round, absl::StrCat("exit_ack/", *n)), "1");
}

void NodeAgent::Impl::FinishAsHost(int64_t round, int others) {
  if (server_ == nullptr && etcd_ == nullptr) return;
  if (others > 0) {
    // Every node read the outcome before the rendezvous goes (the served
    // store stops, etcd's keys are revoked).
    absl::Status acked =
        store_->Wait({Rendezvous::Key(round, absl::StrCat("exit_ack/", others))}, kExitAckTimeout);
    if (!acked.ok()) Log("some nodes did not confirm the end of the job; closing the store");
  }
  if (etcd_ != nullptr) {
    if (absl::Status s = etcd_->RevokeLease(); !s.ok()) {
      Log(absl::StrCat("the job's keys in etcd stay until their lease expires: ", s.message()));
    }
  }
}

absl::StatusOr<RoundOutcome> NodeAgent::Impl::ReadEnd(const RoundInfo& round) {
  ASSIGN_OR_RETURN(auto text,
                   store_->Get(Rendezvous::Key(round.round, "end"), absl::ZeroDuration()));
  auto rec = DecodeRecord(text);
  if (!rec.ok()) return rec.status();
  RoundOutcome out;
  out.record = *std::move(rec);
  out.kind = out.record["kind"];
  if (out.kind == "failure") {
    auto n = store_->Get(Rendezvous::Key(round.round, "end_restart"), kFollowUpTimeout);
    if (!n.ok()) return n.status();
    (void)absl::SimpleAtoi(*n, &out.restart);
    out.final = out.restart > o_.max_restarts;
  }
  return out;
}

RoundOutcome NodeAgent::Impl::RunRound(const RoundInfo& round) {
  auto fail = [](absl::Status s) {
    RoundOutcome out;
    out.kind = "error";
    out.error = std::move(s);
    return out;
  };
  group_->Configure(round);
  heartbeats_.clear();
  next_request_slot_ = 0;
  last_request_poll_ = absl::InfinitePast();
  DiscardRequests();

  const std::string end_key = Rendezvous::Key(round.round, "end");
  if (absl::Status s = group_->Start(-1, round.restart_count); !s.ok()) {
    Log(absl::StrCat("error: ", s.message()));
    auto rec = EncodeRecord({{"kind", "failure"},
                             {"node_rank", absl::StrCat(node_rank_)},
                             {"host", host_name_},
                             {"rank", "?"},
                             {"reason", std::string(s.message())}});
    if (auto won = store_->CompareSet(end_key, "", rec); won.ok() && *won == rec) {
      auto n = store_->Add("rdzv/restarts", 1);
      if (n.ok()) {
        (void)store_->Set(Rendezvous::Key(round.round, "end_restart"), absl::StrCat(*n));
      }
    }
  }
  const absl::Duration heartbeat_period =
      std::max(o_.monitor_interval, std::min(kHeartbeatPeriodMax, o_.HeartbeatTimeout() / 5));
  std::vector<int> role_gen(o_.roles.size(), 0);
  bool reported_done = false;
  while (true) {
    if (int sig = PendingSignal(); sig != 0) {
      const bool leave = o_.elastic() && !rdzv_->is_host();
      (void)store_->CompareSet(end_key, "",
                               EncodeRecord({{"kind", leave ? "node_left" : "shutdown"},
                                             {"node_rank", absl::StrCat(node_rank_)},
                                             {"group_rank", absl::StrCat(round.group_rank)},
                                             {"host", host_name_},
                                             {"signal", internal::SignalName(sig)}}));
      RoundOutcome out;
      out.kind = leave ? "node_left" : "shutdown";
      out.local_signal = sig;
      return out;
    }
    for (int i : group_->Poll()) {
      const Worker& w = group_->worker(i);
      if (w.dropped) {
        Log(absl::StrCat("rank ", w.rank, " (role ", o_.roles[w.role_index].name, ") ",
                         w.exit.Describe(), ": ", w.stop_reason, "; the round goes on without it"));
        continue;
      }
      // A worker stopped so that it restarts fails, whatever its code (LR3).
      if (w.exit.success() && w.stop_reason.empty()) continue;
      const int role = w.role_index;
      absl::Status s;
      switch (o_.roles[role].policy) {
        case RestartPolicy::kRole: s = ReportRoleFailure(round, role, role_gen[role], i); break;
        case RestartPolicy::kWorker: s = RestartWorker(round, i); break;
        case RestartPolicy::kGroup: s = ReportFailure(round, i); break;
      }
      if (!s.ok()) return fail(Annotate(s, "reporting a worker failure"));
    }
    // After Poll: a worker that ended meanwhile is not running any more,
    // so a request about it does nothing (LR5).
    if (absl::Status s = HandleRequests(round); !s.ok()) {
      return fail(CutOff(s, "handling the workers' requests"));
    }
    for (int role = 0; role < static_cast<int>(o_.roles.size()); ++role) {
      if (o_.roles[role].policy != RestartPolicy::kRole) continue;
      auto restarted = MaybeRestartRole(round, role, &role_gen[role], &reported_done);
      if (!restarted.ok()) {
        return fail(Annotate(restarted.status(), "restarting a role"));
      }
    }
    if (!reported_done && group_->AllSucceeded()) {
      absl::Status s =
          store_->Set(Rendezvous::Key(round.round, absl::StrCat("done/", round.group_rank)), "1");
      if (!s.ok()) return fail(s);
      reported_done = true;
    }
    const absl::Time now = absl::Now();
    if (!rdzv_->is_host() && now - last_heartbeat_sent_ >= heartbeat_period) {
      auto hb = store_->Add(Rendezvous::Key(round.round, absl::StrCat("hb/", round.group_rank)), 1);
      if (!hb.ok()) return fail(CutOff(hb.status(), "heartbeat"));
      last_heartbeat_sent_ = now;
    }
    if (rdzv_->is_host()) {
      if (absl::Status s = HostChecks(round); !s.ok()) return fail(CutOff(s, "checking the round"));
    } else if (dynamic_host_) {
      if (absl::Status s = WatchHost(round); !s.ok()) return fail(CutOff(s, "watching the host"));
    }
    auto end = ReadEnd(round);
    if (end.ok()) return *std::move(end);
    if (!IsMissingKey(end.status())) {
      return fail(CutOff(end.status(), "watching the round"));
    }
    Tick(o_.monitor_interval);
  }
}

absl::Duration NodeAgent::Impl::StoreCallTimeout() const {
  // A partition shorter than the tolerance delays a store call; a longer one
  // fails it, and this node fences itself (CutOff).
  return o_.PartitionTolerance() + kHeartbeatPeriodMax;
}

absl::Status NodeAgent::Impl::CutOff(const absl::Status& s, absl::string_view doing) const {
  // A node that reaches the store over the network (the built-in one on
  // another node, or etcd) can be cut off from it.
  const bool remote = etcd_ != nullptr || (server_ == nullptr && o_.max_nodes > 1);
  if (!remote || !(absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s))) {
    return Annotate(s, doing);
  }
  return absl::Status(
      s.code(),
      absl::StrCat("this node is cut off from the job (a network partition?): the rendezvous "
                   "store at ",
                   etcd_ != nullptr ? absl::StrCat("etcd ", o_.etcd.endpoint)
                                    : absl::StrCat(o_.master_addr, ":", o_.rdzv_port),
                   " did not answer for ", DurationText(o_.PartitionTolerance()),
                   " (--partition_tolerance), so this node stops its workers; the master node "
                   "takes it for lost after ",
                   DurationText(o_.HeartbeatTimeout()), " (", doing, ": ", s.message(), ")"));
}

void NodeAgent::Impl::PrintSummary(const RoundOutcome& out) {
  Record r = out.record;
  std::string text = absl::StrCat(
      "\n==================== baton-run: job failed ====================\n",
      "run id:        ", run_id_, "\n", "restarts:      ", out.restart - 1, " of --max_restarts ",
      o_.max_restarts, " used; no restart left\n", "first failure: rank ", r["rank"], " (role ",
      r["role"], ", role rank ", r["role_rank"], ", local rank ", r["local_rank"],
      ") on node rank ", r["node_rank"], " (", r["host"], "), pid ", r["pid"], "\n",
      "reason:        ", r["reason"], "\n", "time:          ", r["time"], "\n");
  if (!r["error_content"].empty()) {
    absl::StrAppend(&text, "error file:    ", r["error_file"], "\n", Indent(r["error_content"]),
                    "\n");
  } else {
    absl::StrAppend(&text, "error file:    none written (", kEnvErrorFile, ")\n");
  }
  absl::StrAppend(
      &text, "last output", r["log"].empty() ? "" : absl::StrCat(" (log ", r["log"], ")"), ":\n",
      Indent(r["tail"]), "\n", "===============================================================\n");
  (void)!::write(STDERR_FILENO, text.data(), text.size());
}

NodeAgent::NodeAgent(LaunchOptions options, std::string job_token)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(job_token))) {}
NodeAgent::~NodeAgent() = default;
int NodeAgent::Run() { return impl_->Run(); }
void NodeAgent::RequestStop(int signal) { impl_->RequestStop(signal); }

void NodeAgent::RequestStateReport() { impl_->RequestStateReport("SIGUSR1"); }

}  // namespace baton::launcher
