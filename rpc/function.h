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

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <c10/util/Exception.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "rpc/codec.h"
#include "rpc/future.h"
#include "rpc/payload.h"
#include "rpc/worker_info.h"

namespace baton::rpc {

class RpcAgent;

// What a running implementation knows about its call.
struct CallContext {
  RpcAgent* agent = nullptr;
  const WorkerInfo* caller = nullptr;
  absl::string_view function;
  // When the caller gives up; nested waits should not outlive it.
  absl::Time deadline = absl::InfiniteFuture();
  absl::Duration time_left() const {
    return deadline == absl::InfiniteFuture() ? absl::InfiniteDuration()
                                              : deadline - absl::Now();
  }
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

 private:
  std::string name_;
};

using Responder = absl::AnyInvocable<void(absl::StatusOr<Payload>)>;
using RawHandler =
    std::function<void(const CallContext& ctx, Payload args, Responder done)>;

class FunctionRegistry {
 public:
  struct Entry {
    std::string signature;  // empty: accepts any (raw handlers)
    RawHandler handler;
  };

  // ALREADY_EXISTS if the name is taken.
  absl::Status RegisterRaw(std::string name, std::string signature,
                           RawHandler handler);

  template <typename R, typename... Args, typename F>
  absl::Status Register(const Function<R(Args...)>& fn, F impl);

  // nullptr if unknown.
  std::shared_ptr<const Entry> Find(absl::string_view name) const;
  std::vector<std::string> Names() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Entry>> entries_
      ABSL_GUARDED_BY(mu_);
};

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

template <typename R>
absl::StatusOr<Payload> EncodeResult(const absl::StatusOr<Stored<R>>& r) {
  if (!r.ok()) return r.status();
  return EncodeMessage<Stored<R>>(*r);
}

// Converts whatever the implementation returned into the reply.
template <typename R, typename Ret>
void Reply(Ret&& ret, Responder& done) {
  using D = std::decay_t<Ret>;
  if constexpr (IsFuture<D>::value) {
    static_assert(std::is_convertible_v<Stored<typename D::value_type>, Stored<R>>,
                  "the returned future's type does not match the Function's result");
    ret.OnReady([done = std::move(done)](const auto& r) mutable {
      if (!r.ok()) {
        done(r.status());
      } else if constexpr (std::is_void_v<R>) {
        done(EncodeMessage(std::monostate()));
      } else {
        done(EncodeMessage<R>(static_cast<R>(*r)));
      }
    });
  } else if constexpr (std::is_same_v<D, absl::Status>) {
    static_assert(std::is_void_v<R>, "absl::Status return needs a void Function");
    if (!ret.ok()) return done(ret);
    done(EncodeMessage(std::monostate()));
  } else if constexpr (IsStatusOr<D>::value) {
    if (!ret.ok()) return done(ret.status());
    done(EncodeMessage<R>(static_cast<R>(*std::forward<Ret>(ret))));
  } else {
    static_assert(std::is_convertible_v<D, R>,
                  "the implementation's return type does not match the Function's result");
    done(EncodeMessage<R>(static_cast<R>(std::forward<Ret>(ret))));
  }
}

}  // namespace internal

template <typename R, typename... Args, typename F>
absl::Status FunctionRegistry::Register(const Function<R(Args...)>& fn, F impl) {
  using Tuple = typename Function<R(Args...)>::ArgsTuple;
  constexpr bool kWithContext =
      std::is_invocable_v<F&, const CallContext&, std::decay_t<Args>...>;
  static_assert(kWithContext || std::is_invocable_v<F&, std::decay_t<Args>...>,
                "the implementation cannot be called with the Function's arguments");
  auto shared_impl = std::make_shared<F>(std::move(impl));
  RawHandler handler = [shared_impl](const CallContext& ctx, Payload args,
                                     Responder done) {
    Tuple decoded;
    absl::Status s = DecodeMessage(args, &decoded);
    if (!s.ok()) {
      done(absl::DataLossError(
          absl::StrCat("undecodable arguments: ", s.message())));
      return;
    }
    args = Payload();  // release the receive buffers not aliased by tensors
    try {
      auto call = [&](auto&&... a) -> decltype(auto) {
        if constexpr (kWithContext) {
          return (*shared_impl)(ctx, std::move(a)...);
        } else {
          return (*shared_impl)(std::move(a)...);
        }
      };
      using Ret = decltype(std::apply(call, std::move(decoded)));
      if constexpr (std::is_void_v<Ret>) {
        std::apply(call, std::move(decoded));
        done(EncodeMessage(std::monostate()));
      } else {
        internal::Reply<R>(std::apply(call, std::move(decoded)), done);
      }
    } catch (...) {
      done(internal::StatusFromCurrentException());
    }
  };
  return RegisterRaw(fn.name(), Function<R(Args...)>::signature(),
                     std::move(handler));
}

}  // namespace baton::rpc

#endif  // BATON_RPC_FUNCTION_H_
