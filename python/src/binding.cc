// Shared helpers of baton._C's binding files (binding.h).
#include "python/src/binding.h"

#include <string>

namespace baton::python {
namespace {

// One per interpreter, like every Python exception class.
PyObject* g_status_error = nullptr;

}  // namespace

void SetStatusErrorType(PyObject* type) { g_status_error = type; }

void Raise(const absl::Status& s) {
  AcquireGil gil;
  PyErr_SetObject(g_status_error,
                  py::make_tuple(static_cast<int>(s.code()), std::string(s.message())).ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

py::object ToPython(const PyObj& v) {
  if (v.live.valid()) return py::make_tuple(true, v.live.get());
  py::list tensors;
  for (const at::Tensor& t : v.tensors) tensors.append(py::cast(t));
  py::list rrefs;
  for (const auto& r : v.rrefs) rrefs.append(py::cast(r));
  return py::make_tuple(false, py::make_tuple(py::bytes(v.pickle), tensors, rrefs));
}

PyObj FromParts(py::bytes pickle, const std::vector<at::Tensor>& tensors,
                const std::vector<PyRRef>& rrefs) {
  PyObj v;
  v.pickle = pickle;
  v.tensors = tensors;
  v.rrefs = rrefs;
  return v;
}

}  // namespace baton::python
