// The RPC agent's calls, replies to them and shutdown (internal::AgentImpl
// behind the RpcAgent handle). Serving requests is in agent_serve.cc, the
// bootstrap (options from the environment, store, token, registration,
// links) in bootstrap.cc, and peer failures and incarnations in
// peer_failures.cc.
#include "rpc/agent.h"

#include <unistd.h>

#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "rpc/channel/shm/shm_channel.h"
#include "rpc/internal/agent_impl.h"
#include "rpc/internal/wire.h"
#include "rpc/transport/grpc/grpc_transport.h"
#include "rpc/transport/shm/shm_transport.h"
#include "store/store_server.h"

namespace baton::rpc {
namespace {

absl::Status CheckName(const std::string& name) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker name '", name, "' must have 1 to 128 characters"));
  }
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
          c == ':')) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker name '", name, "' may contain only letters, digits and _-.:"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* RendezvousStepName(RendezvousStep step) {
  switch (step) {
    case RendezvousStep::kConnectingStore: return "connecting to the store";
    case RendezvousStep::kRoundTaken: return "init round taken";
    case RendezvousStep::kRegistered: return "registered";
    case RendezvousStep::kBeforeInitBarrier: return "before the init barrier";
    case RendezvousStep::kAfterInitBarrier: return "after the init barrier";
  }
  return "unknown";
}

// ---- The public handle ----

RpcAgent::RpcAgent(std::unique_ptr<internal::AgentImpl> impl)
    : impl_(std::move(impl)), runtime_(impl_.get()) {
  impl_->set_handle(this);
}

absl::StatusOr<std::unique_ptr<RpcAgent>> RpcAgent::Create(
    AgentOptions options, std::shared_ptr<FunctionRegistry> registry,
    AgentCollaborators collaborators) {
  if (options.dynamic_group) {
    if (options.max_ranks < 1 || options.max_ranks > (1 << 16)) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_ranks must be in [1, 65536], got ", options.max_ranks));
    }
    if (options.rank < 0 || options.rank >= options.max_ranks) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " is outside [0, ",
                                                     options.max_ranks,
                                                     ") (AgentOptions::max_ranks)"));
    }
    if (options.restarts.rejoin) {
      return absl::FailedPreconditionError(
          "a dynamic group has no rejoin: a rank that left joins again as a new member");
    }
    if (!options.devices.maps.empty()) {
      return absl::InvalidArgumentError(
          "device maps need a group of fixed size (they are checked against every worker at "
          "the rendezvous); pass a world size");
    }
  } else if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be at least 1, got ", options.world_size));
  } else if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is outside [0, ", options.world_size, ")"));
  }
  RETURN_IF_ERROR(CheckName(options.name));
  if (options.transport.max_message_bytes < 1024) {
    return absl::InvalidArgumentError("max_message_bytes must be at least 1024");
  }
  if (options.transport.max_calls_in_flight < 1 || options.transport.max_bytes_in_flight < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_calls_in_flight (", options.transport.max_calls_in_flight,
                     ") and max_bytes_in_flight (", options.transport.max_bytes_in_flight,
                     ") must be at least 1"));
  }
  if (registry == nullptr) registry = std::make_shared<FunctionRegistry>();
  const std::string name = options.name;
  const int rank = options.rank;
  std::unique_ptr<RpcAgent> agent(new RpcAgent(std::make_unique<internal::AgentImpl>(
      std::move(options), std::move(registry), std::move(collaborators))));
  absl::Status s = agent->impl_->Rendezvous();
  if (!s.ok()) {
    (void)agent->impl_->Teardown(/*cancel_streams=*/true, absl::Now() + absl::Seconds(5));
    return Annotate(s, absl::StrCat("init of worker '", name, "' (rank ", rank, ")"));
  }
  return agent;
}

RpcAgent::~RpcAgent() { impl_->Destroy(); }

absl::Status RpcAgent::Shutdown(bool graceful) { return impl_->Shutdown(graceful); }
AgentStats RpcAgent::stats() const { return impl_->stats(); }
int RpcAgent::metrics_port() const { return impl_->metrics_port(); }

// ---- AgentImpl ----

namespace internal {

thread_local bool t_delivering = false;

AgentImpl::AgentImpl(AgentOptions options, std::shared_ptr<FunctionRegistry> registry,
                     AgentCollaborators collaborators)
    : options_(std::move(options)),
      slots_(options_.dynamic_group ? options_.max_ranks : options_.world_size),
      registry_(std::move(registry)),
      network_factory_(std::move(collaborators.network_transport)),
      rendezvous_observer_(std::move(collaborators.rendezvous_observer)),
      timer_(std::move(collaborators.timer)),
      executor_(std::move(collaborators.executor)),
      cuda_channel_(std::move(collaborators.cuda_channel)) {
  if (!options_.observability.metrics_address.empty() || options_.observability.collect_metrics) {
    metrics_ = std::make_unique<obs::MetricsRegistry>();
  }
  traffic_ = std::make_unique<PeerTraffic[]>(std::max(0, slots_));
  member_ = std::make_unique<std::atomic<bool>[]>(std::max(0, slots_));
  peers_.reserve(std::max(0, slots_));
  for (int r = 0; r < slots_; ++r) peers_.push_back(std::make_unique<Peer>());
  OpenTrace();
  RegisterStateFunction();
}

void AgentImpl::FillPeers(const std::function<int64_t(int)>& incarnation_of) {
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) peers_[r]->Reset(incarnation_of(r));
  peers_known_.store(true, std::memory_order_release);
}

void AgentImpl::CountTraffic(int peer, const Payload& payload, bool out) {
  if (peer < 0 || peer >= slots_) return;
  PeerTraffic& t = traffic_[peer];
  const auto bytes = static_cast<int64_t>(payload.total_size());
  (out ? t.bytes_out : t.bytes_in).fetch_add(bytes, std::memory_order_relaxed);
  (out ? t.messages_out : t.messages_in).fetch_add(1, std::memory_order_relaxed);
}

AgentImpl::~AgentImpl() = default;

void AgentImpl::Destroy() {
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

absl::StatusOr<WorkerInfo> AgentImpl::worker(const WorkerRef& ref) const {
  if (ref.id() >= 0 || ref.name().empty()) {
    if (IsMember(ref.id())) return workers_[ref.id()];
    if (options_.dynamic_group && ref.id() >= 0 && ref.id() < slots_) {
      return absl::NotFoundError(absl::StrCat(
          "no worker with id ", ref.id(), " in the group: it left the group, or never joined it"));
    }
    return absl::NotFoundError(
        absl::StrCat("no worker with id ", ref.id(), "; ids are 0..", workers_.size() - 1));
  }
  int id = -1;
  {
    absl::ReaderMutexLock lock(&members_mu_);
    if (auto it = by_name_.find(ref.name()); it != by_name_.end()) id = it->second;
  }
  if (id < 0) {
    std::vector<std::string> names;
    for (const WorkerInfo& w : workers()) names.push_back(w.name);
    return absl::NotFoundError(absl::StrCat("could not find destination: no worker named '",
                                            ref.name(), "'; workers are ",
                                            absl::StrJoin(names, ", ")));
  }
  return workers_[id];
}

std::vector<WorkerInfo> AgentImpl::workers() const {
  std::vector<WorkerInfo> out;
  for (int r = 0; r < static_cast<int>(workers_.size()); ++r) {
    if (IsMember(r)) out.push_back(workers_[r]);
  }
  return out;
}

std::string AgentImpl::CallContextText(int peer, const std::string& function) const {
  const std::string name =
      peer >= 0 && peer < static_cast<int>(workers_.size()) ? workers_[peer].name : "?";
  return absl::StrCat("rpc to worker '", name, "' (id ", peer, "), function '", function, "'");
}

int64_t AgentImpl::PeerLimit(int peer) const {
  return std::min(options_.transport.max_message_bytes, peer_limits_[peer]);
}

Future<Payload> AgentImpl::Call(int to, const std::string& function, const std::string& signature,
                                Payload args, const CallOptions& opts, bool windowed) {
  // RRef G8: until the request leaves, a failure takes back what it carried.
  std::vector<std::function<void()>> undo;
  undo.swap(args.undo_if_undelivered);
  auto fail = [&undo](absl::Status s) {
    for (auto& f : undo) f();
    return MakeErrorFuture<Payload>(std::move(s));
  };
  if (to < 0 || to >= static_cast<int>(workers_.size())) {
    return fail(absl::NotFoundError(
        absl::StrCat("rpc of function '", function, "': no worker with id ", to)));
  }
  if (!IsMember(to)) {  // M3
    return fail(absl::NotFoundError(absl::StrCat("rpc of function '", function, "': worker id ", to,
                                                 " left the group, or never joined it")));
  }
  const absl::Duration timeout =
      opts.timeout > absl::ZeroDuration() ? opts.timeout : options_.timeouts.rpc;
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  // The same instant as a time of the timer's clock (rpc/timer.h), read
  // before any wait below counts against the timeout; a test's fake clock
  // moves it.
  const absl::Time timer_deadline = timeout == absl::InfiniteDuration()
                                        ? absl::InfiniteFuture()
                                        : timer_->clock().Now() + timeout;
  // P6: a restarted peer that we know of is called at its new address.
  // Not on a delivery thread, which must not wait for the store.
  if (to != rank_ && !t_delivering) {
    // With restarts.wait set, a call to a rank confirmed dead waits, within its
    // deadline, for the rank's next incarnation to register (P7).
    WaitForSuccessor(to, deadline);
    FollowNewerIncarnation(to, deadline);
  }
  const uint64_t id = next_call_id_.fetch_add(1, std::memory_order_relaxed);
  Frame frame;
  frame.header.set_kind(proto::FrameHeader::REQUEST);
  frame.header.set_id(id);
  frame.header.set_function(function);
  frame.header.set_signature(signature);
  if (!opts.label.empty() && opts.label != function) frame.header.set_label(opts.label);
  frame.header.set_caller_id(rank_);
  frame.header.set_caller_incarnation(incarnation_);
  const PeerPath& path = *paths_[to];
  const bool bulk_shm = path.bulk();
  // We opened its probe: it may answer through its segments.
  if (bulk_shm) frame.header.set_reply_shm(true);
  if (timeout != absl::InfiniteDuration()) {
    frame.header.set_timeout_us(std::max<int64_t>(1, absl::ToInt64Microseconds(timeout)));
  }
  frame.payload = std::move(args);
  const size_t size = internal::FrameSize(frame);
  if (static_cast<int64_t>(size) > PeerLimit(to)) {
    return fail(absl::ResourceExhaustedError(
        absl::StrCat(CallContextText(to, function), ": request of ", size,
                     " bytes exceeds the message size limit of ", PeerLimit(to),
                     " bytes (AgentOptions::transport.max_message_bytes)")));
  }
  // F1: wait for room in the peer's window; the wait counts against the
  // call's deadline.
  const int64_t window_bytes = windowed ? static_cast<int64_t>(size) : -1;
  if (windowed) {
    if (absl::Status room = window_->Acquire(to, window_bytes, deadline, !t_delivering);
        !room.ok()) {
      return fail(absl::IsCancelled(room)
                      ? absl::FailedPreconditionError(
                            absl::StrCat(CallContextText(to, function), ": the agent is shut down"))
                      : Annotate(room, CallContextText(to, function)));
    }
  }
  if (timeout != absl::InfiniteDuration() && window_bytes >= 0) {
    // What is left of it after any wait for room travels to the callee (a
    // shorter varint: the frame does not grow past the size checked above).
    frame.header.set_timeout_us(
        std::max<int64_t>(1, absl::ToInt64Microseconds(deadline - absl::Now())));
  }
  CountTraffic(to, frame.payload, /*out=*/true);
  if (bulk_shm) {
    path.ExportBlobs(frame, timeout == absl::InfiniteDuration()
                                ? absl::InfiniteFuture()
                                : absl::Now() + timeout + absl::Seconds(5));
  }
  // P8: a request that is known undelivered may go to the rank's next
  // incarnation. Not for probes, calls to self, or requests whose tensors
  // wait in shared-memory segments (Export above) for this incarnation.
  // An idempotent call may go again after a partition (CallOptions).
  std::shared_ptr<const Frame> resend;
  if ((options_.restarts.wait > absl::ZeroDuration() || opts.idempotent) && windowed &&
      to != rank_ && frame.header.shm_blobs_size() == 0) {
    resend = std::make_shared<const Frame>(frame);
  }
  Promise<Payload> promise(executor_.get());
  PendingCall call;
  call.promise = promise;
  call.peer = to;
  call.function = opts.label.empty() ? function : opts.label;
  call.timeout = timeout;
  call.deadline = deadline;
  call.window_bytes = window_bytes;
  call.undo = std::move(undo);
  call.resend = std::move(resend);
  call.idempotent = opts.idempotent;
  call.started = absl::Now();  // the state report's age, and metrics
  if (metrics_ != nullptr) call.metrics = metrics_->Rpc(call.function);
  bool added = false;
  {
    absl::MutexLock lock(&mu_);
    if (running_) {
      ++outgoing_;
      // The peer's table refuses it once Teardown closed it, even if
      // running_ was read before that.
      added = peers_[to]->AddCall(id, call);
      if (!added) --outgoing_;
    }
  }
  if (!added) {
    if (windowed) window_->Release(to, window_bytes);
    undo = std::move(call.undo);  // not added: the failure takes it back
    return fail(absl::FailedPreconditionError(
        absl::StrCat(CallContextText(to, function), ": the agent is shut down")));
  }
  const DeadlineTimer::Id timer =
      timeout == absl::InfiniteDuration()
          ? 0
          : timer_->Schedule(timer_deadline, [this, id, to, function, timeout] {
              Complete(to, id,
                       absl::DeadlineExceededError(
                           absl::StrCat(CallContextText(to, function),
                                        ": timed out: RPC ran for more than its timeout (",
                                        DurationText(timeout), ")")),
                       /*undelivered=*/false, /*timed_out=*/true);
            });
  peers_[to]->WithCall(id, [timer](PendingCall& c) { c.timer = timer; });
  SendRequest(id, to, function, std::move(frame));
  return promise.future();
}

void AgentImpl::SendRequest(uint64_t id, int to, const std::string& function, Frame frame) {
  absl::StatusOr<uint64_t> stream = paths_[to]->Send(std::move(frame));
  if (!stream.ok()) {
    // Evidence (P2): the probe checks it, or the store names a successor.
    if (absl::IsUnavailable(stream.status())) SuspectPeer(to, stream.status());
    // P8: it did not leave; it may go to the rank's next incarnation.
    if (!absl::IsUnavailable(stream.status()) || !Redeliver(to, id, /*unread=*/true)) {
      Complete(to, id,
               Annotate(stream.status(),
                        absl::StrCat(CallContextText(to, function), ": worker unreachable")),
               /*undelivered=*/true);
    }
    return;
  }
  peers_[to]->WithCall(id, [&stream](PendingCall& call) {
    // Unless the stream ended meanwhile and the call is queued to go again.
    if (call.stream_id == 0) call.stream_id = *stream;
  });
}

void AgentImpl::Complete(int peer, uint64_t id, absl::StatusOr<Payload> result, bool undelivered,
                         bool timed_out) {
  // G8: after a timeout the callee may yet say that it never decoded the
  // request (OnResponse), e.g. refused because the deadline had passed
  // there; the undo waits for that.
  std::optional<PendingCall> call = peers_[peer]->TakeCall(id, /*keep_undo=*/timed_out);
  if (!call.has_value()) return;
  // Queued to go again and known never read (P8): no late word will come.
  if (call->known_unread()) undelivered = true;
  Finish(*std::move(call), id, std::move(result), undelivered);
}

void AgentImpl::Finish(PendingCall call, uint64_t id, absl::StatusOr<Payload> result,
                       bool undelivered) {
  timer_->Cancel(call.timer);
  if (call.window_bytes >= 0) window_->Release(call.peer, call.window_bytes);
  if (undelivered) {
    for (auto& f : call.undo) f();
  }
  call.undo.clear();
  if (call.metrics != nullptr) {
    call.metrics->Record(obs::Side::kCaller, result.status().code(), absl::Now() - call.started);
  }
  calls_done_out_.fetch_add(1, std::memory_order_relaxed);
  if (trace_ != nullptr) TraceOutgoing(id, call.peer, call.function, call.started, result.status());
  call.promise.Set(std::move(result));
  absl::MutexLock lock(&mu_);
  --outgoing_;
}

void AgentImpl::OnResponse(int peer, Frame frame) {
  DeliveryScope delivering;
  const uint64_t id = frame.header.id();
  // Reply notes first: the caller sees their effect once its call completes.
  for (const proto::ReplyNote& n : frame.header.notes()) {
    if (auto kind = registry_->FindReplyNoteKind(n.kind()); kind != nullptr && handle_ != nullptr) {
      kind->on_arrival(*this, peer, n.data());
    }
  }
  if (frame.header.shm_blobs_size() > 0) {
    absl::Status s = peer >= 0 && peer < static_cast<int>(paths_.size())
                         ? paths_[peer]->ImportBlobs(frame)
                         : absl::DataLossError("shared-memory blob from an unknown peer");
    if (!s.ok() && frame.header.status_code() == 0) {
      frame.header.set_status_code(static_cast<int>(s.code()));
      frame.header.set_error_message(std::string(s.message()));
    }
  }
  CountTraffic(peer, frame.payload, /*out=*/false);
  // Only the calls made to `peer` can be completed by what its stream
  // brings.
  if (peer < 0 || peer >= static_cast<int>(peers_.size())) return;
  const bool failed = frame.header.status_code() != 0;
  std::optional<PendingCall> call = peers_[peer]->TakeCall(id);
  if (!call.has_value()) {
    // Already timed out. If the callee never decoded it, what the request
    // took along (RRef forks) goes back now (G8); any other answer ends the
    // wait for that word.
    std::vector<std::function<void()>> late_undo = peers_[peer]->TakeLateUndo(id);
    if (failed && frame.header.not_run()) {
      for (auto& f : late_undo) f();
    }
    return;
  }
  if (!failed) {
    Finish(*std::move(call), id, std::move(frame.payload), /*undelivered=*/false);
    return;
  }
  const std::string function = call->function;
  Finish(*std::move(call), id,
         Annotate(StatusFromWire(frame.header.status_code(), frame.header.error_message()),
                  CallContextText(peer, function)),
         /*undelivered=*/frame.header.not_run());
}

void AgentImpl::AddShutdownHook(ShutdownHook hook) {
  absl::MutexLock lock(&mu_);
  hooks_.push_back(std::move(hook));
}

bool AgentImpl::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

AgentStats AgentImpl::stats() const {
  AgentStats s;
  {
    absl::MutexLock lock(&mu_);
    s.running_incoming = incoming_;
    s.peer_failures = peer_failures_;
    s.calls_waiting_for_restart = waiting_for_restart_;
  }
  for (const auto& p : peers_) {
    s.pending_outgoing += static_cast<int64_t>(p->pending_calls());
    s.peer_probes_in_flight += p->probing() ? 1 : 0;
  }
  s.executor_threads = executor_ ? executor_->num_threads() : 0;
  s.executor_parallelism = executor_ ? executor_->parallelism() : 0;
  s.timers = timer_ ? timer_->pending() : 0;
  s.live_streams = transport_ ? transport_->live_streams() : 0;
  s.shm_busy_segments = shm_ ? shm_->busy_segments() : 0;
  s.shm_bulk_bytes_copied_out = shm_ ? shm_->bytes_copied_out() : 0;
  s.shm_bulk_bytes_copied_in = shm_ ? shm_->bytes_copied_in() : 0;
  if (window_ != nullptr) {
    const CallWindow::Stats w = window_->stats();
    s.calls_waited_for_window = w.calls_waited;
    s.calls_refused_by_window = w.calls_refused;
  }
  if (gate_ != nullptr) {
    const RequestGate::Stats g = gate_->stats();
    s.requests_refused = g.refused;
    s.requests_queued = g.queued;
  }
  if (shm_transport_ != nullptr) {
    const auto t = shm_transport_->stats();
    s.shm_frames_sent = t.frames_sent;
    s.shm_frames_received = t.frames_received;
  }
  return s;
}

bool AgentImpl::uses_shm_transport(int peer) const {
  return ready_.HasBeenNotified() && peer >= 0 && peer < static_cast<int>(paths_.size()) &&
         paths_[peer]->linked();
}

bool AgentImpl::uses_shm(int peer) const {
  return ready_.HasBeenNotified() && peer >= 0 && peer < static_cast<int>(paths_.size()) &&
         paths_[peer]->bulk();
}

absl::Status AgentImpl::Shutdown(bool graceful) {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::OkStatus();
  }
  if (executor_->InPool()) {
    return absl::FailedPreconditionError(
        "Shutdown() called from a remote function; call it from the main thread");
  }
  absl::Time deadline = absl::Now() + options_.timeouts.shutdown;
  absl::Status first;
  auto note = [&first](const absl::Status& s) {
    if (first.ok() && !s.ok()) first = s;
  };
  if (graceful) {
    // 1. Everyone stops issuing new top-level calls (EnterShutdown may have
    // waited for that already).
    const absl::Status entered = EnterShutdown();
    note(entered);
    if (options_.timeouts.shutdown_wait_for_peers != absl::ZeroDuration()) {
      // The wait for the others had its own bound; the rest has its own.
      deadline = absl::Now() + options_.timeouts.shutdown;
    }
    // A worker died before it reached shutdown: no agreement can follow,
    // so this worker stops as a non-graceful shutdown does.
    if (absl::IsUnavailable(entered)) graceful = false;
  }
  if (graceful) {
    std::vector<ShutdownHook> hooks;
    {
      absl::MutexLock lock(&mu_);
      hooks = hooks_;
    }
    for (auto& h : hooks) {
      if (h.settle) note(h.settle(deadline));
    }
    // M3: a dynamic group's members stop calling this worker before it
    // drains.
    if (options_.dynamic_group) AnnounceLeave(deadline);
    // 2. Drain: our outgoing calls are answered and incoming ones replied.
    {
      absl::MutexLock lock(&mu_);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return outgoing_ == 0 && incoming_ == 0;
      };
      if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
        note(absl::DeadlineExceededError(
            absl::StrCat("shutdown: ", outgoing_, " outgoing and ", incoming_,
                         " incoming call(s) still running at the deadline")));
      }
    }
    // 3. Everyone is drained; nobody will call anyone again. (A dynamic
    // group's members stopped calling this one: nobody waits for the rest.)
    if (!options_.dynamic_group) {
      note(rendezvous_->DrainedBarrier(deadline - absl::Now()));
    }
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

absl::Status AgentImpl::EnterShutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (entered_.has_value()) return *entered_;
    if (!running_) return absl::FailedPreconditionError("the agent was shut down");
  }
  if (executor_->InPool()) {
    return absl::FailedPreconditionError(
        "shutdown called from a remote function; call it from the main thread");
  }
  absl::Status s = AwaitPeersAtShutdown();
  absl::MutexLock lock(&mu_);
  entered_ = s;
  return s;
}

absl::Status AgentImpl::Teardown(bool cancel_streams, absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (torn_down_) return absl::OkStatus();
    torn_down_ = true;
    running_ = false;
  }
  if (!ready_.HasBeenNotified()) ready_.Notify();
  metrics_server_.reset();  // its collectors read what goes below
  state_server_.reset();
  if (trace_ != nullptr) trace_->Flush();
  if (window_ != nullptr) window_->Close();  // callers waiting for room give up
  absl::Status first;
  auto note = [&first](const absl::Status& s) {
    if (first.ok() && !s.ok()) first = s;
  };
  auto left = [deadline] { return std::max(absl::Milliseconds(100), deadline - absl::Now()); };
  if (transport_) note(transport_->CloseStreams(cancel_streams, left()));
  if (shm_transport_) shm_transport_->Close();
  // Calls still pending can no longer be answered; no call is added from
  // now on (Call fails it).
  for (const auto& p : peers_) {
    for (auto& [id, call] : p->CloseCalls()) {
      Finish(std::move(call), id,
             absl::CancelledError("the agent shut down before the reply arrived"),
             /*undelivered=*/false);
    }
  }
  if (transport_) transport_->StopServer(std::min(absl::Seconds(1), left()));
  {
    std::vector<ShutdownHook> hooks;
    {
      absl::MutexLock lock(&mu_);
      hooks.swap(hooks_);
      failure_listeners_.clear();
    }
    for (auto& h : hooks) {
      if (h.release) h.release();
    }
  }
  if (gate_ != nullptr) gate_->Close();
  if (executor_) {
    executor_->Close();
    note(executor_->Join(left()));
  }
  {
    // Completions already under way on transport or timer threads finish
    // before the timer and the window go.
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outgoing_ == 0; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&done), absl::Now() + left())) {
      note(absl::DeadlineExceededError(absl::StrCat(
          "shutdown: ", outgoing_, " call completion(s) still running at the deadline")));
    }
  }
  if (timer_) timer_->Stop();
  if (shm_) shm_->Close();
  if (options_.dynamic_group) ReleaseMembership(left());
  if (store_server_ != nullptr && rendezvous_ != nullptr) {
    // Rank 0 hosts the store: keep it until every worker has left its
    // shutdown barrier (a dynamic group: the group), so nobody loses the
    // store mid-wait.
    rendezvous_->SayLeft(std::min(absl::Seconds(5), left()));
    if (options_.dynamic_group) {
      (void)AwaitMembersGone(left());
    } else {
      rendezvous_->AwaitAllLeft(std::min(absl::Seconds(5), left()));
    }
    store_server_->Shutdown(absl::Milliseconds(200));
    if (!token_file_.empty()) ::unlink(token_file_.c_str());
  } else if (rendezvous_ != nullptr && !ns_.empty() && !options_.dynamic_group) {
    rendezvous_->SayLeft(std::min(absl::Seconds(5), left()));
    // Rank 0 stops its store once every rank has left. Wait (bounded) until
    // it is gone, so that an immediate init in this process cannot reach the
    // old store and register into a finished round.
    if (options_.store == nullptr) {
      rendezvous_->AwaitStoreGone(store_instance_, std::min(absl::Seconds(5), left()));
    }
  }
  return first;
}

}  // namespace internal
}  // namespace baton::rpc
