"""baton.rpc: torch.distributed.rpc's API on baton's runtime.

    import baton.rpc as rpc          # was: import torch.distributed.rpc as rpc
    rpc.init_rpc("worker0", rank=0, world_size=2)
    y = rpc.rpc_sync("worker1", torch.add, args=(x, 1))
    r = rpc.remote("worker1", MyClass, args=(3,))
    r.rpc_sync().method(...)
    rpc.shutdown()

Semantics follow torch.distributed.rpc; what differs is listed in
python/README.md. Threads: every blocking call releases the GIL; functions
called by other workers run on baton's executor and hold the GIL only while
Python runs.
"""
import atexit
import collections
import os
import threading
import time

import torch

from baton import _C, _errors, _pickle
from baton._errors import (  # noqa: F401
    RemoteException, RpcError, RpcRuntimeError, RpcTimeoutError, WorkerUnavailableError)
from baton.rpc import functions  # noqa: F401

__all__ = [
    "init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info",
    "get_worker_infos",
    "WorkerInfo", "RRef", "BackendType", "RpcBackendOptions", "TensorPipeRpcBackendOptions",
    "functions", "is_available", "RpcError", "RpcRuntimeError", "RpcTimeoutError",
    "WorkerUnavailableError", "RemoteException", "UNSET_RPC_TIMEOUT", "DEFAULT_RPC_TIMEOUT_SEC",
    "CppFunction",
]

from baton.rpc.constants import (  # noqa: E402
    DEFAULT_INIT_METHOD, DEFAULT_RPC_TIMEOUT_SEC, UNSET_RPC_TIMEOUT)


def is_available():
    return True


from baton.rpc.backend_registry import BackendType  # noqa: E402


class RpcBackendOptions:
    """torch's TensorPipeRpcBackendOptions, read by init_rpc.

    rpc_timeout: default timeout of calls, in seconds (0: none).
    init_method: "env://" (MASTER_ADDR, MASTER_PORT) or "tcp://host:port".
    num_worker_threads: accepted for compatibility; baton's executor sizes
    itself (E1-E3 in docs/threading.md).
    device_maps (set_device_map): where CUDA tensors sent to a worker
    arrive, as in torch (docs/cuda.md); devices, _transports, _channels:
    accepted and unused.
    """

    def __init__(self, num_worker_threads=16, rpc_timeout=DEFAULT_RPC_TIMEOUT_SEC,
                 init_method=DEFAULT_INIT_METHOD, device_maps=None, devices=None,
                 _transports=None, _channels=None, **kwargs):
        self.num_worker_threads = num_worker_threads
        self.rpc_timeout = rpc_timeout
        self.init_method = init_method
        self.device_maps = dict(device_maps or {})
        self.devices = list(devices or [])
        self.init_timeout = kwargs.pop("init_timeout", None)
        self.shutdown_timeout = kwargs.pop("shutdown_timeout", None)
        self.restart_wait = kwargs.pop("restart_wait", None)
        # How long shutdown() waits for the other workers to call theirs:
        # 0 (torch's behaviour) waits as long as they live.
        self.shutdown_wait_for_peers = kwargs.pop("shutdown_wait_for_peers", 0)
        if kwargs:
            raise TypeError(f"unknown RPC backend options: {sorted(kwargs)}")

    def set_device_map(self, to, device_map):
        self.device_maps[to] = dict(device_map)

    def set_devices(self, devices):
        self.devices = list(devices)


TensorPipeRpcBackendOptions = RpcBackendOptions


def _cuda_index(device, to):
    """A device map's key or value as a CUDA device index, as torch accepts
    them: an int, "cuda:N" or a torch.device of type cuda."""
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    d = torch.device(device)
    if d.type != "cuda" or d.index is None:
        raise ValueError(f"device map for {to!r}: {device!r} is not a CUDA device with an index "
                         "(use an int, 'cuda:N' or torch.device('cuda', N))")
    return d.index


class WorkerInfo:
    """A worker's name and id (its rank)."""
    __slots__ = ("name", "id")

    def __init__(self, name, id):  # noqa: A002  (torch's field name)
        self.name = name
        self.id = id

    def __eq__(self, other):
        return isinstance(other, WorkerInfo) and (self.name, self.id) == (other.name, other.id)

    def __hash__(self):
        return hash((self.name, self.id))

    def __repr__(self):
        return f"WorkerInfo(id={self.id}, name={self.name})"

    def __reduce__(self):
        return (WorkerInfo, (self.name, self.id))


# ---- The agent of this process (torch's API has one per process) ----

_lock = threading.Lock()
_agent = None


_initializing = threading.Event()  # set while init_rpc runs
_ready = threading.Event()  # set once _agent is assigned


def _current():
    agent = _agent
    if agent is None and _initializing.is_set():
        # Another worker's call can arrive while init_rpc() still waits for
        # the rest of the job: its function runs once init_rpc() returns.
        _ready.wait(timeout=600)
        agent = _agent
    if agent is None:
        raise RpcRuntimeError(
            "RPC has not been initialized: call baton.rpc.init_rpc() first (or it was shut down)")
    return agent


def _parse_init_method(init_method):
    if init_method in (None, "", DEFAULT_INIT_METHOD):
        return None, None
    if init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://"):].rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"init_method '{init_method}' is not tcp://host:port")
        return host.strip("[]"), int(port)
    raise ValueError(f"init_method '{init_method}': baton supports env:// and tcp://host:port")


def init_rpc(name=None, backend=None, rank=None, world_size=None, rpc_backend_options=None,
             ps_server=None):
    """Starts this worker's agent and meets the other workers.

    rank and world_size default to RANK and WORLD_SIZE (set by baton-run);
    MASTER_ADDR and MASTER_PORT say where rank 0 serves the rendezvous.
    name None (baton's addition): the name baton-run gives, its role and
    rank within the role ("trainer0"), else "worker<rank>".
    ps_server (baton's addition): a baton.ps.PsServer this worker hosts.
    """
    global _agent
    if isinstance(backend, RpcBackendOptions) and rpc_backend_options is None:
        backend, rpc_backend_options = None, backend
    options = rpc_backend_options or RpcBackendOptions()
    config = _C.AgentConfig()
    config.name = name or ""
    if ps_server is not None:
        config.installers = [ps_server._c]
    if rank is not None and rank >= 0:
        config.rank = int(rank)
    if world_size is not None:
        config.world_size = int(world_size)
    host, port = _parse_init_method(options.init_method)
    if host is not None:
        config.master_addr = "127.0.0.1" if host == "localhost" else host
        config.master_port = port
    elif os.environ.get("MASTER_ADDR") == "localhost":
        config.master_addr = "127.0.0.1"
    if options.rpc_timeout is not None:
        config.rpc_timeout = float(options.rpc_timeout)
    config.device_maps = {
        str(to): {_cuda_index(k, to): _cuda_index(v, to) for k, v in dict(m).items()}
        for to, m in options.device_maps.items()}
    for field in ("init_timeout", "shutdown_timeout", "restart_wait", "shutdown_wait_for_peers"):
        value = getattr(options, field, None)
        if value is not None:
            setattr(config, field, float(value))
    with _lock:
        if _agent is not None:
            raise RpcRuntimeError("init_rpc() called twice: this process already has an agent")
        _ready.clear()
        _initializing.set()
        try:
            _agent = _C.Agent.create(config, _pickle.dumps, _run)
        except _C.StatusError as e:
            raise _errors.translate(e) from None
        finally:
            _initializing.clear()
            _ready.set()


def shutdown(graceful=True, timeout=0):
    """Stops the agent: graceful waits for every worker to finish its calls.

    A graceful shutdown first waits for every other worker to call shutdown()
    (as torch's does: without limit while they live, unless
    RpcBackendOptions(shutdown_wait_for_peers=seconds) says otherwise; a
    worker found dead ends the wait with WorkerUnavailableError). The steps
    after that are bounded by RpcBackendOptions(shutdown_timeout=...).
    timeout is accepted for torch's signature.
    """
    global _agent
    with _lock:
        agent = _agent
        if agent is None:
            return
        # Calls keep arriving until every worker agreed to stop: the agent
        # stays reachable from the functions they run until then.
        try:
            agent.shutdown(bool(graceful))
        except _C.StatusError as e:
            raise _errors.translate(e) from None
        finally:
            _agent = None


@atexit.register
def _shutdown_at_exit():
    # A script that never called shutdown(): stop without the agreement, so
    # no runtime thread outlives the interpreter.
    global _agent
    agent, _agent = _agent, None
    if agent is not None:
        try:
            agent.shutdown(False)
        except _C.StatusError:
            pass


def get_worker_info(worker_name=None):
    agent = _current()
    try:
        name, wid = agent.worker(worker_name) if worker_name is not None else agent.self_info()
    except _C.StatusError as e:
        raise _errors.translate(e) from None
    return WorkerInfo(name, wid)


def get_worker_infos():
    """Every worker of the job, by rank (baton's addition)."""
    return [WorkerInfo(n, i) for n, i in _current().workers()]


def _to(to):
    if isinstance(to, WorkerInfo):
        return to.id
    if isinstance(to, (str, int)) and not isinstance(to, bool):
        return to
    raise TypeError(f"an RPC destination is a worker name, rank or WorkerInfo, not {to!r}")


def _timeout(timeout):
    if timeout is None or timeout == UNSET_RPC_TIMEOUT:
        return None  # the agent's rpc_timeout
    if timeout < 0:
        raise ValueError(f"timeout {timeout}: use seconds > 0, 0 for none, or leave it unset")
    return float(timeout)  # 0: no timeout


def _name_of(func):
    if isinstance(func, CppFunction):
        return func.name
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if qualname is None:
        return repr(func)
    return f"{module}.{qualname}" if module else qualname


def _describe_to(agent, to):
    if isinstance(to, str):
        return to
    try:
        return agent.worker(to)[0]
    except _C.StatusError:
        return str(to)


def _pack(func, args, kwargs):
    args = tuple(args) if args is not None else ()
    kwargs = dict(kwargs) if kwargs is not None else {}
    if not callable(func):
        raise TypeError(f"{func!r} is not callable")
    return _pickle.dumps((func, args, kwargs))


def _value_of(result):
    """The Python value of a (live, obj) / (False, parts) pair from _C."""
    live, payload = result
    if live:
        return payload
    return _pickle.loads(*payload)


class CppFunction:
    """A function registered in C++ (rpc/function.h) on another worker, named
    with its signature as C++ spells it:

        add = rpc.CppFunction("cpp.add", "(Tensor,Tensor)->Tensor")
        c = rpc.rpc_sync("cpp1", add, args=(a, b))

    Arguments are encoded by the signature's types (python/src/cpp_call.h:
    tensors, bool, int, float, str, lists/tuples for vector/pair/tuple,
    dicts with str keys for maps, None for an empty optional) and the typed
    result comes back as Python values. The callee checks the signature."""

    def __init__(self, name, signature):
        self.name = name
        try:
            self.signature = _C.canonical_signature(signature)
        except _C.StatusError as e:
            raise ValueError(e.args[1] if len(e.args) == 2 else str(e)) from None

    def __repr__(self):
        return f"CppFunction({self.name!r}, {self.signature!r})"


def _label_of(func, args):
    """How a call is named in baton's metrics, hang reports and timeline: the
    Python function (all Python calls share one C++ entry point), or for an
    RRef proxy the method and what made the RRef."""
    if func is _invoke_method and args and len(args) >= 2:
        rref, method_name = args[0], args[1]
        what = getattr(rref, "_what", None)
        return f"{what}.{method_name}" if what else f"RRef.{method_name}"
    return _name_of(func)


def _invoke(agent, to, func, args, kwargs, timeout):
    if isinstance(func, CppFunction):
        if kwargs:
            raise TypeError(f"{func!r} takes positional arguments only")
        try:
            return agent.call_cpp(to, func.name, func.signature, tuple(args or ()),
                                  _timeout(timeout))
        except _C.StatusError as e:
            raise _errors.translate(e, _describe_to(agent, to), func.name) from None
    data, tensors, rrefs = _pack(func, args, kwargs)
    try:
        return agent.call(to, data, tensors, rrefs, _timeout(timeout), _label_of(func, args))
    except _C.StatusError as e:
        raise _errors.translate(e, _describe_to(agent, to), _name_of(func)) from None


def rpc_sync(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Runs func(*args, **kwargs) on worker `to` and returns its result."""
    agent = _current()
    to = _to(to)
    future = _invoke(agent, to, func, args, kwargs, timeout)
    try:
        return _value_of(future.wait())
    except _C.StatusError as e:
        raise _errors.translate(e, _describe_to(agent, to), _name_of(func)) from None


def _torch_future(cfuture, worker, function):
    """A torch.futures.Future completed (on baton's executor) with cfuture's value."""
    out = torch.futures.Future()

    def complete():
        try:
            value = _value_of(cfuture.wait())
        except _C.StatusError as e:
            out.set_exception(_errors.translate(e, worker, function))
        except BaseException as e:  # noqa: BLE001  (an unpickling error fails the future)
            out.set_exception(e)
        else:
            out.set_result(value)

    cfuture.then(complete)
    return out


def rpc_async(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Like rpc_sync, but returns a torch.futures.Future at once."""
    agent = _current()
    to = _to(to)
    cfuture = _invoke(agent, to, func, args, kwargs, timeout)
    return _torch_future(cfuture, _describe_to(agent, to), _name_of(func))


def remote(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Runs func on worker `to`, keeps the result there, and returns an RRef to it."""
    agent = _current()
    to = _to(to)
    if isinstance(func, CppFunction):
        raise TypeError(f"remote() of {func!r}: a C++ function's result is fetched with "
                        "rpc_sync/rpc_async (RRefs of C++ values are made by C++ callers)")
    data, tensors, rrefs = _pack(func, args, kwargs)
    try:
        c = agent.remote(to, data, tensors, rrefs, _timeout(timeout), _label_of(func, args))
    except _C.StatusError as e:
        raise _errors.translate(e, _describe_to(agent, to), _name_of(func)) from None
    return RRef._wrap(c, _name_of(func))


# ---- Running calls from other workers ----

def _is_async(func):
    return getattr(func, "_baton_async_execution", False) or hasattr(
        func, "_wrapped_async_rpc_function")


def _invoke_method(rref, method_name, args, kwargs):
    """Runs on an RRef's owner for the rpc_sync()/rpc_async()/remote() proxies."""
    return getattr(rref.local_value(), method_name)(*args, **kwargs)


def _as_cfuture(result, what):
    # torch.futures.Future, or the torch._C.Future that its then() returns.
    if isinstance(result, torch._C.Future):
        cfuture = _C.Future()

        def settle(fut):
            try:
                value = fut.value()
            except BaseException as e:  # noqa: BLE001  (the exception fails the call)
                cfuture.set_error(*_errors.status_of(e))
            else:
                cfuture.set_result(value)

        result.add_done_callback(settle)
        return cfuture
    raise TypeError(f"{what} is decorated with @async_execution but returned "
                    f"{type(result).__name__}, not a torch.futures.Future")


def _run(data, tensors, rrefs, caller):
    """Called by the runtime (holding the GIL) for each Python call to this worker:
    returns (is_async, value), value being a _C.Future when is_async."""
    func, args, kwargs = _pickle.loads(data, tensors, rrefs)
    if func is _invoke_method:
        rref, method_name = args[0], args[1]
        target = getattr(type(rref.local_value()), method_name, None)
        result = func(*args, **kwargs)
        if target is not None and _is_async(target):
            return True, _as_cfuture(result, _name_of(target))
        return False, result
    result = func(*args, **kwargs)
    if _is_async(func):
        return True, _as_cfuture(result, _name_of(func))
    return False, result


# ---- RRef ----

class _Proxy:
    def __init__(self, rref, kind, timeout):
        self._rref = rref
        self._kind = kind
        self._timeout = timeout

    def __getattr__(self, method_name):
        rref, kind, timeout = self._rref, self._kind, self._timeout

        def call(*args, **kwargs):
            target = kind
            return target(rref.owner(), _invoke_method,
                          args=(rref, method_name, args, kwargs), timeout=timeout)
        call.__name__ = method_name
        return call


class RRef:
    """A reference to a value on its owner worker (torch.distributed.rpc.RRef).

    RRef(value) makes one owned by this worker. Copies sent to other workers
    are counted by the owner (baton's RRef protocol, G1-G10): the value lives
    exactly as long as some reference to it does.
    """

    def __init__(self, value, type_hint=None):
        self._c = _current().make_owned(value)
        self._what = type(value).__name__

    @classmethod
    def _wrap(cls, c, what=None):
        self = cls.__new__(cls)
        self._c = c
        self._what = what
        return self

    def is_owner(self):
        return self._c.is_owner()

    def owner(self):
        return get_worker_info(self._c.owner_id())

    def owner_name(self):
        return self.owner().name

    def confirmed_by_owner(self):
        return self._c.confirmed_by_owner()

    def _describe(self):
        return f"RRef {self._c.id()}" + (f" ({self._what})" if self._what else "")

    def to_here(self, timeout=UNSET_RPC_TIMEOUT):
        """A copy of the value (the value itself on its owner)."""
        agent = _current()
        try:
            return _value_of(self._c.to_here(_timeout(timeout)).wait())
        except _C.StatusError as e:
            raise _errors.translate(e, _describe_to(agent, self._c.owner_id()),
                                    f"to_here() of {self._describe()}") from None

    def local_value(self):
        """The value itself; on the owner only."""
        try:
            return _value_of(self._c.local_value())
        except _C.StatusError as e:
            raise _errors.translate(e, None, f"local_value() of {self._describe()}") from None

    def rpc_sync(self, timeout=UNSET_RPC_TIMEOUT):
        """rref.rpc_sync().method(*args): runs the method on the owner."""
        return _Proxy(self, rpc_sync, timeout)

    def rpc_async(self, timeout=UNSET_RPC_TIMEOUT):
        return _Proxy(self, rpc_async, timeout)

    def remote(self, timeout=UNSET_RPC_TIMEOUT):
        return _Proxy(self, remote, timeout)

    def __repr__(self):
        kind = "OwnerRRef" if self.is_owner() else "UserRRef"
        return f"{kind}({self._c.id()}, owner={self._c.owner_id()})"

    def __reduce__(self):
        raise TypeError(
            "an RRef is sent as an argument or result of an RPC, not pickled by hand")


_pickle.RREF_TYPES = (RRef,)
_pickle.WRAP_RREF = RRef._wrap
from baton.rpc import api, backend_registry, constants, internal, options, rref_proxy  # noqa: E402,F401,E501  (torch.distributed.rpc layout)
