// Remote functions: typed handles, the registry, and the typed dispatch
// that turns a Payload into a call of user code and back.
//
// Usage:
//   const Function<torch::Tensor(torch::Tensor, torch::Tensor)> add_fn("add");
//   registry.Register(add_fn, [](torch::Tensor a, torch::Tensor b) { return a + b; });
//   torch::Tensor c = agent.rpc_sync("w1", add_fn, a, b);   // type-checked
//
// Contract:
// - A Function handle names the function and fixes its wire type; callers and
//   callees share the handle (typically a constant in a common header). The
//   callee rejects a call whose signature differs from the registered one
//   with INVALID_ARGUMENT naming both.
// - An implementation may take `const CallContext&` first (caller, deadline,
//   and the agent, for nested calls). It may return R, absl::StatusOr<R>
//   (R = void: absl::Status), or Future<R> to finish asynchronously: the
//   reply is sent when the future completes and no thread waits meanwhile.
// - Exceptions thrown by an implementation are caught: baton::Error keeps
//   its code; any other exception becomes UNKNOWN "remote exception: what".
//   Undecodable arguments give DATA_LOSS; the worker keeps serving.
//
// Thread-safety: FunctionRegistry is safe for concurrent use; functions may
// be registered while the agent serves (a call to a name not yet registered
// fails with NOT_FOUND). Implementations run concurrently on the agent's
// executor and must be thread-safe.
#ifndef BATON_RPC_FUNCTION_H_
#define BATON_RPC_FUNCTION_H_

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "obs/metrics.h"
#include "rpc/call_hook.h"
#include "rpc/codec.h"
#include "rpc/future.h"
#include "rpc/payload.h"
#include "rpc/worker_info.h"

namespace baton::obs {
class StateWriter;
}  // namespace baton::obs

namespace baton::rpc {

class RpcAgent;
class Runtime;

// What a running implementation knows about its call.
class FunctionRegistry;

struct CallContext {
  // The callee's agent: its user handle, for nested calls from user code,
  // and what the protocol layers use (rpc/runtime.h).
  RpcAgent* agent = nullptr;
  Runtime* runtime = nullptr;
  // The registry that dispatched the call (its call hooks run on the reply).
  FunctionRegistry* registry = nullptr;
  const WorkerInfo* caller = nullptr;
  // The caller's incarnation (Runtime::incarnation() on its side; 0 when
  // the request did not say).
  int64_t caller_incarnation = 0;
  absl::string_view function;
  // When the caller gives up; nested waits should not outlive it.
  absl::Time deadline = absl::InfiniteFuture();
  // The request's extensions (set only while call hooks exist).
  std::map<std::string, std::string> extensions;
  absl::Duration time_left() const {
    return deadline == absl::InfiniteFuture() ? absl::InfiniteDuration() : deadline - absl::Now();
  }
};

// ---- Reply notes ----
// A protocol layer that must tell a request's caller something small (the
// RRef protocol's ChildAccept for a fork sent back to its owner) may put it
// on that request's reply instead of sending a message of its own: one
// message and two thread wake-ups fewer on each side.
//
// Contract:
// - AttachToReply succeeds only on the thread that runs the synchronous part
//   of a request's handler (the decoding of its arguments included), for the
//   request's own caller, and only until the reply leaves. Otherwise it
//   returns false and the layer sends its message its own way.
// - An attached note travels in the reply frame (FrameHeader.notes), an
//   error reply included. The caller's agent hands it to the kind's
//   on_arrival before it completes the call, also when the call had already
//   timed out.
// - A note whose reply has not left when the handler's synchronous part
//   returns (an asynchronous function) goes to the kind's unsent, on the
//   callee, at that moment. So each note is delivered once, and leaves at
//   the latest when the function's synchronous part returns.
// - A reply that cannot be sent means that its caller is gone; its notes go
//   with it.
// - A reply carries at most kMaxReplyNotes notes (receivers refuse a header
//   that lists more as DATA_LOSS); AttachToReply returns false beyond that.
// (kMaxReplyNotes is in rpc/payload.h, beside the wire's other limits.)
struct ReplyNoteKind {
  // On the caller, on the transport's thread: must not block.
  std::function<void(Runtime& runtime, int from, absl::string_view data)> on_arrival;
  // On the callee: sends the note as a message of its own.
  std::function<void(Runtime& runtime, int to, std::string data)> unsent;
};

// See "Reply notes" above. `kind` names a ReplyNoteKind added to the
// registry of the agent that runs the request.
bool AttachToReply(int caller, absl::string_view kind, std::string data);

// The notes of the request whose handler runs on this thread (the agent
// makes one around each handler's synchronous part).
class ReplyNoteScope {
 public:
  struct Note {
    std::string kind;
    std::string data;
  };
  // `request_id` tells this request's reply from a nested one's.
  ReplyNoteScope(int caller, uint64_t request_id);
  ~ReplyNoteScope();
  ReplyNoteScope(const ReplyNoteScope&) = delete;
  ReplyNoteScope& operator=(const ReplyNoteScope&) = delete;

  // The notes for the reply of (caller, request_id) if it is sent on this
  // thread while its scope is open; later notes are refused. Empty
  // otherwise.
  static std::vector<Note> TakeForReply(int caller, uint64_t request_id);
  // The notes that did not leave with the reply (at the end of the
  // synchronous part); later notes are refused.
  std::vector<Note> TakeUnsent();

 private:
  friend bool AttachToReply(int, absl::string_view, std::string);
  const int caller_;
  const uint64_t request_id_;
  bool closed_ = false;
  std::vector<Note> notes_;
  ReplyNoteScope* const outer_;
};

template <typename Sig>
class Function;

template <typename R, typename... Args>
class Function<R(Args...)> {
 public:
  using Result = R;
  using ArgsTuple = std::tuple<std::decay_t<Args>...>;

  explicit Function(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  static std::string signature() {
    std::string s = "(";
    ((s += TypeName<Args>() + ","), ...);
    if (sizeof...(Args) > 0) s.pop_back();
    return s + ")->" + TypeName<internal::Stored<R>>();
  }
  static const std::string& cached_signature() {
    static const std::string s = signature();
    return s;
  }

 private:
  std::string name_;
};

using Responder = absl::AnyInvocable<void(absl::StatusOr<Payload>)>;
using RawHandler = std::function<void(const CallContext& ctx, Payload args, Responder done)>;

// A typed value held by the runtime without knowing its type statically,
// e.g. the value of an RRef on its owner.
struct AnyValue {
  std::shared_ptr<void> ptr;
  std::string type;  // typeid(T).name() of the value
  // Encodes *ptr for `context.peer`; null when the type cannot be sent
  // (remote objects stay on their owner).
  std::function<absl::StatusOr<Payload>(const void*, const CodecContext&)> encode;

  // A value that can be sent (T has a Codec).
  template <typename T>
  static AnyValue Of(std::shared_ptr<T> v) {
    AnyValue out;
    out.type = typeid(T).name();
    out.encode = [](const void* p, const CodecContext& c) {
      return EncodeMessage(*static_cast<const T*>(p), &c);
    };
    out.ptr = std::move(v);
    return out;
  }
  // A value that stays where it is (e.g. a remote object).
  template <typename T>
  static AnyValue Opaque(std::shared_ptr<T> v) {
    AnyValue out;
    out.type = typeid(T).name();
    out.ptr = std::move(v);
    return out;
  }
};

using ValueDone = absl::AnyInvocable<void(absl::StatusOr<AnyValue>)>;
// Runs the function like a call, but keeps its result as a value instead of
// encoding a reply (used by remote(), which stores the result on the callee).
using ValueHandler = std::function<void(const CallContext& ctx, Payload args, ValueDone done)>;

class FunctionRegistry {
 public:
  struct Entry {
    std::string signature;  // empty: accepts any (raw handlers)
    RawHandler handler;
    ValueHandler value_handler;  // null for raw handlers
    // The runtime's own short, non-blocking handlers (protocol bookkeeping)
    // may run on the transport's thread instead of the executor. Never set
    // for user functions.
    bool inline_safe = false;
  };

  // ALREADY_EXISTS if the name is taken.
  absl::Status RegisterRaw(std::string name, std::string signature, RawHandler handler,
                           ValueHandler value_handler = nullptr);
  // A protocol handler that never blocks and never runs user code: it is
  // dispatched on the transport thread, saving a thread hand-off.
  absl::Status RegisterInternalInline(std::string name, RawHandler handler);

  template <typename R, typename... Args, typename F>
  absl::Status Register(const Function<R(Args...)>& fn, F impl);

  // nullptr if unknown.
  std::shared_ptr<const Entry> Find(absl::string_view name) const;
  std::vector<std::string> Names() const;

  // Reply note kinds (see "Reply notes" above). ALREADY_EXISTS if `kind` is
  // taken. Add before RpcAgent::Create, on every worker.
  absl::Status AddReplyNoteKind(std::string kind, ReplyNoteKind handlers);
  // nullptr if unknown.
  std::shared_ptr<const ReplyNoteKind> FindReplyNoteKind(absl::string_view kind) const;

  // Call hooks (rpc/call_hook.h), run on every typed call and reply.
  void AddCallHook(std::shared_ptr<CallHook> hook);
  bool has_call_hooks() const { return has_hooks_.load(std::memory_order_acquire); }
  // Encodes `value` for `message.peer`, running the send hooks.
  template <typename T>
  absl::StatusOr<Payload> EncodeForSend(const T& value, const MessageInfo& message) const;
  // Decodes `payload`, running the receive hooks.
  template <typename T>
  absl::Status DecodeReceived(const Payload& payload, T* out, const MessageInfo& message) const;
  // The hooks' scopes for user code answering `ctx` (CallHook::EnterCall);
  // they end when the returned object is destroyed.
  class CallScopes {
   public:
    CallScopes() = default;
    CallScopes(CallScopes&&) = default;
    CallScopes& operator=(CallScopes&&) = default;
    ~CallScopes() {
      while (!scopes_.empty()) scopes_.pop_back();  // innermost first
    }

   private:
    friend class FunctionRegistry;
    std::vector<std::unique_ptr<CallScope>> scopes_;
  };
  CallScopes EnterCall(const CallContext& ctx) const;

  // Metrics (obs/metrics.h) of what this registry's protocol layers keep
  // (RRefs, autograd contexts, a PS shard): an agent with metrics on
  // (AgentOptions::observability.metrics_address) serves them. Add before RpcAgent::Create;
  // a collector must not block, and must cope with state already gone
  // (hold weak references).
  void AddMetricsCollector(std::function<void(obs::MetricsWriter&)> collector) {
    absl::MutexLock lock(&mu_);
    metrics_collectors_.push_back(std::move(collector));
  }
  std::vector<std::function<void(obs::MetricsWriter&)>> metrics_collectors() const {
    absl::ReaderMutexLock lock(&mu_);
    return metrics_collectors_;
  }

  // State collectors: each protocol layer (RRefs, distributed autograd, the
  // PS, the pipeline) adds its section, its waits and its progress counters
  // to the worker's state for the hang report (obs/state.h), when asked.
  // The same rules as for metrics collectors: add before RpcAgent::Create,
  // never block, cope with state already gone.
  void AddStateCollector(std::function<void(obs::StateWriter&)> collector) {
    absl::MutexLock lock(&mu_);
    state_collectors_.push_back(std::move(collector));
  }
  std::vector<std::function<void(obs::StateWriter&)>> state_collectors() const {
    absl::ReaderMutexLock lock(&mu_);
    return state_collectors_;
  }

  // Protocol layers (RRefs, distributed autograd) keep their per-worker
  // state here, one object per type, so codecs and handlers can reach it
  // without globals.
  template <typename T>
  void SetExtension(std::shared_ptr<T> ext) {
    absl::MutexLock lock(&mu_);
    extensions_[typeid(T).name()] = std::move(ext);
  }
  template <typename T>
  std::shared_ptr<T> GetExtension() const {
    absl::ReaderMutexLock lock(&mu_);
    auto it = extensions_.find(typeid(T).name());
    return it == extensions_.end() ? nullptr : std::static_pointer_cast<T>(it->second);
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Entry>> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<void>> extensions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<const ReplyNoteKind>> note_kinds_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(obs::MetricsWriter&)>> metrics_collectors_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(obs::StateWriter&)>> state_collectors_ ABSL_GUARDED_BY(mu_);
  using Hooks = std::vector<std::shared_ptr<CallHook>>;
  // Copy-on-write: a call takes the current list with one reference count.
  std::shared_ptr<const Hooks> hooks_ ABSL_GUARDED_BY(mu_) = std::make_shared<const Hooks>();
  std::atomic<bool> has_hooks_{false};
  std::shared_ptr<const Hooks> hooks() const {
    absl::ReaderMutexLock lock(&mu_);
    return hooks_;
  }

 public:
  // The hooks themselves, for messages encoded without a static type (an
  // RRef's value): collect the tensors with CodecContext::sent_tensors /
  // received_tensors and run these.
  absl::Status RunSendHooks(const MessageInfo& m, const std::vector<at::Tensor>& tensors,
                            std::map<std::string, std::string>& extensions) const;
  absl::Status RunReceiveHooks(const MessageInfo& m, const std::vector<at::Tensor*>& tensors,
                               const std::map<std::string, std::string>& extensions) const;
};

template <typename T>
absl::StatusOr<Payload> FunctionRegistry::EncodeForSend(const T& value,
                                                        const MessageInfo& message) const {
  std::vector<at::Tensor> tensors;
  const bool hooks = has_call_hooks();
  CodecContext cc{message.runtime, message.peer, hooks ? &tensors : nullptr, nullptr};
  cc.answers = message.answers || !message.is_request;
  absl::StatusOr<Payload> p = EncodeMessage(value, &cc);
  if (!p.ok() || !hooks) return p;
  absl::Status s = RunSendHooks(message, tensors, p->extensions);
  if (!s.ok()) {
    p->Undeliverable();
    return s;
  }
  return p;
}

template <typename T>
absl::Status FunctionRegistry::DecodeReceived(const Payload& payload, T* out,
                                              const MessageInfo& message) const {
  std::vector<at::Tensor*> tensors;
  const bool hooks = has_call_hooks();
  CodecContext cc{message.runtime, message.peer, nullptr, hooks ? &tensors : nullptr};
  absl::Status s = DecodeMessage(payload, out, &cc);
  if (!s.ok() || !hooks) return s;
  return RunReceiveHooks(message, tensors, payload.extensions);
}

namespace internal {

template <typename T>
struct IsFuture : std::false_type {};
template <typename T>
struct IsFuture<Future<T>> : std::true_type {};
template <typename T>
struct IsStatusOr : std::false_type {};
template <typename T>
struct IsStatusOr<absl::StatusOr<T>> : std::true_type {};

// The status an exception escaping user code becomes.
absl::Status StatusFromCurrentException();

template <typename F, typename Tuple>
struct IsInvocableWithContext;
template <typename F, typename... Ts>
struct IsInvocableWithContext<F, std::tuple<Ts...>>
    : std::is_invocable<F&, const CallContext&, Ts...> {};

template <typename R>
using TypedDone = absl::AnyInvocable<void(absl::StatusOr<Stored<R>>)>;

// Converts whatever the implementation returned into a typed result.
template <typename R, typename Ret>
void Deliver(Ret&& ret, TypedDone<R>& done) {
  using D = std::decay_t<Ret>;
  if constexpr (IsFuture<D>::value) {
    static_assert(std::is_convertible_v<Stored<typename D::value_type>, Stored<R>>,
                  "the returned future's type does not match the Function's result");
    ret.OnReady([done = std::move(done)](const auto& r) mutable {
      if (!r.ok()) {
        done(r.status());
      } else {
        done(Stored<R>(*r));
      }
    });
  } else if constexpr (std::is_same_v<D, absl::Status>) {
    static_assert(std::is_void_v<R>, "absl::Status return needs a void Function");
    if (!ret.ok()) return done(ret);
    done(std::monostate());
  } else if constexpr (IsStatusOr<D>::value) {
    if (!ret.ok()) return done(ret.status());
    done(static_cast<R>(*std::forward<Ret>(ret)));
  } else {
    static_assert(std::is_convertible_v<D, R>,
                  "the implementation's return type does not match the Function's result");
    done(static_cast<R>(std::forward<Ret>(ret)));
  }
}

// Decodes the arguments, runs `impl` (catching exceptions) and hands the
// typed result to `done`, now or when a returned future completes.
template <typename R, typename Tuple, typename F>
void InvokeTyped(F& impl, const CallContext& ctx, Payload args, TypedDone<R> done) {
  constexpr bool kWithContext = IsInvocableWithContext<F, Tuple>::value;
  Tuple decoded;
  const MessageInfo m{ctx.runtime, /*is_request=*/true, ctx.caller != nullptr ? ctx.caller->id : -1,
                      ctx.function};
  absl::Status s;
  if (ctx.registry != nullptr) {
    s = ctx.registry->DecodeReceived(args, &decoded, m);
  } else {
    const CodecContext cc{ctx.runtime, m.peer};
    s = DecodeMessage(args, &decoded, &cc);
  }
  if (!s.ok()) {
    if (s.code() == absl::StatusCode::kDataLoss) {
      s = absl::DataLossError(absl::StrCat("undecodable arguments: ", s.message()));
    }
    done(s);
    return;
  }
  args = Payload();  // release the receive buffers not aliased by tensors
  FunctionRegistry::CallScopes scopes;
  if (ctx.registry != nullptr && ctx.registry->has_call_hooks()) {
    scopes = ctx.registry->EnterCall(ctx);
  }
  try {
    auto call = [&](auto&&... a) -> decltype(auto) {
      if constexpr (kWithContext) {
        return impl(ctx, std::move(a)...);
      } else {
        return impl(std::move(a)...);
      }
    };
    using Ret = decltype(std::apply(call, std::move(decoded)));
    if constexpr (std::is_void_v<Ret>) {
      std::apply(call, std::move(decoded));
      done(std::monostate());
    } else {
      Deliver<R>(std::apply(call, std::move(decoded)), done);
    }
  } catch (...) {
    done(StatusFromCurrentException());
  }
}

}  // namespace internal

template <typename R, typename... Args, typename F>
absl::Status FunctionRegistry::Register(const Function<R(Args...)>& fn, F impl) {
  using Tuple = typename Function<R(Args...)>::ArgsTuple;
  static_assert(internal::IsInvocableWithContext<F, Tuple>::value ||
                    std::is_invocable_v<F&, std::decay_t<Args>...>,
                "the implementation cannot be called with the Function's arguments");
  auto shared_impl = std::make_shared<F>(std::move(impl));
  RawHandler handler = [shared_impl](const CallContext& ctx, Payload args, Responder done) {
    MessageInfo reply{ctx.runtime, /*is_request=*/false,
                      ctx.caller != nullptr ? ctx.caller->id : -1, ctx.function};
    internal::InvokeTyped<R, Tuple>(
        *shared_impl, ctx, std::move(args),
        [done = std::move(done), reply, registry = ctx.registry, request_ext = ctx.extensions,
         name = std::string(ctx.function)](absl::StatusOr<internal::Stored<R>> r) mutable {
          if (!r.ok()) return done(r.status());
          reply.function = name;
          reply.request_extensions = &request_ext;
          if (registry != nullptr) {
            return done(registry->EncodeForSend<internal::Stored<R>>(*r, reply));
          }
          CodecContext cc{reply.runtime, reply.peer};
          cc.answers = true;
          done(EncodeMessage<internal::Stored<R>>(*r, &cc));
        });
  };
  ValueHandler value_handler = [shared_impl](const CallContext& ctx, Payload args, ValueDone done) {
    internal::InvokeTyped<R, Tuple>(
        *shared_impl, ctx, std::move(args),
        [done = std::move(done)](absl::StatusOr<internal::Stored<R>> r) mutable {
          if (!r.ok()) return done(r.status());
          done(AnyValue::Of(std::make_shared<internal::Stored<R>>(*std::move(r))));
        });
  };
  return RegisterRaw(fn.name(), Function<R(Args...)>::signature(), std::move(handler),
                     std::move(value_handler));
}

}  // namespace baton::rpc

#endif  // BATON_RPC_FUNCTION_H_
