// baton._C.Future (py_future.h).
#include "python/src/py_future.h"

#include <sched.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton::python {

std::shared_ptr<PyFuture> PyFuture::Make() {
  rpc::Promise<PyObj> p;
  return New(p.future(), p);
}

std::shared_ptr<PyFuture> PyFuture::New(rpc::Future<PyObj> f,
                                        std::optional<rpc::Promise<PyObj>> p) {
  return std::shared_ptr<PyFuture>(new PyFuture(std::move(f), std::move(p)),
                                   ReleaseGilDelete<PyFuture>());
}

py::object PyFuture::Wait(std::optional<double> timeout) const {
  if (!future_.ready()) {
    py::gil_scoped_release nogil;
    // A reply on one host often comes within microseconds: look again for
    // a short while before sleeping (a wake-up costs more than the call).
    const absl::Time spin_end = absl::Now() + absl::Microseconds(50);
    while (!future_.ready() && absl::Now() < spin_end) sched_yield();
    if (!future_.WaitFor(Seconds(timeout, absl::InfiniteDuration()))) {
      Raise(
          absl::DeadlineExceededError(absl::StrCat("future not complete after ", *timeout, " s")));
    }
  }
  const auto& r = future_.result();
  if (!r.ok()) Raise(r.status());
  return ToPython(*r);
}

std::shared_ptr<PyFuture> PyFuture::Then(py::function fn) const {
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

bool PyFuture::SetResult(py::object value) {
  CheckPromise("set_result");
  PyObj v;
  v.live = PyRef(std::move(value));
  py::gil_scoped_release nogil;  // callbacks may run here and take the GIL
  return promise_->SetValue(std::move(v));
}

bool PyFuture::SetError(int code, const std::string& message) {
  CheckPromise("set_exception");
  py::gil_scoped_release nogil;
  return promise_->SetError(absl::Status(static_cast<absl::StatusCode>(code), message));
}

void PyFuture::CheckPromise(const char* what) const {
  if (!promise_.has_value()) {
    Raise(absl::FailedPreconditionError(
        absl::StrCat(what,
                     "() on a future returned by an RPC: only a Future() made by the "
                     "user can be completed by hand")));
  }
}

void BindFutures(py::module_& m) {
  py::class_<PyFuture, std::shared_ptr<PyFuture>>(m, "Future")
      .def(py::init(&PyFuture::Make))
      .def("done", &PyFuture::done)
      .def("wait", &PyFuture::Wait, py::arg("timeout") = py::none())
      .def("then", &PyFuture::Then)
      .def("set_result", &PyFuture::SetResult)
      .def("set_error", &PyFuture::SetError);
}

}  // namespace baton::python
