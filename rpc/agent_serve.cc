// The callee side of the RPC agent (internal::AgentImpl): a request is
// admitted (flow control, docs/flow_control.md), dispatched to its function
// on the executor or inline, and answered with its reply and the reply's
// notes (rpc/function.h); rpc/agent.cc has the caller side and shutdown.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/agent.h"
#include "rpc/internal/agent_impl.h"
#include "rpc/internal/wire.h"

namespace baton::rpc {
namespace {

// `s`, or its first `max` bytes and how long it was.
std::string Clip(absl::string_view s, size_t max) {
  if (s.size() <= max) return std::string(s);
  return absl::StrCat(s.substr(0, max), "... (", s.size(), " bytes)");
}

// How an incoming call is named in metrics, the hang report and the
// timeline: the caller's label (FrameHeader.label), else the function.
std::string ShownName(const proto::FrameHeader& h) {
  return h.label().empty() ? h.function() : Clip(h.label(), 128);
}

// What an incoming request holds: its frame and the shared-memory blobs it
// names (clipped: a hostile size must not count for more than a message).
int64_t RequestBytes(const Frame& frame, int64_t max_message_bytes) {
  int64_t bytes = static_cast<int64_t>(internal::FrameSize(frame));
  for (const auto& blob : frame.header.shm_blobs()) {
    bytes += static_cast<int64_t>(
        std::min<uint64_t>(blob.size(), static_cast<uint64_t>(max_message_bytes)));
  }
  return bytes;
}

}  // namespace

namespace internal {

void AgentImpl::OnRequest(std::shared_ptr<ReplyChannel> channel, Frame frame) {
  DeliveryScope delivering;
  const absl::Time deadline = frame.header.timeout_us() > 0
                                  ? absl::Now() + absl::Microseconds(frame.header.timeout_us())
                                  : absl::InfiniteFuture();
  const uint64_t id = frame.header.id();
  const int caller = frame.header.caller_id();
  const int64_t caller_incarnation = frame.header.caller_incarnation();
  bool other_incarnation, reported_dead;
  {
    absl::MutexLock lock(&mu_);
    ++incoming_;
    const absl::Time now = absl::Now();
    incoming_calls_[{caller, id}] =
        IncomingCall{ShownName(frame.header), now, false, now, caller_incarnation};
  }
  {
    const Peer* p = caller_incarnation > 0 ? PeerAt(caller) : nullptr;
    const Peer::Incarnations known = p != nullptr ? p->incarnations() : Peer::Incarnations{};
    other_incarnation = p != nullptr && caller_incarnation != known.latest;
    reported_dead = p != nullptr && caller_incarnation <= known.dead;
  }
  // P4: an incarnation reported dead (for one cut off past the partition
  // tolerance, its state here was released) never acts for its rank again.
  if (reported_dead && !other_incarnation) {
    Refuse(channel, id, caller,
           absl::UnavailableError(absl::StrCat(
               "worker '", options_.name, "' refuses a request from incarnation ",
               caller_incarnation, " of worker id ", caller,
               ": it was reported dead (cut off or silent past the partition tolerance, or "
               "gone); a worker reported dead must restart to rejoin the job")));
    return;
  }
  // P1, P4: a newer incarnation replaces its predecessor here at once; an
  // older one is a replaced process.
  if (other_incarnation && !NoteIncarnation(caller, caller_incarnation)) {
    Refuse(
        channel, id, caller,
        absl::UnavailableError(absl::StrCat(
            "worker '", options_.name, "' refuses a request from incarnation ", caller_incarnation,
            " of worker id ", caller, ": a newer incarnation of that rank rejoined the job")));
    return;
  }
  if (ready_.HasBeenNotified()) {
    auto entry = registry_->Find(frame.header.function());
    if (entry != nullptr && entry->inline_safe) {
      Dispatch(channel, std::move(frame), deadline, /*admitted=*/-1);
      return;
    }
  }
  // F2/F3: admitted within the caller's limits, queued behind the caller's
  // earlier requests only.
  const int64_t bytes = RequestBytes(frame, options_.transport.max_message_bytes);
  auto task = [this, channel, frame = std::move(frame), deadline, bytes]() mutable {
    Dispatch(channel, std::move(frame), deadline, bytes);
  };
  if (absl::Status s = gate_->Submit(caller, bytes, std::move(task)); !s.ok()) {
    Refuse(channel, id, caller,
           absl::IsUnavailable(s) ? absl::UnavailableError(absl::StrCat("worker '", options_.name,
                                                                        "' is shutting down"))
                                  : Annotate(s, absl::StrCat("worker '", options_.name, "'")));
  }
}

void AgentImpl::Dispatch(const std::shared_ptr<ReplyChannel>& channel, Frame frame,
                         absl::Time deadline, int64_t admitted) {
  const uint64_t id = frame.header.id();
  const int caller = frame.header.caller_id();
  const std::string& fname = frame.header.function();
  // A peer that finished rendezvous first may call before we have.
  if (!ready_.WaitForNotificationWithDeadline(deadline) ||
      workers_.size() != static_cast<size_t>(slots_)) {
    Refuse(
        channel, id, caller,
        absl::UnavailableError(absl::StrCat("worker '", options_.name, "' has not finished init")),
        admitted);
    return;
  }
  if (caller < 0 || caller >= static_cast<int>(workers_.size())) {
    Refuse(channel, id, caller,
           absl::InvalidArgumentError(absl::StrCat("unknown caller id ", caller)), admitted);
    return;
  }
  if (frame.header.shm_blobs_size() > 0) {
    // Only the caller's own segments may be named (PeerPath::ImportBlobs).
    absl::Status s = paths_[caller]->ImportBlobs(frame);
    if (!s.ok()) {
      Refuse(channel, id, caller, Annotate(s, "undecodable request"), admitted);
      return;
    }
  }
  CountTraffic(caller, frame.payload, /*out=*/false);
  if (absl::Now() > deadline) {
    Refuse(channel, id, caller,
           absl::DeadlineExceededError(
               "timed out: RPC ran for more than its timeout: the call's deadline passed before "
               "its function started (it waited in this worker's queue)"),
           admitted);
    return;
  }
  std::shared_ptr<const FunctionRegistry::Entry> entry = registry_->Find(fname);
  if (entry == nullptr) {
    Refuse(channel, id, caller,
           absl::NotFoundError(absl::StrCat("unknown function '", Clip(fname, 256),
                                            "' (not registered on worker '", self().name, "')")),
           admitted);
    return;
  }
  if (!frame.header.signature().empty() && !entry->signature.empty() &&
      frame.header.signature() != entry->signature) {
    Refuse(channel, id, caller,
           absl::InvalidArgumentError(absl::StrCat(
               "argument type mismatch: the caller sends ", frame.header.signature(),
               " but worker '", self().name, "' registered '", fname, "' as ", entry->signature)),
           admitted);
    return;
  }
  CallContext ctx;
  ctx.agent = handle_;
  ctx.runtime = this;
  ctx.registry = registry_.get();
  ctx.caller = &workers_[caller];
  ctx.caller_incarnation = frame.header.caller_incarnation();
  ctx.function = fname;
  ctx.deadline = deadline;
  if (registry_->has_call_hooks()) ctx.extensions = frame.payload.extensions;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = incoming_calls_.find({caller, id}); it != incoming_calls_.end()) {
      it->second.running = true;
      it->second.started = absl::Now();
    }
  }
  obs::RpcMetrics* const metrics =
      metrics_ != nullptr ? metrics_->Rpc(ShownName(frame.header)) : nullptr;
  const absl::Time started = metrics != nullptr ? absl::Now() : absl::InfinitePast();
  std::vector<ReplyNoteScope::Note> unsent;
  {
    ReplyNoteScope notes(caller, id);
    entry->handler(ctx, std::move(frame.payload),
                   [this, channel, id, caller, admitted, metrics, started,
                    reply_shm = frame.header.reply_shm()](absl::StatusOr<Payload> result) {
                     if (metrics != nullptr) {
                       metrics->Record(obs::Side::kCallee, result.status().code(),
                                       absl::Now() - started);
                     }
                     SendReply(channel, id, caller, std::move(result), admitted, reply_shm,
                               /*not_run=*/false, ReplyNoteScope::TakeForReply(caller, id));
                   });
    unsent = notes.TakeUnsent();
  }
  // The reply did not leave during the synchronous part (an asynchronous
  // function): its notes go their own way now.
  for (ReplyNoteScope::Note& n : unsent) {
    if (auto kind = registry_->FindReplyNoteKind(n.kind); kind != nullptr && handle_ != nullptr) {
      kind->unsent(*this, caller, std::move(n.data));
    }
  }
}

void AgentImpl::SendReply(const std::shared_ptr<ReplyChannel>& channel, uint64_t id, int caller,
                          absl::StatusOr<Payload> result, int64_t admitted, bool reply_shm,
                          bool not_run, std::vector<ReplyNoteScope::Note> notes) {
  Frame frame;
  frame.header.set_kind(proto::FrameHeader::RESPONSE);
  frame.header.set_id(id);
  for (ReplyNoteScope::Note& n : notes) {
    proto::ReplyNote* out = frame.header.add_notes();
    out->set_kind(std::move(n.kind));
    out->set_data(std::move(n.data));
  }
  // The reply's outcome, apart from the value (which moves into the frame).
  absl::Status status = result.status();
  if (status.ok()) {
    frame.payload = *std::move(result);
    const int64_t limit =
        ready_.HasBeenNotified() && caller >= 0 && caller < static_cast<int>(peer_limits_.size())
            ? PeerLimit(caller)
            : options_.transport.max_message_bytes;
    const size_t size = internal::FrameSize(frame);
    if (static_cast<int64_t>(size) > limit) {
      frame.payload.Undeliverable();  // RRef G8
      frame.payload = Payload();
      status = absl::ResourceExhaustedError(absl::StrCat(
          "reply of ", size, " bytes exceeds the message size limit of ", limit, " bytes"));
    }
  }
  if (status.ok()) CountTraffic(caller, frame.payload, /*out=*/true);
  if (!status.ok()) {
    frame.header.set_not_run(not_run);
    frame.header.set_status_code(static_cast<int>(status.code()));
    // An error names what was wrong, not a copy of a huge input: a reply
    // must never outgrow the caller's limit (it would end the whole stream).
    frame.header.set_error_message(Clip(status.message(), 16 << 10));
  } else if (reply_shm && ready_.HasBeenNotified() && caller >= 0 &&
             caller < static_cast<int>(paths_.size()) && paths_[caller]->bulk()) {
    // Both ends opened each other's probe: the caller said so for its side
    // (a rejoined caller opened none, and would refuse our segments).
    // The caller releases the segment on receipt; the expiry only covers a
    // caller that died or gave up first.
    paths_[caller]->ExportBlobs(frame, absl::Now() + options_.timeouts.rpc + absl::Seconds(5));
  }
  // The gate lets go first: once the reply is out, the caller's window has
  // room again and its next request must find room here too.
  if (admitted >= 0) gate_->Finish(caller, admitted);
  std::vector<std::function<void()>> undo;
  undo.swap(frame.payload.undo_if_undelivered);
  // The timeline's end of the call: before the reply leaves (the caller may
  // complete before Send returns).
  const absl::Time replied = trace_ != nullptr ? absl::Now() : absl::InfinitePast();
  if (!channel->Send(std::move(frame))) {
    for (auto& f : undo) f();  // RRef G8: the caller is gone
  }
  FinishIncoming(caller, id, replied);
}

void AgentImpl::FinishIncoming(int caller, uint64_t id, absl::Time replied) {
  calls_done_in_.fetch_add(1, std::memory_order_relaxed);
  std::optional<IncomingCall> done;
  {
    absl::MutexLock lock(&mu_);
    auto it = incoming_calls_.find({caller, id});
    if (it != incoming_calls_.end()) {
      if (trace_ != nullptr) done = std::move(it->second);
      incoming_calls_.erase(it);
    }
    --incoming_;
  }
  if (done.has_value()) TraceIncoming(caller, id, *done, replied);
}

}  // namespace internal
}  // namespace baton::rpc
