// The agent's part of the job's timeline (obs/trace.h, TL1-TL3): a slice per
// call on each side with its flow arrows, and the clock offset to rank 0.

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "obs/trace.h"
#include "rpc/codec.h"
#include "rpc/internal/agent_impl.h"

namespace baton::rpc::internal {
namespace {

// TL3: rank 0 answers with its clock (Unix microseconds), inline.
constexpr char kClockFn[] = "baton.trace.clock";
constexpr int kClockSamples = 8;

std::string FlowId(char kind, int rank, int64_t incarnation, uint64_t id) {
  return absl::StrCat(std::string(1, kind), rank, ".", incarnation, ".", id);
}

}  // namespace

void AgentImpl::OpenTrace() {
  if (options_.observability.trace_dir.empty()) return;
  auto recorder = obs::TraceRecorder::Open(options_.observability.trace_dir);
  if (!recorder.ok()) {
    Log().Warning(absl::StrCat("records no trace: ", recorder.status().message()));
    return;
  }
  trace_ = *std::move(recorder);
  // A registry reused by a later agent has it already.
  (void)registry_->RegisterInternalInline(kClockFn,
                                          [](const CallContext&, Payload, Responder done) {
                                            done(EncodeMessage(absl::ToUnixMicros(absl::Now())));
                                          });
}

absl::Status AgentImpl::StartTrace() {
  if (trace_ == nullptr) return absl::OkStatus();
  trace_->SetIdentity(rank_, options_.name);
  if (rank_ == 0) {
    trace_->SetClock(0, 0, "rank 0's own clock");
    return absl::OkStatus();
  }
  // TL3: the round trip of least time bounds the offset best.
  double best_rtt = -1, best_offset = 0;
  absl::Status last;
  for (int i = 0; i < kClockSamples; ++i) {
    ASSIGN_OR_RETURN(auto args, EncodeMessage(int64_t{0}));
    const absl::Time sent = absl::Now();
    auto reply = CallRaw(0, kClockFn, "", std::move(args), CallOptions{absl::Seconds(5)}).result();
    const absl::Time received = absl::Now();
    if (!reply.ok()) {
      last = reply.status();
      continue;
    }
    int64_t remote_us = 0;
    if (absl::Status s = DecodeMessage(*reply, &remote_us); !s.ok()) {
      last = s;
      continue;
    }
    const double rtt = absl::ToDoubleMicroseconds(received - sent);
    const double midpoint = absl::ToDoubleMicroseconds((sent - absl::UnixEpoch())) + rtt / 2;
    if (best_rtt < 0 || rtt < best_rtt) {
      best_rtt = rtt;
      best_offset = static_cast<double>(remote_us) - midpoint;
    }
  }
  if (best_rtt < 0) {
    trace_->SetClock(0, -1, absl::StrCat("unmeasured (", last.message(), "): this worker's clock"));
  } else {
    trace_->SetClock(best_offset, best_rtt / 2,
                     absl::StrCat("least round trip of ", kClockSamples,
                                  " calls to rank 0 (NTP's method); error at most half of it"));
  }
  return absl::OkStatus();
}

void AgentImpl::TraceOutgoing(uint64_t id, int peer, const std::string& function,
                              absl::Time started, const absl::Status& status) {
  const absl::Time now = absl::Now();
  const std::string to =
      ready_.HasBeenNotified() && peer >= 0 && peer < static_cast<int>(workers_.size())
          ? workers_[peer].name
          : absl::StrCat("rank ", peer);
  trace_->Slice(absl::StrCat(function, " -> ", to), "rpc", started, now,
                {{"peer", to}, {"status", std::string(absl::StatusCodeToString(status.code()))}},
                {FlowId('q', rank_, incarnation_, id), started},
                {FlowId('r', rank_, incarnation_, id), now});
}

void AgentImpl::TraceIncoming(int caller, uint64_t id, const IncomingCall& call,
                              absl::Time replied) {
  const absl::Time now = replied;
  const std::string from =
      ready_.HasBeenNotified() && caller >= 0 && caller < static_cast<int>(workers_.size())
          ? workers_[caller].name
          : absl::StrCat("rank ", caller);
  const obs::TraceRecorder::Flow arrival{FlowId('q', caller, call.caller_incarnation, id),
                                         call.arrived};
  const obs::TraceRecorder::Flow reply{FlowId('r', caller, call.caller_incarnation, id), now};
  const absl::Time start = call.running ? call.started : now;
  if (start - call.arrived > absl::Microseconds(1)) {
    trace_->Slice(absl::StrCat("queued ", call.function), "queue", call.arrived, start,
                  {{"caller", from}}, {}, arrival);
    trace_->Slice(absl::StrCat(call.function, " <- ", from), "serve", start, now,
                  {{"caller", from}}, reply);
  } else {
    trace_->Slice(absl::StrCat(call.function, " <- ", from), "serve", start, now,
                  {{"caller", from}}, reply, arrival);
  }
}

}  // namespace baton::rpc::internal
