#include "python/src/torch_future.h"

#include <exception>
#include <memory>
#include <string>
#include <utility>

#include <torch/csrc/jit/python/pybind_utils.h>

namespace baton::python {

namespace py = pybind11;

namespace {

// A Python exception stored as a future's error. Raised again as itself
// each time the future is waited for (a py::error_already_set can be
// restored only once). The exception object is released with the GIL held,
// whichever thread drops the last copy.
class StoredPythonError : public std::exception {
 public:
  explicit StoredPythonError(py::object exception)
      : what_(py::str(exception).cast<std::string>()),
        exception_(new py::object(std::move(exception)), [](py::object* o) {
          py::gil_scoped_acquire gil;
          delete o;
        }) {}

  const char* what() const noexcept override { return what_.c_str(); }

  void Raise() const {
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception_->ptr())), exception_->ptr());
  }

 private:
  std::string what_;
  std::shared_ptr<py::object> exception_;
};

}  // namespace

void BindTorchFuture(py::module_& m) {
  // pybind11's translators are shared by every module on the same internals
  // (torch's included), so torch's Future.wait() and value() raise the
  // stored exception.
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const StoredPythonError& e) {
      e.Raise();
    }
  });
  m.def(
      "fail_torch_future",
      [](const std::shared_ptr<torch::jit::PythonFutureWrapper>& future, py::object exception) {
        if (!PyExceptionInstance_Check(exception.ptr())) {
          throw py::type_error("fail_torch_future: the error must be an exception instance");
        }
        if (future->fut->completed()) {
          throw std::runtime_error("fail_torch_future: the future already completed");
        }
        future->fut->setError(std::make_exception_ptr(StoredPythonError(std::move(exception))));
      },
      py::arg("future"), py::arg("exception"));
}

}  // namespace baton::python
