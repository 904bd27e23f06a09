// What every binding file of the extension module baton._C shares
// (python/src/module.cc assembles the module from them): errors raised as
// baton._C.StatusError, timeouts taken from Python, values handed to
// Python, and the GIL around baton objects and blocking calls.
//
// Contract:
// - Raise() and Check() raise baton._C.StatusError(code, message), code
//   being the absl::StatusCode number (baton/_errors.py maps it to torch's
//   exception classes); the type is set once at import (SetStatusErrorType).
// - Timeouts from Python go through Seconds() (agent_options.h).
//
// Thread-safety: Raise and Check take the GIL themselves; the rest run
// under the GIL unless they say otherwise.
#ifndef BATON_PYTHON_SRC_BINDING_H_
#define BATON_PYTHON_SRC_BINDING_H_

#include <optional>
#include <vector>

// Every binding file sees the same type casters (optional, vector, map,
// function, Tensor): one set for the whole module.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "python/src/agent_options.h"
#include "python/src/py_value.h"
#include "rref/rref.h"

namespace baton::python {

using PyRRef = rref::RRef<PyObj>;

// baton._C.StatusError, once at import.
void SetStatusErrorType(PyObject* type);

[[noreturn]] void Raise(const absl::Status& s);
void Check(const absl::Status& s);

// A value handed to Python: (True, obj) for a live object, (False, (bytes,
// [Tensor], [RRef])) for pickled parts that the Python layer unpickles.
pybind11::object ToPython(const PyObj& v);
PyObj FromParts(pybind11::bytes pickle, const std::vector<at::Tensor>& tensors,
                const std::vector<PyRRef>& rrefs);

// Dropping a baton object can send messages and wait for room in a peer's
// flow-control window (an RRef's deletion), and a runtime thread that drops
// a tensor Python has seen takes the GIL: so no baton object is destroyed
// while its thread holds the GIL.
template <typename T>
struct ReleaseGilDelete {
  void operator()(T* p) const {
    if (Py_IsInitialized() && PyGILState_Check()) {
      pybind11::gil_scoped_release nogil;
      delete p;
    } else {
      delete p;
    }
  }
};

// Runs f with the GIL released.
template <typename F>
auto ReleasingGil(F f) {
  pybind11::gil_scoped_release nogil;
  return f();
}

}  // namespace baton::python

#endif  // BATON_PYTHON_SRC_BINDING_H_
