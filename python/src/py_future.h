// baton._C.Future: an RPC's future (or one completed from Python, as
// torch.futures.Future()) handed to Python, and Wrap, which makes one of a
// C++ future of tensors.
//
// Contract: Wait() releases the GIL while it waits and raises StatusError
// for an error; Then()'s callback runs under the GIL on the thread that
// completes the future (the agent's executor for RPC futures);
// SetResult/SetError complete only a future made from Python.
//
// Thread-safety: called under the GIL; the future itself is safe for
// concurrent use.
#ifndef BATON_PYTHON_SRC_PY_FUTURE_H_
#define BATON_PYTHON_SRC_PY_FUTURE_H_

#include <sched.h>

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <pybind11/pybind11.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "python/src/binding.h"
#include "python/src/py_value.h"
#include "rpc/future.h"

namespace baton::python {

class PyFuture {
 public:
  explicit PyFuture(rpc::Future<PyObj> f, std::optional<rpc::Promise<PyObj>> p = std::nullopt)
      : future_(std::move(f)), promise_(std::move(p)) {}
  // A future completed from Python (torch.futures.Future()).
  static std::shared_ptr<PyFuture> Make() {
    rpc::Promise<PyObj> p;
    return New(p.future(), p);
  }
  static std::shared_ptr<PyFuture> New(rpc::Future<PyObj> f,
                                       std::optional<rpc::Promise<PyObj>> p = std::nullopt) {
    return std::shared_ptr<PyFuture>(new PyFuture(std::move(f), std::move(p)),
                                     ReleaseGilDelete<PyFuture>());
  }

  bool done() const { return future_.ready(); }

  // The value; raises StatusError. timeout None or <= 0: no limit of its own
  // (an RPC's future completes by its deadline).
  py::object Wait(std::optional<double> timeout) const {
    if (!future_.ready()) {
      py::gil_scoped_release nogil;
      // A reply on one host often comes within microseconds: look again for
      // a short while before sleeping (a wake-up costs more than the call).
      const absl::Time spin_end = absl::Now() + absl::Microseconds(50);
      while (!future_.ready() && absl::Now() < spin_end) sched_yield();
      if (!future_.WaitFor(Seconds(timeout, absl::InfiniteDuration()))) {
        Raise(absl::DeadlineExceededError(
            absl::StrCat("future not complete after ", *timeout, " s")));
      }
    }
    const auto& r = future_.result();
    if (!r.ok()) Raise(r.status());
    return ToPython(*r);
  }

  // fn() runs under the GIL once the future completes (on the agent's
  // executor for RPC futures); its result completes the returned future.
  std::shared_ptr<PyFuture> Then(py::function fn) const {
    PyRef callback(std::move(fn));
    rpc::Future<PyObj> next =
        future_.Then([callback](const rpc::Future<PyObj>&) -> absl::StatusOr<PyObj> {
          AcquireGil gil;
          try {
            PyObj out;
            out.live = PyRef(callback.get()());
            return out;
          } catch (py::error_already_set& e) {
            return StatusFromPython(e, "a future's callback");
          }
        });
    return PyFuture::New(std::move(next));
  }

  bool SetResult(py::object value) {
    CheckPromise("set_result");
    PyObj v;
    v.live = PyRef(std::move(value));
    py::gil_scoped_release nogil;  // callbacks may run here and take the GIL
    return promise_->SetValue(std::move(v));
  }
  bool SetError(int code, const std::string& message) {
    CheckPromise("set_exception");
    py::gil_scoped_release nogil;
    return promise_->SetError(absl::Status(static_cast<absl::StatusCode>(code), message));
  }

  const rpc::Future<PyObj>& future() const { return future_; }

 private:
  void CheckPromise(const char* what) const {
    if (!promise_.has_value()) {
      Raise(absl::FailedPreconditionError(
          absl::StrCat(what,
                       "() on a future returned by an RPC: only a Future() made by the "
                       "user can be completed by hand")));
    }
  }
  rpc::Future<PyObj> future_;
  std::optional<rpc::Promise<PyObj>> promise_;
};

// The value (a tensor, a list of tensors, or None) as a live Python
// object, made on the executor under the GIL.
template <typename T>
std::shared_ptr<PyFuture> Wrap(rpc::Future<T> f) {
  return PyFuture::New(f.Then([](const rpc::Future<T>& done) -> absl::StatusOr<PyObj> {
    const auto& r = done.result();
    if (!r.ok()) return r.status();
    AcquireGil gil;
    PyObj o;
    if constexpr (std::is_void_v<T>) {
      o.live = PyRef(py::none());
    } else {
      o.live = PyRef(py::cast(*r));
    }
    return o;
  }));
}

// Binds Future.
void BindFutures(pybind11::module_& m);

}  // namespace baton::python

#endif  // BATON_PYTHON_SRC_PY_FUTURE_H_
