// baton._C.Future (py_future.h).
#include "python/src/py_future.h"

namespace baton::python {

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
