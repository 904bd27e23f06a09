#include "rref/rref_service.h"

#include <cxxabi.h>

#include <atomic>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "obs/state.h"
#include "rref/rref.h"

namespace baton::rref {
namespace {

rpc::Future<void> ToVoid(rpc::Future<rpc::Payload> raw) {
  rpc::Promise<void> p;
  raw.OnReady([p](const absl::StatusOr<rpc::Payload>& r) {
    if (r.ok()) {
      p.SetValue();
    } else {
      p.SetError(r.status());
    }
  });
  return p.future();
}

// Waits for an owned value on behalf of an incoming call (a fetch or a
// method): `on_value` runs when the value is ready, or `on_deadline` at the
// call's deadline if it is not ready by then; exactly one of them runs. A
// call parked on an id that is not created yet stops waiting at its
// deadline and takes its early entry with it (G3), so an unknown id neither
// holds the call nor leaves anything behind.
void AwaitOwnedValue(const std::shared_ptr<RRefContext>& rctx, RRefId rref,
                     const rpc::CallContext& ctx,
                     absl::AnyInvocable<void(const absl::StatusOr<rpc::AnyValue>&)> on_value,
                     absl::AnyInvocable<void(absl::Status)> on_error) {
  bool waits_early = false;
  auto value = rctx->OwnedValue(rref, &waits_early);
  if (!value.ok()) return on_error(value.status());
  rpc::DeadlineTimer* timer = ctx.runtime != nullptr ? ctx.runtime->timer() : nullptr;
  if (value->ready() || timer == nullptr || ctx.deadline == absl::InfiniteFuture()) {
    value->OnReady(std::move(on_value));
    return;
  }
  struct Race {
    std::atomic<bool> decided{false};
    absl::AnyInvocable<void(const absl::StatusOr<rpc::AnyValue>&)> on_value;
    absl::AnyInvocable<void(absl::Status)> on_error;
  };
  auto race = std::make_shared<Race>();
  race->on_value = std::move(on_value);
  race->on_error = std::move(on_error);
  const std::string function(ctx.function);
  const int self = rctx->self();
  std::weak_ptr<RRefContext> weak = rctx;
  // ctx.deadline is real time; the timer's deadlines are times of its clock.
  timer->Schedule(
      timer->FromRealTime(ctx.deadline), [race, weak, rref, waits_early, function, self] {
        if (race->decided.exchange(true)) return;
        if (auto c = weak.lock(); c != nullptr && waits_early) c->StopWaitingEarly(rref);
        race->on_error(absl::DeadlineExceededError(absl::StrCat(
            function, " on RRef ", rref.ToString(), ": worker ", self,
            waits_early ? " has not created the RRef's value (the remote() that creates it has "
                          "not arrived, or the id is unknown)"
                        : " has not finished creating the RRef's value",
            " by the call's deadline")));
      });
  // The timer's entry is not cancelled when the value comes first: it only
  // holds `race` until the deadline and then does nothing.
  value->OnReady([race](const absl::StatusOr<rpc::AnyValue>& v) {
    if (race->decided.exchange(true)) return;
    race->on_value(v);
  });
}

}  // namespace

void ToProto(const GlobalId& id, proto::GlobalIdProto* out) {
  out->set_worker(id.worker);
  out->set_local(id.local);
}

GlobalId FromProto(const proto::GlobalIdProto& p) { return GlobalId{p.worker(), p.local()}; }

rpc::Payload WithHeader(const proto::RRefCall& header, rpc::Payload args) {
  rpc::Encoder enc;
  enc.WriteString(header.SerializeAsString());
  rpc::Payload out = *std::move(enc).Finish();
  out.bytes += args.bytes;
  out.blobs = std::move(args.blobs);
  out.extensions = std::move(args.extensions);
  out.undo_if_undelivered = std::move(args.undo_if_undelivered);
  return out;
}

absl::Status TakeHeader(rpc::Payload& payload, proto::RRefCall* header) {
  rpc::Decoder dec(payload);
  std::string head;
  RETURN_IF_ERROR(dec.ReadString(&head, "RRef call header"));
  if (!header->ParseFromString(head)) return absl::DataLossError("malformed RRef call header");
  payload.bytes.erase(0, payload.bytes.size() - dec.remaining());
  return absl::OkStatus();
}

std::shared_ptr<RRefService> RRefService::Install(rpc::FunctionRegistry& registry,
                                                  SenderWrapper wrapper) {
  std::shared_ptr<RRefService> svc(new RRefService(&registry));
  svc->wrapper_ = std::move(wrapper);
  svc->RegisterHandlers();
  registry.SetExtension(svc);
  std::weak_ptr<RRefService> weak = svc;
  registry.AddMetricsCollector([weak](obs::MetricsWriter& w) {
    auto self = weak.lock();
    if (self == nullptr) return;
    auto ctx = self->context();  // null until the first RRef: none yet
    const RRefDebugState st = ctx != nullptr ? ctx->DebugState() : RRefDebugState{};
    size_t forks = 0, pending = 0;
    for (const auto& o : st.owned) forks += o.forks.size();
    for (const auto& h : st.held) pending += h.pending_children.size();
    w.Gauge("baton_rref_owned", "RRefs this worker owns.", static_cast<double>(st.owned.size()));
    w.Gauge("baton_rref_owned_forks", "Forks of the owned RRefs held elsewhere.",
            static_cast<double>(forks));
    w.Gauge("baton_rref_held", "RRefs this worker holds, owned elsewhere.",
            static_cast<double>(st.held.size()));
    w.Gauge("baton_rref_forks_unconfirmed",
            "Forks this worker made of held RRefs that their owner has not confirmed yet.",
            static_cast<double>(pending));
    w.Gauge("baton_rref_messages_unanswered", "RRef protocol messages awaiting their answer.",
            static_cast<double>(st.unanswered_messages));
  });
  // The hang report: the tables in numbers, and every fork still waiting for
  // its owner's confirmation as a wait on that owner.
  registry.AddStateCollector([weak](obs::StateWriter& w) {
    auto self = weak.lock();
    if (self == nullptr) return;
    auto ctx = self->context();
    const RRefDebugState st = ctx != nullptr ? ctx->DebugState() : RRefDebugState{};
    size_t forks = 0;
    for (const auto& o : st.owned) forks += o.forks.size();
    auto section = w.AddSection("rref");
    section.Field("owned", static_cast<int64_t>(st.owned.size()))
        .Field("owned_forks", static_cast<int64_t>(forks))
        .Field("held", static_cast<int64_t>(st.held.size()))
        .Field("forks_unconfirmed", static_cast<int64_t>(st.unconfirmed.size()))
        .Field("early_entries", static_cast<int64_t>(st.early_entries))
        .Field("messages_unanswered", st.unanswered_messages);
    // One wait per owner (a job may hold thousands of forks): how many, and
    // the oldest.
    struct PerOwner {
      size_t count = 0;
      const RRefDebugState::Unconfirmed* oldest = nullptr;
    };
    std::map<int, PerOwner> by_owner;
    constexpr size_t kMaxListed = 32;
    for (size_t i = 0; i < st.unconfirmed.size(); ++i) {
      const auto& u = st.unconfirmed[i];
      if (i < kMaxListed) {
        section.Line(absl::StrCat("fork ", u.child.ToString(), " of RRef ", u.rref.ToString(),
                                  " sent to worker ", u.dest, ", unconfirmed by owner ", u.owner,
                                  " for ", absl::FormatDuration(w.now() - u.since)));
      }
      PerOwner& p = by_owner[u.owner];
      ++p.count;
      if (p.oldest == nullptr || u.since < p.oldest->since) p.oldest = &u;
    }
    for (const auto& [owner, p] : by_owner) {
      if (owner < 0) continue;
      w.AddWait(owner, "rref",
                absl::StrCat("confirmation of ", p.count, " fork(s), the oldest ",
                             p.oldest->child.ToString(), " of RRef ", p.oldest->rref.ToString(),
                             " (sent to worker ", p.oldest->dest, ")"),
                p.oldest->since);
    }
  });
  return svc;
}

absl::StatusOr<std::shared_ptr<RRefService>> RRefService::Of(rpc::Runtime& agent) {
  auto svc = agent.registry().GetExtension<RRefService>();
  if (svc == nullptr) {
    return absl::FailedPreconditionError(
        "RRefs are not enabled on this agent: call rref::RRefService::Install(registry) "
        "before RpcAgent::Create");
  }
  svc->EnsureAttached(&agent);
  return svc;
}

void RRefService::Attach(rpc::Runtime* runtime) { EnsureAttached(runtime); }

std::shared_ptr<RRefContext> RRefService::EnsureAttached(rpc::Runtime* agent) {
  {
    absl::MutexLock lock(&mu_);
    if (context_ != nullptr) return context_;
    agent_ = agent;
    if (wrapper_) wrapped_sender_ = wrapper_(this);
    ControlSender* sender = wrapped_sender_ != nullptr ? wrapped_sender_.get() : this;
    std::weak_ptr<RRefService> weak = weak_from_this();
    context_ = std::make_shared<RRefContext>(
        agent->self().id, sender, agent->incarnation(), [weak](int worker) -> int64_t {
          auto self = weak.lock();
          rpc::Runtime* a = self != nullptr ? self->runtime() : nullptr;
          return a != nullptr ? a->peer_incarnation(worker) : 0;
        });
  }
  std::weak_ptr<RRefService> weak = shared_from_this();
  // G7: what a dead incarnation held is let go.
  agent->AddPeerFailureListener([weak](const rpc::PeerFailure& f) {
    if (auto self = weak.lock()) {
      if (auto ctx = self->context()) ctx->OnPeerFailure(f.peer, f.incarnation);
    }
  });
  rpc::Runtime::ShutdownHook hook;
  hook.settle = [weak](absl::Time deadline) {
    auto self = weak.lock();
    if (self == nullptr) return absl::OkStatus();
    return self->context()->Settle(deadline);
  };
  hook.release = [weak] {
    auto self = weak.lock();
    if (self == nullptr) return;
    std::shared_ptr<RRefContext> ctx;
    {
      absl::MutexLock lock(&self->mu_);
      self->agent_ = nullptr;
      ctx = self->context_;
    }
    ctx->Clear();
  };
  agent->AddShutdownHook(std::move(hook));
  absl::MutexLock lock(&mu_);
  return context_;
}

rpc::Runtime* RRefService::runtime() const {
  absl::MutexLock lock(&mu_);
  return agent_;
}

std::shared_ptr<RRefContext> RRefService::context() const {
  absl::MutexLock lock(&mu_);
  return context_;
}

rpc::Future<void> RRefService::SendControl(int to, const proto::RRefControl& msg) {
  rpc::Runtime* a = runtime();
  if (a == nullptr) {
    return rpc::MakeErrorFuture<void>(
        absl::FailedPreconditionError("RRef message after the agent shut down"));
  }
  rpc::Payload p;
  p.bytes = msg.SerializeAsString();
  return ToVoid(a->CallRaw(to, kControlFn, "", std::move(p)));
}

namespace {
proto::RRefControl ControlMessage(proto::RRefControl::Kind kind, RRefId rref, ForkId fork) {
  proto::RRefControl m;
  m.set_kind(kind);
  ToProto(rref, m.mutable_rref());
  ToProto(fork, m.mutable_fork());
  return m;
}
}  // namespace

rpc::Future<void> RRefService::ForkRequest(int owner, RRefId rref, ForkId fork, int parent) {
  proto::RRefControl m = ControlMessage(proto::RRefControl::FORK_REQUEST, rref, fork);
  m.set_parent(parent);
  return SendControl(owner, m);
}

rpc::Future<void> RRefService::ChildAccept(int parent, RRefId rref, ForkId fork) {
  return SendControl(parent, ControlMessage(proto::RRefControl::CHILD_ACCEPT, rref, fork));
}

bool RRefService::ChildAcceptOnReply(int parent, RRefId rref, ForkId fork) {
  return rpc::AttachToReply(
      parent, kAcceptNote,
      ControlMessage(proto::RRefControl::CHILD_ACCEPT, rref, fork).SerializeAsString());
}

rpc::Future<void> RRefService::UserDelete(int owner, RRefId rref, ForkId fork) {
  return SendControl(owner, ControlMessage(proto::RRefControl::USER_DELETE, rref, fork));
}

absl::Status RRefService::RegisterMethod(const std::string& pointer_key, Method method) {
  auto m = std::make_shared<const Method>(std::move(method));
  absl::MutexLock lock(&mu_);
  if (!methods_.emplace(m->qualified_name, m).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("method '", m->qualified_name, "' is already registered"));
  }
  by_pointer_[pointer_key] = m;
  return absl::OkStatus();
}

void RRefService::SetClassName(const std::string& type, const std::string& name) {
  absl::MutexLock lock(&mu_);
  class_names_[type] = name;
}

std::string RRefService::ClassNameOf(const std::string& type) const {
  absl::MutexLock lock(&mu_);
  auto it = class_names_.find(type);
  return it == class_names_.end() ? std::string() : it->second;
}

std::shared_ptr<const RRefService::Method> RRefService::FindMethod(
    const std::string& qualified_name) const {
  absl::MutexLock lock(&mu_);
  auto it = methods_.find(qualified_name);
  return it == methods_.end() ? nullptr : it->second;
}

std::shared_ptr<const RRefService::Method> RRefService::FindMethodByPointer(
    const std::string& pointer_key) const {
  absl::MutexLock lock(&mu_);
  auto it = by_pointer_.find(pointer_key);
  return it == by_pointer_.end() ? nullptr : it->second;
}

RRefDebugState RRefService::DebugState() const {
  auto ctx = context();
  return ctx == nullptr ? RRefDebugState() : ctx->DebugState();
}

absl::Status RRefService::WaitUntilEmpty(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    RRefDebugState s = DebugState();
    if (s.empty()) return absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("RRef tables not empty after ", DurationText(timeout), ": ", s.ToString()));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

void RRefService::RunForValue(const rpc::CallContext& ctx, const std::string& function,
                              const std::string& signature, RRefId rref, rpc::Payload args,
                              absl::AnyInvocable<void(absl::Status)> done) {
  std::shared_ptr<RRefContext> rctx = context();
  auto entry = registry_->Find(function);
  absl::Status error;
  if (entry == nullptr || !entry->value_handler) {
    error = absl::NotFoundError(absl::StrCat("unknown function '", function, "' for remote()"));
  } else if (!signature.empty() && signature != entry->signature) {
    error = absl::InvalidArgumentError(absl::StrCat("argument type mismatch: the caller sends ",
                                                    signature, " but '", function,
                                                    "' is registered as ", entry->signature));
  }
  if (!error.ok()) {
    rctx->SetValue(rref, error);
    done(error);
    return;
  }
  auto shared_done = std::make_shared<absl::AnyInvocable<void(absl::Status)>>(std::move(done));
  entry->value_handler(ctx, std::move(args),
                       [rctx, rref, shared_done](absl::StatusOr<rpc::AnyValue> v) {
                         absl::Status s = v.status();
                         rctx->SetValue(rref, std::move(v));
                         (*shared_done)(s);
                       });
}

void RRefService::RunMethod(const rpc::CallContext& ctx, RRefId target,
                            const std::string& qualified, const std::string& signature,
                            rpc::Payload args, rpc::ValueDone done) {
  std::shared_ptr<RRefContext> rctx = context();
  auto method = FindMethod(qualified);
  if (method == nullptr) {
    return done(absl::NotFoundError(absl::StrCat(
        "unknown method '", qualified, "' (register the class's methods on every worker)")));
  }
  if (!signature.empty() && signature != method->signature) {
    return done(absl::InvalidArgumentError(absl::StrCat("argument type mismatch: the caller sends ",
                                                        signature, " but '", qualified,
                                                        "' is registered as ", method->signature)));
  }
  // The object may still be under construction: continue when it is ready,
  // on the executor, with a context that outlives this call; or fail at the
  // call's deadline.
  struct Pending {
    rpc::CallContext ctx;
    std::string function;
    rpc::Payload args;
    rpc::ValueDone done;
  };
  auto pending = std::make_shared<Pending>();
  pending->ctx = ctx;
  pending->function = qualified;
  pending->ctx.function = pending->function;
  pending->args = std::move(args);
  pending->done = std::move(done);
  rpc::Executor* ex = ctx.runtime != nullptr ? ctx.runtime->executor() : nullptr;
  AwaitOwnedValue(
      rctx, target, ctx,
      [method, pending, ex](const absl::StatusOr<rpc::AnyValue>& v) {
        if (!v.ok()) {
          return pending->done(Annotate(v.status(), "the remote object failed to construct"));
        }
        std::shared_ptr<void> object = v->ptr;
        auto run = [method, pending, object]() mutable {
          method->invoke(object, pending->ctx, std::move(pending->args), std::move(pending->done));
        };
        if (ex == nullptr || !ex->Submit(run)) run();
      },
      [pending](absl::Status s) { pending->done(std::move(s)); });
}

namespace {

// Encodes an RRef's value (or a method's result) for the caller, running the
// registry's send hooks on the tensors it carries.
absl::StatusOr<rpc::Payload> EncodeValueForReply(const rpc::AnyValue& v,
                                                 const rpc::CallContext& ctx) {
  std::vector<at::Tensor> tensors;
  const bool hooks = ctx.registry != nullptr && ctx.registry->has_call_hooks();
  rpc::CodecContext cc{ctx.runtime, ctx.caller != nullptr ? ctx.caller->id : -1,
                       hooks ? &tensors : nullptr, nullptr};
  cc.answers = true;
  absl::StatusOr<rpc::Payload> p = v.encode(v.ptr.get(), cc);
  if (!p.ok() || !hooks) return p;
  rpc::MessageInfo m{ctx.runtime, /*is_request=*/false, cc.peer, ctx.function};
  m.request_extensions = &ctx.extensions;
  absl::Status s = ctx.registry->RunSendHooks(m, tensors, p->extensions);
  if (!s.ok()) {
    p->Undeliverable();  // the reply is not sent: take back the forks its encoding made (G8)
    return s;
  }
  return p;
}

// The common part of the RRef call handlers: find the service and parse the
// call header, then run `body`.
template <typename SelfOf, typename Body>
rpc::RawHandler WithCall(SelfOf self_of, Body body) {
  return [self_of, body](const rpc::CallContext& ctx, rpc::Payload args, rpc::Responder done) {
    auto self = self_of();
    proto::RRefCall h;
    if (self == nullptr) return done(absl::UnavailableError("RRef service is gone"));
    if (absl::Status s = TakeHeader(args, &h); !s.ok()) return done(s);
    body(self.get(), h, ctx, std::move(args), std::move(done));
  };
}

}  // namespace

void RRefService::RegisterHandlers() {
  std::weak_ptr<RRefService> weak = weak_from_this();
  auto self_of = [weak]() { return weak.lock(); };

  (void)registry_->RegisterInternalInline(
      kControlFn, [self_of](const rpc::CallContext& ctx, rpc::Payload args, rpc::Responder done) {
        auto self = self_of();
        proto::RRefControl m;
        if (self == nullptr || !m.ParseFromString(args.bytes)) {
          return done(absl::DataLossError("malformed RRef control message"));
        }
        auto rctx = self->EnsureAttached(ctx.runtime);
        const RRefId rref = FromProto(m.rref());
        const ForkId fork = FromProto(m.fork());
        switch (m.kind()) {
          case proto::RRefControl::FORK_REQUEST:
            rctx->OnForkRequest(
                rref, fork, m.parent(),
                Holder{ctx.caller != nullptr ? ctx.caller->id : -1, ctx.caller_incarnation});
            break;
          case proto::RRefControl::CHILD_ACCEPT: rctx->OnChildAccept(rref, fork); break;
          case proto::RRefControl::USER_DELETE: rctx->OnUserDelete(rref, fork); break;
          default: return done(absl::DataLossError("unknown RRef control message"));
        }
        done(rpc::Payload());
      });

  // G11: ChildAccepts that travel on replies.
  rpc::ReplyNoteKind accept;
  accept.on_arrival = [self_of](rpc::Runtime& agent, int /*from*/, absl::string_view data) {
    auto self = self_of();
    proto::RRefControl m;
    if (self == nullptr || !m.ParseFromArray(data.data(), static_cast<int>(data.size())) ||
        m.kind() != proto::RRefControl::CHILD_ACCEPT) {
      return;  // a malformed note confirms nothing; the child stays pending
    }
    self->EnsureAttached(&agent)->OnChildAccept(FromProto(m.rref()), FromProto(m.fork()));
  };
  accept.unsent = [self_of](rpc::Runtime& agent, int to, std::string data) {
    auto self = self_of();
    proto::RRefControl m;
    if (self == nullptr || !m.ParseFromString(data)) return;
    self->EnsureAttached(&agent)->SendChildAccept(to, FromProto(m.rref()), FromProto(m.fork()));
  };
  (void)registry_->AddReplyNoteKind(kAcceptNote, std::move(accept));

  (void)registry_->RegisterRaw(
      kRemoteFn, "",
      WithCall(self_of, [](RRefService* self, const proto::RRefCall& h, const rpc::CallContext& ctx,
                           rpc::Payload args, rpc::Responder done) {
        auto rctx = self->EnsureAttached(ctx.runtime);
        const RRefId rref = FromProto(h.rref());
        rctx->OnRemoteCreate(rref, FromProto(h.fork()), h.type(),
                             Holder{ctx.caller->id, ctx.caller_incarnation});
        auto shared = std::make_shared<rpc::Responder>(std::move(done));
        self->RunForValue(ctx, h.function(), h.signature(), rref, std::move(args),
                          [shared](absl::Status s) {
                            if (s.ok()) {
                              (*shared)(rpc::Payload());
                            } else {
                              (*shared)(s);
                            }
                          });
      }));

  (void)registry_->RegisterRaw(
      kFetchFn, "",
      WithCall(self_of, [](RRefService* self, const proto::RRefCall& h, const rpc::CallContext& ctx,
                           rpc::Payload /*args*/, rpc::Responder done) {
        auto rctx = self->EnsureAttached(ctx.runtime);
        auto shared = std::make_shared<rpc::Responder>(std::move(done));
        rpc::CallContext reply_ctx = ctx;
        reply_ctx.function = kFetchFn;
        AwaitOwnedValue(
            rctx, FromProto(h.rref()), ctx,
            [shared, reply_ctx, type = h.type()](const absl::StatusOr<rpc::AnyValue>& v) {
              if (!v.ok()) return (*shared)(v.status());
              if (!type.empty() && type != v->type) {
                return (*shared)(absl::InvalidArgumentError(
                    "the RRef's value has a different type than the caller expects"));
              }
              if (!v->encode) {
                return (*shared)(absl::FailedPreconditionError(
                    "the RRef holds a remote object, which stays on its owner: call its methods "
                    "instead of to_here()"));
              }
              (*shared)(EncodeValueForReply(*v, reply_ctx));
            },
            [shared](absl::Status s) { (*shared)(std::move(s)); });
      }));

  (void)registry_->RegisterRaw(
      kMethodFn, "",
      WithCall(self_of, [](RRefService* self, const proto::RRefCall& h, const rpc::CallContext& ctx,
                           rpc::Payload args, rpc::Responder done) {
        self->EnsureAttached(ctx.runtime);
        auto shared = std::make_shared<rpc::Responder>(std::move(done));
        rpc::CallContext reply_ctx = ctx;
        reply_ctx.function = kMethodFn;
        self->RunMethod(ctx, FromProto(h.rref()), h.function(), h.signature(), std::move(args),
                        [shared, reply_ctx](absl::StatusOr<rpc::AnyValue> v) {
                          if (!v.ok()) return (*shared)(v.status());
                          if (!v->encode) {
                            return (*shared)(absl::FailedPreconditionError(
                                "the method's result cannot be sent; use rref.remote(...)"));
                          }
                          (*shared)(EncodeValueForReply(*v, reply_ctx));
                        });
      }));

  (void)registry_->RegisterRaw(
      kRemoteMethodFn, "",
      WithCall(self_of, [](RRefService* self, const proto::RRefCall& h, const rpc::CallContext& ctx,
                           rpc::Payload args, rpc::Responder done) {
        auto rctx = self->EnsureAttached(ctx.runtime);
        const RRefId result = FromProto(h.result_rref());
        rctx->OnRemoteCreate(result, FromProto(h.fork()), h.type(),
                             Holder{ctx.caller->id, ctx.caller_incarnation});
        auto shared = std::make_shared<rpc::Responder>(std::move(done));
        self->RunMethod(ctx, FromProto(h.rref()), h.function(), h.signature(), std::move(args),
                        [shared, rctx, result](absl::StatusOr<rpc::AnyValue> v) {
                          absl::Status s = v.status();
                          rctx->SetValue(result, std::move(v));
                          if (s.ok()) {
                            (*shared)(rpc::Payload());
                          } else {
                            (*shared)(s);
                          }
                        });
      }));
}

namespace internal {

std::shared_ptr<RefHandle> RemoteCreate(rpc::Runtime& agent, RRefService& svc, int to,
                                        const std::string& function, const std::string& signature,
                                        const std::string& type, rpc::Payload args,
                                        const rpc::CallOptions& opts) {
  auto ctx = svc.context();
  auto settle = [](rpc::Promise<void> created, const std::string& what) {
    return [created, what](absl::Status s) {
      if (s.ok()) {
        created.SetValue();
      } else {
        created.SetError(Annotate(s, what));
      }
    };
  };
  const std::string what = absl::StrCat("remote(", function, ")");
  if (to == agent.self().id) {
    auto handle = ctx->CreateOwned(type);
    rpc::CallContext call;
    call.agent = &agent.handle();
    call.runtime = &agent;
    call.registry = &agent.registry();
    call.caller = &agent.self();
    auto task = [svc = svc.shared_from_this(), call, function, signature, rref = handle->rref(),
                 done = settle(handle->created_promise(), what), p = std::move(args)]() mutable {
      call.function = function;
      svc->RunForValue(call, function, signature, rref, std::move(p), std::move(done));
    };
    if (!agent.executor()->Submit(std::move(task))) {
      // The value will never exist: its entry and created() say why.
      const absl::Status shut =
          absl::FailedPreconditionError(absl::StrCat(what, ": the agent is shut down"));
      ctx->SetValue(handle->rref(), shut);
      handle->created_promise().SetError(shut);
    }
    return handle;
  }
  auto handle = ctx->CreateUserForRemote(to, type);
  proto::RRefCall h;
  ToProto(handle->rref(), h.mutable_rref());
  ToProto(handle->fork(), h.mutable_fork());
  h.set_function(function);
  h.set_signature(signature);
  h.set_type(type);
  rpc::Payload request = WithHeader(h, std::move(args));
  // G8: a creation the owner never received is not counted there.
  request.undo_if_undelivered.push_back(
      [weak = std::weak_ptr<RRefContext>(ctx), fork = handle->fork()] {
        if (auto c = weak.lock()) c->ForgetUncreated(fork);
      });
  rpc::Future<rpc::Payload> raw = agent.CallRaw(to, kRemoteFn, "", std::move(request), opts);
  raw.OnReady([done = settle(handle->created_promise(), what)](
                  const absl::StatusOr<rpc::Payload>& r) mutable { done(r.status()); });
  return handle;
}

std::string Demangle(const char* name) {
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = (status == 0 && out != nullptr) ? out : name;
  std::free(out);
  return s;
}
}  // namespace internal

}  // namespace baton::rref
