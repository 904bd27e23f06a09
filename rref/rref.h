// Remote references: the typed API.
//
//   // Every worker, before RpcAgent::Create:
//   auto rrefs = rref::RRefService::Install(*registry);
//   rref::RegisterClass<ParameterServer>(*rrefs, "ParameterServer")
//       .Constructor<int64_t>()
//       .Method("get_param", &ParameterServer::get_param)
//       .Method("update", &ParameterServer::update);
//   ... agent = RpcAgent::Create(...); rrefs->Attach(agent.get());
//
//   rref::RRef<torch::Tensor> r = rref::remote(*agent, "w1", make_fn, x);  // returns at once
//   torch::Tensor v = r.to_here();                           // copy of the owner's value
//   auto ps = rref::remote<ParameterServer>(*agent, "ps", int64_t{10});
//   torch::Tensor p = ps.rpc_sync(&ParameterServer::get_param, std::string("w"));
//
// Contract:
// - remote() returns at once; the function runs on the owner and its result
//   stays there. created() completes when the owner has the value (or fails
//   with the function's error); to_here() waits for it, bounded by a timeout.
// - RRefs are values in the RPC codec: they travel as arguments and results,
//   inside containers, and as values of other RRefs. Each copy on another
//   worker is a fork counted by the owner (rref/rref_context.h): the owner
//   frees the value exactly when the last reference anywhere is gone.
// - local_value() works on the owner only (FAILED_PRECONDITION elsewhere).
// - Methods of remote objects run on the owner, concurrently when called
//   concurrently: the class must be thread-safe.
// - Errors (docs/api.md, "Errors"): failures name the RRef and its owner; a
//   dead owner makes to_here() and method calls fail with UNAVAILABLE
//   within their timeout. remote(), MakeOwned() and RRef::remote() never
//   throw: a failure found before anything is sent (an unknown worker,
//   class or method, arguments the codec cannot send, no Install) gives an
//   RRef whose created() has failed with it, and every use of that RRef
//   (to_here, its methods, sending it) fails with the same code, as an
//   rpc_async to an unknown worker fails its future. The accessors that
//   return a plain value (to_here(), rpc_sync(), local_value(), owner())
//   throw baton::Error holding that status.
//
// Thread-safety: RRef<T> is a cheap shared handle, safe for concurrent use.
#ifndef BATON_RREF_RREF_H_
#define BATON_RREF_RREF_H_

#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "rpc/agent.h"
#include "rref/rref_context.h"
#include "rref/rref_service.h"

namespace baton::rref {

namespace internal {

template <typename T, typename = void>
struct HasCodec : std::false_type {};
template <typename T>
struct HasCodec<T, std::void_t<decltype(rpc::Codec<T>::Name())>> : std::true_type {};

std::string Demangle(const char* name);

template <typename T>
std::string ValueTypeName() {
  if constexpr (HasCodec<T>::value) {
    return rpc::TypeName<T>();
  } else {
    return Demangle(typeid(T).name());
  }
}

template <typename M>
struct MethodTraits;
template <typename R, typename C, typename... A>
struct MethodTraits<R (C::*)(A...)> {
  using Class = C;
  using Result = R;
  using Args = std::tuple<std::decay_t<A>...>;
  static std::string Signature() {
    std::string s = "(";
    ((s += rpc::TypeName<std::decay_t<A>>() + ","), ...);
    if (sizeof...(A) > 0) s.pop_back();
    return s + ")->" + ValueTypeName<rpc::internal::Stored<R>>();
  }
};
template <typename R, typename C, typename... A>
struct MethodTraits<R (C::*)(A...) const> : MethodTraits<R (C::*)(A...)> {};

template <typename M>
std::string PointerKey(M method) {
  std::string key = typeid(M).name();
  key.push_back('#');
  key.append(reinterpret_cast<const char*>(&method), sizeof(method));
  return key;
}

template <typename R>
rpc::AnyValue MakeValue(std::shared_ptr<R> v) {
  if constexpr (HasCodec<R>::value) {
    return rpc::AnyValue::Of(std::move(v));
  } else {
    return rpc::AnyValue::Opaque(std::move(v));
  }
}

// Starts remote() of `function` (already encoded `args`) on worker `to` and
// returns the caller's reference: the owner's local one when `to` is this
// worker (the function then runs on this agent's executor), else a user
// fork whose created() completes with the remote call.
std::shared_ptr<RefHandle> RemoteCreate(rpc::Runtime& agent, RRefService& svc, int to,
                                        const std::string& function, const std::string& signature,
                                        const std::string& type, rpc::Payload args,
                                        const rpc::CallOptions& opts);

}  // namespace internal

template <typename T>
class RRef {
 public:
  RRef() = default;
  RRef(std::shared_ptr<RefHandle> handle, std::shared_ptr<RRefService> service)
      : handle_(std::move(handle)), service_(std::move(service)) {}

  bool valid() const { return handle_ != nullptr; }
  bool is_owner() const { return handle_->is_owner(); }
  int owner_id() const { return handle_->owner(); }
  std::string id() const { return handle_->rref().ToString(); }
  // The RRef's id and, on a user, its fork's id ({-1, 0} on the owner).
  RRefId rref_id() const { return handle_->rref(); }
  ForkId fork_id() const { return handle_->fork(); }
  // The owner, as the agent knows it. Throws baton::Error if there is none
  // to name: the RRef's remote() failed before it was sent (its error), or
  // the agent shut down.
  rpc::WorkerInfo owner() const {
    ThrowIfError(Unusable("owner()"));
    absl::StatusOr<rpc::WorkerInfo> w = Agent()->worker(handle_->owner());
    if (!w.ok()) throw Error(w.status());
    return *w;
  }
  std::string owner_name() const { return owner().name; }
  // Completes when the owner has created the value, or fails with the
  // creation's error, also one found before anything was sent (an unknown
  // worker, an unregistered class or method, arguments the codec cannot
  // send): remote() reports every failure here and through every use of
  // the RRef, never by throwing.
  rpc::Future<void> created() const { return handle_->created(); }

  // A copy of the owner's value. The future fails with DEADLINE_EXCEEDED if
  // the value is not there within `timeout` (zero: the agent's timeouts.rpc).
  // Never blocks the caller, on the owner either.
  rpc::Future<T> to_here_async(absl::Duration timeout = absl::ZeroDuration()) const;
  T to_here(absl::Duration timeout = absl::ZeroDuration()) const {
    return to_here_async(timeout).value();
  }

  // The value itself, on the owner only. Waits for its creation (bounded by
  // the agent's timeouts.rpc). Throws baton::Error (FAILED_PRECONDITION off
  // the owner, the creation's error if it failed), as to_here() does.
  std::shared_ptr<T> local_value() const;

  // Methods of a remote object (see RegisterClass).
  template <typename M, typename... CallArgs>
  auto rpc_async(M method, CallArgs&&... args) const
      -> rpc::Future<typename internal::MethodTraits<M>::Result>;
  template <typename M, typename... CallArgs>
  auto rpc_sync(M method, CallArgs&&... args) const -> typename internal::MethodTraits<M>::Result {
    return rpc_async(method, std::forward<CallArgs>(args)...).value();
  }
  // Runs the method on the owner and keeps its result there, as a new RRef.
  template <typename M, typename... CallArgs>
  auto remote(M method, CallArgs&&... args) const
      -> RRef<rpc::internal::Stored<typename internal::MethodTraits<M>::Result>>;

  const std::shared_ptr<RefHandle>& handle() const { return handle_; }
  const std::shared_ptr<RRefService>& service() const { return service_; }

 private:
  // Why this RRef cannot be used for `what`: its remote() failed before it
  // was sent (a Failed handle, rref_context.h), or it has no service.
  absl::Status Unusable(absl::string_view what) const {
    if (handle_->attached() && service_ != nullptr) return absl::OkStatus();
    return CreationFailed(handle_->created().status(), what);
  }
  rpc::Runtime* Agent() const {
    rpc::Runtime* a = service_->runtime();
    if (a == nullptr) {
      throw Error(absl::FailedPreconditionError(
          absl::StrCat("RRef ", id(), " used after its agent shut down")));
    }
    return a;
  }
  std::string Describe() const {
    if (!handle_->attached()) return "an RRef that was never sent";
    return absl::StrCat("RRef ", id(), " owned by worker ", handle_->owner());
  }
  // `what` (a use of this RRef) fails: its creation failed with `s`.
  absl::Status CreationFailed(const absl::Status& s, absl::string_view what) const {
    return absl::Status(s.code(),
                        absl::StrCat(what, ": the RRef creation (remote()) failed",
                                     absl::IsDeadlineExceeded(s)
                                         ? " by its timeout; the value may not exist on its owner"
                                         : "",
                                     ": ", s.message()));
  }

  std::shared_ptr<RefHandle> handle_;
  std::shared_ptr<RRefService> service_;
};

namespace internal {

// An RRef whose remote() failed before anything was sent (RefHandle::Failed).
template <typename T>
RRef<T> FailedRRef(int owner, absl::Status cause) {
  return RRef<T>(RefHandle::Failed(owner, typeid(T).name(), std::move(cause)), nullptr);
}

}  // namespace internal

// ---- remote() ----

template <typename R, typename... Args, typename... CallArgs>
RRef<R> remote(rpc::RpcAgent& agent, const rpc::CallOptions& opts, const rpc::WorkerRef& to,
               const rpc::Function<R(Args...)>& fn, CallArgs&&... args) {
  static_assert(!std::is_void_v<R>, "remote() needs a function with a result");
  static_assert(sizeof...(CallArgs) == sizeof...(Args),
                "wrong number of arguments for this Function");
  rpc::Runtime& rt = agent.runtime();
  const std::string what = absl::StrCat("remote(", fn.name(), ")");
  absl::StatusOr<std::shared_ptr<RRefService>> svc = RRefService::Of(rt);
  if (!svc.ok()) return internal::FailedRRef<R>(-1, Annotate(svc.status(), what));
  absl::StatusOr<rpc::WorkerInfo> worker = rt.worker(to);
  if (!worker.ok()) return internal::FailedRRef<R>(-1, Annotate(worker.status(), what));
  typename rpc::Function<R(Args...)>::ArgsTuple tuple(std::forward<CallArgs>(args)...);
  auto payload = rt.registry().EncodeForSend(
      tuple, rpc::MessageInfo{&rt, /*is_request=*/true, worker->id, fn.name()});
  if (!payload.ok()) {
    return internal::FailedRRef<R>(
        worker->id, Annotate(payload.status(), absl::StrCat(what, ": cannot encode arguments")));
  }
  std::shared_ptr<RefHandle> handle = internal::RemoteCreate(
      rt, **svc, worker->id, fn.name(), rpc::Function<R(Args...)>::cached_signature(),
      typeid(R).name(), *std::move(payload), opts);
  return RRef<R>(std::move(handle), *std::move(svc));
}

template <typename R, typename... Args, typename... CallArgs>
RRef<R> remote(rpc::RpcAgent& agent, const rpc::WorkerRef& to, const rpc::Function<R(Args...)>& fn,
               CallArgs&&... args) {
  return remote(agent, rpc::CallOptions{}, to, fn, std::forward<CallArgs>(args)...);
}

// An RRef owned by this worker holding `value` (like torch's RRef(value)):
// e.g. a remote module hands out RRefs to its parameters this way. The value
// is shared, not copied: local_value() returns the same object.
template <typename T>
RRef<T> MakeOwned(rpc::RpcAgent& agent, T value) {
  absl::StatusOr<std::shared_ptr<RRefService>> svc = RRefService::Of(agent.runtime());
  if (!svc.ok()) {
    return internal::FailedRRef<T>(agent.self().id, Annotate(svc.status(), "MakeOwned"));
  }
  auto ctx = (*svc)->context();
  auto handle = ctx->CreateOwned(typeid(T).name());
  ctx->SetValue(handle->rref(), internal::MakeValue(std::make_shared<T>(std::move(value))));
  handle->created_promise().SetValue();
  return RRef<T>(std::move(handle), *std::move(svc));
}

// Creates a remote object of class C (registered with RegisterClass) on `to`.
template <typename C, typename... CallArgs>
RRef<C> remote(rpc::RpcAgent& agent, const rpc::WorkerRef& to, CallArgs&&... args);

// ---- Remote-object classes ----

template <typename C>
class ClassBuilder {
 public:
  ClassBuilder(RRefService& svc, std::string name) : svc_(svc), name_(std::move(name)) {}

  // Registers the constructor used by remote<C>(agent, to, args...).
  template <typename... A>
  ClassBuilder& Constructor() {
    const rpc::Function<void(A...)> fn(ConstructorName());
    std::string signature = rpc::Function<void(A...)>::signature();
    rpc::ValueHandler value = [](const rpc::CallContext& ctx, rpc::Payload args,
                                 rpc::ValueDone done) {
      std::tuple<std::decay_t<A>...> decoded;
      const rpc::CodecContext cc{ctx.runtime, ctx.caller != nullptr ? ctx.caller->id : -1};
      absl::Status s = rpc::DecodeMessage(args, &decoded, &cc);
      if (!s.ok())
        return done(absl::DataLossError(absl::StrCat("undecodable arguments: ", s.message())));
      try {
        auto obj = std::apply([](auto&&... a) { return std::make_shared<C>(std::move(a)...); },
                              std::move(decoded));
        done(rpc::AnyValue::Opaque(std::move(obj)));
      } catch (...) {
        done(rpc::internal::StatusFromCurrentException());
      }
    };
    rpc::RawHandler reply = [name = name_](const rpc::CallContext&, rpc::Payload,
                                           rpc::Responder done) {
      done(absl::FailedPreconditionError(
          absl::StrCat("the constructor of ", name, " is called through remote<", name, ">()")));
    };
    Check(svc_.registry().RegisterRaw(ConstructorName(), signature, reply, value));
    return *this;
  }

  template <typename M>
  ClassBuilder& Method(const std::string& method_name, M method) {
    using Tr = internal::MethodTraits<M>;
    static_assert(std::is_base_of_v<typename Tr::Class, C>, "not a method of this class");
    using R = typename Tr::Result;
    RRefService::Method m;
    m.qualified_name = absl::StrCat(name_, ".", method_name);
    m.signature = Tr::Signature();
    m.invoke = [method](std::shared_ptr<void> object, const rpc::CallContext& ctx,
                        rpc::Payload args, rpc::ValueDone done) {
      typename Tr::Args decoded;
      const rpc::MessageInfo m{ctx.runtime, /*is_request=*/true,
                               ctx.caller != nullptr ? ctx.caller->id : -1, ctx.function};
      absl::Status s;
      if (ctx.registry != nullptr) {
        s = ctx.registry->DecodeReceived(args, &decoded, m);
      } else {
        const rpc::CodecContext cc{ctx.runtime, m.peer};
        s = rpc::DecodeMessage(args, &decoded, &cc);
      }
      if (!s.ok()) {
        return done(s.code() == absl::StatusCode::kDataLoss
                        ? absl::DataLossError(absl::StrCat("undecodable arguments: ", s.message()))
                        : s);
      }
      C* obj = static_cast<C*>(object.get());
      rpc::FunctionRegistry::CallScopes scopes;
      if (ctx.registry != nullptr && ctx.registry->has_call_hooks()) {
        scopes = ctx.registry->EnterCall(ctx);
      }
      try {
        if constexpr (std::is_void_v<R>) {
          std::apply([&](auto&&... a) { (obj->*method)(std::move(a)...); }, std::move(decoded));
          done(internal::MakeValue(std::make_shared<std::monostate>()));
        } else {
          R r = std::apply([&](auto&&... a) { return (obj->*method)(std::move(a)...); },
                           std::move(decoded));
          done(internal::MakeValue(std::make_shared<R>(std::move(r))));
        }
      } catch (...) {
        done(rpc::internal::StatusFromCurrentException());
      }
    };
    Check(svc_.RegisterMethod(internal::PointerKey(method), std::move(m)));
    return *this;
  }

  std::string ConstructorName() const { return absl::StrCat(name_, ".__init__"); }

 private:
  static void Check(const absl::Status& s) {
    if (!s.ok()) throw Error(s);
  }
  RRefService& svc_;
  const std::string name_;
};

// Registers class C under `name` on this worker's service. Every worker
// that creates or calls such objects registers the same class and methods.
template <typename C>
ClassBuilder<C> RegisterClass(RRefService& svc, const std::string& name) {
  svc.SetClassName(typeid(C).name(), name);
  return ClassBuilder<C>(svc, name);
}

}  // namespace baton::rref

#include "rref/rref_inl.h"  // IWYU pragma: export

#endif  // BATON_RREF_RREF_H_
