// AgentImpl: the state and protocol behind the public RpcAgent handle
// (rpc/agent.h), as TensorPipe separates Context from ContextImpl. It is the
// transports' handler: requests are dispatched to the registry, replies
// complete pending calls, and a closed stream fails the calls pending on it.
//
// Collaborators come in through the constructor (AgentCollaborators): the
// network transport's factory, the timer and the executor; the store through
// AgentOptions::store. Only what is not given is built here, in
// Rendezvous() (bootstrap.cc): the gRPC transport, the store client or
// server, the shared-memory channel and transport.
//
// Contract: RpcAgent's (rpc/agent.h); every method here backs one of its
// methods.
//
// Peers' incarnations (docs/peer_failures.md): every request carries its
// caller's incarnation. A newer one than known replaces the rank's entry in
// peers_ at once (so that what is recorded for the caller from then on is
// recorded for the new incarnation), reports the old incarnation dead, and
// reads the rank's registration again for its new address. A confirmed
// death is per incarnation: evidence about an incarnation already reported
// dead only makes the agent look at the store again (rate-limited).
//
// Thread-safety: as RpcAgent. `mu_` guards the count of outgoing calls,
// the hooks, the failure listeners, the incoming calls and the
// running/torn-down flags. What this worker knows of each peer (its
// incarnations, identity, probe, the calls made to it and its redelivery
// queue) is that peer's Peer (rpc/internal/peer.h), with a lock of its own,
// taken after mu_ when both are held. What
// Rendezvous() fills (workers_, peer_limits_, paths_, by_name_, the
// transports) is written before ready_ is notified and only read
// afterwards; requests that arrive earlier wait for ready_ on the executor.
// Each path's bulk flag is atomic: it changes when a peer is replaced.
#ifndef BATON_RPC_INTERNAL_AGENT_IMPL_H_
#define BATON_RPC_INTERNAL_AGENT_IMPL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/identity.h"
#include "base/log.h"
#include "obs/http_server.h"
#include "obs/metrics.h"
#include "obs/state.h"
#include "obs/trace.h"
#include "proto/rpc.pb.h"
#include "rpc/agent.h"
#include "rpc/internal/device_maps.h"
#include "rpc/internal/flow_control.h"
#include "rpc/internal/peer.h"
#include "rpc/internal/peer_path.h"
#include "rpc/internal/rendezvous.h"
#include "rpc/runtime.h"
#include "rpc/transport.h"

namespace baton::store {
class StoreServer;
}

namespace baton::rpc::internal {

// True on a thread inside a transport's handler callback (OnRequest,
// OnResponse, ...): such a thread delivers replies, so a call made there
// (by an inline function) must not wait for window room (F4).
extern thread_local bool t_delivering;

// Marks the calling thread as delivering for its lifetime.
class DeliveryScope {
 public:
  DeliveryScope() : outer_(t_delivering) { t_delivering = true; }
  ~DeliveryScope() { t_delivering = outer_; }
  DeliveryScope(const DeliveryScope&) = delete;
  DeliveryScope& operator=(const DeliveryScope&) = delete;

 private:
  const bool outer_;
};

// How many CUDA devices this process sees (0 in a CPU-only LibTorch).
int LocalCudaDevices();
// Adds AgentOptions::devices.maps and the device count to a registration.
void PublishDeviceMaps(const AgentOptions& options, proto::WorkerRecord& mine);

class ShmChannel;
class ShmTransport;

// Answers at once; the probe of a suspected dead peer.
inline constexpr char kPingFunction[] = "__baton.ping";

class AgentImpl final : public Runtime, private TransportHandler {
 public:
  AgentImpl(AgentOptions options, std::shared_ptr<FunctionRegistry> registry,
            AgentCollaborators collaborators);
  ~AgentImpl() override;

  AgentImpl(const AgentImpl&) = delete;
  AgentImpl& operator=(const AgentImpl&) = delete;

  // The handle that remote functions see as CallContext::agent. Set once,
  // before Rendezvous().
  void set_handle(RpcAgent* handle) { handle_ = handle; }

  // Bootstrap (bootstrap.cc): store, token, network transport, rank claim,
  // registration, same-host links, init barrier.
  absl::Status Rendezvous();
  // Shuts down without the agreement if still running; else tears down.
  void Destroy();

  // Runtime (rpc/runtime.h).
  RpcAgent& handle() override { return *handle_; }
  const WorkerInfo& self() const override { return workers_[rank_]; }
  std::vector<WorkerInfo> workers() const override;
  // Whether `rank` is in the group now: every rank of a fixed group once the
  // rendezvous read it, a dynamic group's members (membership.cc).
  bool IsMember(int rank) const {
    return rank >= 0 && rank < slots_ && member_[rank].load(std::memory_order_acquire);
  }
  absl::StatusOr<WorkerInfo> worker(const WorkerRef& ref) const override;
  const AgentOptions& options() const override { return options_; }
  FunctionRegistry& registry() override { return *registry_; }
  Executor* executor() override { return executor_.get(); }
  DeadlineTimer* timer() override { return timer_.get(); }
  store::Store& store() override { return *store_; }
  const std::string& store_namespace() const override { return ns_; }

  Future<Payload> CallRaw(int to, const std::string& function, const std::string& signature,
                          Payload args, const CallOptions& opts) override {
    return Call(to, function, signature, std::move(args), opts, /*windowed=*/true);
  }
  void AddShutdownHook(ShutdownHook hook) override;
  void AddPeerFailureListener(PeerFailureListener listener) override;
  int64_t incarnation() const override { return incarnation_; }
  int64_t peer_incarnation(int peer) const override;
  bool peer_known_dead(int peer) const override;
  std::vector<OutgoingCall> OutgoingCalls() const override;
  absl::Status RetirePeer(int peer) override;
  absl::StatusOr<std::vector<int>> RetiredPeers() override;
  absl::Status Shutdown(bool graceful);
  absl::Status EnterShutdown() override;
  // Shutdown's first step: every worker reached its Shutdown()
  // (AgentOptions::timeouts.shutdown_wait_for_peers).
  absl::Status AwaitPeersAtShutdown();
  absl::Status Teardown(bool cancel_streams, absl::Time deadline);
  bool running() const override;
  AgentStats stats() const;
  obs::MetricsRegistry* metrics() const override { return metrics_.get(); }
  obs::TraceRecorder* trace() const override { return trace_.get(); }
  int metrics_port() const { return metrics_server_ != nullptr ? metrics_server_->port() : 0; }
  // The agent's own families (AgentStats) and the server, at the end of the
  // rendezvous.
  absl::Status StartMetrics();
  // The worker's state for the hang report (obs/state.h; agent_state.cc),
  // and its server on AgentOptions::observability.state_socket, started with the metrics.
  void CollectState(proto::WorkerState* out) const;
  std::string StateJson() const override;
  // Every worker's state (proto::JobState as JSON): this one's, and the
  // others' through RPC, each within `timeout` (GET /job_state).
  std::string JobStateJson(absl::Duration timeout);
  // Registers the inline function that answers with StateJson().
  void RegisterStateFunction();  // in the constructor
  absl::Status StartStateServer();
  // The timeline (obs/trace.h; agent_trace.cc): opens the recorder and
  // measures the clock offset to rank 0 (TL3), at the end of the rendezvous.
  absl::Status StartTrace();
  void OpenTrace();  // in the constructor
  // The agent's log (AgentOptions::observability.log), its lines prefixed with the worker.
  Logger Log() const {
    return options_.observability.log.Child(absl::StrCat("worker '", options_.name, "'"));
  }
  void TraceOutgoing(uint64_t id, int peer, const std::string& function, absl::Time started,
                     const absl::Status& status);
  // GET /metrics (when metrics are on), GET /state and GET /job_state.
  std::map<std::string, obs::HttpRoute> ObservabilityRoutes();
  bool uses_shm(int peer) const override;
  bool uses_shm_transport(int peer) const override;
  std::string StreamIdentity(int peer) const;
  absl::StatusOr<int> DeviceOnPeer(int peer, int device, bool answers) const override;
  CudaTensorChannel* CudaChannelFor(int peer) const override;
  // Fills device_maps_ and cuda_channel_peer_ from the registrations
  // (rpc/device_map.cc); CheckJobDeviceMaps checks them.
  void ResolveDeviceMaps(const std::vector<proto::WorkerRecord>& records);

 private:
  // At most this many sends of one request (P8).
  static constexpr int kMaxDeliveries = 4;

  // The rendezvous' steps, in order (bootstrap.cc says what each leaves).
  // The store's keys are rendezvous_'s; these methods apply what it reads.
  struct Registration {
    std::string probe_name;   // this process's bulk-channel probe, or ""
    std::string probe_token;  // what opening the probe must find
    proto::WorkerRecord mine;
    std::vector<proto::WorkerRecord> records;  // as read before the barrier
  };
  absl::Status PrepareRuntime();
  absl::Status ConnectStore();
  // The job's store is not rank 0's: injected, or on etcd.
  bool ExternalStore() const {
    return options_.store != nullptr || !options_.etcd.endpoint.empty();
  }
  absl::Status TakeRound();
  absl::StatusOr<std::string> AgreeOnToken();
  absl::Status StartNetworkTransport(const std::string& token);
  absl::Status ClaimRank();
  absl::Status StartSameHostPaths(Registration& reg);
  absl::Status Register(Registration& reg);
  absl::Status ReadRegistrations(Registration& reg);
  absl::Status ConnectPeers(const Registration& reg);
  absl::StatusOr<std::vector<int>> FollowSuccessors(const Registration& reg);
  // The rendezvous' last step: the path to self, metrics and state servers,
  // then running and ready_.
  absl::Status BecomeReady(const proto::WorkerRecord& mine);

  // A dynamic group (membership.cc, rpc/agent.h M1-M4), instead of the
  // fixed rendezvous from TakeRound on: the group's keys, the name, the
  // members before this one, and the announcement to them (M1).
  absl::Status JoinGroup();
  absl::Status TakeGroupRound();
  absl::Status ClaimName();
  // Sizes the per-peer tables for options_.max_ranks slots, none a member.
  void MakeSlots(const proto::WorkerRecord& mine);
  absl::Status ReadMembers();
  // Calls `function` on every other member at once (outside the window),
  // each within `timeout`; the calls, by member.
  std::vector<std::pair<int, Future<Payload>>> NotifyMembers(const char* function,
                                                             absl::Duration timeout);
  void AnnounceJoin();
  // Takes `rank`, registered as `record`, into the group: its entry, name,
  // window and network address; then IsMember(rank).
  absl::Status AdmitMember(int rank, const proto::WorkerRecord& record);
  // A member's join notice: reads its registration and admits it.
  absl::Status OnJoinNotice(int caller, int64_t incarnation);
  // M3: a member's leave notice; it is no member from now on.
  absl::Status OnLeaveNotice(int caller, int64_t incarnation);
  // Takes `rank` out of the group (a leave notice, a failed join notice, a
  // reported death).
  void RemoveMember(int rank);
  // M3: tells every member this worker leaves, within `deadline`.
  void AnnounceLeave(absl::Time deadline);
  // Takes this worker's registration, rank claim and count out of the
  // store (Teardown; only what the join made).
  void ReleaseMembership(absl::Duration timeout);
  // The store's host: waits, at most `timeout`, until no member is left.
  absl::Status AwaitMembersGone(absl::Duration timeout);
  // Runs the rendezvous observer (AgentCollaborators) at `step`.
  absl::Status Step(RendezvousStep step);

  // TransportHandler.
  void OnRequest(std::shared_ptr<ReplyChannel> channel, Frame frame) override;
  void OnResponse(int peer, Frame frame) override;
  void OnStreamClosed(int peer, uint64_t stream_id, const absl::Status& cause) override;
  void OnPeerLost(int peer, const absl::Status& cause) override;
  // P8: requests on a stream the peer never accepted were not delivered.
  void OnStreamRefused(int peer, uint64_t stream_id, const absl::Status& cause) override;
  void OnRequestsUnread(int peer, uint64_t stream_id, const std::vector<uint64_t>& ids,
                        const absl::Status& cause) override;
  // W2: checks what an incoming stream presents (stream_identity.cc).
  void AuthenticateStream(absl::string_view identity,
                          std::function<void(absl::StatusOr<int>)> done) override;

  // Stream identities (stream_identity.cc, docs/flow_control.md W1-W3).
  // What this worker presents on a stream toward `peer_incarnation` of
  // `peer`, whose registered key is `peer_key` (empty if either has none).
  std::string IdentityToward(int peer, int64_t peer_incarnation, const std::string& peer_key) const;
  // Gives the network transport `peer`'s registered address and the
  // identity to present there, and keeps its key for checking its streams.
  void AddNetworkPeer(int peer, const proto::WorkerRecord& record);
  // `rank` if `proof` proves that incarnation `incarnation` of `rank`,
  // holding `key`, opened the stream; else PERMISSION_DENIED naming it.
  absl::StatusOr<int> CheckClaim(int rank, int64_t incarnation, const std::string& proof,
                                 const std::string& key) const;

  // Sends request `id` (pending) to `to`: records its stream, or, if the
  // transport cannot take it, queues it to go again (P8) or fails it.
  void SendRequest(uint64_t id, int to, const std::string& function, Frame frame);
  // A call; `windowed` false skips flow control (the liveness probe, which
  // must get through to a peer whose window is full).
  Future<Payload> Call(int to, const std::string& function, const std::string& signature,
                       Payload args, const CallOptions& opts, bool windowed);

  // Confirms a suspected death of `peer`'s latest known incarnation with a
  // probe call, then reports it (ReportDead). A probe that meets silence
  // (IsSilence) is made again (ProbeAgain) until the peer answers or it was
  // silent for options_.timeouts.partition_tolerance.
  void SuspectPeer(int peer, const absl::Status& cause);
  void ProbeAgain(int peer, const absl::Status& cause);
  // Whether call `id`, pending on `peer`, may go again after a partition
  // (CallOptions::idempotent, with its request kept).
  bool Idempotent(int peer, uint64_t id) const;
  // Between the probes of a silent peer.
  static constexpr absl::Duration kSilentProbePeriod = absl::Seconds(1);
  // `peer` has `incarnation` (from a request or its registration): if that
  // is newer than known, it replaces the entry, turns shared-memory blobs
  // toward the rank off, reports the older incarnation dead and refreshes
  // the address. Returns false if `incarnation` is older than known (a
  // replaced process).
  bool NoteIncarnation(int peer, int64_t incarnation);
  // Tells the listeners that `incarnation` of `peer` (and every earlier one)
  // is dead, unless already told.
  void ReportDead(int peer, int64_t incarnation, const absl::Status& cause);
  // Reads `peer`'s registration from the store on the executor (at most
  // one read per peer in flight, and one per 500 ms) and takes its
  // incarnation and address if newer.
  void RefreshPeer(int peer);
  // Reads `peer`'s registration from the store (waiting at most `timeout`)
  // and follows a newer incarnation than the one whose address the
  // transport has. Returns whether it did.
  bool LoadPeerRecord(int peer, absl::Duration timeout);
  // P6: before a call to `peer`, if a newer incarnation of it is known
  // than the one whose address the transport has, loads its registration
  // (bounded by `deadline`), so the call goes to it and not to its
  // predecessor.
  void FollowNewerIncarnation(int peer, absl::Time deadline);
  // P7: if `peer`'s latest known incarnation was confirmed dead, waits (at
  // most options_.restarts.wait, within `deadline`) for its successor's
  // registration and follows it.
  void WaitForSuccessor(int peer, absl::Time deadline);
  // Waits until `until` for incarnation `dead` + 1 of `peer` to register
  // and follows it; counted in calls_waiting_for_restart. True if it did.
  bool AwaitSuccessor(int peer, int64_t dead, absl::Time until);
  // P8: queues call `id`, pending on `peer`, to be sent again once the
  // peer can take it (the incarnation that refused it answers a probe, or
  // its successor registered): `unread`, it is known the callee never read
  // it; else it is an idempotent call whose stream ended in silence. False
  // if it cannot go again (no request kept, its sends used up, shutting
  // down); the caller then fails it.
  bool Redeliver(int peer, uint64_t id, bool unread);
  // The task that sends `peer`'s queued calls again (one per peer at a time).
  void RedeliverTo(int peer);
  // Whether `peer` can take requests now, waiting for that until `until`
  // (bounded by options_.restarts.wait): OK once an incarnation newer than
  // `incarnation` is followed or `incarnation` answers a probe; else
  // UNAVAILABLE naming the peer.
  absl::Status AwaitDeliverable(int peer, int64_t incarnation, absl::Time until);
  // Sends pending call `id` again (or fails it with `why`).
  void Resend(uint64_t id, int peer, const absl::Status& why);

  // `admitted`: the bytes gate_ admitted the request with, given back with
  // the reply (-1: the request did not go through the gate).
  void Dispatch(const std::shared_ptr<ReplyChannel>& channel, Frame frame, absl::Time deadline,
                int64_t admitted);
  void SendReply(const std::shared_ptr<ReplyChannel>& channel, uint64_t id, int caller,
                 absl::StatusOr<Payload> result, int64_t admitted = -1, bool reply_shm = false,
                 bool not_run = false, std::vector<ReplyNoteScope::Note> notes = {});
  // A reply refusing the request before its function ran: nothing in its
  // payload was decoded (FrameHeader.not_run).
  void Refuse(const std::shared_ptr<ReplyChannel>& channel, uint64_t id, int caller,
              const absl::Status& status, int64_t admitted = -1) {
    SendReply(channel, id, caller, status, admitted, /*reply_shm=*/false, /*not_run=*/true);
  }
  void FinishIncoming(int caller, uint64_t id, absl::Time replied);

  // The pending calls (id, function) that went to `peer` on `stream_id`.
  std::vector<std::pair<uint64_t, std::string>> CallsOnStream(int peer, uint64_t stream_id) const;
  // P8: redelivers (with restarts.wait) or fails as undelivered calls known
  // never read by `peer`; `why` and `cause` explain a failure.
  void RedeliverUnread(int peer, const std::vector<std::pair<uint64_t, std::string>>& calls,
                       absl::string_view why, const absl::Status& cause);
  // Completes and removes call `id` pending on `peer` (no-op if already
  // gone). `undelivered`: the callee never decoded the request (RRef G8:
  // its undo runs). `timed_out`: the caller's deadline passed; the callee
  // may still answer, and if it answers that it never decoded the request,
  // the undo runs then (Peer::TakeLateUndo).
  void Complete(int peer, uint64_t id, absl::StatusOr<Payload> result, bool undelivered = false,
                bool timed_out = false);
  // Completes `call`, already taken from its peer's table: gives back its
  // timer and window room, runs its undo if `undelivered`, records it, sets
  // its future, and counts it out of outgoing_.
  void Finish(PendingCall call, uint64_t id, absl::StatusOr<Payload> result, bool undelivered);
  std::string CallContextText(int peer, const std::string& function) const;
  int64_t PeerLimit(int peer) const;
  // The names of `peer`'s shared-memory segments start with this.

  const AgentOptions options_;
  // The per-peer tables' size: world_size, or a dynamic group's max_ranks.
  const int slots_;
  const std::shared_ptr<FunctionRegistry> registry_;
  RpcAgent* handle_ = nullptr;
  NetworkTransportFactory network_factory_;                          // null: gRPC
  std::function<absl::Status(RendezvousStep)> rendezvous_observer_;  // null: none
  // options_.restarts.rejoin, unless the rank never joined (P5): set in Rendezvous.
  bool rejoin_ = false;
  int rank_ = -1;
  int64_t incarnation_ = 0;  // set during Rendezvous
  // This incarnation's key pair (W1): made in Rendezvous before the
  // network transport starts, constant afterwards.
  std::optional<WorkerIdentity> identity_;
  std::string ns_;
  std::string token_;                 // set in ConnectStore (JobStore::token)
  std::string token_file_;            // rank 0 wrote the token here (one-host job)
  TlsConfig tls_;                     // loaded from options_.security.tls in ConnectStore
  std::string store_instance_;        // set during Rendezvous
  std::vector<WorkerInfo> workers_;   // set during Rendezvous
  std::vector<int64_t> peer_limits_;  // set during Rendezvous
  // Where this worker's tensors arrive on each peer
  // (AgentOptions::devices.maps); set during Rendezvous.
  DeviceMaps device_maps_;
  // The peers AgentCollaborators::cuda_channel serves: other processes on
  // this host (same boot id and PID namespace); set during Rendezvous.
  std::vector<bool> cuda_channel_peer_;
  // How messages to each peer travel (link, network, bulk channel); set
  // during Rendezvous, after the transports it borrows.
  std::vector<std::unique_ptr<PeerPath>> paths_;
  // Per slot: IsMember. A fixed group sets every slot before ready_; a
  // dynamic group sets a slot once its workers_ entry is written
  // (AdmitMember, release) and clears it when the member leaves. A slot's
  // workers_ entry is written once, before its first admission, and read
  // only for members afterwards.
  std::unique_ptr<std::atomic<bool>[]> member_;
  // Guards the name index, which a dynamic group changes as members come
  // and go; taken before mu_ is, never while holding it.
  mutable absl::Mutex members_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::flat_hash_map<std::string, int> by_name_ ABSL_GUARDED_BY(members_mu_);
  // The slots whose workers_ entry is written (a dynamic group).
  std::vector<bool> named_ ABSL_GUARDED_BY(members_mu_);
  // A dynamic group: this worker's place in the member list (0: not
  // joined), set in JoinGroup; the nonce of its rank claim (ClaimRank).
  int64_t member_seq_ = 0;
  std::string rank_claim_;
  bool counted_ = false;  // in the group's `live` count (TakeGroupRound)
  // Set once this worker's leave began: join notices are refused from then
  // on, so nobody joins a member that is going (M3).
  std::atomic<bool> leaving_{false};
  // Every store key of the job (rendezvous.h): the rendezvous, the group's
  // join and leave, a peer's record and successor, the shutdown's barriers
  // and marks. Made with the store in ConnectStore, its round taken in
  // TakeRound or TakeGroupRound; null before.
  std::unique_ptr<internal::Rendezvous> rendezvous_;

  std::unique_ptr<store::StoreServer> store_server_;  // rank 0 only
  // AgentOptions::observability.metrics_address: the registry (set in Create, before any
  // call) and its server (from the end of the rendezvous to Teardown).
  std::unique_ptr<obs::MetricsRegistry> metrics_;
  std::unique_ptr<obs::HttpServer> metrics_server_;
  std::unique_ptr<obs::HttpServer> state_server_;
  // AgentOptions::observability.trace_dir: set in StartTrace, before the agent serves.
  std::unique_ptr<obs::TraceRecorder> trace_;
  std::shared_ptr<store::Store> store_;
  std::unique_ptr<DeadlineTimer> timer_;
  std::unique_ptr<Executor> executor_;
  std::shared_ptr<CudaTensorChannel> cuda_channel_;  // AgentCollaborators
  std::unique_ptr<NetworkTransport> transport_;
  std::unique_ptr<ShmChannel> shm_;
  std::unique_ptr<ShmTransport> shm_transport_;
  // Flow control (flow_control.h): the gate is made with the executor, the
  // window once the peers' limits are known (both before ready_).
  std::unique_ptr<RequestGate> gate_;
  std::unique_ptr<CallWindow> window_;

  // Notified when Rendezvous() has filled workers_ and peer_limits_ (or
  // gave up). Requests that arrive earlier wait for it on the executor.
  absl::Notification ready_;
  std::atomic<uint64_t> next_call_id_{1};
  // Serializes LoadPeerRecord's updates of the transport's peer addresses
  // (taken before mu_, never while holding it).
  absl::Mutex peer_update_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  // Calls made and not yet finished: in a peer's table (Peer::AddCall), or
  // taken from it and still in Finish(), which uses the timer and the
  // window. The drain and Teardown wait for zero, or the agent could be
  // destroyed under a completion.
  int64_t outgoing_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ShutdownHook> hooks_ ABSL_GUARDED_BY(mu_);
  std::vector<PeerFailureListener> failure_listeners_ ABSL_GUARDED_BY(mu_);
  int64_t peer_failures_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waiting_for_restart_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t incoming_ ABSL_GUARDED_BY(mu_) = 0;
  // Requests being served, by (caller, request id), for the state report.
  struct IncomingCall {
    std::string function;
    absl::Time started;  // arrival; once running, the start of its function
    bool running = false;
    absl::Time arrived;
    int64_t caller_incarnation = 0;
  };
  void TraceIncoming(int caller, uint64_t id, const IncomingCall& call, absl::Time replied);
  absl::flat_hash_map<std::pair<int, uint64_t>, IncomingCall> incoming_calls_ ABSL_GUARDED_BY(mu_);
  // Payload bytes (message bodies and tensors, before or after any
  // shared-memory segment) and messages, per peer and direction, for the
  // metrics; world_size entries.
  struct PeerTraffic {
    std::atomic<int64_t> bytes_out{0};
    std::atomic<int64_t> bytes_in{0};
    std::atomic<int64_t> messages_out{0};
    std::atomic<int64_t> messages_in{0};
  };
  std::unique_ptr<PeerTraffic[]> traffic_;
  // One Peer per slot, made in the constructor and never resized (so no
  // lock guards the vector); filled by the rendezvous (FillPeers), which
  // then sets peers_known_. Before that a peer is unknown (PeerAt: null).
  std::vector<std::unique_ptr<Peer>> peers_;
  std::atomic<bool> peers_known_{false};
  // `peer`'s entry, or null if it is out of range or the rendezvous has not
  // filled the table yet.
  Peer* PeerAt(int peer) const {
    if (peer < 0 || peer >= static_cast<int>(peers_.size()) ||
        !peers_known_.load(std::memory_order_acquire)) {
      return nullptr;
    }
    return peers_[peer].get();
  }
  // Resets every peer, `incarnation_of(rank)` its incarnation (0: none),
  // then marks the table known.
  void FillPeers(const std::function<int64_t(int)>& incarnation_of);
  void CountTraffic(int peer, const Payload& payload, bool out);
  // Progress counters of the state report: calls completed each way.
  std::atomic<int64_t> calls_done_out_{0};
  std::atomic<int64_t> calls_done_in_{0};
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool torn_down_ ABSL_GUARDED_BY(mu_) = false;
  // The outcome of Shutdown's first step once EnterShutdown() ran it.
  std::optional<absl::Status> entered_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_INTERNAL_AGENT_IMPL_H_
