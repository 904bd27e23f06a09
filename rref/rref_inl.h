// Template implementations for rref/rref.h. Not a public header.
#ifndef BATON_RREF_RREF_INL_H_
#define BATON_RREF_RREF_INL_H_

namespace baton::rref {

template <typename T>
rpc::Future<T> RRef<T>::to_here_async(absl::Duration timeout) const {
  static_assert(internal::HasCodec<T>::value,
                "to_here() copies the value, but this type cannot be sent: a remote object "
                "stays on its owner; call its methods (rpc_sync/rpc_async/remote)");
  if (absl::Status s = Unusable(absl::StrCat("to_here of ", Describe())); !s.ok()) {
    return rpc::MakeErrorFuture<T>(std::move(s));
  }
  rpc::Runtime* agent = service_->runtime();
  if (agent == nullptr) {
    return rpc::MakeErrorFuture<T>(absl::FailedPreconditionError(
        absl::StrCat("to_here of ", Describe(), ": the agent is shut down")));
  }
  if (timeout <= absl::ZeroDuration()) timeout = agent->options().timeouts.rpc;
  if (is_owner()) {
    auto value = service_->context()->OwnedValue(handle_->rref());
    if (!value.ok()) return rpc::MakeErrorFuture<T>(value.status());
    // Never blocks the caller: the copy is made when the value exists, and
    // the agent's timer fails the future at the timeout if it does not.
    rpc::Promise<T> out(agent->executor());
    const std::string what = absl::StrCat("to_here of ", Describe());
    rpc::DeadlineTimer* timer = agent->timer();
    const rpc::DeadlineTimer::Id expiry =
        timer->Schedule(timer->clock().Now() + timeout, [out, what, timeout] {
          out.SetError(absl::DeadlineExceededError(
              absl::StrCat(what, ": value not created after ", DurationText(timeout))));
        });
    value->OnReady([out, what, timer, expiry](const auto& v) {
      timer->Cancel(expiry);
      if (!v.ok()) {
        out.SetError(Annotate(v.status(), what));
      } else {
        out.SetValue(*static_cast<const T*>(v->ptr.get()));
      }
    });
    return out.future();
  }
  auto owner = agent->worker(handle_->owner());
  if (!owner.ok()) return rpc::MakeErrorFuture<T>(owner.status());
  // Its remote() failed: the owner has no value and will get none (a fetch
  // would wait there for a creation that never comes, G3).
  if (rpc::Future<void> c = handle_->created(); c.ready() && !c.status().ok()) {
    return rpc::MakeErrorFuture<T>(
        CreationFailed(c.status(), absl::StrCat("to_here of ", Describe())));
  }
  // G10: an owner that died took the value along.
  if (absl::Status s = handle_->context().CheckOwner(*handle_, owner->name); !s.ok()) {
    return rpc::MakeErrorFuture<T>(Annotate(s, absl::StrCat("to_here of ", Describe())));
  }
  proto::RRefCall h;
  ToProto(handle_->rref(), h.mutable_rref());
  h.set_type(handle_->type());
  rpc::Payload request = WithHeader(h, {});
  if (agent->registry().has_call_hooks()) {
    // No tensors travel, but hooks may tag the fetch (e.g. with the autograd
    // context, so the owner records the value it sends back).
    absl::Status s = agent->registry().RunSendHooks(
        rpc::MessageInfo{agent, /*is_request=*/true, owner->id, kFetchFn}, {}, request.extensions);
    if (!s.ok())
      return rpc::MakeErrorFuture<T>(Annotate(s, absl::StrCat("to_here of ", Describe())));
  }
  rpc::Future<rpc::Payload> raw =
      agent->CallRaw(owner->id, kFetchFn, "", std::move(request), rpc::CallOptions{timeout});
  return agent->template DecodeFuture<T>(std::move(raw), *owner,
                                         absl::StrCat("to_here of ", Describe()));
}

template <typename T>
std::shared_ptr<T> RRef<T>::local_value() const {
  ThrowIfError(Unusable(absl::StrCat("local_value() of ", Describe())));
  if (!is_owner()) {
    rpc::Runtime* a = service_->runtime();
    throw Error(absl::FailedPreconditionError(absl::StrCat(
        "local_value() of ", Describe(), " called on worker ",
        a != nullptr ? a->self().name : std::string("?"), ", which is not its owner")));
  }
  auto value = service_->context()->OwnedValue(handle_->rref());
  if (!value.ok()) throw Error(value.status());
  rpc::Runtime* a = Agent();
  if (!value->WaitFor(a->options().timeouts.rpc)) {
    throw Error(absl::DeadlineExceededError(
        absl::StrCat("local_value() of ", Describe(), ": value not created in time")));
  }
  const auto& v = value->result();
  if (!v.ok()) throw Error(Annotate(v.status(), absl::StrCat("local_value() of ", Describe())));
  return std::static_pointer_cast<T>(v->ptr);
}

template <typename T>
template <typename M, typename... CallArgs>
auto RRef<T>::rpc_async(M method, CallArgs&&... args) const
    -> rpc::Future<typename internal::MethodTraits<M>::Result> {
  using Tr = internal::MethodTraits<M>;
  using R = typename Tr::Result;
  static_assert(std::is_base_of_v<typename Tr::Class, T>, "not a method of this RRef's class");
  if (absl::Status s = Unusable(absl::StrCat("a method call on ", Describe())); !s.ok()) {
    return rpc::MakeErrorFuture<R>(std::move(s));
  }
  auto m = service_->FindMethodByPointer(internal::PointerKey(method));
  if (m == nullptr) {
    return rpc::MakeErrorFuture<R>(
        absl::NotFoundError(absl::StrCat("method of ", internal::Demangle(typeid(T).name()),
                                         " is not registered (RegisterClass(...).Method(...))")));
  }
  rpc::Runtime* agent = service_->runtime();
  if (agent == nullptr) {
    return rpc::MakeErrorFuture<R>(absl::FailedPreconditionError(
        absl::StrCat(m->qualified_name, " on ", Describe(), ": the agent is shut down")));
  }
  if (rpc::Future<void> c = handle_->created(); c.ready() && !c.status().ok()) {
    return rpc::MakeErrorFuture<R>(
        CreationFailed(c.status(), absl::StrCat(m->qualified_name, " on ", Describe())));
  }
  auto owner = agent->worker(handle_->owner());
  if (!owner.ok()) return rpc::MakeErrorFuture<R>(owner.status());
  // If the fork's owner died or restarted, the call fails here, with no message to it (G10).
  if (absl::Status s = handle_->context().CheckOwner(*handle_, owner->name); !s.ok()) {
    return rpc::MakeErrorFuture<R>(
        Annotate(s, absl::StrCat(m->qualified_name, " on ", Describe())));
  }
  typename Tr::Args tuple(std::forward<CallArgs>(args)...);
  auto payload = agent->registry().EncodeForSend(
      tuple, rpc::MessageInfo{agent, /*is_request=*/true, handle_->owner(), m->qualified_name});
  if (!payload.ok()) return rpc::MakeErrorFuture<R>(payload.status());
  proto::RRefCall h;
  ToProto(handle_->rref(), h.mutable_rref());
  h.set_function(m->qualified_name);
  h.set_signature(m->signature);
  rpc::Future<rpc::Payload> raw =
      agent->CallRaw(owner->id, kMethodFn, "", WithHeader(h, *std::move(payload)));
  return agent->template DecodeFuture<R>(std::move(raw), *owner,
                                         absl::StrCat(m->qualified_name, " on ", Describe()));
}

template <typename T>
template <typename M, typename... CallArgs>
auto RRef<T>::remote(M method, CallArgs&&... args) const
    -> RRef<rpc::internal::Stored<typename internal::MethodTraits<M>::Result>> {
  using Tr = internal::MethodTraits<M>;
  using R = rpc::internal::Stored<typename Tr::Result>;
  static_assert(std::is_base_of_v<typename Tr::Class, T>, "not a method of this RRef's class");
  const int owner = handle_->owner();
  if (absl::Status s = Unusable(absl::StrCat("remote() on ", Describe())); !s.ok()) {
    return internal::FailedRRef<R>(owner, std::move(s));
  }
  auto m = service_->FindMethodByPointer(internal::PointerKey(method));
  if (m == nullptr) {
    return internal::FailedRRef<R>(
        owner, absl::NotFoundError(absl::StrCat("remote() on ", Describe(), ": method of ",
                                                internal::Demangle(typeid(T).name()),
                                                " is not registered")));
  }
  const std::string what = absl::StrCat("remote(", m->qualified_name, ") on ", Describe());
  rpc::Runtime* agent = service_->runtime();
  if (agent == nullptr) {
    return internal::FailedRRef<R>(
        owner, absl::FailedPreconditionError(absl::StrCat(what, ": the agent is shut down")));
  }
  auto ctx = service_->context();
  typename Tr::Args tuple(std::forward<CallArgs>(args)...);
  const rpc::CodecContext cc{agent, owner};
  auto payload = rpc::EncodeMessage(tuple, &cc);
  if (!payload.ok()) {
    return internal::FailedRRef<R>(
        owner, Annotate(payload.status(), absl::StrCat(what, ": cannot encode arguments")));
  }
  const std::string type = typeid(R).name();
  if (is_owner()) {
    auto result = ctx->CreateOwned(type);
    rpc::Promise<void> created = result->created_promise();
    rpc::CallContext call;
    call.agent = &agent->handle();
    call.runtime = agent;
    call.registry = &agent->registry();
    call.caller = &agent->self();
    call.function = m->qualified_name;
    service_->RunMethod(call, handle_->rref(), m->qualified_name, m->signature, *std::move(payload),
                        [ctx, rref = result->rref(), created](absl::StatusOr<rpc::AnyValue> v) {
                          absl::Status s = v.status();
                          ctx->SetValue(rref, std::move(v));
                          if (s.ok()) {
                            created.SetValue();
                          } else {
                            created.SetError(s);
                          }
                        });
    return RRef<R>(std::move(result), service_);
  }
  auto result = ctx->CreateUserForRemote(handle_->owner(), type);
  {
    // G10: a dead owner runs no method; the result is never created.
    auto owner = agent->worker(handle_->owner());
    absl::Status s = owner.ok() ? ctx->CheckOwner(*handle_, owner->name) : owner.status();
    if (!s.ok()) {
      ctx->ForgetUncreated(result->fork());  // G8: nothing reached the owner
      result->created_promise().SetError(Annotate(s, what));
      return RRef<R>(std::move(result), service_);
    }
  }
  proto::RRefCall h;
  ToProto(handle_->rref(), h.mutable_rref());
  ToProto(result->rref(), h.mutable_result_rref());
  ToProto(result->fork(), h.mutable_fork());
  h.set_function(m->qualified_name);
  h.set_signature(m->signature);
  h.set_type(type);
  rpc::Future<rpc::Payload> raw =
      agent->CallRaw(handle_->owner(), kRemoteMethodFn, "", WithHeader(h, *std::move(payload)));
  rpc::Promise<void> created = result->created_promise();
  raw.OnReady([created](const absl::StatusOr<rpc::Payload>& r) {
    if (r.ok()) {
      created.SetValue();
    } else {
      created.SetError(r.status());
    }
  });
  return RRef<R>(std::move(result), service_);
}

template <typename C, typename... CallArgs>
RRef<C> remote(rpc::RpcAgent& handle, const rpc::WorkerRef& to, CallArgs&&... args) {
  rpc::Runtime& agent = handle.runtime();
  const std::string class_name = internal::Demangle(typeid(C).name());
  absl::StatusOr<std::shared_ptr<RRefService>> service = RRefService::Of(agent);
  if (!service.ok()) {
    return internal::FailedRRef<C>(
        -1, Annotate(service.status(), absl::StrCat("remote<", class_name, ">()")));
  }
  std::shared_ptr<RRefService> svc = *std::move(service);
  const std::string cls = svc->ClassNameOf(typeid(C).name());
  if (cls.empty()) {
    return internal::FailedRRef<C>(
        -1, absl::NotFoundError(absl::StrCat("remote<", class_name, ">(): class ", class_name,
                                             " is not registered (RegisterClass)")));
  }
  const std::string what = absl::StrCat("remote(", cls, ")");
  absl::StatusOr<rpc::WorkerInfo> worker = agent.worker(to);
  if (!worker.ok()) return internal::FailedRRef<C>(-1, Annotate(worker.status(), what));
  auto tuple = std::make_tuple(std::forward<CallArgs>(args)...);
  auto payload = agent.registry().EncodeForSend(
      tuple, rpc::MessageInfo{&agent, /*is_request=*/true, worker->id, cls});
  if (!payload.ok()) {
    return internal::FailedRRef<C>(
        worker->id, Annotate(payload.status(), absl::StrCat(what, ": cannot encode arguments")));
  }
  const std::string ctor = absl::StrCat(cls, ".__init__");
  // The types actually sent: the owner rejects them with INVALID_ARGUMENT
  // naming both signatures if they differ from the registered constructor.
  const std::string signature = rpc::Function<void(std::decay_t<CallArgs>...)>::cached_signature();
  return RRef<C>(internal::RemoteCreate(agent, *svc, worker->id, ctor, signature, typeid(C).name(),
                                        *std::move(payload), {}),
                 svc);
}

}  // namespace baton::rref

namespace baton::rpc {

// RRefs travel in messages: encoding forks the reference for the
// destination, decoding adopts it (rref/rref_context.h).
template <typename T>
struct Codec<rref::RRef<T>> {
  static std::string Name() {
    return absl::StrCat("RRef<", rref::internal::ValueTypeName<T>(), ">");
  }
  static void Encode(const rref::RRef<T>& r, Encoder& enc) {
    if (!r.valid()) {
      enc.WritePod<uint8_t>(0);
      return;
    }
    const CodecContext* cc = enc.context();
    if (cc == nullptr || cc->runtime == nullptr || cc->peer < 0) {
      enc.Fail(absl::FailedPreconditionError("an RRef can only be sent in an RPC"));
      return;
    }
    if (!r.handle()->attached()) {
      // Its remote() failed before it was sent: there is no value to refer to.
      const absl::Status cause = r.created().status();
      enc.Fail(absl::Status(
          cause.code(),
          absl::StrCat("cannot send an RRef whose remote() failed: ", cause.message())));
      return;
    }
    rref::RRefContext& ctx = r.handle()->context();
    rref::ForkDescriptor d = ctx.Fork(*r.handle(), cc->peer);
    // G8: a fork whose message never reaches its destination is taken back.
    enc.UndoIfUndelivered([weak = std::weak_ptr<rref::RRefContext>(ctx.shared_from_this()), d] {
      if (auto c = weak.lock()) c->Unfork(d);
    });
    enc.WritePod<uint8_t>(1);
    enc.WritePod<int32_t>(d.owner);
    enc.WritePod<int32_t>(d.parent);
    enc.WritePod<int32_t>(d.rref.worker);
    enc.WriteVarint(d.rref.local);
    enc.WritePod<int32_t>(d.fork.worker);
    enc.WriteVarint(d.fork.local);
    enc.WriteString(d.type);
  }
  static absl::Status Decode(Decoder& dec, rref::RRef<T>* out) {
    uint8_t present = 0;
    RETURN_IF_ERROR(dec.ReadPod(&present, "RRef tag"));
    if (present == 0) {
      *out = rref::RRef<T>();
      return absl::OkStatus();
    }
    rref::ForkDescriptor d;
    uint64_t rl = 0, fl = 0;
    for (absl::Status st :
         {dec.ReadPod(&d.owner, "RRef owner"), dec.ReadPod(&d.parent, "RRef parent"),
          dec.ReadPod(&d.rref.worker, "RRef id"), dec.ReadVarint(&rl, "RRef id"),
          dec.ReadPod(&d.fork.worker, "RRef fork"), dec.ReadVarint(&fl, "RRef fork"),
          dec.ReadString(&d.type, "RRef type")}) {
      if (!st.ok()) return st;
    }
    d.rref.local = rl;
    d.fork.local = fl;
    if (d.type != typeid(T).name()) {
      return absl::InvalidArgumentError(
          absl::StrCat("received an RRef of ", rref::internal::Demangle(d.type.c_str()),
                       " where RRef<", rref::internal::ValueTypeName<T>(), "> was expected"));
    }
    const CodecContext* cc = dec.context();
    if (cc == nullptr || cc->runtime == nullptr) {
      return absl::FailedPreconditionError("an RRef can only be received in an RPC");
    }
    ASSIGN_OR_RETURN(auto svc, rref::RRefService::Of(*cc->runtime));
    *out = rref::RRef<T>((svc)->context()->Adopt(d), svc);
    return absl::OkStatus();
  }
};

}  // namespace baton::rpc

#endif  // BATON_RREF_RREF_INL_H_
