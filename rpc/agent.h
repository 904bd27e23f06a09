// RpcAgent: one per worker process (or several in one process, for tests).
// It rendezvouses with the other workers through the store, serves the
// functions of its FunctionRegistry, and calls functions on other workers.
//
//   auto registry = std::make_shared<FunctionRegistry>();
//   registry->Register(add_fn, [](torch::Tensor a, torch::Tensor b) { return a + b; });
//   auto agent = RpcAgent::Create(AgentOptions::FromEnv("worker").value(), registry);
//   torch::Tensor c = (*agent)->rpc_sync("worker1", add_fn, a, b);
//   (*agent)->Shutdown();
//
// Contract:
// - Create() returns once every worker of the job has registered its name
//   and address (bounded by init_timeout). Names must be unique; a duplicate
//   name or rank fails Create() on the workers involved with ALREADY_EXISTS.
// - Calls: every call has a deadline (CallOptions::timeout, else
//   AgentOptions::rpc_timeout), which travels to the callee. A call's future
//   always completes by then. Errors keep their code end to end and name the
//   callee worker and function:
//     DEADLINE_EXCEEDED  timeout;             UNAVAILABLE  dead/unreachable peer;
//     NOT_FOUND          unknown function or worker;
//     INVALID_ARGUMENT   argument type mismatch (signatures differ) or a value
//                        the codec cannot send;
//     DATA_LOSS          undecodable payload;  RESOURCE_EXHAUSTED  over the
//                        message size limit;   UNKNOWN  exception in user code
//                        (with its message);   UNAUTHENTICATED  wrong job token.
// - Tensors are sent from their own memory: do not modify a tensor passed to
//   rpc_async until its future completes.
// - Shutdown(graceful=true): all workers agree through the store, every
//   worker drains its outstanding calls (incoming and outgoing), then servers
//   stop. Each step is bounded by shutdown_timeout, also when a peer died.
//   Afterwards no thread or socket of the agent remains.
//
// Thread-safety: safe for concurrent use from any thread, including from
// inside remote functions (nested calls). Shutdown() must not be called from
// a remote function.
#ifndef BATON_RPC_AGENT_H_
#define BATON_RPC_AGENT_H_

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "rpc/codec.h"
#include "rpc/executor.h"
#include "rpc/function.h"
#include "rpc/future.h"
#include "rpc/timer.h"
#include "rpc/transport.h"
#include "rpc/worker_info.h"
#include "store/store.h"

namespace baton::store {
class StoreServer;
}

namespace baton::rpc::internal {
class GrpcTransport;
class ShmChannel;
class ShmTransport;
}  // namespace baton::rpc::internal

namespace baton::rpc {

struct AgentOptions {
  std::string name;
  int rank = -1;
  int world_size = -1;
  // Where rank 0 serves the rendezvous store.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // host:port for this worker's RPC server. Empty: loopback when the master
  // is local, else the local address that routes to the master; port 0.
  std::string listen_address;
  // Shared secret checked on every call. Empty: BATON_JOB_TOKEN if set,
  // else rank 0 creates one and shares it through the store.
  std::string job_token;
  absl::Duration rpc_timeout = absl::Seconds(60);
  absl::Duration init_timeout = absl::Seconds(60);
  absl::Duration shutdown_timeout = absl::Seconds(30);
  // Largest message (request or reply, tensors included) sent or accepted.
  int64_t max_message_bytes = int64_t{1} << 30;
  // Send large tensors to workers on the same host through shared memory
  // (rpc/internal/shm_channel.h). FromEnv reads BATON_SHM=0 to turn it off.
  bool same_host_shm = true;
  // How messages travel between workers on the same host (same boot id and
  // PID namespace, and a successful shared-memory handshake): kShm sends
  // every message, small calls included, through shared-memory rings
  // (rpc/internal/shm_transport.h); kGrpc uses loopback gRPC, as between
  // hosts. FromEnv reads BATON_TRANSPORT=shm|grpc.
  enum class LocalTransport { kShm, kGrpc };
  LocalTransport local_transport = LocalTransport::kShm;
  // Bytes of each ring of a same-host pair (two per pair; frames larger than
  // a ring are cut into pieces). A 64-worker host whose workers all talk to
  // each other maps 2016 pairs * 2 * 256 KiB = ~1 GiB of /dev/shm.
  size_t shm_ring_bytes = size_t{256} << 10;
  int min_threads = 4;
  int max_threads = 256;
  // Use this store instead of the one at master_addr:master_port (tests,
  // or a store served elsewhere). Rank 0 then starts no store server.
  std::shared_ptr<store::Store> store;
  // Rejoin a running job as a restarted incarnation of `rank` (baton-run's
  // per-role restart sets BATON_REJOIN=1) instead of rendezvousing anew:
  // the other workers keep running, so this worker reads their
  // registrations, replaces its own, and skips the init barrier. The
  // rejoined worker can call every peer; a peer calling it uses the address
  // it learnt at startup and gets UNAVAILABLE, so only roles that are called
  // by nobody (trainers of a parameter server, observers) should be
  // restarted this way. Large tensors it sends go over the stream, not
  // shared memory (the peers' probes are gone), and every message goes over
  // gRPC (no same-host link is set up for it). FAILED_PRECONDITION for
  // rank 0, which serves the store, or when there is no job to rejoin.
  bool rejoin = false;

  // Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and BATON_JOB_TOKEN
  // through env/env.h's parser, which validates them all (without baton-run,
  // MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to 29500),
  // BATON_TRANSPORT (shm or grpc; INVALID_ARGUMENT otherwise) and BATON_SHM
  // (0 turns the bulk channel off). The core reads no other variable.
  // The worker's name is BATON_WORKER_NAME if set, else role + role rank
  // for a job with roles (e.g. "trainer3"), else name_prefix + rank.
  // INVALID_ARGUMENT naming the variable if one is missing or malformed.
  static absl::StatusOr<AgentOptions> FromEnv(const std::string& name_prefix = "worker");
};

struct CallOptions {
  // Zero: AgentOptions::rpc_timeout.
  absl::Duration timeout = absl::ZeroDuration();
};

// A worker named by name, id or WorkerInfo.
class WorkerRef {
 public:
  WorkerRef(const char* name) : name_(name) {}          // NOLINT
  WorkerRef(std::string name) : name_(std::move(name)) {}  // NOLINT
  WorkerRef(int id) : id_(id) {}                          // NOLINT
  WorkerRef(const WorkerInfo& w) : id_(w.id) {}           // NOLINT
  const std::string& name() const { return name_; }
  int id() const { return id_; }

 private:
  std::string name_;
  int id_ = -1;
};

struct AgentStats {
  int64_t pending_outgoing = 0;
  int64_t running_incoming = 0;
  int executor_threads = 0;
  size_t timers = 0;
  int live_streams = 0;
  size_t shm_busy_segments = 0;
  // Frames through the same-host shared-memory transport.
  int64_t shm_frames_sent = 0;
  int64_t shm_frames_received = 0;
};

class RpcAgent : private TransportHandler {
 public:
  static absl::StatusOr<std::unique_ptr<RpcAgent>> Create(
      AgentOptions options, std::shared_ptr<FunctionRegistry> registry);
  // Shuts down without the graceful agreement if Shutdown() was not called.
  ~RpcAgent() override;

  RpcAgent(const RpcAgent&) = delete;
  RpcAgent& operator=(const RpcAgent&) = delete;

  const WorkerInfo& self() const { return workers_[rank_]; }
  const std::vector<WorkerInfo>& workers() const { return workers_; }
  absl::StatusOr<WorkerInfo> worker(const WorkerRef& ref) const;
  const AgentOptions& options() const { return options_; }
  FunctionRegistry& registry() { return *registry_; }
  Executor* executor() { return executor_.get(); }
  // The agent's deadline timer (one thread for every call's deadline).
  DeadlineTimer* timer() { return timer_.get(); }
  store::Store& store() { return *store_; }
  // Prefix of this job's keys in the store (unique per init round).
  const std::string& store_namespace() const { return ns_; }

  // Typed calls. Arguments convert to the Function's parameter types at
  // compile time. rpc_sync throws baton::Error on failure.
  template <typename R, typename... Args, typename... CallArgs>
  Future<R> rpc_async(const CallOptions& opts, const WorkerRef& to,
                      const Function<R(Args...)>& fn, CallArgs&&... args);
  template <typename R, typename... Args, typename... CallArgs>
  Future<R> rpc_async(const WorkerRef& to, const Function<R(Args...)>& fn,
                      CallArgs&&... args) {
    return rpc_async(CallOptions{}, to, fn, std::forward<CallArgs>(args)...);
  }
  template <typename R, typename... Args, typename... CallArgs>
  R rpc_sync(const CallOptions& opts, const WorkerRef& to,
             const Function<R(Args...)>& fn, CallArgs&&... args) {
    return rpc_async(opts, to, fn, std::forward<CallArgs>(args)...).value();
  }
  template <typename R, typename... Args, typename... CallArgs>
  R rpc_sync(const WorkerRef& to, const Function<R(Args...)>& fn,
             CallArgs&&... args) {
    return rpc_async(CallOptions{}, to, fn, std::forward<CallArgs>(args)...).value();
  }

  // Untyped call: sends `args` as they are. An empty `signature` skips the
  // callee's type check. Used by the typed calls and by protocol layers.
  Future<Payload> CallRaw(int to, const std::string& function,
                          const std::string& signature, Payload args,
                          const CallOptions& opts = {});

  // Decodes a raw reply from `from` into R; errors name `what`.
  template <typename R>
  Future<R> DecodeFuture(Future<Payload> raw, const WorkerInfo& from, const std::string& what);

  // Protocol layers settle their state during a graceful shutdown: `settle`
  // runs after every worker stopped issuing calls and before the drain (e.g.
  // RRef users send their deletions); `release` runs after every worker
  // drained, and in every shutdown or destruction, graceful or not, once no
  // call can arrive any more (e.g. owners drop what remains).
  // REQUIRES: called before Shutdown().
  struct ShutdownHook {
    std::function<absl::Status(absl::Time deadline)> settle;
    std::function<void()> release;
  };
  void AddShutdownHook(ShutdownHook hook);

  absl::Status Shutdown(bool graceful = true);
  bool running() const;
  AgentStats stats() const;
  // Whether calls to `peer` carry large tensors through shared memory.
  bool uses_shm(int peer) const;
  // Whether messages to `peer` go through the same-host shared-memory
  // transport (else gRPC).
  bool uses_shm_transport(int peer) const;

 private:
  struct PendingCall {
    Promise<Payload> promise;
    int peer = -1;
    std::string function;
    uint64_t stream_id = 0;
    DeadlineTimer::Id timer = 0;
    absl::Duration timeout;
  };

  RpcAgent(AgentOptions options, std::shared_ptr<FunctionRegistry> registry);
  absl::Status Rendezvous();
  absl::Status ConnectStore();
  absl::StatusOr<std::string> AgreeOnToken();
  absl::Status Teardown(bool cancel_streams, absl::Time deadline);

  // TransportHandler.
  void OnRequest(std::shared_ptr<ReplyChannel> channel,
                 Frame frame) override;
  void OnResponse(int peer, Frame frame) override;
  void OnStreamClosed(int peer, uint64_t stream_id,
                      const absl::Status& cause) override;

  void Dispatch(const std::shared_ptr<ReplyChannel>& channel,
                Frame frame, absl::Time deadline);
  void SendReply(const std::shared_ptr<ReplyChannel>& channel,
                 uint64_t id, int caller, absl::StatusOr<Payload> result);
  void FinishIncoming();

  // Completes and removes pending call `id` (no-op if already gone).
  void Complete(uint64_t id, absl::StatusOr<Payload> result);
  std::string CallContextText(int peer, const std::string& function) const;
  int64_t PeerLimit(int peer) const;

  const AgentOptions options_;
  const std::shared_ptr<FunctionRegistry> registry_;
  int rank_ = -1;
  std::string ns_;
  std::string store_instance_;                   // set during Create
  std::vector<WorkerInfo> workers_;              // set during Create
  std::vector<int64_t> peer_limits_;             // set during Create
  std::vector<bool> peer_shm_;                   // set during Create
  absl::flat_hash_map<std::string, int> by_name_;  // set during Create

  std::unique_ptr<store::StoreServer> store_server_;  // rank 0 only
  std::shared_ptr<store::Store> store_;
  std::unique_ptr<DeadlineTimer> timer_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<internal::GrpcTransport> transport_;
  std::unique_ptr<internal::ShmChannel> shm_;
  std::unique_ptr<internal::ShmTransport> shm_transport_;

  // Notified when Create() has filled workers_ and peer_limits_ (or gave
  // up). Requests that arrive earlier wait for it on the executor.
  absl::Notification ready_;
  std::atomic<uint64_t> next_call_id_{1};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, PendingCall> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<ShutdownHook> hooks_ ABSL_GUARDED_BY(mu_);
  int64_t incoming_ ABSL_GUARDED_BY(mu_) = 0;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool torn_down_ ABSL_GUARDED_BY(mu_) = false;
};

// ---- Template implementation ----

template <typename R, typename... Args, typename... CallArgs>
Future<R> RpcAgent::rpc_async(const CallOptions& opts, const WorkerRef& to,
                              const Function<R(Args...)>& fn,
                              CallArgs&&... args) {
  static_assert(sizeof...(CallArgs) == sizeof...(Args),
                "wrong number of arguments for this Function");
  auto worker = this->worker(to);
  if (!worker.ok()) {
    return MakeErrorFuture<R>(Annotate(
        worker.status(), absl::StrCat("rpc of function '", fn.name(), "'")));
  }
  typename Function<R(Args...)>::ArgsTuple tuple(std::forward<CallArgs>(args)...);
  absl::StatusOr<Payload> payload = registry_->EncodeForSend(
      tuple, MessageInfo{this, /*is_request=*/true, worker->id, fn.name()});
  if (!payload.ok()) {
    return MakeErrorFuture<R>(Annotate(
        payload.status(),
        absl::StrCat("rpc to worker '", worker->name, "' (id ", worker->id,
                     "), function '", fn.name(), "': cannot encode arguments")));
  }
  Future<Payload> raw = CallRaw(worker->id, fn.name(),
                                Function<R(Args...)>::cached_signature(),
                                *std::move(payload), opts);
  return DecodeFuture<R>(std::move(raw), *worker, fn.name());
}

template <typename R>
Future<R> RpcAgent::DecodeFuture(Future<Payload> raw, const WorkerInfo& from,
                                 const std::string& what) {
  Promise<R> typed(executor_.get());
  raw.OnReady([this, typed, name = from.name, id = from.id,
               fname = what](const absl::StatusOr<Payload>& r) {
    if (!r.ok()) {
      typed.SetError(r.status());
      return;
    }
    internal::Stored<R> value{};
    absl::Status s = registry_->DecodeReceived(
        *r, &value, MessageInfo{this, /*is_request=*/false, id, fname});
    if (!s.ok()) {
      typed.SetError(absl::Status(
          s.code() == absl::StatusCode::kDataLoss ? absl::StatusCode::kDataLoss : s.code(),
          absl::StrCat("rpc to worker '", name, "' (id ", id, "), function '", fname, "': ",
                       s.code() == absl::StatusCode::kDataLoss ? "undecodable result: " : "",
                       s.message())));
      return;
    }
    typed.Set(std::move(value));
  });
  return typed.future();
}

}  // namespace baton::rpc

#endif  // BATON_RPC_AGENT_H_
