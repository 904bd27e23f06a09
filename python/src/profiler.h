// The C++ half of the RPC-aware profiler: what torch's RPC agent does when
// torch.autograd.profiler_legacy.profile() is active on the caller
// (baton/rpc/_profiling.py is the Python half and states the protocol).
//
// Registers in `m`:
// - profiler_config() -> bytes: the legacy profiler's config on this thread
//   (record_shapes, profile_memory, ...), pickled. RuntimeError when no
//   profile is active here.
// - profiler_begin(config: bytes): enables the legacy profiler on this thread
//   with a caller's config (the callee, around the function it runs).
//   RuntimeError when a profile is already active on this thread.
// - profiler_end(consolidate=True) -> bytes: disables it on this thread and
//   returns what it recorded, pickled; with consolidate=False this thread
//   only stops recording and returns None, and a ProfileScope captured
//   before ends the profile (work that continues on other threads, as an
//   @async_execution function's).
// - ProfileScope(): the calling thread's state, its active profile among
//   it (RuntimeError when none is active), captured when a call is sent;
//   .add_remote_events(events: bytes, prefix: str, node_id: int) adds a
//   callee's events to that profile from any thread, each named prefix +
//   its own name, keeping the node id it was recorded with (the callee's
//   own, or its nested callees'; `node_id` for one that has none) (ValueError when
//   `events` is not what profiler_end() returns); .end_profile() -> bytes
//   ends a profile left open by profiler_end(consolidate=False) and returns
//   everything recorded into it.
// - profiler_set_node_id(id: int): the node id this process's own events
//   carry (a worker's id, as torch's init_rpc sets it).
//
// Thread-safety: the profiler's state is per thread, as torch's legacy
// profiler keeps it; call with the GIL held.
#ifndef BATON_PYTHON_SRC_PROFILER_H_
#define BATON_PYTHON_SRC_PROFILER_H_

#include <pybind11/pybind11.h>

namespace baton::python {

void BindProfiler(pybind11::module_& m);

}  // namespace baton::python

#endif  // BATON_PYTHON_SRC_PROFILER_H_
