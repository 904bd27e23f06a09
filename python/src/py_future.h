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

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <pybind11/pybind11.h>

#include "absl/status/statusor.h"
#include "python/src/binding.h"
#include "python/src/py_value.h"
#include "rpc/future.h"

namespace baton::python {

class PyFuture {
 public:
  explicit PyFuture(rpc::Future<PyObj> f, std::optional<rpc::Promise<PyObj>> p = std::nullopt)
      : future_(std::move(f)), promise_(std::move(p)) {}
  // A future completed from Python (torch.futures.Future()).
  static std::shared_ptr<PyFuture> Make();
  static std::shared_ptr<PyFuture> New(rpc::Future<PyObj> f,
                                       std::optional<rpc::Promise<PyObj>> p = std::nullopt);

  bool done() const { return future_.ready(); }

  // The value; raises StatusError. timeout None or <= 0: no limit of its own
  // (an RPC's future completes by its deadline).
  pybind11::object Wait(std::optional<double> timeout) const;

  // fn() runs under the GIL once the future completes (on the agent's
  // executor for RPC futures); its result completes the returned future.
  std::shared_ptr<PyFuture> Then(pybind11::function fn) const;

  bool SetResult(pybind11::object value);
  bool SetError(int code, const std::string& message);

  const rpc::Future<PyObj>& future() const { return future_; }

 private:
  void CheckPromise(const char* what) const;

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
