// baton._C.Supervisor: group/supervisor.h for baton.rpc.group.Supervisor.
// The handler is a Python callable run on the agent's executor under the
// GIL; stop() and the object's end release the GIL while they wait for a
// handler that runs (which needs it).
#include <Python.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "absl/strings/str_cat.h"
#include "group/supervisor.h"
#include "python/src/agent_options.h"
#include "python/src/binding.h"
#include "python/src/py_agent.h"
#include "python/src/py_value.h"

namespace baton::python {
namespace {

namespace py = pybind11;

rpc::WorkerRef MemberRef(const py::object& m) {
  if (py::isinstance<py::int_>(m)) return rpc::WorkerRef(m.cast<int>());
  return rpc::WorkerRef(m.cast<std::string>());
}

// Ends a supervisor without holding the GIL (Stop waits for a handler
// that may need it).
void Destroy(group::Supervisor* s) {
  if (PyGILState_Check()) {
    py::gil_scoped_release nogil;
    delete s;
  } else {
    delete s;
  }
}

}  // namespace

void BindGroup(py::module_& m) {
  py::class_<group::Supervisor, std::shared_ptr<group::Supervisor>>(m, "Supervisor")
      // handler(kind, name, id, incarnation, code, message, function)
      .def_static(
          "watch",
          [](const std::shared_ptr<PyAgent>& agent, const std::vector<int>& members, int fanout,
             std::optional<double> timeout, std::optional<double> hung_after,
             py::function handler) {
            group::GroupOptions go;
            go.fanout = fanout;
            go.timeout = Seconds(timeout, absl::ZeroDuration());
            std::vector<rpc::WorkerRef> refs(members.begin(), members.end());
            absl::StatusOr<group::Group> g = group::Group::Of(agent->agent(), refs, go);
            Check(g.status());
            group::SupervisorOptions so;
            // None: calls are not watched (Python refuses values <= 0).
            so.hung_after =
                hung_after.has_value() ? absl::Seconds(*hung_after) : absl::ZeroDuration();
            PyRef callback(std::move(handler));
            auto on_failure = [callback](const group::MemberFailure& f) {
              AcquireGil gil;
              try {
                callback.get()(std::string(group::KindName(f.kind)), f.member.name, f.member.id,
                               f.incarnation, static_cast<int>(f.cause.code()),
                               std::string(f.cause.message()), f.function);
              } catch (py::error_already_set& e) {
                e.discard_as_unraisable("baton.rpc.group.Supervisor handler");
              }
            };
            absl::StatusOr<std::unique_ptr<group::Supervisor>> s;
            {
              py::gil_scoped_release nogil;
              s = group::Supervisor::Watch(*g, on_failure, so);
            }
            Check(s.status());
            return std::shared_ptr<group::Supervisor>(s->release(), Destroy);
          },
          py::arg("agent"), py::arg("members"), py::arg("fanout"), py::arg("timeout"),
          py::arg("hung_after"), py::arg("handler"))
      .def("members",
           [](const group::Supervisor& self) {
             absl::StatusOr<group::Group> g = self.group();
             Check(g.status());
             std::vector<int> out;
             for (const rpc::WorkerInfo& w : g->members()) out.push_back(w.id);
             return out;
           })
      .def(
          "restart",
          [](group::Supervisor& self, const py::object& member, const std::string& reason,
             int64_t incarnation) {
            rpc::WorkerRef ref = MemberRef(member);
            py::gil_scoped_release nogil;
            Check(self.Restart(ref, reason, incarnation));
          },
          py::arg("member"), py::arg("reason") = std::string(), py::arg("incarnation") = 0)
      .def(
          "drop",
          [](group::Supervisor& self, const py::object& member, const std::string& reason) {
            rpc::WorkerRef ref = MemberRef(member);
            py::gil_scoped_release nogil;
            Check(self.Drop(ref, reason));
          },
          py::arg("member"), py::arg("reason") = std::string())
      .def("stop", &group::Supervisor::Stop, py::call_guard<py::gil_scoped_release>());
}

}  // namespace baton::python
