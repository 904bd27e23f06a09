#include "python/src/profiler.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ThreadLocalState.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/profiler/api.h>

namespace baton::python {
namespace {

namespace py = pybind11;
namespace legacy = torch::autograd::profiler;

py::bytes Pickle(const at::IValue& value) {
  const std::vector<char> data = torch::jit::pickle_save(value);
  return py::bytes(data.data(), data.size());
}

at::IValue Unpickle(const py::bytes& bytes, const char* what) {
  const std::string text = bytes;
  try {
    return torch::jit::pickle_load(std::vector<char>(text.begin(), text.end()));
  } catch (const c10::Error& e) {
    throw py::value_error(std::string(what) +
                          " is not a pickled profiler record: " + e.what_without_backtrace());
  }
}

py::bytes PickleEvents(const legacy::thread_event_lists& lists) {
  c10::impl::GenericList events(c10::AnyType::get());
  for (const auto& list : lists) {
    for (const legacy::LegacyEvent& event : list) events.push_back(event.toIValue());
  }
  return Pickle(at::IValue(std::move(events)));
}

void RequireProfiling(const char* what) {
  if (!torch::profiler::impl::profilerEnabled()) {
    throw std::runtime_error(std::string(what) + ": no profile is active on this thread");
  }
}

}  // namespace

void BindProfiler(py::module_& m) {
  m.def("profiler_config", [] {
    RequireProfiling("profiler_config");
    return Pickle(torch::profiler::impl::getProfilerConfig().toIValue());
  });
  m.def("profiler_begin", [](const py::bytes& config) {
    if (torch::profiler::impl::profilerEnabled()) {
      throw std::runtime_error("profiler_begin: a profile is already active on this thread");
    }
    const at::IValue value = Unpickle(config, "profiler_begin's config");
    torch::profiler::impl::ProfilerConfig parsed = [&] {
      try {
        return torch::profiler::impl::ProfilerConfig::fromIValue(value);
      } catch (const c10::Error& e) {
        throw py::value_error(std::string("profiler_begin's config: ") +
                              e.what_without_backtrace());
      }
    }();
    legacy::enableProfilerLegacy(parsed);
  });
  m.def(
      "profiler_end",
      [](bool consolidate) -> py::object {
        RequireProfiling("profiler_end");
        if (!consolidate) {
          // This thread stops recording; the profile lives on in the state
          // a ProfileScope captured, which ends it.
          legacy::disableProfilerLegacy(legacy::ProfilerDisableOptions(true, false));
          return py::none();
        }
        return PickleEvents(legacy::disableProfilerLegacy());
      },
      py::arg("consolidate") = true);
  // The caller thread's state (its profile among it), captured when a
  // call is sent: replies complete on baton's threads, where the events of
  // the callee are added under it (torch's futures do not carry it into
  // callbacks in every version).
  py::class_<at::ThreadLocalState>(m, "ProfileScope")
      .def(py::init([] {
        RequireProfiling("ProfileScope");
        return std::make_unique<at::ThreadLocalState>();
      }))
      .def(
          "add_remote_events",
          [](const at::ThreadLocalState& scope, const py::bytes& events, const std::string& prefix,
             int64_t node_id) {
            const at::IValue value = Unpickle(events, "the remote events");
            if (!value.isList()) throw py::value_error("the remote events are not a list");
            std::vector<legacy::LegacyEvent> parsed;
            for (const at::IValue& item : value.toListRef()) {
              try {
                parsed.push_back(legacy::LegacyEvent::fromIValue(item));
              } catch (const c10::Error& e) {
                throw py::value_error(std::string("a remote event: ") + e.what_without_backtrace());
              }
              legacy::LegacyEvent& event = parsed.back();
              // at::StringView of a std::string keeps its own copy.
              event.setName(at::StringView(prefix + event.name()));
              // An event keeps the node id it was recorded with (a callee's
              // own nested callees' events travel through it); one recorded
              // before its process had an id gets the callee's.
              if (event.nodeId() < 0) event.setNodeId(static_cast<int>(node_id));
            }
            at::ThreadLocalStateGuard guard(scope);
            RequireProfiling("ProfileScope.add_remote_events");
            legacy::addEventList(std::move(parsed));
          })
      .def("end_profile", [](const at::ThreadLocalState& scope) {
        at::ThreadLocalStateGuard guard(scope);
        RequireProfiling("ProfileScope.end_profile");
        // The threads that recorded into it already stopped (profiler_end
        // with consolidate=False): collect everything they recorded.
        return PickleEvents(
            legacy::disableProfilerLegacy(legacy::ProfilerDisableOptions(false, true)));
      });
  m.def("profiler_set_node_id",
        [](int64_t node_id) { at::RecordFunction::setDefaultNodeId(node_id); });
}

}  // namespace baton::python
