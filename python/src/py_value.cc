#include "python/src/py_value.h"

#include <utility>

#include <torch/csrc/utils/pybind.h>

#include "absl/strings/str_cat.h"
#include "rpc/agent.h"

namespace baton::python {

PyRef::PyRef(py::object obj) : holder_(std::make_shared<Holder>(std::move(obj))) {}

py::object PyRef::get() const { return holder_ == nullptr ? py::none() : holder_->obj; }

PyRef::Holder::~Holder() {
  if (!obj) return;
  if (!Py_IsInitialized() || _Py_IsFinalizing()) {
    // No thread may take the GIL any more: leak the reference.
    obj.release();
    return;
  }
  AcquireGil gil;
  obj = py::object();
}

absl::Status PickleLive(rpc::Runtime* agent, const PyObj& live, PyObj* out) {
  if (agent == nullptr) {
    return absl::FailedPreconditionError("a Python value can only be sent in an RPC");
  }
  std::shared_ptr<PyRuntime> runtime = agent->registry().GetExtension<PyRuntime>();
  if (runtime == nullptr || !runtime->dumps.valid()) {
    return absl::FailedPreconditionError(
        "this agent has no Python runtime: Python values are sent by baton's Python front end");
  }
  if (!Py_IsInitialized() || _Py_IsFinalizing()) {
    return absl::UnavailableError("the Python interpreter is shutting down");
  }
  AcquireGil gil;
  try {
    py::tuple parts = runtime->dumps.get()(live.live.get());
    out->pickle = parts[0].cast<std::string>();
    out->tensors.clear();
    for (py::handle t : parts[1].cast<py::list>()) out->tensors.push_back(t.cast<at::Tensor>());
    out->rrefs.clear();
    for (py::handle r : parts[2].cast<py::list>()) {
      out->rrefs.push_back(r.cast<rref::RRef<PyObj>>());
    }
    return absl::OkStatus();
  } catch (py::error_already_set& e) {
    absl::Status s = StatusFromPython(e, "pickling a value to send");
    return absl::InvalidArgumentError(s.message());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("pickling a value to send: ", e.what()));
  }
}

absl::Status StatusFromPython(py::error_already_set& e, const std::string& where) {
  std::string type = "builtins.Exception";
  std::string text;
  try {
    py::object t = e.type();
    const std::string module = py::str(t.attr("__module__"));
    const std::string qualname = py::str(t.attr("__qualname__"));
    type = absl::StrCat(module, ".", qualname);
    text = py::str(e.value());
    py::object tb =
        py::module_::import("traceback").attr("format_exception")(e.type(), e.value(), e.trace());
    text += "\n";
    text += py::str("").attr("join")(tb).cast<std::string>();
  } catch (...) {
    text = e.what();
  }
  if (!where.empty()) absl::StrAppend(&text, "(while ", where, ")");
  return absl::UnknownError(absl::StrCat(kPythonErrorPrefix, type, ": ", text));
}

}  // namespace baton::python

namespace baton::rpc {

void Codec<python::PyObj>::Encode(const python::PyObj& v, Encoder& enc) {
  const python::PyObj* src = &v;
  python::PyObj pickled;
  if (v.live.valid()) {
    absl::Status s = python::PickleLive(enc.context() != nullptr ? enc.context()->runtime : nullptr,
                                        v, &pickled);
    if (!s.ok()) {
      enc.Fail(std::move(s));
      return;
    }
    src = &pickled;
  }
  Encoder::Nested nested(enc, "py");
  if (!nested.ok()) return;
  enc.WriteString(src->pickle);
  // torch.distributed.rpc keeps a view's strides (rpc/codec.h, ViewLayout).
  EncodeTensors(src->tensors, enc, ViewLayout::kKeep);
  Codec<std::vector<rref::RRef<python::PyObj>>>::Encode(src->rrefs, enc);
}

absl::Status Codec<python::PyObj>::Decode(Decoder& dec, python::PyObj* out) {
  Decoder::Nested nested(dec, "py");
  if (!nested.status().ok()) return nested.status();
  out->live = python::PyRef();
  absl::Status s = dec.ReadString(&out->pickle, "pickle");
  if (s.ok()) s = DecodeTensors(dec, &out->tensors, ViewLayout::kKeep);
  if (s.ok()) s = Codec<std::vector<rref::RRef<python::PyObj>>>::Decode(dec, &out->rrefs);
  return s;
}

}  // namespace baton::rpc
