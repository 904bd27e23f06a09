// The agent's configuration and the small value types of its API:
// AgentOptions (what a worker is and how it behaves), AgentCollaborators
// (what tests replace), CallOptions, WorkerRef, AgentStats and PeerFailure.
// Both the user's handle (rpc/agent.h) and the protocol layers' interface
// (rpc/runtime.h) speak in them.
//
// Thread-safety: plain values.
#ifndef BATON_RPC_AGENT_OPTIONS_H_
#define BATON_RPC_AGENT_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/log.h"
#include "base/tls.h"
#include "env/env.h"
#include "rpc/codec.h"
#include "rpc/executor.h"
#include "rpc/timer.h"
#include "rpc/transport.h"
#include "rpc/worker_info.h"
#include "store/store.h"

namespace baton::rpc {

// What a worker is and how it behaves. The top level says who the worker is
// and where it meets the job (name, rank, the rendezvous store); each
// sub-struct holds one concern: transport, security, timeouts, restarts,
// devices, threads, observability. Every field has a working default except
// name and rank (FromEnv fills them from the launch environment).
struct AgentOptions {
  std::string name;
  int rank = -1;
  int world_size = -1;
  // A dynamic group (the contract above, M1-M4): world_size is not read;
  // the rank is below max_ranks, the size of the agent's per-peer tables.
  // FAILED_PRECONDITION with restarts.rejoin (a rank that left joins again
  // as a new worker instead). Device maps are refused (INVALID_ARGUMENT):
  // they are checked against every worker at the rendezvous.
  bool dynamic_group = false;
  int max_ranks = 1024;
  // Where rank 0 serves the rendezvous store.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Use this store instead of the one at master_addr:master_port (tests,
  // or a store served elsewhere). Rank 0 then starts no store server.
  std::shared_ptr<store::Store> store;
  // The job's store on etcd (store/etcd_store.h), connected at Create():
  // every rank, rank 0 included, is a client of it, so any rank may restart
  // alone and rejoin. FromEnv reads BATON_STORE_ETCD (host:port),
  // BATON_STORE_PREFIX, BATON_ETCD_USER with BATON_ETCD_PASSWORD or
  // BATON_ETCD_PASSWORD_FILE, and BATON_ETCD_CA/CERT/KEY (baton-run
  // --rdzv_backend etcd sets them). Needs security.job_token: the token
  // never goes through etcd.
  struct Etcd {
    std::string endpoint;  // empty: not used
    std::string prefix;
    std::string user;
    std::string password;
    TlsFiles tls;
  } etcd;
  // What runs on this worker above the C++ API ("python" for baton.rpc),
  // published at rendezvous: WorkerInfo::front_ends of every worker, so a
  // front end knows which workers take part in its own steps.
  std::vector<std::string> front_ends;

  // How messages and tensors travel.
  enum class LocalTransport { kShm, kNetwork, kGrpc = kNetwork };
  struct Transport {
    // host:port for this worker's RPC server. Empty: loopback when the
    // master is local, else the local address that routes to the master;
    // port 0.
    std::string listen_address;
    // Largest message (request or reply, tensors included) sent or accepted.
    int64_t max_message_bytes = int64_t{1} << 30;
    // Send large tensors (blobs of at least network_bulk_min_bytes) that go
    // over the network transport through a TCP connection of their own
    // beside its stream (rpc/channel/tcp/bulk_channel.h; a broken
    // connection is resumed and its unacknowledged tensors sent again, B8);
    // not under TLS. FromEnv reads BATON_NET_BULK=0 to turn it off.
    bool network_bulk = true;
    size_t network_bulk_min_bytes = size_t{1} << 18;
    // Its connections per peer pair (B10: a tensor of 4 MiB or more is cut
    // into one slice per connection, sent side by side; smaller ones
    // alternate), 1 to 8. FromEnv reads BATON_NET_BULK_LANES.
    int network_bulk_lanes = 2;
    // Send large tensors to workers on the same host through shared memory
    // (rpc/channel/shm/shm_channel.h). FromEnv reads BATON_SHM=0 to turn it
    // off.
    bool same_host_shm = true;
    // How messages travel between workers on the same host (same boot id
    // and PID namespace, and a successful shared-memory handshake): kShm
    // sends every message, small calls included, through shared-memory
    // rings (rpc/transport/shm/shm_transport.h); kNetwork (also spelt kGrpc)
    // uses the network transport, as between hosts: loopback gRPC, or the
    // transport a test injects (AgentCollaborators). FromEnv reads
    // BATON_TRANSPORT=shm|grpc.
    LocalTransport local_transport = LocalTransport::kShm;
    // Bytes of each ring of a same-host pair (two per pair; frames larger
    // than a ring are cut into pieces). A 64-worker host whose workers all
    // talk to each other maps 2016 pairs * 2 * 256 KiB = ~1 GiB of /dev/shm.
    size_t shm_ring_bytes = size_t{256} << 10;
    // The same-host transport links every pair of a host's workers at
    // rendezvous only on a host with at most this many other workers of
    // the job; beyond it they talk over the network transport (loopback
    // gRPC; large tensors still take the shared-memory bulk channel,
    // same_host_shm). A link costs each side 2 * shm_ring_bytes of /dev/shm
    // at most, a mapping and a check of its peer's process every 100 ms, so
    // a host of n workers pays n^2 of them: 64 other workers is about
    // 1 GiB, 255 would be 16 GiB. 0: no limit. FromEnv reads
    // BATON_SHM_LINK_PEERS.
    int shm_link_peers_max = 64;
    // Flow control per peer (rpc/internal/flow_control.h,
    // docs/flow_control.md). A caller keeps at most max_calls_in_flight
    // calls and max_bytes_in_flight request bytes unanswered toward each
    // worker (the smaller of its own and that worker's limits). A call past
    // that blocks in rpc_async/CallRaw until replies free room, at most
    // until the call's deadline, and then fails with RESOURCE_EXHAUSTED; on
    // a thread that delivers messages (an inline function) it fails at once
    // instead. A worker holds at most as many requests from one caller,
    // queued or running, and refuses the excess at once with
    // RESOURCE_EXHAUSTED (only a caller that ignores its window meets
    // this). A single message larger than max_bytes_in_flight still goes,
    // alone. Both must be at least 1.
    int64_t max_calls_in_flight = 1024;
    int64_t max_bytes_in_flight = int64_t{256} << 20;
  } transport;

  // What proves a worker belongs to the job.
  struct Security {
    // Shared secret checked on every call and by the rendezvous store
    // (FromEnv reads BATON_JOB_TOKEN; baton-run always sets it). Empty is
    // allowed only where it cannot leak:
    // - MASTER_ADDR on loopback (one host): rank 0 creates one and hands it
    //   to the other ranks in /tmp/baton-<uid>/job-<MASTER_PORT>.token
    //   (mode 0600, directory 0700), never through the store;
    // - an injected in-process `store`: rank 0 shares one through it.
    // Any other master address fails Create() with FAILED_PRECONDITION
    // saying how to provide a token.
    std::string job_token;
    // Mutual TLS for the store and the gRPC streams (base/tls.h: the job's
    // CA, this worker's certificate and key, optionally the name every
    // certificate carries). FromEnv reads BATON_TLS_CA, BATON_TLS_CERT,
    // BATON_TLS_KEY and BATON_TLS_SERVER_NAME (baton-run sets them from its
    // --tls_* flags). The files are read at Create(); a missing one fails
    // it naming the file. The same-host shared-memory transport does not
    // use it (its segments are private to the user).
    TlsFiles tls;
  } security;

  // How long things may take. absl::InfiniteDuration() means no limit
  // wherever it is allowed.
  struct Timeouts {
    // A call's deadline when its CallOptions::timeout is zero.
    absl::Duration rpc = absl::Seconds(60);
    // Create(): the rendezvous, until every worker has registered.
    absl::Duration init = absl::Seconds(60);
    // Each step of Shutdown().
    absl::Duration shutdown = absl::Seconds(30);
    // How long a graceful Shutdown() waits for the other workers to reach
    // their own Shutdown() (its first step: a worker with nothing left to
    // do waits there while the others still work). Zero: shutdown;
    // absl::InfiniteDuration(): as long as it takes, unless a missing
    // worker is confirmed dead (UNAVAILABLE naming it), as torch's
    // shutdown() waits. With restarts.wait, a dead worker is missing only
    // once its successor has not registered within restarts.wait (P9,
    // docs/peer_failures.md). The later steps are bounded by shutdown from
    // the moment all arrived.
    absl::Duration shutdown_wait_for_peers = absl::ZeroDuration();
    // Partitions (docs/peer_failures.md, "Partitions"): a peer that stops
    // answering without a sign of death (no refusal, no reset: silence) is
    // probed again and again, and reported dead only once it stayed silent
    // this long; calls meanwhile fail at their own deadlines, and go
    // through again when the link comes back. A refused or reset
    // connection still proves a death at once. FromEnv reads
    // BATON_PARTITION_TOLERANCE (seconds; baton-run --partition_tolerance
    // sets it).
    absl::Duration partition_tolerance = absl::Seconds(30);
  } timeouts;

  // Workers that a launcher restarts.
  struct Restarts {
    // P7 (docs/peer_failures.md): a call to a peer whose latest known
    // incarnation was confirmed dead waits up to this long (within its own
    // deadline) for the next incarnation of that rank to register, and
    // then goes to it; zero (the default) fails such calls at once with
    // UNAVAILABLE. For jobs whose launcher restarts failed workers.
    absl::Duration wait = absl::ZeroDuration();
    // Rejoin a running job as a restarted incarnation of `rank` (baton-run's
    // per-role restart sets BATON_REJOIN=1) instead of rendezvousing anew:
    // the other workers keep running, so this worker reads their
    // registrations, replaces its own with the next incarnation number
    // (Runtime::incarnation()), and skips the init barrier. The rejoined
    // worker can call every peer. A peer learns of the new incarnation, and
    // of its address, when it calls that peer or when the peer confirms the
    // old incarnation dead; until then the peer's calls to the rank fail
    // with UNAVAILABLE, so roles that are called by nobody (trainers of a
    // parameter server, observers) suit this best. Learning of a new
    // incarnation tells the peer's failure listeners that the old one is
    // dead (AddPeerFailureListener). Large tensors go over the stream, not
    // shared memory, both ways (the peers' probes are gone), and every
    // message goes over gRPC (no same-host link is set up for it).
    // FAILED_PRECONDITION for rank 0 when it serves the store (neither
    // `store` nor `etcd` given). Start-up (docs/peer_failures.md, P5): a
    // rank whose predecessor died before it recorded its init round in the
    // store never joined, and starts as a first start would. One whose
    // predecessor joined but died before the job's start-up ended takes its
    // place in the start-up: it registers, publishes what the others wait
    // for, and meets them at the init barrier.
    bool rejoin = false;
  } restarts;

  // CUDA devices (docs/cuda.md).
  struct Devices {
    // A tensor sent to worker W arrives on the device maps[W] names for its
    // device, as with torch's TensorPipeRpcBackendOptions.set_device_map:
    // {"w1", {{0, 1}}} sends this worker's cuda:0 tensors to w1's cuda:1.
    // kCpuDevice (rpc/codec.h) names the host: {{kCpuDevice, 0}} sends CPU
    // tensors to W's cuda:0, {{0, kCpuDevice}} cuda:0 tensors to W's host
    // memory. A request's tensors follow this worker's own map for W; a
    // reply's (and distributed autograd's gradients, CallOptions::answers)
    // the inverse of W's map for this worker, as torch's; where that map is
    // missing, a CUDA tensor follows the other one and a CPU tensor stays
    // on the CPU (rpc/internal/device_maps.h). Every worker checks the whole job's
    // maps once it has read every registration, so Create fails alike on
    // every worker, with INVALID_ARGUMENT naming the first worker at fault,
    // for a map naming a worker not in the job or the worker itself, a
    // device its worker or W does not have, or two devices mapped to one
    // (rpc/internal/device_maps.h). A CPU tensor no map names stays on the
    // CPU; a CUDA tensor sent where no map names its device fails the call
    // with INVALID_ARGUMENT naming the device and the worker.
    std::map<std::string, std::map<int, int>> maps;
    // The devices this worker's tensors travel from and to (torch's
    // TensorPipeRpcBackendOptions.devices; kCpuDevice is the host). Where
    // set, its own maps may take only these devices, and the other
    // workers' maps may send to it only these; the same check refuses an
    // index it does not have, or one listed twice. Empty: every device it
    // has.
    std::vector<int> devices;
  } devices;

  // The executor that runs remote functions (rpc/executor.h).
  struct Threads {
    int min = 4;
    int max = 256;
    // User functions running at once, not counting those waiting in a
    // baton wait (E1-E3); 0: the number of hardware threads, at least 2.
    int parallelism = 0;
  } threads;

  // Metrics, the hang report, the timeline and the agent's log.
  struct Observability {
    // Serve this worker's metrics in Prometheus's format (obs/metrics.h) at
    // host:port, GET /metrics; empty: none. FromEnv reads
    // BATON_METRICS_PORT (all interfaces) or BATON_METRICS_ADDRESS;
    // baton-run --metrics_port P gives its workers P + local rank.
    std::string metrics_address;
    // Collect metrics even without metrics_address: they are then served on
    // state_socket only (GET /metrics), where baton-run's
    // --node_metrics_port gathers a node's workers onto one port. FromEnv
    // reads BATON_METRICS=1.
    bool collect_metrics = false;
    // Serve this worker's state for the hang report (obs/state.h) on a Unix
    // socket at this path, GET /state (JSON of proto/state.proto's
    // WorkerState); empty: none. FromEnv reads BATON_STATE_SOCKET, which
    // baton-run sets for every worker. A socket that cannot be made is said
    // on stderr and the worker runs on without it. With metrics on, the
    // metrics address serves GET /state too.
    std::string state_socket;
    // Record this worker's spans for the job's timeline (obs/trace.h) into
    // this directory; `baton-trace DIR` merges every worker's. Empty: off.
    // FromEnv reads BATON_TRACE.
    std::string trace_dir;
    // Where the agent's own log lines go (base/log.h), each prefixed with
    // the worker's name; default: stderr.
    Logger log;
  } observability;

  // Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and BATON_JOB_TOKEN
  // through env/env.h's parser, which validates them all (without baton-run,
  // MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to 29500),
  // BATON_TRANSPORT (shm or grpc; INVALID_ARGUMENT otherwise) and BATON_SHM
  // (0 turns the bulk channel off). The core reads no other variable.
  // The worker's name is BATON_WORKER_NAME if set, else role + role rank
  // for a job with roles (e.g. "trainer3"), else name_prefix + rank.
  // INVALID_ARGUMENT naming the variable if one is missing or malformed.
  // `lookup` (null: the process environment) answers for every variable
  // read, e.g. a front end's explicit rank and world size in front of the
  // environment.
  static absl::StatusOr<AgentOptions> FromEnv(const std::string& name_prefix = "worker",
                                              baton::EnvLookup lookup = nullptr);
};

// The agent's collaborators, for tests to replace (production code passes
// none and gets the defaults). The agent owns what it is given.
// The steps of the rendezvous (RpcAgent::Create), in order, as an
// AgentCollaborators::rendezvous_observer sees them.
enum class RendezvousStep {
  kConnectingStore,  // before the store is reached
  kRoundTaken,       // its init round and incarnation are recorded in the store
  kRegistered,       // its registration (name, address) is published
  kBeforeInitBarrier,
  kAfterInitBarrier,
};
const char* RendezvousStepName(RendezvousStep step);

struct AgentCollaborators {
  // Creates the network transport: the one the worker registers an address
  // for and reaches every peer through that has no same-host link. Null:
  // gRPC (rpc/transport/grpc/grpc_transport.h). Tests pass an in-process loopback
  // (testing/rpc/loopback_transport.h).
  NetworkTransportFactory network_transport;
  // Null: the agent's own timer thread, on the real clock. A timer on
  // another clock (a test's testing::FakeClock) moves the caller's side of
  // the agent's timed events with that clock: calls' timeouts, to_here's
  // timeout on an owner, the probes of silent peers. A callee's deadline
  // (CallContext::deadline) and the waits of rendezvous and shutdown stay on
  // real time.
  std::unique_ptr<DeadlineTimer> timer;
  // Null: an Executor with AgentOptions::threads (min, max). The
  // agent closes and joins it at shutdown.
  std::unique_ptr<Executor> executor;
  // Runs as the rendezvous reaches each step. A non-OK status stops the
  // rendezvous there and Create fails with it, leaving in the store what a
  // process that died at that step leaves (tests of start-up failures).
  // Null: nothing runs.
  std::function<absl::Status(RendezvousStep)> rendezvous_observer;
  // Moves CUDA tensors to workers on this host (another process, same boot
  // and PID namespace) through CUDA IPC instead of host memory
  // (rpc/cuda/ipc_channel.h, CUDA builds). Null: host memory.
  std::shared_ptr<CudaTensorChannel> cuda_channel;
};

struct CallOptions {
  // Zero: AgentOptions::timeouts.rpc.
  absl::Duration timeout = absl::ZeroDuration();
  // What to call the call in metrics, the hang report, the timeline and
  // errors, on both sides, when not the function's name (a function behind
  // a generic entry point, such as a Python function). Empty: the function.
  std::string label;
  // The function may run more than once for one call without harm (a read,
  // or a write that its callee recognises when repeated). A call whose
  // stream broke (UNAVAILABLE: a network partition outlasted the
  // connection, or the connection was reset) is then sent again once the
  // peer answers a probe, within the call's deadline, instead of failing
  // because it may have run; it fails if the probe proves the peer dead
  // ("Partitions" in docs/peer_failures.md). Costs a copy of the request
  // per call.
  bool idempotent = false;
  // The call's tensors answer tensors the callee sent this worker earlier
  // (distributed autograd's gradients): they follow the inverse of the
  // callee's device map for this worker, as a reply's do, rather than this
  // worker's own map (AgentOptions::devices.maps).
  bool answers = false;
};

// A worker named by name, id or WorkerInfo.
class WorkerRef {
 public:
  WorkerRef(const char* name) : name_(name) {}             // NOLINT
  WorkerRef(std::string name) : name_(std::move(name)) {}  // NOLINT
  WorkerRef(int id) : id_(id) {}                           // NOLINT
  WorkerRef(const WorkerInfo& w) : id_(w.id) {}            // NOLINT
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
  // User functions the executor runs at once (AgentOptions::threads.parallelism, E1).
  int executor_parallelism = 0;
  size_t timers = 0;
  int live_streams = 0;
  size_t shm_busy_segments = 0;
  // Tensor bytes copied into shared-memory segments for same-host peers,
  // and out of segments they sent (rpc/channel/shm/shm_channel.h, S1/S2): the
  // copies a large tensor costs on one host.
  int64_t shm_bulk_bytes_copied_out = 0;
  int64_t shm_bulk_bytes_copied_in = 0;
  // Frames through the same-host shared-memory transport.
  int64_t shm_frames_sent = 0;
  int64_t shm_frames_received = 0;
  // Peers confirmed dead (each confirmation counts), and suspected deaths
  // whose probe has not answered yet (a confirmation can only follow one).
  int64_t peer_failures = 0;
  int64_t peer_probes_in_flight = 0;
  // Flow control (AgentOptions::transport.max_calls_in_flight): our calls that found
  // a peer's window full and waited, those that got RESOURCE_EXHAUSTED at
  // their deadline, requests we refused, and requests admitted but not yet
  // started.
  int64_t calls_waited_for_window = 0;
  int64_t calls_refused_by_window = 0;
  int64_t requests_refused = 0;
  int64_t requests_queued = 0;
  // Calls now waiting for a dead peer's next incarnation (P7).
  int64_t calls_waiting_for_restart = 0;
};

// One incarnation of a peer found dead (Runtime::AddPeerFailureListener).
struct PeerFailure {
  int peer = -1;
  // This incarnation of the peer's rank, and every earlier one, is dead.
  int64_t incarnation = 0;
  // UNAVAILABLE, naming the worker, the evidence and the probe's error, or
  // the newer incarnation that replaced it.
  absl::Status cause;
};

}  // namespace baton::rpc

#endif  // BATON_RPC_AGENT_OPTIONS_H_
