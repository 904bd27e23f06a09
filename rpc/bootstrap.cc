// Bootstrap of the RPC agent: reading the options from the environment,
// connecting to the store, agreeing on the token, claiming the rank,
// publishing and reading the workers' registrations (proto::WorkerRecord),
// the shared-memory probe and links, and the init barrier. The store's keys
// and what each means are the Rendezvous' (rpc/internal/rendezvous.h); what
// they say is applied to the agent here. The agent's calls and replies are
// in agent.cc.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_io.h"
#include "base/host.h"
#include "base/status_macros.h"
#include "env/env.h"
#include "rpc/agent.h"
#include "rpc/channel/shm/shm_channel.h"
#include "rpc/internal/agent_impl.h"
#include "rpc/internal/job_store.h"
#include "rpc/transport/grpc/grpc_transport.h"
#include "rpc/transport/shm/shm_transport.h"
#include "store/store_client.h"
#include "store/store_server.h"

namespace baton::rpc {
namespace {

// The local IPv4 address that routes to `host` (no packet is sent).
absl::StatusOr<std::string> LocalAddressToward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 ||
      res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve MASTER_ADDR '", host, "'"));
  }
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  std::string out;
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf));
      out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (out.empty()) {
    return absl::UnavailableError(absl::StrCat("no local address routes to ", host));
  }
  return out;
}

}  // namespace

absl::StatusOr<AgentOptions> AgentOptions::FromEnv(const std::string& name_prefix,
                                                   EnvLookup lookup) {
  if (lookup == nullptr) {
    lookup = [](absl::string_view name) -> std::optional<std::string> {
      const char* v = std::getenv(std::string(name).c_str());
      if (v == nullptr) return std::nullopt;
      return std::string(v);
    };
  }
  auto get = [&lookup](absl::string_view name) -> std::string {
    std::optional<std::string> v = lookup(name);
    return v.has_value() ? *v : std::string();
  };
  AgentOptions o;
  if (const std::string v = get("BATON_TRANSPORT"); !v.empty()) {
    if (v == "shm") {
      o.transport.local_transport = LocalTransport::kShm;
    } else if (v == "grpc") {
      o.transport.local_transport = LocalTransport::kGrpc;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("BATON_TRANSPORT is '", v, "'; use shm or grpc"));
    }
  }
  if (get("BATON_SHM") == "0") {
    o.transport.same_host_shm = false;
  }
  if (get("BATON_NET_BULK") == "0") {
    o.transport.network_bulk = false;
  }
  if (const std::string v = get("BATON_SHM_LINK_PEERS"); !v.empty()) {
    if (!absl::SimpleAtoi(v, &o.transport.shm_link_peers_max) ||
        o.transport.shm_link_peers_max < 0) {
      return absl::InvalidArgumentError(absl::StrCat("BATON_SHM_LINK_PEERS is '", v,
                                                     "'; use a number of workers, 0 for no limit"));
    }
  }
  if (const std::string lanes = get("BATON_NET_BULK_LANES"); !lanes.empty()) {
    if (!absl::SimpleAtoi(lanes, &o.transport.network_bulk_lanes) ||
        o.transport.network_bulk_lanes < 1 || o.transport.network_bulk_lanes > 8) {
      return absl::InvalidArgumentError(
          absl::StrCat("BATON_NET_BULK_LANES is '", lanes, "'; use a number from 1 to 8"));
    }
  }
  // One parser for RANK, WORLD_SIZE, MASTER_* (env/env.h), under baton-run
  // or not; without baton-run MASTER_ADDR and MASTER_PORT have defaults.
  const bool launched = get(baton::kEnvLaunched) == "1";
  auto env =
      baton::ReadLaunchEnv([launched, &get](absl::string_view name) -> std::optional<std::string> {
        if (std::string v = get(name); !v.empty()) return v;
        if (!launched && name == baton::kEnvMasterAddr) return std::string("127.0.0.1");
        if (!launched && name == baton::kEnvMasterPort) return std::string("29500");
        return std::nullopt;
      });
  if (!env.ok()) {
    absl::Status s = env.status();
    if (absl::IsNotFound(s)) s = absl::InvalidArgumentError(s.message());
    return Annotate(s,
                    launched ? "reading the environment baton-run set" : "reading the environment");
  }
  o.rank = env->rank;
  o.world_size = env->world_size;
  o.master_addr = env->master_addr;
  o.master_port = env->master_port;
  o.security.job_token = env->job_token;
  o.restarts.rejoin = env->rejoin;
  auto env_or_empty = [&get](const char* name) { return get(name); };
  o.security.tls.ca_file = env_or_empty(baton::kEnvTlsCa);
  o.security.tls.cert_file = env_or_empty(baton::kEnvTlsCert);
  o.security.tls.key_file = env_or_empty(baton::kEnvTlsKey);
  o.security.tls.server_name = env_or_empty(baton::kEnvTlsServerName);
  if (const std::string v = get(baton::kEnvRestartWait); !v.empty()) {
    double seconds = 0;
    if (!absl::SimpleAtod(v, &seconds) || !(seconds >= 0) || seconds > 1e9) {
      return absl::InvalidArgumentError(
          absl::StrCat(baton::kEnvRestartWait, " is '", v, "'; expected seconds, 0 or more"));
    }
    o.restarts.wait = absl::Seconds(seconds);
  }
  if (const std::string v = get(baton::kEnvPartitionTolerance); !v.empty()) {
    double seconds = 0;
    if (!absl::SimpleAtod(v, &seconds) || !(seconds > 0) || seconds > 1e9) {
      return absl::InvalidArgumentError(absl::StrCat(baton::kEnvPartitionTolerance, " is '", v,
                                                     "'; expected seconds, more than 0"));
    }
    o.timeouts.partition_tolerance = absl::Seconds(seconds);
  }
  if (const std::string v = get("BATON_METRICS_ADDRESS"); !v.empty()) {
    o.observability.metrics_address = v;
  } else if (const std::string port = get("BATON_METRICS_PORT"); !port.empty()) {
    int p = 0;
    if (!absl::SimpleAtoi(port, &p) || p < 0 || p > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("BATON_METRICS_PORT is '", port, "'; expected a port"));
    }
    o.observability.metrics_address = absl::StrCat("0.0.0.0:", p);
  }
  o.observability.state_socket = get("BATON_STATE_SOCKET");
  o.observability.collect_metrics = get("BATON_METRICS") == "1";
  o.observability.trace_dir = get("BATON_TRACE");
  o.etcd.endpoint = get(baton::kEnvStoreEtcd);
  if (!o.etcd.endpoint.empty()) {
    o.etcd.prefix = get(baton::kEnvStorePrefix);
    if (o.etcd.prefix.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(baton::kEnvStoreEtcd, " is set but ", baton::kEnvStorePrefix,
                       " is not: the job's keys need a prefix of their own"));
    }
    o.etcd.user = get(baton::kEnvEtcdUser);
    o.etcd.password = get(baton::kEnvEtcdPassword);
    if (const std::string file = get(baton::kEnvEtcdPasswordFile); !file.empty()) {
      auto password = ReadFile(file);
      if (!password.ok()) return Annotate(password.status(), baton::kEnvEtcdPasswordFile);
      o.etcd.password = std::string(absl::StripTrailingAsciiWhitespace(*password));
    }
    o.etcd.tls.ca_file = get(baton::kEnvEtcdCa);
    o.etcd.tls.cert_file = get(baton::kEnvEtcdCert);
    o.etcd.tls.key_file = get(baton::kEnvEtcdKey);
  }
  const std::string n = get("BATON_WORKER_NAME");
  o.name = !n.empty()               ? n
           : env->role != "default" ? absl::StrCat(env->role, env->role_rank)
                                    : absl::StrCat(name_prefix, o.rank);
  return o;
}

namespace internal {

// store_, store_server_, token_, token_file_ and tls_ (rpc/internal/job_store.h);
// rendezvous_, the store's keys (rpc/internal/rendezvous.h).
absl::Status AgentImpl::ConnectStore() {
  ASSIGN_OR_RETURN(JobStore job, JobStore::Connect(options_));
  store_ = std::move(job.store);
  store_server_ = std::move(job.server);
  token_ = std::move(job.token);
  token_file_ = std::move(job.token_file);
  tls_ = std::move(job.tls);
  rendezvous_ = std::make_unique<internal::Rendezvous>(store_, options_);
  return absl::OkStatus();
}

absl::StatusOr<std::string> AgentImpl::AgreeOnToken() {
  if (!token_.empty()) return token_;
  // An injected in-process store: rank 0 creates the token there.
  return rendezvous_->AgreeOnToken();
}

absl::Status AgentImpl::Step(RendezvousStep step) {
  if (rendezvous_observer_ == nullptr) return absl::OkStatus();
  return Annotate(rendezvous_observer_(step),
                  absl::StrCat("rendezvous step ", RendezvousStepName(step)));
}

// The rendezvous, step by step: each step below says what it leaves
// behind for the next. Rendezvous() reads as the list of them.
absl::Status AgentImpl::Rendezvous() {
  if (options_.dynamic_group) return JoinGroup();  // membership.cc
  rank_ = options_.rank;
  RETURN_IF_ERROR(PrepareRuntime());
  RETURN_IF_ERROR(Step(RendezvousStep::kConnectingStore));
  RETURN_IF_ERROR(ConnectStore());
  RETURN_IF_ERROR(TakeRound());
  ASSIGN_OR_RETURN(auto token, AgreeOnToken());
  RETURN_IF_ERROR(StartNetworkTransport(token));
  RETURN_IF_ERROR(ClaimRank());
  Registration reg;
  RETURN_IF_ERROR(StartSameHostPaths(reg));
  RETURN_IF_ERROR(Register(reg));
  RETURN_IF_ERROR(ReadRegistrations(reg));
  RETURN_IF_ERROR(ConnectPeers(reg));
  RETURN_IF_ERROR(Step(RendezvousStep::kBeforeInitBarrier));
  RETURN_IF_ERROR(rendezvous_->ProbedBarrier());
  RETURN_IF_ERROR(Step(RendezvousStep::kAfterInitBarrier));
  auto superseded = FollowSuccessors(reg);
  if (!superseded.ok()) return superseded.status();
  // No rank leaves init while another still needs the store for its own
  // (FollowSuccessors above, the barrier's answer): the store lives in
  // rank 0's process, which may exit as soon as its init returns. So every
  // other rank, past the barrier, says so, and the store's host returns
  // only once all did. That last word needs no answer: once the barrier
  // passed the job is formed, and the host may be gone before it replies.
  // A rank that rejoins finds every key of the round already there.
  RETURN_IF_ERROR(rendezvous_->DoneBarrier());
  if (store_server_ != nullptr) {
    // Bounded: a rank that died right after the barrier never says so.
    (void)rendezvous_->AwaitOthersPassed();
  } else {
    (void)rendezvous_->SayPassed();
  }
  // The job's device maps are checked by every worker alike, now that none
  // needs the store: each fails here with the same error, naming the worker
  // at fault (rpc/internal/device_maps.h), and none is left waiting.
  RETURN_IF_ERROR(CheckJobDeviceMaps(reg.records));
  if (shm_ != nullptr) shm_->RemoveProbe();
  if (shm_transport_ != nullptr) shm_transport_->Activate(*superseded);
  RETURN_IF_ERROR(BecomeReady(reg.mine));
  // After the notification: measuring the clock calls rank 0.
  return StartTrace();
}

absl::Status AgentImpl::BecomeReady(const proto::WorkerRecord& mine) {
  // Calls to self go through the loopback server like any other call.
  AddNetworkPeer(rank_, mine);
  RETURN_IF_ERROR(StartMetrics());
  RETURN_IF_ERROR(StartStateServer());
  {
    absl::MutexLock lock(&mu_);
    running_ = true;
  }
  ready_.Notify();
  return absl::OkStatus();
}

// The executor, the timer, the request gate and the ping function; checks
// that need nothing but the options.
absl::Status AgentImpl::PrepareRuntime() {
  if (timer_ == nullptr) timer_ = std::make_unique<DeadlineTimer>();
  if (executor_ == nullptr) {
    executor_ = std::make_unique<Executor>(Executor::Options{
        options_.threads.min, options_.threads.max, options_.threads.parallelism});
  }
  // F2/F3 (flow_control.h): every request from a peer passes the gate, also
  // those that arrive before our rendezvous finished.
  gate_ = std::make_unique<RequestGate>(
      slots_,
      FlowLimits{options_.transport.max_calls_in_flight, options_.transport.max_bytes_in_flight},
      executor_.get());
  // The probe that confirms a suspected peer death (SuspectPeer). A registry
  // shared by several agents has it already.
  (void)registry_->RegisterInternalInline(
      kPingFunction, [](const CallContext&, Payload, Responder done) { done(Payload()); });
  if (options_.restarts.rejoin && rank_ == 0 && !ExternalStore()) {
    return absl::FailedPreconditionError(
        "rank 0 cannot rejoin a running job: it serves the job's store, which died with it");
  }
  return absl::OkStatus();
}

// ns_ (this round's key prefix), rejoin_, incarnation_, store_instance_
// (Rendezvous::TakeRound: a new round for each init, or the predecessor's
// for a rejoining incarnation, P5).
absl::Status AgentImpl::TakeRound() {
  rejoin_ = options_.restarts.rejoin;
  absl::StatusOr<internal::Rendezvous::Round> round = rendezvous_->TakeRound(rejoin_);
  ns_ = rendezvous_->ns();  // set once the round is, also if what follows failed
  if (!round.ok()) return round.status();
  rejoin_ = round->rejoin;
  incarnation_ = round->incarnation;
  RETURN_IF_ERROR(Step(RendezvousStep::kRoundTaken));

  // Which store instance this round uses (see Teardown).
  ASSIGN_OR_RETURN(store_instance_, rendezvous_->ShareStoreInstance(ExternalStore()));
  return absl::OkStatus();
}

// identity_ and transport_ (with tls_ from ConnectStore), listening on this
// host's address toward the master (loopback for a job on loopback).
absl::Status AgentImpl::StartNetworkTransport(const std::string& token) {
  std::string listen = options_.transport.listen_address;
  if (listen.empty()) {
    std::string host = "127.0.0.1";
    if (!IsLoopbackHost(options_.master_addr)) {
      ASSIGN_OR_RETURN(auto local, LocalAddressToward(options_.master_addr, options_.master_port));
      host = local;
    }
    listen = host + ":0";
  }
  // W1: this incarnation's key pair, before any stream can arrive.
  ASSIGN_OR_RETURN(identity_, WorkerIdentity::Generate());
  NetworkTransportOptions network{listen, token, options_.transport.max_message_bytes, tls_,
                                  options_.timeouts.partition_tolerance};
  network.bulk_channel = options_.transport.network_bulk;
  network.bulk_min_bytes = options_.transport.network_bulk_min_bytes;
  network.bulk_lanes = options_.transport.network_bulk_lanes;
  network.log = Log();
  absl::StatusOr<std::unique_ptr<NetworkTransport>> transport;
  if (network_factory_ != nullptr) {
    transport = network_factory_(network, this);
  } else {
    transport = GrpcTransport::Start(network, this);
  }
  if (!transport.ok()) return transport.status();
  transport_ = *std::move(transport);

  return absl::OkStatus();
}

// The rank is this process's, or ALREADY_EXISTS names it.
absl::Status AgentImpl::ClaimRank() {
  ASSIGN_OR_RETURN(rank_claim_, rendezvous_->ClaimRank(rejoin_));
  return absl::OkStatus();
}

// shm_ (the bulk channel, with a probe that peers try to open) and
// shm_transport_ (this process's hub; links come after registration).
absl::Status AgentImpl::StartSameHostPaths(Registration& reg) {
  reg.probe_token = RandomHex(8);
  if (options_.transport.same_host_shm) {
    ShmChannel::Sweep();
    shm_ = std::make_unique<ShmChannel>();
    auto probe = shm_->CreateProbe(reg.probe_token);
    if (probe.ok()) reg.probe_name = *probe;
  }
  // The same-host transport: a hub now, links after everyone registered. A
  // rejoining incarnation uses gRPC (its peers set their links up long ago).
  if (options_.transport.local_transport == AgentOptions::LocalTransport::kShm && !rejoin_) {
    ShmTransportOptions so;
    so.ring_bytes = options_.transport.shm_ring_bytes;
    auto t = ShmTransport::Create(so, rank_, options_.world_size, this);
    if (t.ok()) {
      shm_transport_ = *std::move(t);
    } else if (absl::IsInvalidArgument(t.status())) {
      return Annotate(t.status(), "AgentOptions::transport.shm_ring_bytes");
    }  // else: no /dev/shm room; gRPC it is
  }
  return absl::OkStatus();
}

// Publishes reg.mine, this incarnation's record.
absl::Status AgentImpl::Register(Registration& reg) {
  proto::WorkerRecord& mine = reg.mine;
  mine.set_name(options_.name);
  mine.set_address(transport_->address());
  mine.set_max_message_bytes(options_.transport.max_message_bytes);
  mine.set_max_calls_in_flight(options_.transport.max_calls_in_flight);
  mine.set_max_bytes_in_flight(options_.transport.max_bytes_in_flight);
  mine.set_incarnation(incarnation_);
  mine.set_identity_key(identity_->public_key());
  mine.set_shm_probe(reg.probe_name);
  mine.set_shm_probe_token(reg.probe_token);
  // Workers with the same boot id (and PID namespace) share a host and may
  // use the shared-memory transport.
  mine.set_boot_id(BootId());
  mine.set_pid_namespace(ShmChannel::ObjectPrefix(0));
  mine.set_pid(getpid());
  if (shm_transport_ != nullptr) mine.set_shm_hub(shm_transport_->hub_name());
  PublishDeviceMaps(options_, mine);
  mine.set_cuda_ipc(cuda_channel_ != nullptr);
  for (const std::string& f : options_.front_ends) mine.add_front_ends(f);
  mine.set_bulk_address(transport_->bulk_address());
  // P7: callers waiting for this incarnation of the rank wait on its mark.
  RETURN_IF_ERROR(rendezvous_->Publish(mine));
  RETURN_IF_ERROR(Step(RendezvousStep::kRegistered));
  // P5: a rejoining incarnation sets up no same-host links, and says so for
  // the higher ranks that wait for its predecessor's.
  if (rejoin_) RETURN_IF_ERROR(rendezvous_->PublishNoLinks());
  return absl::OkStatus();
}

// Waits for every rank's record (reg.records), then fills workers_,
// peer_limits_, by_name_, the device maps, the call windows and peers_.
absl::Status AgentImpl::ReadRegistrations(Registration& reg) {
  ASSIGN_OR_RETURN(reg.records, rendezvous_->ReadRecords());
  const std::vector<proto::WorkerRecord>& records = reg.records;
  workers_.resize(options_.world_size);
  peer_limits_.resize(options_.world_size);
  for (int r = 0; r < options_.world_size; ++r) {
    peer_limits_[r] = records[r].max_message_bytes();
    workers_[r] = WorkerInfo{records[r].name(),
                             r,
                             records[r].address(),
                             {records[r].front_ends().begin(), records[r].front_ends().end()}};
    absl::MutexLock lock(&members_mu_);
    auto [it, inserted] = by_name_.emplace(records[r].name(), r);
    if (!inserted) {
      return absl::AlreadyExistsError(absl::StrCat("worker name '", records[r].name(),
                                                   "' is not unique: ranks ", it->second, " and ",
                                                   r, " both use it"));
    }
  }
  // Before ready_: every rank of a fixed group is a member.
  for (int r = 0; r < options_.world_size; ++r) member_[r].store(true, std::memory_order_release);
  ResolveDeviceMaps(records);
  // F1: our window toward each peer stays within what that peer holds.
  std::vector<FlowLimits> windows(options_.world_size);
  for (int r = 0; r < options_.world_size; ++r) {
    auto smaller = [](int64_t mine, int64_t theirs) {
      return theirs > 0 ? std::min(mine, theirs) : mine;
    };
    windows[r] = FlowLimits{
        smaller(options_.transport.max_calls_in_flight, records[r].max_calls_in_flight()),
        smaller(options_.transport.max_bytes_in_flight, records[r].max_bytes_in_flight())};
  }
  window_ = std::make_unique<CallWindow>(std::move(windows));
  FillPeers([&](int r) {
    // A registration without one counts as the first.
    return r == rank_ ? incarnation_ : std::max<int64_t>(1, records[r].incarnation());
  });
  return absl::OkStatus();
}

// The network path to every peer, the bulk channel toward peers that opened
// our probe (S4), and the same-host links: the lower rank of each pair
// creates the link and publishes its name ("-": none); the higher rank
// opens it. A link is used once both sides mapped it (checked after the
// barrier, in Activate()).
absl::Status AgentImpl::ConnectPeers(const Registration& reg) {
  const std::vector<proto::WorkerRecord>& records = reg.records;
  const proto::WorkerRecord& mine = reg.mine;
  for (int r = 0; r < options_.world_size; ++r) {
    if (r != rank_) AddNetworkPeer(r, records[r]);
  }
  // S4 of the shared-memory channel: use it toward peers that can open our
  // probe. Everyone probes before anyone removes its probe object. Each
  // peer's path (PeerPath) then owns the choice of link, network and bulk
  // channel.
  int usable = 0;
  paths_.clear();
  for (int r = 0; r < options_.world_size; ++r) {
    const bool usable_toward =
        shm_ != nullptr && !records[r].shm_probe().empty() &&
        ShmChannel::CheckProbe(records[r].shm_probe(), records[r].shm_probe_token());
    usable += usable_toward;
    // Its probe opened, so it shares our PID namespace: its segments are
    // named with its pid under our prefix.
    paths_.push_back(std::make_unique<PeerPath>(
        r, transport_.get(), shm_transport_.get(), shm_.get(),
        usable_toward ? ShmChannel::ObjectPrefix(records[r].pid()) : std::string()));
  }
  if (shm_ != nullptr) (void)rendezvous_->PublishProbesOpened(usable);
  // Same-host links: one record per worker, one read of the lower ranks'.
  // Every worker of a host counts the same peers there (they read the same
  // records), so all of them, or none, link (shm_link_peers_max).
  auto same_host = [&](int r) {
    return r != rank_ && !records[r].shm_hub().empty() && records[r].boot_id() == mine.boot_id() &&
           records[r].pid_namespace() == mine.pid_namespace();
  };
  int host_peers = 0;
  for (int r = 0; r < options_.world_size; ++r) host_peers += same_host(r);
  const bool link = options_.transport.shm_link_peers_max == 0 ||
                    host_peers <= options_.transport.shm_link_peers_max;
  if (shm_transport_ != nullptr && !rejoin_) {
    proto::SameHostLinks created;
    bool any_higher = false;
    for (int r = rank_ + 1; r < options_.world_size; ++r) {
      if (!same_host(r)) continue;
      any_higher = true;
      if (!link) continue;
      auto made =
          shm_transport_->CreateLink(r, records[r].shm_hub(), static_cast<pid_t>(records[r].pid()));
      if (made.ok()) (*created.mutable_links())[r] = *made;
    }
    // Published even when this worker links none (a host over the limit):
    // a peer that counted otherwise (its options differ) waits for it.
    if (any_higher) RETURN_IF_ERROR(rendezvous_->PublishLinks(created));
    std::vector<int> lower;
    for (int r = 0; r < rank_ && link; ++r) {
      if (same_host(r)) lower.push_back(r);
    }
    ASSIGN_OR_RETURN(std::vector<proto::SameHostLinks> links, rendezvous_->ReadLinks(lower));
    for (size_t i = 0; i < lower.size(); ++i) {
      auto it = links[i].links().find(rank_);
      if (it == links[i].links().end()) continue;  // none toward this rank ("-": none at all)
      const int r = lower[i];
      (void)shm_transport_->OpenLink(r, it->second, records[r].shm_hub(),
                                     static_cast<pid_t>(records[r].pid()));
    }
  }
  return absl::OkStatus();
}

// P5: a rank that died during start-up after registering was replaced by a
// successor that registered again before it reached the barrier; follow the
// successor (its address, its incarnation, no link or probe of ours).
// Returns the ranks superseded so.
absl::StatusOr<std::vector<int>> AgentImpl::FollowSuccessors(const Registration& reg) {
  std::vector<int> superseded;
  ASSIGN_OR_RETURN(auto successors, rendezvous_->ReadSuccessors(reg.records));
  for (const auto& [r, now] : successors) {
    superseded.push_back(r);
    workers_[r].address = now.address();
    peers_[r]->Reset(now.incarnation());
    paths_[r]->LoseSameHost(absl::UnavailableError(
        absl::StrCat("worker '", workers_[r].name, "': incarnation ", now.incarnation(),
                     " replaced the process during start-up")));
    AddNetworkPeer(r, now);
  }
  return superseded;
}

}  // namespace internal
}  // namespace baton::rpc
