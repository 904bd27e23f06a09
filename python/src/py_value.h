// PyObj: how a Python value travels through baton, and how the Python front
// end reaches the interpreter from the runtime's threads.
//
// A Python value is pickled by the Python layer (baton/_pickle.py) into
// three parts: the pickle bytes, the tensors taken out of it (which travel
// through baton's tensor codec: no copy to hand them over, shared memory
// for large ones on one host, every dtype, views sending only what they
// view), and the RRefs taken out
// of it (which travel as RRef forks, so the RRef protocol's guarantees hold
// for Python values as for C++ ones). A PyObj holds either those parts
// (received, not yet unpickled) or a live Python object (on the worker that
// made it, e.g. an RRef's value on its owner). Encoding a live object
// pickles it, under the GIL, through the agent's PyRuntime.
//
// Contract:
// - Codec<PyObj> decodes without the GIL; only pickling (encoding a live
//   object) takes it.
// - Every py::object held by C++ sits in a PyRef, whose last copy drops the
//   Python reference under the GIL from any thread (and leaks it once the
//   interpreter is finalizing, when no thread may take the GIL).
// - Errors from Python code become absl::Status UNKNOWN with a message that
//   starts "python exception <module>.<qualname>: " so that the caller can
//   re-raise the same type (StatusFromPython, PythonErrorPrefix).
//
// Thread-safety: PyObj and PyRef are values, safe to copy across threads;
// the Python objects inside are only touched under the GIL.
#ifndef BATON_PYTHON_SRC_PY_VALUE_H_
#define BATON_PYTHON_SRC_PY_VALUE_H_

#include <memory>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "absl/status/status.h"
#include "rpc/codec.h"
#include "rref/rref.h"

namespace baton::python {

namespace py = pybind11;

// Takes the GIL on any thread. A runtime thread keeps the Python thread
// state it gets the first time (pybind11 would otherwise create and delete
// one for every acquisition, which costs more than the call it serves).
class AcquireGil {
 public:
  AcquireGil() {
    thread_local bool pinned = false;
    if (!pinned) {
      gil_.inc_ref();  // never released: the thread state lives with the thread
      pinned = true;
    }
  }
  AcquireGil(const AcquireGil&) = delete;
  AcquireGil& operator=(const AcquireGil&) = delete;

 private:
  py::gil_scoped_acquire gil_;
};

// A Python reference that may be copied and dropped on any thread.
class PyRef {
 public:
  PyRef() = default;
  // REQUIRES: the GIL.
  explicit PyRef(py::object obj);
  bool valid() const { return holder_ != nullptr; }
  // REQUIRES: the GIL.
  py::object get() const;

 private:
  struct Holder {
    explicit Holder(py::object o) : obj(std::move(o)) {}
    ~Holder();
    py::object obj;
  };
  std::shared_ptr<Holder> holder_;
};

struct PyObj {
  // The live object; valid() false for a received value.
  PyRef live;
  // The pickled parts (a received value, or a live one already pickled).
  std::string pickle;
  std::vector<at::Tensor> tensors;
  std::vector<rref::RRef<PyObj>> rrefs;
};

// What the runtime needs of the interpreter: the Python layer's pickler,
// installed per agent as a FunctionRegistry extension.
struct PyRuntime {
  // dumps(obj) -> (bytes, [Tensor], [RRef]); called under the GIL.
  PyRef dumps;
};

// Pickles `live` into `out` through the agent's PyRuntime (takes the GIL).
absl::Status PickleLive(rpc::Runtime* agent, const PyObj& live, PyObj* out);

// The status for the Python exception being handled (REQUIRES: the GIL and
// a caught py::error_already_set): UNKNOWN "python exception
// <module>.<qualname>: <message>\n<traceback>".
absl::Status StatusFromPython(py::error_already_set& e, const std::string& where);
inline constexpr char kPythonErrorPrefix[] = "python exception ";

}  // namespace baton::python

namespace baton::rpc {

template <>
struct Codec<python::PyObj> {
  static std::string Name() { return "py"; }
  static void Encode(const python::PyObj& v, Encoder& enc);
  static absl::Status Decode(Decoder& dec, python::PyObj* out);
};

}  // namespace baton::rpc

#endif  // BATON_PYTHON_SRC_PY_VALUE_H_
