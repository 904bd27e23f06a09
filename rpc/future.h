// Future<T> and Promise<T>: the completion handle of every asynchronous call.
//
// Contract:
// - A promise is completed at most once, with a value or an error status;
//   later completions are ignored (Set returns false).
// - Waits take a timeout. An RPC's future always completes by the call's own
//   deadline, so result()/value() (which wait without a limit of their own)
//   are still bounded for futures returned by the agent.
// - Then(f) runs f on the future's executor (the agent's pool) once the
//   future completes, or inline if the future has no executor. f receives the
//   completed future; an exception thrown by f becomes the error of the
//   returned future.
// - OnReady(cb) is the low-level form: cb runs inline on the completing
//   thread (or at once if already complete). It must be short and must not
//   block; it is meant for the runtime's own plumbing.
// - Future<void> holds no value; value() returns nothing.
//
// Thread-safety: Future and Promise are cheap shared handles; every method is
// safe for concurrent use.
#ifndef BATON_RPC_FUTURE_H_
#define BATON_RPC_FUTURE_H_

#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "rpc/executor.h"

namespace baton::rpc {

template <typename T>
class Future;
template <typename T>
class Promise;

namespace internal {

template <typename T>
using Stored = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

template <typename T>
struct FutureState {
  using Result = absl::StatusOr<Stored<T>>;

  explicit FutureState(Executor* ex) : executor(ex) {}

  bool ready() const {
    absl::MutexLock lock(&mu);
    return result.has_value();
  }

  bool WaitFor(absl::Duration timeout) const {
    if (ready()) return true;
    // A pool thread that waits lends its place to the next task (E2).
    Executor::BlockingScope blocking;
    absl::MutexLock lock(&mu);
    auto has = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return result.has_value(); };
    if (timeout == absl::InfiniteDuration()) {
      mu.Await(absl::Condition(&has));
      return true;
    }
    return mu.AwaitWithTimeout(absl::Condition(&has), timeout);
  }

  // `result` is written once, under `mu`, and never changes afterwards: a
  // reference taken under the lock stays valid and may be read without it.
  bool Set(Result r) {
    std::vector<absl::AnyInvocable<void(const Result&)>> cbs;
    const Result* set;
    {
      absl::MutexLock lock(&mu);
      if (result.has_value()) return false;
      result.emplace(std::move(r));
      set = &*result;
      cbs.swap(callbacks);
    }
    for (auto& cb : cbs) cb(*set);
    return true;
  }

  void OnReady(absl::AnyInvocable<void(const Result&)> cb) {
    const Result* set;
    {
      absl::MutexLock lock(&mu);
      if (!result.has_value()) {
        callbacks.push_back(std::move(cb));
        return;
      }
      set = &*result;
    }
    cb(*set);
  }

  const Result& Get() const {
    std::optional<Executor::BlockingScope> blocking;
    if (!ready()) blocking.emplace();  // E2, as in WaitFor
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](const std::optional<Result>* r) { return r->has_value(); }, &result));
    return *result;
  }

  mutable absl::Mutex mu;
  std::optional<Result> result ABSL_GUARDED_BY(mu);
  std::vector<absl::AnyInvocable<void(const Result&)>> callbacks ABSL_GUARDED_BY(mu);
  Executor* const executor;
};

template <typename T>
struct UnwrapStatusOr {
  using type = T;
};
template <typename T>
struct UnwrapStatusOr<absl::StatusOr<T>> {
  using type = T;
};

}  // namespace internal

template <typename T>
class Future {
 public:
  using value_type = T;
  using Result = absl::StatusOr<internal::Stored<T>>;

  Future() = default;

  bool valid() const { return state_ != nullptr; }
  bool ready() const { return state_->ready(); }

  // Returns true if the future completed within `timeout`.
  bool WaitFor(absl::Duration timeout) const { return state_->WaitFor(timeout); }

  // The result status, or DEADLINE_EXCEEDED if the future is not complete
  // after `timeout`.
  absl::Status Wait(absl::Duration timeout) const {
    if (!state_->WaitFor(timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("future not complete after ", DurationText(timeout)));
    }
    return state_->Get().status();
  }

  // Waits for completion; see the contract for why this is bounded.
  const Result& result() const { return state_->Get(); }
  absl::Status status() const { return result().status(); }

  // Waits, then returns the value or throws baton::Error.
  T value() const {
    const Result& r = result();
    if (!r.ok()) throw Error(r.status());
    if constexpr (!std::is_void_v<T>) return *r;
  }

  void OnReady(absl::AnyInvocable<void(const Result&)> cb) const { state_->OnReady(std::move(cb)); }

  // f: (const Future<T>&) -> U, absl::StatusOr<U> or void.
  template <typename F>
  auto Then(F f) const {
    using R = std::invoke_result_t<F, const Future<T>&>;
    using U = typename internal::UnwrapStatusOr<R>::type;
    Promise<U> promise(state_->executor);
    Future<U> out = promise.future();
    Future<T> self = *this;
    Executor* ex = state_->executor;
    state_->OnReady([self, promise, ex, f = std::move(f)](const Result&) mutable {
      auto run = [self, promise, f = std::move(f)]() mutable {
        try {
          if constexpr (std::is_void_v<R>) {
            f(self);
            promise.SetValue();
          } else {
            promise.Set(f(self));
          }
        } catch (const std::exception& e) {
          promise.SetError(
              absl::UnknownError(absl::StrCat("exception in Then callback: ", e.what())));
        } catch (...) {
          promise.SetError(absl::UnknownError("unknown exception in Then callback"));
        }
      };
      if (ex == nullptr || !ex->Submit(run)) run();
    });
    return out;
  }

  Executor* executor() const { return state_->executor; }

 private:
  friend class Promise<T>;
  explicit Future(std::shared_ptr<internal::FutureState<T>> s) : state_(std::move(s)) {}
  std::shared_ptr<internal::FutureState<T>> state_;
};

template <typename T>
class Promise {
 public:
  using Result = absl::StatusOr<internal::Stored<T>>;

  explicit Promise(Executor* executor = nullptr)
      : state_(std::make_shared<internal::FutureState<T>>(executor)) {}

  Future<T> future() const { return Future<T>(state_); }

  bool Set(Result r) const { return state_->Set(std::move(r)); }
  template <typename U = T, typename = std::enable_if_t<!std::is_void_v<U>>>
  bool SetValue(U value) const {
    return state_->Set(Result(std::move(value)));
  }
  template <typename U = T, typename = std::enable_if_t<std::is_void_v<U>>>
  bool SetValue() const {
    return state_->Set(Result(std::monostate()));
  }
  bool SetError(absl::Status status) const {
    if (status.ok()) status = absl::InternalError("promise failed with OK status");
    return state_->Set(Result(std::move(status)));
  }
  bool ready() const { return state_->ready(); }

 private:
  std::shared_ptr<internal::FutureState<T>> state_;
};

template <typename T>
Future<T> MakeReadyFuture(internal::Stored<T> value) {
  Promise<T> p;
  p.Set(std::move(value));
  return p.future();
}

template <typename T>
Future<T> MakeErrorFuture(absl::Status status) {
  Promise<T> p;
  p.SetError(std::move(status));
  return p.future();
}

// Waits for every future within one `timeout`. Returns the first error in
// order, or DEADLINE_EXCEEDED naming how many were still pending.
template <typename T>
absl::Status WaitAll(const std::vector<Future<T>>& futures, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int pending = 0;
  for (const auto& f : futures) {
    const absl::Duration left = timeout == absl::InfiniteDuration()
                                    ? absl::InfiniteDuration()
                                    : std::max(absl::ZeroDuration(), deadline - absl::Now());
    if (!f.WaitFor(left)) ++pending;
  }
  if (pending > 0) {
    return absl::DeadlineExceededError(absl::StrCat("WaitAll: ", pending, " of ", futures.size(),
                                                    " futures not complete after ",
                                                    DurationText(timeout)));
  }
  for (const auto& f : futures) {
    if (!f.status().ok()) return f.status();
  }
  return absl::OkStatus();
}

}  // namespace baton::rpc

#endif  // BATON_RPC_FUTURE_H_
