#include "rpc/agent.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "env/env.h"
#include "rpc/internal/shm_channel.h"
#include "rpc/internal/shm_transport.h"
#include "rpc/internal/transport.h"
#include "rpc/internal/wire.h"
#include "store/store_client.h"
#include "store/store_server.h"

namespace baton::rpc {
namespace {

using internal::Frame;

absl::Status CheckName(const std::string& name) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker name '", name, "' must have 1 to 128 characters"));
  }
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ||
          c == '.' || c == ':')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker name '", name, "' may contain only letters, digits and _-.:"));
    }
  }
  return absl::OkStatus();
}

std::string RandomHex(int bytes) {
  std::random_device rd;
  std::string out;
  static const char* kHex = "0123456789abcdef";
  for (int i = 0; i < bytes; ++i) {
    const unsigned v = rd() & 0xff;
    out.push_back(kHex[v >> 4]);
    out.push_back(kHex[v & 15]);
  }
  return out;
}

bool IsLoopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

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

// This boot of the machine: workers with the same boot id (and PID
// namespace) share a host and may use the shared-memory transport.
std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

}  // namespace

absl::StatusOr<AgentOptions> AgentOptions::FromEnv(const std::string& name_prefix) {
  AgentOptions o;
  if (const char* t = std::getenv("BATON_TRANSPORT"); t != nullptr && *t != '\0') {
    const std::string v = t;
    if (v == "shm") {
      o.local_transport = LocalTransport::kShm;
    } else if (v == "grpc") {
      o.local_transport = LocalTransport::kGrpc;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("BATON_TRANSPORT is '", v, "'; use shm or grpc"));
    }
  }
  if (const char* s = std::getenv("BATON_SHM"); s != nullptr && std::string(s) == "0") {
    o.same_host_shm = false;
  }
  // One parser for RANK, WORLD_SIZE, MASTER_* (env/env.h), under baton-run
  // or not; without baton-run MASTER_ADDR and MASTER_PORT have defaults.
  const bool launched = baton::is_elastic_launched();
  auto env = baton::ReadLaunchEnv([launched](absl::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v != nullptr && *v != '\0') return std::string(v);
    if (!launched && name == baton::kEnvMasterAddr) return std::string("127.0.0.1");
    if (!launched && name == baton::kEnvMasterPort) return std::string("29500");
    return std::nullopt;
  });
  if (!env.ok()) {
    absl::Status s = env.status();
    if (absl::IsNotFound(s)) s = absl::InvalidArgumentError(s.message());
    return Annotate(s, launched ? "reading the environment baton-run set"
                                : "reading the environment");
  }
  o.rank = env->rank;
  o.world_size = env->world_size;
  o.master_addr = env->master_addr;
  o.master_port = env->master_port;
  o.job_token = env->job_token;
  o.rejoin = env->rejoin;
  const char* n = std::getenv("BATON_WORKER_NAME");
  o.name = (n != nullptr && *n != '\0') ? std::string(n)
           : env->role != "default"    ? absl::StrCat(env->role, env->role_rank)
                                       : absl::StrCat(name_prefix, o.rank);
  return o;
}

RpcAgent::RpcAgent(AgentOptions options, std::shared_ptr<FunctionRegistry> registry)
    : options_(std::move(options)), registry_(std::move(registry)) {}

absl::StatusOr<std::unique_ptr<RpcAgent>> RpcAgent::Create(
    AgentOptions options, std::shared_ptr<FunctionRegistry> registry) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size must be at least 1, got ", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", options.rank, " is outside [0, ", options.world_size, ")"));
  }
  if (absl::Status s = CheckName(options.name); !s.ok()) return s;
  if (options.max_message_bytes < 1024) {
    return absl::InvalidArgumentError("max_message_bytes must be at least 1024");
  }
  if (registry == nullptr) registry = std::make_shared<FunctionRegistry>();
  std::unique_ptr<RpcAgent> agent(new RpcAgent(std::move(options), std::move(registry)));
  absl::Status s = agent->Rendezvous();
  if (!s.ok()) {
    (void)agent->Teardown(/*cancel_streams=*/true, absl::Now() + absl::Seconds(5));
    return Annotate(s, absl::StrCat("init of worker '", agent->options_.name,
                                    "' (rank ", agent->options_.rank, ")"));
  }
  return agent;
}

absl::Status RpcAgent::ConnectStore() {
  if (options_.store != nullptr) {
    store_ = options_.store;
    return absl::OkStatus();
  }
  const std::string master =
      absl::StrCat(options_.master_addr, ":", options_.master_port);
  const std::string env_token = [] {
    const char* t = std::getenv("BATON_JOB_TOKEN");
    return t == nullptr ? std::string() : std::string(t);
  }();
  if (options_.rank == 0) {
    auto server = store::StoreServer::Start({master, env_token});
    if (!server.ok()) {
      return Annotate(server.status(),
                      absl::StrCat("rank 0 serves the rendezvous store at ", master,
                                   " (MASTER_ADDR:MASTER_PORT)"));
    }
    store_server_ = *std::move(server);
    // Rank 0 uses the served store directly; the server outlives the agent's
    // use of it (see Teardown).
    store_ = std::shared_ptr<store::Store>(std::shared_ptr<void>(),
                                           &store_server_->store());
    return absl::OkStatus();
  }
  auto client = std::make_shared<store::StoreClient>(
      store::StoreClientOptions{master, env_token, options_.init_timeout});
  absl::Status s = client->WaitForServer(options_.init_timeout);
  if (!s.ok()) return s;
  store_ = std::move(client);
  return absl::OkStatus();
}

absl::StatusOr<std::string> RpcAgent::AgreeOnToken() {
  if (!options_.job_token.empty()) return options_.job_token;
  if (const char* t = std::getenv("BATON_JOB_TOKEN"); t != nullptr && *t != '\0') {
    return std::string(t);
  }
  const std::string key = ns_ + "job_token";
  if (options_.rank == 0) {
    auto v = store_->CompareSet(key, "", RandomHex(16));
    if (!v.ok()) return v.status();
    return *v;
  }
  return store_->Get(key, options_.init_timeout);
}

absl::Status RpcAgent::Rendezvous() {
  rank_ = options_.rank;
  timer_ = std::make_unique<DeadlineTimer>();
  executor_ = std::make_unique<Executor>(
      Executor::Options{options_.min_threads, options_.max_threads});
  if (options_.rejoin && rank_ == 0 && options_.store == nullptr) {
    return absl::FailedPreconditionError(
        "rank 0 cannot rejoin a running job: it serves the job's store, which died with it");
  }
  if (absl::Status s = ConnectStore(); !s.ok()) return s;

  // Each init of a rank against a store is a new round with fresh keys, so
  // repeated init/shutdown in one job never sees stale registrations. A
  // rejoining incarnation takes the round its predecessor was in.
  auto round =
      store_->Add(absl::StrCat("baton/init_round/", rank_), options_.rejoin ? 0 : 1);
  if (!round.ok()) return round.status();
  if (*round == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, " was asked to rejoin (BATON_REJOIN=1) but never joined this job"));
  }
  ns_ = absl::StrCat("baton/r", *round, "/");

  // Which store instance this round uses (see Teardown).
  if (options_.rank == 0) {
    store_instance_ = RandomHex(8);
    if (absl::Status s = store_->Set(ns_ + "store_instance", store_instance_); !s.ok()) return s;
  } else if (options_.store == nullptr) {
    auto v = store_->Get(ns_ + "store_instance", options_.init_timeout);
    if (!v.ok()) return v.status();
    store_instance_ = *v;
  }

  auto token = AgreeOnToken();
  if (!token.ok()) return token.status();

  std::string listen = options_.listen_address;
  if (listen.empty()) {
    std::string host = "127.0.0.1";
    if (!IsLoopback(options_.master_addr)) {
      auto local = LocalAddressToward(options_.master_addr, options_.master_port);
      if (!local.ok()) return local.status();
      host = *local;
    }
    listen = host + ":0";
  }
  auto transport = internal::GrpcTransport::Start(
      {listen, *token, options_.max_message_bytes}, this);
  if (!transport.ok()) return transport.status();
  transport_ = *std::move(transport);

  // Claim the rank, then publish name, address and message limit.
  const std::string nonce = RandomHex(8);
  const std::string claim_key = absl::StrCat(ns_, "rank_claim/", rank_);
  if (options_.rejoin) {
    // The predecessor holds the claim; the restarted incarnation takes it.
    if (absl::Status s = store_->Set(claim_key, nonce); !s.ok()) return s;
  }
  auto claim = store_->CompareSet(claim_key, "", nonce);
  if (!claim.ok()) return claim.status();
  if (*claim != nonce) {
    return absl::AlreadyExistsError(absl::StrCat(
        "rank ", rank_, " is already taken by another process in this job"));
  }
  std::string probe_name, probe_token = RandomHex(8);
  if (options_.same_host_shm) {
    internal::ShmChannel::Sweep();
    shm_ = std::make_unique<internal::ShmChannel>();
    auto probe = shm_->CreateProbe(probe_token);
    if (probe.ok()) probe_name = *probe;
  }
  // The same-host transport: a hub now, links after everyone registered. A
  // rejoining incarnation uses gRPC (its peers set their links up long ago).
  if (options_.local_transport == AgentOptions::LocalTransport::kShm && !options_.rejoin) {
    internal::ShmTransportOptions so;
    so.ring_bytes = options_.shm_ring_bytes;
    auto t = internal::ShmTransport::Create(so, rank_, options_.world_size, this);
    if (t.ok()) {
      shm_transport_ = *std::move(t);
    } else if (absl::IsInvalidArgument(t.status())) {
      return Annotate(t.status(), "AgentOptions::shm_ring_bytes");
    }  // else: no /dev/shm room; gRPC it is
  }
  proto::WorkerRecord mine;
  mine.set_name(options_.name);
  mine.set_address(transport_->address());
  mine.set_max_message_bytes(options_.max_message_bytes);
  mine.set_shm_probe(probe_name);
  mine.set_shm_probe_token(probe_token);
  mine.set_boot_id(BootId());
  mine.set_pid_namespace(internal::ShmChannel::ObjectPrefix(0));
  mine.set_pid(getpid());
  if (shm_transport_ != nullptr) mine.set_shm_hub(shm_transport_->hub_name());
  if (absl::Status s = store_->Set(absl::StrCat(ns_, "worker/", rank_), mine.SerializeAsString());
      !s.ok()) {
    return s;
  }
  std::vector<std::string> keys;
  for (int r = 0; r < options_.world_size; ++r) keys.push_back(absl::StrCat(ns_, "worker/", r));
  if (absl::Status s = store_->Wait(keys, options_.init_timeout); !s.ok()) {
    return Annotate(s, "waiting for every worker to register");
  }
  workers_.resize(options_.world_size);
  peer_limits_.resize(options_.world_size);
  std::vector<proto::WorkerRecord> records(options_.world_size);
  for (int r = 0; r < options_.world_size; ++r) {
    auto v = store_->Get(keys[r], options_.init_timeout);
    if (!v.ok()) return v.status();
    if (!records[r].ParseFromString(*v) || records[r].name().empty() ||
        records[r].address().empty()) {
      return absl::DataLossError(absl::StrCat("malformed registration of rank ", r));
    }
    peer_limits_[r] = records[r].max_message_bytes();
    workers_[r] = WorkerInfo{records[r].name(), r, records[r].address()};
    auto [it, inserted] = by_name_.emplace(records[r].name(), r);
    if (!inserted) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker name '", records[r].name(), "' is used by ranks ", it->second, " and ", r,
          "; names must be unique"));
    }
  }
  for (const auto& w : workers_) {
    if (w.id != rank_) transport_->AddPeer(w.id, w.address);
  }
  // S4 of the shared-memory channel: use it toward peers that can open our
  // probe. Everyone probes before anyone removes its probe object.
  peer_shm_.assign(options_.world_size, false);
  if (shm_ != nullptr) {
    int usable = 0;
    for (int r = 0; r < options_.world_size; ++r) {
      peer_shm_[r] = !records[r].shm_probe().empty() &&
                     internal::ShmChannel::CheckProbe(records[r].shm_probe(),
                                                      records[r].shm_probe_token());
      usable += peer_shm_[r];
    }
    (void)store_->Set(absl::StrCat(ns_, "shm_probe/", rank_, "/", usable), "1");
  }
  // Same-host links: the lower rank of each pair creates the link and
  // publishes its name ("-": none); the higher rank opens it. A link is used
  // once both sides mapped it (checked after the barrier, in Activate()).
  if (shm_transport_ != nullptr && !options_.rejoin) {
    auto same_host = [&](int r) {
      return r != rank_ && !records[r].shm_hub().empty() &&
             records[r].boot_id() == mine.boot_id() &&
             records[r].pid_namespace() == mine.pid_namespace();
    };
    for (int r = rank_ + 1; r < options_.world_size; ++r) {
      if (!same_host(r)) continue;
      auto link = shm_transport_->CreateLink(r, records[r].shm_hub(),
                                             static_cast<pid_t>(records[r].pid()));
      if (absl::Status s = store_->Set(absl::StrCat(ns_, "shm_link/", rank_, "/", r),
                                       link.ok() ? *link : "-");
          !s.ok()) {
        return s;
      }
    }
    for (int r = 0; r < rank_; ++r) {
      if (!same_host(r)) continue;
      auto name = store_->Get(absl::StrCat(ns_, "shm_link/", r, "/", rank_), options_.init_timeout);
      if (!name.ok()) return Annotate(name.status(), "waiting for a shared-memory link");
      if (*name != "-") {
        (void)shm_transport_->OpenLink(r, *name, records[r].shm_hub(),
                                       static_cast<pid_t>(records[r].pid()));
      }
    }
  }
  if (absl::Status s = store::Barrier(*store_, ns_ + "init/probed", rank_,
                                      options_.world_size, options_.init_timeout);
      !s.ok()) {
    return s;
  }
  if (shm_ != nullptr) shm_->RemoveProbe();
  if (shm_transport_ != nullptr) shm_transport_->Activate();
  // Calls to self go through the loopback server like any other call.
  transport_->AddPeer(rank_, transport_->address());
  {
    absl::MutexLock lock(&mu_);
    running_ = true;
  }
  ready_.Notify();
  return absl::OkStatus();
}

RpcAgent::~RpcAgent() {
  bool running;
  {
    absl::MutexLock lock(&mu_);
    running = running_;
  }
  if (running) {
    (void)Shutdown(/*graceful=*/false);
  } else {
    (void)Teardown(/*cancel_streams=*/true, absl::Now() + absl::Seconds(5));
  }
}

absl::StatusOr<WorkerInfo> RpcAgent::worker(const WorkerRef& ref) const {
  if (ref.id() >= 0 || ref.name().empty()) {
    if (ref.id() >= 0 && ref.id() < static_cast<int>(workers_.size())) {
      return workers_[ref.id()];
    }
    return absl::NotFoundError(absl::StrCat("no worker with id ", ref.id(),
                                            "; ids are 0..", workers_.size() - 1));
  }
  auto it = by_name_.find(ref.name());
  if (it == by_name_.end()) {
    std::vector<std::string> names;
    for (const auto& w : workers_) names.push_back(w.name);
    return absl::NotFoundError(absl::StrCat("no worker named '", ref.name(),
                                            "'; workers are ", absl::StrJoin(names, ", ")));
  }
  return workers_[it->second];
}

std::string RpcAgent::CallContextText(int peer, const std::string& function) const {
  const std::string name = peer >= 0 && peer < static_cast<int>(workers_.size())
                               ? workers_[peer].name
                               : "?";
  return absl::StrCat("rpc to worker '", name, "' (id ", peer, "), function '",
                      function, "'");
}

int64_t RpcAgent::PeerLimit(int peer) const {
  return std::min(options_.max_message_bytes, peer_limits_[peer]);
}

Future<Payload> RpcAgent::CallRaw(int to, const std::string& function,
                                  const std::string& signature, Payload args,
                                  const CallOptions& opts) {
  if (to < 0 || to >= static_cast<int>(workers_.size())) {
    return MakeErrorFuture<Payload>(absl::NotFoundError(
        absl::StrCat("rpc of function '", function, "': no worker with id ", to)));
  }
  const absl::Duration timeout =
      opts.timeout > absl::ZeroDuration() ? opts.timeout : options_.rpc_timeout;
  const uint64_t id = next_call_id_.fetch_add(1, std::memory_order_relaxed);
  Frame frame;
  frame.header.set_kind(proto::FrameHeader::REQUEST);
  frame.header.set_id(id);
  frame.header.set_function(function);
  frame.header.set_signature(signature);
  frame.header.set_caller_id(rank_);
  if (timeout != absl::InfiniteDuration()) {
    frame.header.set_timeout_us(std::max<int64_t>(1, absl::ToInt64Microseconds(timeout)));
  }
  frame.payload = std::move(args);
  const size_t size = internal::FrameSize(frame);
  if (static_cast<int64_t>(size) > PeerLimit(to)) {
    return MakeErrorFuture<Payload>(absl::ResourceExhaustedError(absl::StrCat(
        CallContextText(to, function), ": request of ", size,
        " bytes exceeds the message size limit of ", PeerLimit(to),
        " bytes (AgentOptions::max_message_bytes)")));
  }
  if (shm_ != nullptr && peer_shm_[to]) {
    shm_->Export(frame, timeout == absl::InfiniteDuration()
                            ? absl::InfiniteFuture()
                            : absl::Now() + timeout + absl::Seconds(5));
  }
  Promise<Payload> promise(executor_.get());
  {
    absl::MutexLock lock(&mu_);
    if (!running_) {
      return MakeErrorFuture<Payload>(absl::FailedPreconditionError(absl::StrCat(
          CallContextText(to, function), ": the agent is shut down")));
    }
    PendingCall& call = pending_[id];
    call.promise = promise;
    call.peer = to;
    call.function = function;
    call.timeout = timeout;
  }
  const DeadlineTimer::Id timer =
      timeout == absl::InfiniteDuration()
          ? 0
          : timer_->Schedule(absl::Now() + timeout, [this, id, to, function, timeout] {
              Complete(id, absl::DeadlineExceededError(absl::StrCat(
                               CallContextText(to, function), ": timed out after ",
                               DurationText(timeout))));
            });
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(id);
    if (it != pending_.end()) it->second.timer = timer;
  }
  absl::StatusOr<uint64_t> stream =
      shm_transport_ != nullptr && shm_transport_->connected(to)
          ? shm_transport_->Send(to, std::move(frame))
          : transport_->Send(to, std::move(frame));
  if (!stream.ok()) {
    Complete(id, Annotate(stream.status(),
                          absl::StrCat(CallContextText(to, function), ": worker unreachable")));
  } else {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(id);
    if (it != pending_.end()) it->second.stream_id = *stream;
  }
  return promise.future();
}

void RpcAgent::Complete(uint64_t id, absl::StatusOr<Payload> result) {
  PendingCall call;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    call = std::move(it->second);
    pending_.erase(it);
  }
  timer_->Cancel(call.timer);
  call.promise.Set(std::move(result));
}

void RpcAgent::OnResponse(int peer, Frame frame) {
  const uint64_t id = frame.header.id();
  if (frame.header.shm_blobs_size() > 0) {
    absl::Status s = shm_ != nullptr ? shm_->Import(frame)
                                     : absl::DataLossError("shared-memory blob without a channel");
    if (!s.ok() && frame.header.status_code() == 0) {
      frame.header.set_status_code(static_cast<int>(s.code()));
      frame.header.set_error_message(std::string(s.message()));
    }
  }
  if (frame.header.status_code() == 0) {
    Complete(id, std::move(frame.payload));
    return;
  }
  std::string function;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;  // already timed out
    function = it->second.function;
  }
  Complete(id, Annotate(StatusFromWire(frame.header.status_code(),
                                       frame.header.error_message()),
                        CallContextText(peer, function)));
}

void RpcAgent::OnStreamClosed(int peer, uint64_t stream_id, const absl::Status& cause) {
  std::vector<std::pair<uint64_t, std::string>> failed;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, call] : pending_) {
      if (call.peer == peer && (call.stream_id == stream_id || call.stream_id == 0)) {
        failed.emplace_back(id, call.function);
      }
    }
  }
  for (const auto& [id, function] : failed) {
    const absl::Status s =
        cause.code() == absl::StatusCode::kUnauthenticated
            ? cause
            : absl::UnavailableError(absl::StrCat(
                  "worker is dead or unreachable (stream ended: ", cause.message(), ")"));
    Complete(id, Annotate(s, CallContextText(peer, function)));
  }
}

void RpcAgent::OnRequest(std::shared_ptr<ReplyChannel> channel, Frame frame) {
  const absl::Time deadline =
      frame.header.timeout_us() > 0
          ? absl::Now() + absl::Microseconds(frame.header.timeout_us())
          : absl::InfiniteFuture();
  {
    absl::MutexLock lock(&mu_);
    ++incoming_;
  }
  const uint64_t id = frame.header.id();
  const int caller = frame.header.caller_id();
  if (ready_.HasBeenNotified()) {
    auto entry = registry_->Find(frame.header.function());
    if (entry != nullptr && entry->inline_safe) {
      Dispatch(channel, std::move(frame), deadline);
      return;
    }
  }
  auto task = [this, channel, frame = std::move(frame), deadline]() mutable {
    Dispatch(channel, std::move(frame), deadline);
  };
  if (!executor_->Submit(std::move(task))) {
    SendReply(channel, id, caller,
              absl::UnavailableError(absl::StrCat("worker '", options_.name,
                                                  "' is shutting down")));
  }
}

void RpcAgent::Dispatch(const std::shared_ptr<ReplyChannel>& channel,
                        Frame frame, absl::Time deadline) {
  const uint64_t id = frame.header.id();
  const int caller = frame.header.caller_id();
  const std::string& fname = frame.header.function();
  // A peer that finished rendezvous first may call before we have.
  if (!ready_.WaitForNotificationWithDeadline(deadline) ||
      workers_.size() != static_cast<size_t>(options_.world_size)) {
    SendReply(channel, id, caller,
              absl::UnavailableError(absl::StrCat("worker '", options_.name,
                                                  "' has not finished init")));
    return;
  }
  if (frame.header.shm_blobs_size() > 0) {
    absl::Status s = shm_ != nullptr ? shm_->Import(frame)
                                     : absl::DataLossError("shared-memory blob without a channel");
    if (!s.ok()) {
      SendReply(channel, id, caller, Annotate(s, "undecodable request"));
      return;
    }
  }
  if (caller < 0 || caller >= static_cast<int>(workers_.size())) {
    SendReply(channel, id, caller,
              absl::InvalidArgumentError(absl::StrCat("unknown caller id ", caller)));
    return;
  }
  if (absl::Now() > deadline) {
    SendReply(channel, id, caller,
              absl::DeadlineExceededError(
                  "the call's deadline passed before the function started"));
    return;
  }
  std::shared_ptr<const FunctionRegistry::Entry> entry = registry_->Find(fname);
  if (entry == nullptr) {
    SendReply(channel, id, caller,
              absl::NotFoundError(absl::StrCat("unknown function '", fname,
                                               "' (not registered on worker '",
                                               self().name, "')")));
    return;
  }
  if (!frame.header.signature().empty() && !entry->signature.empty() &&
      frame.header.signature() != entry->signature) {
    SendReply(channel, id, caller,
              absl::InvalidArgumentError(absl::StrCat(
                  "argument type mismatch: the caller sends ", frame.header.signature(),
                  " but worker '", self().name, "' registered '", fname, "' as ",
                  entry->signature)));
    return;
  }
  CallContext ctx;
  ctx.agent = this;
  ctx.registry = registry_.get();
  ctx.caller = &workers_[caller];
  ctx.function = fname;
  ctx.deadline = deadline;
  if (registry_->has_call_hooks()) ctx.extensions = frame.payload.extensions;
  entry->handler(ctx, std::move(frame.payload),
                 [this, channel, id, caller](absl::StatusOr<Payload> result) {
                   SendReply(channel, id, caller, std::move(result));
                 });
}

void RpcAgent::SendReply(const std::shared_ptr<ReplyChannel>& channel,
                         uint64_t id, int caller, absl::StatusOr<Payload> result) {
  Frame frame;
  frame.header.set_kind(proto::FrameHeader::RESPONSE);
  frame.header.set_id(id);
  if (result.ok()) {
    frame.payload = *std::move(result);
    const int64_t limit = ready_.HasBeenNotified() && caller >= 0 &&
                                  caller < static_cast<int>(peer_limits_.size())
                              ? PeerLimit(caller)
                              : options_.max_message_bytes;
    const size_t size = internal::FrameSize(frame);
    if (static_cast<int64_t>(size) > limit) {
      frame.payload = Payload();
      result = absl::ResourceExhaustedError(absl::StrCat(
          "reply of ", size, " bytes exceeds the message size limit of ", limit, " bytes"));
    }
  }
  if (!result.ok()) {
    frame.header.set_status_code(static_cast<int>(result.status().code()));
    frame.header.set_error_message(std::string(result.status().message()));
  } else if (shm_ != nullptr && ready_.HasBeenNotified() && caller >= 0 &&
             caller < static_cast<int>(peer_shm_.size()) && peer_shm_[caller]) {
    // The caller releases the segment on receipt; the expiry only covers a
    // caller that died or gave up first.
    shm_->Export(frame, absl::Now() + options_.rpc_timeout + absl::Seconds(5));
  }
  channel->Send(std::move(frame));
  FinishIncoming();
}

void RpcAgent::FinishIncoming() {
  absl::MutexLock lock(&mu_);
  --incoming_;
}

void RpcAgent::AddShutdownHook(ShutdownHook hook) {
  absl::MutexLock lock(&mu_);
  hooks_.push_back(std::move(hook));
}

bool RpcAgent::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

AgentStats RpcAgent::stats() const {
  AgentStats s;
  {
    absl::MutexLock lock(&mu_);
    s.pending_outgoing = static_cast<int64_t>(pending_.size());
    s.running_incoming = incoming_;
  }
  s.executor_threads = executor_ ? executor_->num_threads() : 0;
  s.timers = timer_ ? timer_->pending() : 0;
  s.live_streams = transport_ ? transport_->live_streams() : 0;
  s.shm_busy_segments = shm_ ? shm_->busy_segments() : 0;
  if (shm_transport_ != nullptr) {
    const auto t = shm_transport_->stats();
    s.shm_frames_sent = t.frames_sent;
    s.shm_frames_received = t.frames_received;
  }
  return s;
}

bool RpcAgent::uses_shm_transport(int peer) const {
  return shm_transport_ != nullptr && shm_transport_->connected(peer);
}

bool RpcAgent::uses_shm(int peer) const {
  return shm_ != nullptr && peer >= 0 && peer < static_cast<int>(peer_shm_.size()) &&
         peer_shm_[peer];
}


absl::Status RpcAgent::Shutdown(bool graceful) {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::OkStatus();
  }
  if (executor_->InPool()) {
    return absl::FailedPreconditionError(
        "Shutdown() called from a remote function; call it from the main thread");
  }
  const absl::Time deadline = absl::Now() + options_.shutdown_timeout;
  absl::Status first;
  auto note = [&first](const absl::Status& s) {
    if (first.ok() && !s.ok()) first = s;
  };
  if (graceful) {
    const int world = options_.world_size;
    // 1. Everyone stops issuing new top-level calls.
    note(store::Barrier(*store_, ns_ + "shutdown/enter", rank_, world,
                        deadline - absl::Now()));
    std::vector<ShutdownHook> hooks;
    {
      absl::MutexLock lock(&mu_);
      hooks = hooks_;
    }
    for (auto& h : hooks) {
      if (h.settle) note(h.settle(deadline));
    }
    // 2. Drain: our outgoing calls are answered and incoming ones replied.
    {
      absl::MutexLock lock(&mu_);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return pending_.empty() && incoming_ == 0;
      };
      if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
        note(absl::DeadlineExceededError(absl::StrCat(
            "shutdown: ", pending_.size(), " outgoing and ", incoming_,
            " incoming call(s) still running at the deadline")));
      }
    }
    // 3. Everyone is drained; nobody will call anyone again.
    note(store::Barrier(*store_, ns_ + "shutdown/drained", rank_, world,
                        deadline - absl::Now()));
  }
  {
    absl::MutexLock lock(&mu_);
    running_ = false;
  }
  note(Teardown(/*cancel_streams=*/!graceful, deadline));
  if (!first.ok()) {
    return Annotate(first, absl::StrCat("shutdown of worker '", options_.name, "'"));
  }
  return first;
}

absl::Status RpcAgent::Teardown(bool cancel_streams, absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (torn_down_) return absl::OkStatus();
    torn_down_ = true;
    running_ = false;
  }
  if (!ready_.HasBeenNotified()) ready_.Notify();
  absl::Status first;
  auto note = [&first](const absl::Status& s) {
    if (first.ok() && !s.ok()) first = s;
  };
  auto left = [deadline] { return std::max(absl::Milliseconds(100), deadline - absl::Now()); };
  if (transport_) note(transport_->CloseStreams(cancel_streams, left()));
  if (shm_transport_) shm_transport_->Close();
  // Calls still pending can no longer be answered.
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, call] : pending_) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    Complete(id, absl::CancelledError("the agent shut down before the reply arrived"));
  }
  if (transport_) transport_->StopServer(std::min(absl::Seconds(1), left()));
  {
    std::vector<ShutdownHook> hooks;
    {
      absl::MutexLock lock(&mu_);
      hooks.swap(hooks_);
    }
    for (auto& h : hooks) {
      if (h.release) h.release();
    }
  }
  if (executor_) {
    executor_->Close();
    note(executor_->Join(left()));
  }
  if (timer_) timer_->Stop();
  if (shm_) shm_->Close();
  if (store_server_ != nullptr && store_ != nullptr) {
    // Rank 0 hosts the store: keep it until every worker has left its
    // shutdown barrier, so nobody loses the store mid-wait.
    (void)store_->Set(absl::StrCat(ns_, "shutdown/left/", rank_), "1");
    std::vector<std::string> keys;
    for (int r = 0; r < options_.world_size; ++r) {
      keys.push_back(absl::StrCat(ns_, "shutdown/left/", r));
    }
    (void)store_->Wait(keys, std::min(absl::Seconds(5), left()));
    store_server_->Shutdown(absl::Milliseconds(200));
  } else if (store_ != nullptr && !ns_.empty()) {
    (void)store_->Set(absl::StrCat(ns_, "shutdown/left/", rank_), "1");
    // Rank 0 stops its store once every rank has left. Wait (bounded) until
    // it is gone, so that an immediate init in this process cannot reach the
    // old store and register into a finished round.
    if (auto* client = dynamic_cast<store::StoreClient*>(store_.get());
        client != nullptr && options_.store == nullptr && !store_instance_.empty()) {
      const absl::Time until = absl::Now() + std::min(absl::Seconds(5), left());
      const std::string key = ns_ + "store_instance";
      while (absl::Now() < until) {
        auto v = client->TryGet(key, absl::Milliseconds(200));
        if (!v.ok() || *v != store_instance_) break;  // gone, or a new store
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
  }
  return first;
}

}  // namespace baton::rpc
