"""The RPC-aware profiler, as torch's RPC has it.

Inside `torch.autograd.profiler_legacy.profile()` (torch's legacy profiler;
its Kineto profiler does not profile RPCs, in torch either):
- each rpc_sync/rpc_async/remote is an event on the caller named torch's
  way (`rpc_async#fn(worker0 -> worker1)`), spanning the call until its
  future completes;
- the callee runs the function under the legacy profiler with the caller's
  settings (record_shapes, profile_memory, ...), and its events join the
  caller's profile named `<that key>#remote_op: <event>`, with the callee's
  id as their node_id. For rpc_sync/rpc_async they travel back with the
  reply; for remote() the owner keeps them until the caller, told by the
  owner that the value exists, takes them (RRef._get_profiling_future()
  completes then).

With no profile active, a call checks one flag (torch.autograd.
_profiler_enabled()) and takes the usual path: nothing else is added.

The server side (torch's _server_process_global_profile): while one is
entered in a process, every Python call it serves runs under the legacy
profiler (unless its caller profiles it: its events go back to the caller),
and the call's events join each server profile entered, one list per call
(torch keeps one per thread). A served call checks one list for it.
"""
import collections
import itertools
import threading
from typing import Any, Callable, Optional, Tuple

import torch

from baton import _C
from baton.rpc.internal import RPCExecMode, _build_rpc_profiling_key

# What separates the caller's key from a remote event's own name (torch's
# REMOTE_PROFILING_KEY_PREFIX).
REMOTE_OP = "#remote_op: "

# remote() calls whose events wait on their owner to be taken; a caller
# that never takes them (it failed) loses its oldest ones past the cap.
_MAX_KEPT = 10_000
_kept: "collections.OrderedDict[str, bytes]" = collections.OrderedDict()
_kept_lock = threading.Lock()
_ids = itertools.count()


def enabled() -> bool:
    """Whether the calls made on this thread now are profiled."""
    if not torch.autograd._profiler_enabled():
        return False
    try:
        active = torch._C._autograd._profiler_type()
        return active == torch._C._profiler.ActiveProfilerType.LEGACY
    except AttributeError:  # a torch without Kineto: the legacy profiler is the only one
        return True


class _Profiled:
    """A call's result with the events the callee recorded running it."""

    def __init__(self, value: Any, events: Optional[bytes]):
        self.value = value
        self.events = events


def profiled_call(*args, **kwargs):
    """Stands for the profiled function in the message; the callee's
    dispatcher (baton.rpc.api._run) recognises it and runs run_profiled."""
    raise RuntimeError("baton.rpc._profiling.profiled_call runs only as an RPC")


def run_profiled(call: Callable, config: bytes, remote_id: Optional[str], func, args, kwargs):
    """On the callee: call(func, args, kwargs) -> (async name, result) under
    the legacy profiler with the caller's config."""
    # A call to this worker that runs on a thread already profiling (it
    # shares the caller's profile): its events are recorded there.
    started = not torch.autograd._profiler_enabled()
    scope = None
    if started:
        _C.profiler_begin(config)
        scope = _C.ProfileScope()
    try:
        async_name, result = call(func, args, kwargs)
    except BaseException:
        if started:
            _C.profiler_end()
        raise
    pending = async_name is not None and isinstance(result, torch._C.Future)
    if not started:
        events = None
    elif pending:
        # The function's work goes on where its future completes (nested
        # calls, their replies): the profile ends there.
        _C.profiler_end(consolidate=False)
    else:
        events = _C.profiler_end()
    if pending:
        def finish(f):
            events = scope.end_profile() if started else None
            value = f.value()  # the function's error fails the call
            if remote_id is None:
                return _Profiled(value, events)
            # remote(): the owner keeps the value, and the events for the caller.
            _keep(remote_id, events)
            return value
        return async_name, _chain(result, finish)
    if remote_id is not None:
        _keep(remote_id, events)
        return async_name, result
    if async_name is not None:
        return async_name, result  # not a future: the dispatcher names the wrong return type
    return None, _Profiled(result, events)


def _chain(future, fn) -> torch.futures.Future:
    """A future of fn(future) once `future` completes; fn's exception (the
    future's own error among them) fails it with its own class, where
    then() would turn it into a RuntimeError."""
    out = torch.futures.Future()

    def settle(f):
        try:
            value = fn(f)
        except BaseException as e:  # noqa: BLE001  (the chained future fails with it)
            _C.fail_torch_future(out, e)
        else:
            out.set_result(value)

    future.add_done_callback(settle)
    return out


def _keep(remote_id: str, events: Optional[bytes]) -> None:
    if events is None:
        return
    with _kept_lock:
        _kept[remote_id] = events
        while len(_kept) > _MAX_KEPT:
            _kept.popitem(last=False)


def take_events(remote_id: str) -> Optional[bytes]:
    """On a remote() call's owner: the events it kept for that call."""
    with _kept_lock:
        return _kept.pop(remote_id, None)


def _tuple(args) -> tuple:
    return tuple(args) if args is not None else ()


def _func_name(func) -> str:
    from baton.rpc import api  # imports this module first
    if isinstance(func, api._KeptScriptResult):
        func = func.script_function
    if isinstance(func, torch.jit.ScriptFunction):
        return torch._jit_internal._qualified_name(func)
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))


def _key(mode: RPCExecMode, func, self_name: str, dst_name: str) -> str:
    return _build_rpc_profiling_key(mode, _func_name(func), self_name, dst_name)


def call(mode: RPCExecMode, func, args, kwargs, self_name: str, dst: Tuple[str, int],
         send: Callable) -> torch.futures.Future:
    """On the caller, for rpc_sync/rpc_async: send(func, args, kwargs) ->
    torch Future of the reply, sent as a profiled call. Returns the future
    of the function's value, completed after the callee's events joined
    this thread's profile and the call's own event ended."""
    dst_name, dst_id = dst
    key = _key(mode, func, self_name, dst_name)
    config = _C.profiler_config()
    scope = _C.ProfileScope()
    with torch.autograd.profiler.record_function(key) as rf:
        reply = send(profiled_call, (config, None, func, _tuple(args), kwargs or {}), {})
        prefix = key + REMOTE_OP

        def merge(f):
            value = f.value()
            if isinstance(value, _Profiled):
                if value.events is not None:
                    scope.add_remote_events(value.events, prefix, dst_id)
                value = value.value
            return value

        out = _chain(reply, merge)
        return rf._call_end_callbacks_on_future(out)


def remote(func, args, kwargs, self_name: str, dst: Tuple[str, int], send: Callable,
           create: Callable):
    """On the caller, for remote(): send(func, args, kwargs) -> torch Future,
    an unprofiled call to the owner; create(func, args, kwargs) -> RRef, made
    as a profiled call. Returns the RRef, its profiling future set."""
    dst_name, dst_id = dst
    key = _key(RPCExecMode.REMOTE, func, self_name, dst_name)
    config = _C.profiler_config()
    remote_id = f"{self_name}:{next(_ids)}"
    scope = _C.ProfileScope()
    with torch.autograd.profiler.record_function(key) as rf:
        rref = create(profiled_call, (config, remote_id, func, _tuple(args), kwargs or {}), {})
        done = torch.futures.Future()
        prefix = key + REMOTE_OP

        def on_events(f):
            try:
                events = f.value()
                if events is not None:
                    scope.add_remote_events(events, prefix, dst_id)
            except BaseException as e:  # noqa: BLE001  (the profiling future fails with it)
                _C.fail_torch_future(done, e)
            else:
                done.set_result(None)

        def on_created(f):
            try:
                f.value()
            except BaseException as e:  # noqa: BLE001
                _C.fail_torch_future(done, e)
                return
            send(take_events, (remote_id,), {}).add_done_callback(on_events)

        rref._get_future().add_done_callback(on_created)
        rref._profiling_future = rf._call_end_callbacks_on_future(done)
    return rref


# The server profiles entered in this process, outermost first.
server_profiles: "list[_server_process_global_profile]" = []
_server_lock = threading.Lock()


def run_server_profiled(call: Callable, func, args, kwargs):
    """On a worker with server profiles entered: call(func, args, kwargs)
    under the legacy profiler with the outermost one's settings, its events
    added to every one still entered when it ends."""
    with _server_lock:
        outermost = server_profiles[0] if server_profiles else None
    if outermost is None or torch.autograd._profiler_enabled():
        return call(func, args, kwargs)
    with torch.autograd.profiler_legacy.profile(
            use_cuda=_uses_cuda(outermost), record_shapes=outermost.record_shapes,
            profile_memory=outermost.profile_memory) as recorded:
        out = call(func, args, kwargs)
    events = sorted(recorded.function_events,
                    key=lambda e: (e.time_range.start, -e.time_range.end))
    with _server_lock:
        for profile in server_profiles:
            profile._served.append(events)
    return out


def _uses_cuda(profile) -> bool:
    """A profile's CUDA setting: use_cuda (torch 1.13) or use_device (2.x)."""
    return bool(getattr(profile, "use_cuda", False)) or getattr(profile, "use_device", None) == "cuda"


class _server_process_global_profile(torch.autograd.profiler.profile):
    """torch.distributed.rpc._server_process_global_profile: profiles every
    call this worker serves while entered (see the module's docstring), for
    example from another worker through an RRef:

        prof = rpc.remote("worker1", rpc._server_process_global_profile)
        prof.rpc_sync().__enter__()
        ...                                  # calls to worker1
        prof.rpc_sync().__exit__(None, None, None)

    After exit: function_events (every call's events) and
    process_global_function_events (one list per call), as torch's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._served: "list[list]" = []
        self.process_global_function_events: "list[list]" = []

    def __enter__(self):
        if not self.enabled:
            return self
        if self.entered:
            raise RuntimeError("autograd profiler traces are not reentrant")
        self.entered = True
        with _server_lock:
            server_profiles.append(self)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if not self.enabled:
            return False
        with _server_lock:
            if self in server_profiles:
                server_profiles.remove(self)
            served, self._served = self._served, []
        self.process_global_function_events = served
        events = torch.autograd.profiler_util.EventList(
            list(itertools.chain.from_iterable(served)), profile_memory=self.profile_memory,
            **({"use_device": self.use_device} if hasattr(self, "use_device") else
               {"use_cuda": self.use_cuda}))
        events._build_tree()
        if isinstance(getattr(type(self), "function_events", None), property):
            # torch 2.x: a read-only property over what __exit__ would parse.
            self._function_events = events
            self._needs_processing = False
        else:
            self.function_events = events
        return False
