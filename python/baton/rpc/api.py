"""torch.distributed.rpc.api: the RPC API's implementation (baton.rpc
re-exports it, as torch's package does). Module-level names that torch's
programs and tests replace (`_wait_all_workers`,
`_delete_all_user_and_unforked_owner_rrefs`, `_default_pickler`) are looked
up here at each call, as torch's shutdown() looks them up."""
import atexit
import collections
import contextlib
import functools
import itertools
import os
import re
import socket
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Dict, Generic, Iterable, Optional, TypeVar

import torch

from baton import _C, _errors, _pickle
from baton import torch_rpc as _torch_rpc
from baton._errors import (  # noqa: F401
    InvalidArgumentError, RemoteException, RpcError, RpcRuntimeError, RpcTimeoutError,
    WorkerUnavailableError)
from baton.rpc import _profiling, functions  # noqa: F401
from baton.rpc.internal import PythonUDF, RPCExecMode, _internal_rpc_pickler

__all__ = [
    "init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info",
    "get_worker_infos",
    "WorkerInfo", "RRef", "BackendType", "RpcBackendOptions", "TensorPipeRpcBackendOptions",
    "functions", "is_available", "RpcError", "RpcRuntimeError", "RpcTimeoutError",
    "WorkerUnavailableError", "InvalidArgumentError", "RemoteException", "UNSET_RPC_TIMEOUT",
    "DEFAULT_RPC_TIMEOUT_SEC",
    "CppFunction", "get_rpc_timeout", "enable_gil_profiling", "RpcAgent", "TensorPipeAgent",
]

from baton.rpc.constants import (  # noqa: E402
    DEFAULT_INIT_METHOD, DEFAULT_RPC_TIMEOUT_SEC, DEFAULT_SHUTDOWN_TIMEOUT, UNSET_RPC_TIMEOUT)


def is_available():
    return True


from baton.rpc import backend_registry  # noqa: E402
from baton.rpc.backend_registry import BackendType  # noqa: E402


class RpcBackendOptions:
    """torch's TensorPipeRpcBackendOptions, read by init_rpc.

    rpc_timeout: default timeout of calls, in seconds (0: none).
    init_method: "env://" (MASTER_ADDR, MASTER_PORT) or "tcp://host:port".
    num_worker_threads: how many user functions run at once (the
    executor's parallelism, E1 in docs/threading.md; a function waiting in
    an RPC does not count, so nested calls never exhaust it). Unset, it is
    the number of hardware threads (at least 2); it reads 16, torch's
    default, as torch's options do.
    device_maps (set_device_map): where tensors sent to a worker arrive,
    as in torch (docs/cuda.md): CUDA tensors, and CPU tensors where the map
    names "cpu"; devices (set_devices): the devices this worker's tensors
    travel from and to, which its maps and the maps toward it must keep to.
    Every worker checks the whole job's maps and devices at init, and
    init_rpc raises ValueError in torch's words. _transports, _channels:
    accepted and unused.
    """

    def __init__(self, num_worker_threads=None, rpc_timeout=DEFAULT_RPC_TIMEOUT_SEC,
                 init_method=DEFAULT_INIT_METHOD, device_maps=None, devices=None,
                 _transports=None, _channels=None, **kwargs):
        if rpc_timeout is not None and (not isinstance(rpc_timeout, (int, float))
                                        or isinstance(rpc_timeout, bool)):
            raise TypeError("incompatible constructor arguments: rpc_timeout is a number of "
                            f"seconds, not {type(rpc_timeout).__name__}")
        self._num_worker_threads = None
        if num_worker_threads is not None:
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

    @property
    def num_worker_threads(self) -> int:
        return 16 if self._num_worker_threads is None else self._num_worker_threads

    @num_worker_threads.setter
    def num_worker_threads(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"num_worker_threads must be a positive int, not {value!r}")
        self._num_worker_threads = value

    def set_device_map(self, to, device_map):
        """Adds to the map for worker `to`, as torch's does: keys and values
        become torch.device (a negative index raises torch's RuntimeError),
        and a device mapped to two devices raises ValueError."""
        added = {torch.device(k): torch.device(v) for k, v in dict(device_map).items()}
        current = {torch.device(k): torch.device(v)
                   for k, v in dict(self.device_maps.get(to, {})).items()}
        for k, v in added.items():
            if k in current and current[k] != v:
                raise ValueError(f"`set_device_map` only supports 1-to-1 mapping, trying to map "
                                 f"{k} to {v} and {current[k]}")
        self.device_maps[to] = {**current, **added}

    def set_devices(self, devices):
        self.devices = list(devices)


TensorPipeRpcBackendOptions = RpcBackendOptions


# The host in the device maps the agent takes (kCpuDevice in rpc/codec.h).
_CPU = -1


def _as_device(device):
    """A device map's key or value as torch.device (an int is a CUDA index)."""
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    return torch.device(device)


def _map_device(device, where):
    """A device map's key or value as the agent takes it, as torch accepts
    them: "cpu" (or a torch.device of type cpu) for the host, and for a GPU
    an int, "cuda:N" or a torch.device of type cuda with an index."""
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    d = torch.device(device)
    if d.type == "cpu":
        return _CPU
    if d.type != "cuda" or d.index is None:
        raise ValueError(f"{where}: '{d}' is neither the CPU nor a CUDA device "
                         "with an index (use 'cpu', an int, 'cuda:N' or torch.device('cuda', N))")
    return d.index


def _device_map(to, device_map, self_name):
    """A device map as the agent takes it: device index to device index,
    the host as _CPU. A CPU tensor may land on a GPU and a CUDA tensor in
    host memory (torch's {"cpu": 0} and {0: "cpu"}). In a map for this very
    worker, a device to itself says what happens anyway (a call to itself
    keeps its devices) and is dropped. Whether each device exists, and that
    no two map to one, every worker checks at init against the whole job's
    registrations."""
    out = {}
    where = f"device map for {to!r}"
    for k, v in dict(device_map).items():
        k, v = _map_device(k, where), _map_device(v, where)
        if k == v and to == self_name:
            continue
        out[k] = v
    return out


def _share_torch_store_port(config, host, port):
    """torch.distributed's process group and baton's RPC told to meet at the
    same MASTER_PORT (pytorch/examples' batch parameter server calls
    init_process_group, then init_rpc, with one MASTER_ADDR and MASTER_PORT):
    torch's TCPStore already serves that port in rank 0's process, where
    torch's own RPC shares it. baton's store takes another port instead, met
    through torch's store (_meet_through_store). Applies only where this
    process's default process group has a TCPStore on that very port."""
    try:
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return
        store = dist.distributed_c10d._get_default_store()
    except (ImportError, AttributeError, RuntimeError):
        return
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    if port is None:
        port = os.environ.get("MASTER_PORT")
    rank = config.rank if config.rank is not None else os.environ.get("RANK")
    if port is None or rank is None or getattr(store, "port", None) != int(port):
        return
    _meet_through_store(config, store, int(rank))


def _meet_through_store(config, store, rank):
    """Where baton's store serves, agreed through a torch.distributed Store
    every worker shares: rank 0 picks a free port on its address and
    publishes both under a key of this init round; the others read them
    (waiting as long as the store's own timeout)."""
    global _torch_store_rounds
    _torch_store_rounds += 1
    key = f"baton/rpc_store/{_torch_store_rounds}"
    if rank == 0:
        addr = config.master_addr or os.environ.get("MASTER_ADDR") or \
            getattr(store, "host", None) or "127.0.0.1"
        addr = "127.0.0.1" if addr == "localhost" else addr
        with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
            s.bind((addr, 0))
            free = s.getsockname()[1]
        store.set(key, f"{addr} {free}")
    else:
        addr, free = store.get(key).decode().split()
    config.master_addr = addr
    config.master_port = int(free)


# init_rpc calls that met through torch's store, in this process.
_torch_store_rounds = 0


_WORKER_NAME = re.compile(r"[A-Za-z0-9_.:-]*")
_MAX_NAME_LEN = 128


def _check_worker_name(name):
    """torch's rules for worker names, with its messages."""
    if not isinstance(name, str):
        raise TypeError(f"a worker name is a str, not {type(name).__name__}")
    if not name:
        raise RpcRuntimeError("Worker name must be non-empty")
    if len(name) >= _MAX_NAME_LEN:
        raise RpcRuntimeError(f"Worker name must be shorter than {_MAX_NAME_LEN} characters, "
                              f"got {len(name)}")
    if not _WORKER_NAME.fullmatch(name):
        raise RpcRuntimeError("Worker name must match ^[A-Za-z0-9_.:-]*$ (letters, digits and "
                              f"_ . : -), got {name!r}")


class WorkerInfo:
    """A worker's name and id (its rank)."""
    __slots__ = ("name", "id")

    def __init__(self, name: str, id: int):  # noqa: A002  (torch's field name)
        _check_worker_name(name)
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
# This worker's device maps as init_rpc was given them, by worker name,
# devices as torch.device (RpcAgent._get_device_map).
_device_maps_given: Dict[str, Dict[torch.device, torch.device]] = {}


# The default timeout of this worker's calls, in seconds (0: none); init_rpc
# sets it from RpcBackendOptions.rpc_timeout.
_rpc_timeout = DEFAULT_RPC_TIMEOUT_SEC
# torch's flag for shutdown's leak check of user RRefs (its tests set it).
_ignore_rref_leak = True
# How calls are pickled (_use_rpc_pickler replaces it for a block).
_default_pickler = _internal_rpc_pickler
# Per thread: the futures rpc_async() made inside _wait_all().
_thread_local_var = threading.local()

# Counts init_rpc()s: an RRef made under an agent that was shut down since
# (a user RRef that shutdown released) is deleted (RRef._check_not_deleted).
_generation = 0
# Whether this worker's group is dynamic (init_rpc without a world size):
# its members join and leave one by one (rpc/agent.h, M1-M4).
_dynamic = False
_initializing = threading.Event()  # set while init_rpc runs
_ready = threading.Event()  # set once _agent is assigned


# torch's phrases when no agent runs: its Python API's, and (for an RRef
# made by hand) its C++ RRef context's.
_NOT_INITIALIZED = ("RPC has not been initialized. Call baton.rpc.init_rpc() first (or it was "
                    "shut down)")
_NO_CURRENT_AGENT = ("Current RPC agent is not set! Did you initialize the RPC framework (e.g. "
                     "by calling `baton.rpc.init_rpc`)?")


def _current(unset_message: str = _NOT_INITIALIZED):
    agent = _agent
    if agent is None and _initializing.is_set():
        # Another worker's call can arrive while init_rpc() still waits for
        # the rest of the job: its function runs once init_rpc() returns.
        _ready.wait(timeout=600)
        agent = _agent
    if agent is None:
        raise RpcRuntimeError(unset_message)
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
    Without a world size (none passed and no WORLD_SIZE), the group is
    dynamic, as torch's: this worker joins the group that rank 0 started
    (rank 0 first) and leaves it at shutdown(); the others see it from
    then on (get_worker_infos(), calls by name). A group is all fixed or
    all dynamic: the other kind fails with torch's RuntimeError.
    name None (baton's addition): the name baton-run gives, its role and
    rank within the role ("trainer0"), else "worker<rank>".
    ps_server (baton's addition): a baton.ps.PsServer this worker hosts.
    """
    _init(name, backend, rank, world_size, rpc_backend_options, ps_server, store=None)


def _init_rpc_backend(backend=BackendType.TENSORPIPE, store=None, name=None, rank=-1,
                      world_size=None, rpc_backend_options=None):
    """torch's step below init_rpc: starts this worker's agent, meeting the
    others through `store`, a torch.distributed Store they all share (from
    torch.distributed.rendezvous, or a process group's): rank 0 serves
    baton's rendezvous on a free port and publishes where in that store."""
    import torch.distributed as dist
    if not isinstance(store, dist.Store):
        raise TypeError(f"_init_rpc_backend: store is a torch.distributed.Store, not "
                        f"{type(store).__name__}")
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"_init_rpc_backend: rank {rank!r}: a rank >= 0")
    if not isinstance(world_size, int) or world_size <= 0:
        raise ValueError(f"_init_rpc_backend: world_size {world_size!r}: a size > 0 (the store "
                         "meets a fixed group)")
    _init(name, backend, rank, world_size, rpc_backend_options, None, store=store)


def _init(name, backend, rank, world_size, rpc_backend_options, ps_server, store):
    global _agent, _generation, _dynamic, _device_maps_given
    if isinstance(backend, RpcBackendOptions) and rpc_backend_options is None:
        backend, rpc_backend_options = None, backend
    if backend is not None and not backend_registry.is_backend(backend):
        raise TypeError("Argument backend must be a member of BackendType, "
                        f"got {type(backend).__name__}")
    if backend is not None and not backend_registry.is_built_in(backend):
        if store is not None:
            raise TypeError(f"_init_rpc_backend: {backend!r} is a registered backend: "
                            "backend_registry.init_backend() starts it")
        _init_registered_backend(name, backend, rank, world_size, rpc_backend_options)
        return
    if rpc_backend_options is not None:
        if not isinstance(rpc_backend_options, RpcBackendOptions):
            raise TypeError("Argument rpc_backend_options must be an instance of "
                            f"RpcBackendOptions, got {type(rpc_backend_options).__name__}")
        if type(rpc_backend_options) not in (RpcBackendOptions, TensorPipeRpcBackendOptions):
            if backend is None:
                raise TypeError(f"Could not infer backend for options {rpc_backend_options!r}: "
                                "pass backend= (baton runs every BackendType)")
            raise TypeError("`rpc_backend_options` must be a `TensorPipeRpcBackendOptions`, not "
                            f"{type(rpc_backend_options).__name__}")
    if name is not None:
        _check_worker_name(name)
    options = rpc_backend_options or RpcBackendOptions()
    if rank is None or rank < 0:  # torch's errors: from RANK (env://) only
        if options.init_method not in (None, "", DEFAULT_INIT_METHOD):
            raise ValueError(f"rank parameter missing (init_method {options.init_method} "
                             "takes the rank from init_rpc(rank=...))")
        if "RANK" not in os.environ:
            raise ValueError("Error initializing baton.rpc using env:// rendezvous: environment "
                             "variable RANK expected, but not set (start the program with "
                             "baton-run, or pass rank=)")
    config = _C.AgentConfig()
    config.name = name or ""
    config.torch_agent = _torch_rpc.installed()
    if ps_server is not None:
        config.installers = [ps_server._c]
    if rank is not None and rank >= 0:
        config.rank = int(rank)
    if world_size is not None:
        config.world_size = int(world_size)
    dynamic = world_size is None and store is None and "WORLD_SIZE" not in os.environ
    config.dynamic_group = dynamic
    host, port = _parse_init_method(options.init_method)
    if host is not None:
        config.master_addr = "127.0.0.1" if host == "localhost" else host
        config.master_port = port
    elif os.environ.get("MASTER_ADDR") == "localhost":
        config.master_addr = "127.0.0.1"
    if options.rpc_timeout is not None:
        config.rpc_timeout = float(options.rpc_timeout)
    if getattr(options, "_num_worker_threads", None) is not None:
        config.parallelism = options._num_worker_threads
    device_maps = {}
    for to, m in options.device_maps.items():
        mapped = _device_map(to, m, name)
        if mapped or to != name:  # a map for itself that kept every device is no map
            device_maps[str(to)] = mapped
    config.device_maps = device_maps
    config.devices = [_map_device(d, "devices") for d in options.devices]
    given = {str(to): {_as_device(k): _as_device(v) for k, v in dict(m).items()}
             for to, m in options.device_maps.items()}
    if store is not None:
        _meet_through_store(config, store, int(rank))
    else:
        _share_torch_store_port(config, host, port)
    for field in ("init_timeout", "shutdown_timeout", "restart_wait", "shutdown_wait_for_peers"):
        value = getattr(options, field, None)
        if value is not None:
            setattr(config, field, float(value))
    with _lock:
        if _agent is not None:
            raise RpcRuntimeError("RPC is already initialized: init_rpc() was called twice in "
                                  "this process")
        _ready.clear()
        _initializing.set()
        _generation += 1
        try:
            _agent = _C.Agent.create(config, _pickle.dumps, _run)
            _device_maps_given = given
            _dynamic = dynamic
            _errors.SELF_NAME = _agent.self_info()[0]
            # This worker's own profiler events carry its id (torch's
            # _set_profiler_node_id).
            _set_profiler_node_id(_agent.self_info()[1])
            _set_rpc_timeout(DEFAULT_RPC_TIMEOUT_SEC if options.rpc_timeout is None
                             else options.rpc_timeout)
            if _torch_rpc.installed():
                # TorchScript's RPC operators call torch's C++ agent, which
                # drop-in mode makes this one (python/src/torch_agent.h).
                _agent.start_torch_agent(_rpc_timeout)
                # baton's RRefs where scripted code takes RRef[T], and
                # torch's RRefs (what scripted code returns) through RPC.
                _C.install_torch_rref_conversion()
                _pickle.register_reducer(torch._C._distributed_rpc.PyRRef, _reduce_torch_rref)
                # Scripted calls consult torch's own distributed-autograd
                # container (torch's init_rpc initializes it too).
                from baton.distributed import autograd
                autograd._init(_agent.self_info()[1])
        except _C.StatusError as e:
            raise _errors.translate(e) from None
        finally:
            _initializing.clear()
            _ready.set()


def _init_registered_backend(name, backend, rank, world_size, rpc_backend_options):
    """init_rpc for a backend a program registered (backend_registry.py),
    in torch's steps: a store from the options' init_method, this worker's
    distributed-autograd id, the backend's own init handler, whose agent
    becomes the current one."""
    import datetime

    import torch.distributed as dist
    from baton.distributed import autograd
    if name is None:
        raise ValueError(f"init_rpc with {backend!r}: pass name=")
    _check_worker_name(name)
    if rank is None or rank < 0:
        raise ValueError(f"init_rpc with {backend!r}: pass rank= (a rank >= 0)")
    if not world_size:
        raise ValueError(f"init_rpc with {backend!r}: pass world_size= (a registered backend "
                         "meets a group of fixed size through its store; the built-in backend "
                         "takes dynamic groups)")
    options = rpc_backend_options
    if options is not None and not isinstance(options, RpcBackendOptions):
        raise TypeError("Argument rpc_backend_options must be an instance of "
                        f"RpcBackendOptions, got {type(options).__name__}")
    if options is None:
        options = backend_registry.construct_rpc_backend_options(backend)
    store, _, _ = next(dist.rendezvous(options.init_method, rank=rank, world_size=world_size))
    store.set_timeout(datetime.timedelta(seconds=options.rpc_timeout))
    store = dist.PrefixStore(f"rpc_prefix_{next(_registered_inits)}", store)
    autograd._init(rank)
    _set_profiler_node_id(rank)
    agent = backend_registry.init_backend(backend, store=store, name=name, rank=rank,
                                          world_size=world_size, rpc_backend_options=options)
    _init_rpc_states(agent)


_registered_inits = itertools.count()


def _init_rpc_states(agent) -> None:
    """Makes the agent a registered backend's init handler returned the
    current one, unless the handler did (torch's step)."""
    if not _is_current_rpc_agent_set():
        _set_and_start_rpc_agent(agent)


def _set_and_start_rpc_agent(agent) -> None:
    """Makes `agent` this process's current agent and starts it (torch's
    function). RPC here runs on baton's agent: the one accepted is the
    RpcAgent of baton's agent that init_backend() started, current already."""
    if isinstance(agent, RpcAgent) and _agent is not None and agent._agent is _agent:
        return
    raise TypeError(
        f"baton runs RPC on its own agent, not on a {type(agent).__name__}: a registered "
        "backend's init handler returns the agent that backend_registry.init_backend("
        "BackendType.TENSORPIPE, store, name, rank, world_size, rpc_backend_options) started")


def _set_profiler_node_id(worker_id: int) -> None:
    """Tags this process's profiler events with a worker id (torch's
    function; init_rpc sets it to this worker's)."""
    _C.profiler_set_node_id(int(worker_id))


def _enable_jit_rref_pickle() -> None:
    """Lets torch.jit.save() write the RRefs a scripted module holds (in
    drop-in mode baton's RRefs are torch's there), as torch's function."""
    torch._C._distributed_rpc._enable_jit_rref_pickle()


def _disable_jit_rref_pickle() -> None:
    torch._C._distributed_rpc._disable_jit_rref_pickle()


def shutdown(graceful: bool = True, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
    """Stops the agent: graceful waits for every worker to finish its calls.

    A graceful shutdown runs torch's steps, in its order: it waits for every
    other worker to call shutdown() (as torch's does: without limit while
    they live, unless RpcBackendOptions(shutdown_wait_for_peers=seconds) says
    otherwise; a worker found dead ends the wait with WorkerUnavailableError),
    then calls this module's _wait_all_workers(timeout) and
    _delete_all_user_and_unforked_owner_rrefs() (looked up when it runs, so
    a program may replace them, as torch's tests do), and, where
    _ignore_rref_leak is False, raises "Leaking RRef ..." for user RRefs
    this worker still holds after that release. Then every worker drains its
    calls and stops (bounded by RpcBackendOptions(shutdown_timeout=...)). A
    step that raises still stops this worker's agent, without the drain, and
    the error is raised. timeout bounds _wait_all_workers (0:
    shutdown_timeout).
    """
    global _agent
    with _lock:
        agent = _agent
        if agent is None:
            return
        # Calls keep arriving until every worker agreed to stop: the agent
        # stays reachable from the functions they run until then.
        try:
            try:
                leaks = _graceful_steps(agent, timeout) if graceful else None
            except BaseException:
                try:
                    agent.shutdown(False)
                except _C.StatusError:
                    pass  # the step's error says more
                raise
            try:
                agent.shutdown(bool(graceful))
            except _C.StatusError as e:
                raise _errors.translate(e) from None
        finally:
            _agent = None
        if leaks:
            raise RpcRuntimeError("".join(f"Leaking RRef {rref} with fork Id {fork} (owner "
                                          f"{owner}): still held at shutdown\n"
                                          for rref, fork, owner in leaks))


def _graceful_steps(agent, timeout):
    """torch's steps of a graceful shutdown, between the agreement that every
    worker arrived and the drain. Returns the user RRefs still held (leak
    check on)."""
    if _dynamic:
        # torch's steps for a dynamic group: this worker leaves alone (the
        # agent tells the members, M3); nobody waits for the others.
        return None
    try:
        agent.enter_shutdown()
    except _C.StatusError:
        return None  # a worker is dead: agent.shutdown(True) reports it
    seconds = float(timeout) if timeout and timeout > 0 else agent.shutdown_timeout()
    _wait_all_workers(seconds)
    _delete_all_user_and_unforked_owner_rrefs()
    # torch's leak check (its owners raise; here the worker that still holds
    # the references does, which is where the code that kept them runs).
    return None if _ignore_rref_leak else agent.held_rrefs()


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


def get_rpc_timeout() -> float:
    """The default timeout of this worker's calls, in seconds (0: none)."""
    return _rpc_timeout


def enable_gil_profiling(flag: bool) -> None:
    """Times (flag True) or stops timing how long the Python functions this
    worker runs for others wait for the GIL; while on, the agent's debug
    info has the average wait, agent.gil_average_wait_time_us."""
    _current().enable_gil_profiling(bool(flag))


def _set_rpc_timeout(rpc_timeout: float) -> None:
    """Sets the default timeout of this worker's calls that name none."""
    global _rpc_timeout
    if rpc_timeout < 0:
        raise ValueError(f"rpc_timeout {rpc_timeout}: use seconds > 0, or 0 for none")
    _rpc_timeout = float(rpc_timeout)


@contextlib.contextmanager
def _use_rpc_pickler(rpc_pickler):
    """Calls made inside the block are pickled by rpc_pickler (its
    serialize(PythonUDF) -> (bytes, tensors)); then the internal pickler
    again."""
    global _default_pickler
    _default_pickler = rpc_pickler
    try:
        yield
    finally:
        _default_pickler = _internal_rpc_pickler


@contextlib.contextmanager
def _wait_all():
    """Waits, at the end of the block, for every future that rpc_async()
    returned to this thread inside it (torch.futures.wait_all: raises the
    first error)."""
    _thread_local_var.future_list = []
    try:
        yield
    finally:
        try:
            torch.futures.wait_all(_thread_local_var.future_list)
        finally:
            del _thread_local_var.future_list


def _rref_context_get_debug_info() -> Dict[str, str]:
    """This worker's RRef table, counted as torch counts it (values are
    strings): owned RRefs, forks of them known here, user RRefs not yet
    confirmed by their owner, and calls waiting for an RRef still being
    created."""
    return {k: str(v) for k, v in _current().rref_debug_counts().items()}


def _delete_all_user_and_unforked_owner_rrefs(timeout: float = 300.0) -> None:
    """Releases every user RRef this worker holds and waits up to `timeout`
    seconds until their owners confirmed. A graceful shutdown() does this
    itself once every worker arrived; use no RRef of this worker after
    calling it."""
    try:
        _current().settle_rrefs(float(timeout))
    except _C.StatusError as e:
        raise _errors.translate(e) from None


class RpcAgent:
    """The current agent as torch's _get_current_rpc_agent() returns it, for
    the calls programs make on it. baton has one agent for every
    BackendType, so it is also the TensorPipeAgent below."""

    def __init__(self, agent):
        self._agent = agent

    def get_worker_info(self, worker_name: Optional[str] = None) -> WorkerInfo:
        return get_worker_info(worker_name)

    def get_worker_infos(self):
        return get_worker_infos()

    def _get_device_map(self, worker_info: "WorkerInfo") -> Dict[torch.device, torch.device]:
        """This worker's device map for that worker, as init_rpc was given
        it (empty where none was set), as torch's agent answers."""
        return dict(_device_maps_given.get(worker_info.name, {}))

    def get_debug_info(self) -> Dict[str, str]:
        stats = self._agent.stats()
        info = {f"agent.{k}": str(v) for k, v in stats.items()}
        info["agent.rpc_timeout"] = str(_rpc_timeout)
        # torch's key for its request threads: baton's functions at once.
        info["agent.thread_pool_size"] = str(stats["executor_parallelism"])
        return info


# torch's name for the agent of BackendType.TENSORPIPE, which baton serves.
TensorPipeAgent = RpcAgent


def _get_current_rpc_agent() -> RpcAgent:
    return RpcAgent(_current())


def _is_current_rpc_agent_set() -> bool:
    return _agent is not None


def _get_debug_info() -> Dict[str, str]:
    """torch's merged debug info: the agent's, the RRef table's and
    distributed autograd's keys in one dict."""
    from baton.distributed import autograd
    info = _rref_context_get_debug_info()
    info.update(_get_current_rpc_agent().get_debug_info())
    info.update(autograd._get_debug_info())
    return info


# ---- Gathering a value from every worker (torch's _all_gather, _barrier,
# _wait_all_workers) ----
#
# The worker whose name sorts first leads: every other worker sends it its
# value (_gather_to_leader), the leader waits until all arrived, then sends
# the whole {name: value} dict to each (_broadcast_to_followers). Calls with
# the same set of names pair up across workers by sequence number: the k-th
# gather over a set on one worker meets the k-th on the others (threads of
# one worker that gather over the same set at once draw distinct numbers).
# A gather that timed out leaves no state behind on its own worker; a value
# that reaches a leader after the leader gave up stays there (one entry).


class _GatherState:
    def __init__(self, names):
        self.names = frozenset(names)
        self.gathered = {}
        self.all_arrived = threading.Event()  # on the leader
        self.result = None
        self.released = threading.Event()  # on a follower: the leader's broadcast came


_gather_lock = threading.Lock()
_gather_sequence: Dict[tuple, int] = {}
_gather_states: Dict[tuple, _GatherState] = {}


def _gather_state(key, names):
    with _gather_lock:
        state = _gather_states.get(key)
        if state is None:
            state = _gather_states[key] = _GatherState(names)
        return state


def _gather_to_leader(key, worker_name, obj, names):
    """Runs on the leader: records one worker's value."""
    state = _gather_state(key, names)
    with _gather_lock:
        if worker_name in state.gathered:
            raise RuntimeError(f"_all_gather {key[1]} over {sorted(state.names)}: "
                               f"{worker_name} sent its value twice")
        if worker_name not in state.names:
            raise RuntimeError(f"_all_gather {key[1]} over {sorted(state.names)}: "
                               f"{worker_name} is not one of them")
        state.gathered[worker_name] = obj
        if len(state.gathered) == len(state.names):
            state.all_arrived.set()


def _broadcast_to_followers(key, objects):
    """Runs on each follower: the leader's {name: value} of a gather."""
    with _gather_lock:
        state = _gather_states.get(key)
    if state is not None:  # None: this follower gave up waiting
        state.result = objects
        state.released.set()


def _all_gather(obj: Any, worker_names: Optional[Iterable[str]] = None,
                timeout: float = UNSET_RPC_TIMEOUT) -> Dict[str, Any]:
    """{worker name: obj} from every worker in worker_names (default: every
    worker that runs Python and was not dropped: a mixed job's C++ workers
    take no part); each
    of them must call it. timeout (seconds, 0: none) bounds every step;
    unset, the default RPC timeout."""
    self_name = get_worker_info().name
    if worker_names is None:
        # A worker a supervisor dropped takes no part (baton.rpc.group), not
        # even its own.
        agent = _current()
        try:
            retired = set(agent.retired_workers())
        except _C.StatusError as e:
            raise _errors.translate(e) from None
        if self_name in retired:
            return {}
        names = tuple(sorted(n for n in agent.python_workers() if n not in retired))
    else:
        names = tuple(sorted(set(worker_names)))
    if self_name not in names:
        raise ValueError(f"_all_gather: {self_name} gathers over {list(names)} without "
                         "being one of them")
    seconds = get_rpc_timeout() if timeout == UNSET_RPC_TIMEOUT else float(timeout)
    with _gather_lock:
        sequence = _gather_sequence.get(names, 0)
        _gather_sequence[names] = sequence + 1
    key = (names, sequence)
    leader = names[0]
    state = _gather_state(key, names)
    try:
        if self_name == leader:
            _gather_to_leader(key, self_name, obj, names)
            if not state.all_arrived.wait(seconds or None):
                missing = sorted(state.names - set(state.gathered))
                raise RuntimeError(f"{self_name} timed out in _all_gather after {seconds:.2f} "
                                   f"seconds: no value from {missing}")
            futures = {name: rpc_async(name, _broadcast_to_followers, args=(key, state.gathered),
                                       timeout=seconds) for name in names if name != leader}
            errors = []
            for name, fut in futures.items():
                try:
                    fut.wait()
                except RuntimeError as e:
                    errors.append((name, e))
            if errors:  # torch's message, which programs match
                raise RuntimeError(f"Followers {[name for name, _ in errors]} timed out in "
                                   f"_all_gather after {seconds:.2f} seconds. The first "
                                   f"exception is {errors[0][1]}")
            return dict(state.gathered)
        rpc_sync(leader, _gather_to_leader, args=(key, self_name, obj, names), timeout=seconds)
        if not state.released.wait(seconds or None):
            raise RuntimeError(f"{self_name} timed out in _all_gather after {seconds:.2f} "
                               f"seconds waiting for the leader {leader}")
        return state.result
    finally:
        with _gather_lock:
            _gather_states.pop(key, None)


def _barrier(worker_names: Iterable[str]) -> None:
    """Returns once every worker in worker_names called it."""
    try:
        _all_gather(None, set(worker_names))
    except RuntimeError as e:
        raise RuntimeError(f"Failed to complete barrier, got error {e}") from e


def _wait_all_workers(timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
    """Returns once every worker of the job that runs Python called it (0: no
    time limit)."""
    _all_gather(None, timeout=timeout)


def _to(to):
    if isinstance(to, WorkerInfo):
        return to.id
    if isinstance(to, (str, int)) and not isinstance(to, bool):
        return to
    if isinstance(to, float):
        raise ValueError(f"an RPC destination rank is an int, not {to!r}")
    raise TypeError(f"an RPC destination is a worker name, rank or WorkerInfo, not {to!r}")


def _timeout(timeout):
    if timeout is None or timeout == UNSET_RPC_TIMEOUT:
        return _rpc_timeout  # this worker's default (_set_rpc_timeout)
    if timeout < 0:
        raise ValueError(f"timeout {timeout}: use seconds > 0, 0 for none, or leave it unset")
    return float(timeout)  # 0: no timeout


def _name_of(func):
    if isinstance(func, CppFunction):
        return func.name
    if isinstance(func, torch.jit.ScriptFunction):
        return func.qualified_name
    if isinstance(func, _AsyncScript):
        return func.fn.qualified_name
    if isinstance(func, _KeptScriptResult):
        return func.script_function.qualified_name
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


class _AsyncScript:
    """An @async_execution TorchScript function as it travels: the script
    function itself (sent by its qualified name, as torch sends it), run on
    the callee as an async_execution function."""

    _baton_async_execution = True

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        result = self.fn(*args, **kwargs)
        if not isinstance(result, torch._C.Future):
            # TorchScript's phrase for the same mistake under torch.
            kind = "Tensor" if isinstance(result, torch.Tensor) else type(result).__name__
            raise RuntimeError(f"Async functions must return an IValue of Future type, but got "
                               f"{kind}")
        return result


def _check_script_args(func, args, kwargs):
    """A TorchScript function's arguments against its schema, on the caller
    (torch refuses them before sending, remote() included), in torch's words."""
    schema = func.schema
    params = schema.arguments
    if len(args) > len(params):
        raise RuntimeError(f"{func.name}() expected at most {len(params)} argument(s) but "
                           f"received {len(args)} argument(s). Declaration: {schema}")
    names = {a.name for a in params}
    for key in kwargs:
        if key not in names:
            raise RuntimeError(f"Unknown keyword argument '{key}' for operator '{func.name}'. "
                               f"Schema: {schema}")


# torch's words when no overload of a builtin operator takes the arguments
# (1.13's carries its own typo, "many").
_NO_SCHEMA = ("Overloaded torch operator invoked from Python failed to "
              f"{'match' if int(torch.__version__.split('.')[0]) >= 2 else 'many'} any schema")


@functools.lru_cache(maxsize=None)
def _builtin_schemas(name):
    return tuple(torch._C._jit_get_schemas_for_operator(name))


def _unbound(schema, nargs, kwargs):
    """Why `schema` cannot take `nargs` positional arguments and `kwargs`
    (by count and name: torch checks the types on the callee), or None."""
    params = schema.arguments
    positional = [a for a in params if not a.kwarg_only]
    # A list parameter may take the rest as varargs (torch.ones(2, 3)).
    if nargs > len(positional) and not any(isinstance(a.type, torch._C.ListType)
                                           for a in positional):
        return f"expected at most {len(positional)} argument(s) but received {nargs}"
    names = {a.name for a in params}
    for key in kwargs:
        if key not in names:
            return f"unknown keyword argument '{key}'"
        if any(a.name == key for a in positional[:nargs]):
            return f"argument '{key}' given by position and by keyword"
    for i, a in enumerate(params):
        bound = (not a.kwarg_only and i < nargs) or a.name in kwargs
        if not bound and a.default_value is None and not _optional(a):
            return f"argument '{a.name}' not provided"
    return None


def _optional(argument):
    return isinstance(argument.type, torch._C.OptionalType)


def _check_builtin_args(func, args, kwargs):
    """A builtin operator's arguments (torch.add, ...) against its overloads,
    on the caller, as torch does before sending."""
    name = torch.jit._builtins._find_builtin(func)
    if name is None:
        return
    schemas = _builtin_schemas(name)
    reasons = []
    for schema in schemas:
        why = _unbound(schema, len(args), kwargs)
        if why is None:
            return
        reasons.append(f"{schema}:\n{why}")
    if schemas:
        raise RuntimeError(f"{_NO_SCHEMA}:\n" + "\n\n".join(reasons))


def _pack(func, args, kwargs):
    args = tuple(args) if args is not None else ()
    kwargs = dict(kwargs) if kwargs is not None else {}
    if not callable(func):
        raise TypeError(f"{func!r} is not callable")
    wrapped = getattr(func, "_wrapped_async_rpc_function", None)
    if isinstance(wrapped, torch.jit.ScriptFunction):
        _check_script_args(wrapped, args, kwargs)
        func = _AsyncScript(wrapped)
    elif isinstance(func, torch.jit.ScriptFunction):
        _check_script_args(func, args, kwargs)
    elif isinstance(func, _KeptScriptResult):
        _check_script_args(func.script_function, args, kwargs)
    elif type(func).__name__ == "builtin_function_or_method":
        _check_builtin_args(func, args, kwargs)
    pickler = _default_pickler
    if pickler is _internal_rpc_pickler:
        return pickler._serialize_call(func, args, kwargs)
    data, tensors = pickler.serialize(PythonUDF(func, args, kwargs))
    return data, tensors, []


def _value_of(result):
    """The Python value of a (live, obj) / (False, parts) pair from _C."""
    live, payload = result
    if live:
        return payload.value() if type(payload) is _ScriptValue else payload
    return _pickle.loads(*payload)


class _ScriptValue:
    """An RRef's value that stays TorchScript's, as under torch: the list or
    dict a TorchScript function returned to remote() (drop-in mode), held in
    a torch OwnerRRef. Scripted code that takes the RRef gets that RRef, so
    it sees and changes the value itself (TorchScript would convert a Python
    list or dict into a copy); Python reads it as a Python copy (local_value,
    to_here: _value_of and the pickler below)."""

    __slots__ = ("torch_rref",)

    def __init__(self, torch_rref):
        self.torch_rref = torch_rref

    def value(self):
        return self.torch_rref.local_value()


def _script_value_copy(value):
    return value


_pickle.register_reducer(_ScriptValue, lambda held: (_script_value_copy, (held.value(),)))


class _KeptScriptResult:
    """remote() of a TorchScript function in drop-in mode, run on the owner:
    a list or dict result is kept as TorchScript's value (_ScriptValue),
    typed by the function's declared return type."""

    def __init__(self, script_function):
        self.script_function = script_function

    def __call__(self, *args, **kwargs):
        result = self.script_function(*args, **kwargs)
        if isinstance(result, (list, dict)) and _torch_rpc.installed():
            returns = self.script_function.schema.returns
            return _ScriptValue(_C.torch_owner_rref(result, None,
                                                    returns[0].type.annotation_str))
        return result


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


def _profiling_target(agent, to, timeout, function):
    """What baton/rpc/_profiling.py needs of a call's destination: this
    worker's name, the destination's (name, id), and an unprofiled send
    there, (func, args, kwargs) -> torch Future."""
    worker = _describe_to(agent, to)

    def send(f, a, k):
        return _torch_future(_invoke(agent, to, f, a, k, timeout), worker, function)
    return get_worker_info().name, (worker, agent.worker(to)[1]), send


def _profiled(mode, agent, to, func, args, kwargs, timeout):
    """rpc_sync/rpc_async inside a legacy profile (baton/rpc/_profiling.py)."""
    return _profiling.call(mode, func, args, kwargs,
                           *_profiling_target(agent, to, timeout, _name_of(func)))


def rpc_sync(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Runs func(*args, **kwargs) on worker `to` and returns its result."""
    agent = _current()
    to = _to(to)
    if _profiling.enabled() and not isinstance(func, CppFunction):
        return _profiled(RPCExecMode.SYNC, agent, to, func, args, kwargs, timeout).wait()
    future = _invoke(agent, to, func, args, kwargs, timeout)
    try:
        value = _value_of(future.wait())
    except _C.StatusError as e:
        raise _errors.translate(e, _describe_to(agent, to), _name_of(func)) from None
    _wait_for_received_cuda_tensors()
    return value


def _cuda_devices():
    """The CUDA devices of this process, once it uses CUDA: a received CUDA
    tensor is copied on its device's default stream (docs/cuda.md)."""
    return list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []


def _wait_for_received_cuda_tensors():
    """Makes the current stream, where it is not the default one, wait for
    the copies of received CUDA tensors (torch's CUDA futures do the same in
    wait())."""
    if torch.cuda.is_initialized():
        current, default = torch.cuda.current_stream(), torch.cuda.default_stream()
        if current != default:
            current.wait_stream(default)


def _torch_future(cfuture, worker, function):
    """A torch.futures.Future completed (on baton's executor) with cfuture's
    value. Where this process uses CUDA it is a CUDA future: its wait() makes
    the waiter's current streams wait for the copies of received CUDA
    tensors."""
    out = torch.futures.Future(devices=_cuda_devices())

    def complete():
        try:
            value = _value_of(cfuture.wait())
        except _C.StatusError as e:
            _C.fail_torch_future(out, _errors.translate(e, worker, function))
        except BaseException as e:  # noqa: BLE001  (an unpickling error fails the future)
            _C.fail_torch_future(out, e)
        else:
            out.set_result(value)

    cfuture.then(complete)
    return out


def rpc_async(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Like rpc_sync, but returns a torch.futures.Future at once."""
    agent = _current()
    to = _to(to)
    if _profiling.enabled() and not isinstance(func, CppFunction):
        future = _profiled(RPCExecMode.ASYNC, agent, to, func, args, kwargs, timeout)
    else:
        cfuture = _invoke(agent, to, func, args, kwargs, timeout)
        future = _torch_future(cfuture, _describe_to(agent, to), _name_of(func))
    pending = getattr(_thread_local_var, "future_list", None)
    if pending is not None:  # inside _wait_all()
        pending.append(future)
    return future


def remote(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Runs func on worker `to`, keeps the result there, and returns an RRef to it."""
    agent = _current()
    to = _to(to)
    if isinstance(func, CppFunction):
        raise TypeError(f"remote() of {func!r}: a C++ function's result is fetched with "
                        "rpc_sync/rpc_async (RRefs of C++ values are made by C++ callers)")
    label, what = _label_of(func, args), _name_of(func)
    if isinstance(func, torch.jit.ScriptFunction) and _torch_rpc.installed():
        func = _KeptScriptResult(func)

    def create(f, a, k):
        data, tensors, rrefs = _pack(f, a, k)
        try:
            c = agent.remote(to, data, tensors, rrefs, _timeout(timeout), label)
        except _C.StatusError as e:
            raise _errors.translate(e, _describe_to(agent, to), what) from None
        return RRef._wrap(c, what)

    if not _profiling.enabled():
        return create(func, args, kwargs)
    return _profiling.remote(func, args, kwargs, *_profiling_target(agent, to, timeout, what),
                             create)


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
                # wait(), not value(): a CUDA future's result is ready only
                # in its streams' order, and this thread's current streams
                # (where the reply is encoded) must wait for them.
                value = fut.wait()
            except BaseException as e:  # noqa: BLE001  (the exception fails the call)
                cfuture.set_error(*_errors.status_of(e))
            else:
                cfuture.set_result(value)

        result.add_done_callback(settle)
        return cfuture
    # torch's class and phrase (its suites match them), with the function named.
    raise RuntimeError("Functions decorated with @rpc.async_function must return a "
                       f"torch.futures.Future object, but {what} returned "
                       f"{type(result).__name__}")


def _call(func, args, kwargs):
    """Runs one call: (its name, its torch Future) for an @async_execution
    function, else (None, its result)."""
    if func is _invoke_method:
        rref, method_name = args[0], args[1]
        target = getattr(type(rref.local_value()), method_name, None)
        result = func(*args, **kwargs)
        if target is not None and _is_async(target):
            return _name_of(target), result
        return None, result
    result = func(*args, **kwargs)
    return (_name_of(func), result) if _is_async(func) else (None, result)


def _run(data, tensors, rrefs, caller):
    """Called by the runtime (holding the GIL) for each Python call to this worker:
    returns (is_async, value), value being a _C.Future when is_async."""
    try:
        func, args, kwargs = _pickle.loads(data, tensors, rrefs)
    except AttributeError as e:
        # The function (or a class of an argument) is missing here: pickle
        # sends functions by name only. A RuntimeError at the caller, as
        # under torch (the function's own errors keep their types).
        raise RuntimeError(
            f"{e}. The RPC pickler does not serialize function code: define the function "
            f"(and the classes of its arguments) in the same module on worker "
            f"{get_worker_info().name!r} as on the caller") from e
    try:
        if func is _profiling.profiled_call:
            async_name, result = _profiling.run_profiled(_call, *args, **kwargs)
        elif _profiling.server_profiles:
            async_name, result = _profiling.run_server_profiled(_call, func, args, kwargs)
        else:
            async_name, result = _call(func, args, kwargs)
    except Exception as e:
        # The callee's log says what failed, as torch's RPC prints it; the
        # caller gets the exception itself.
        print(f"On {get_worker_info()}:\n{e!r}\n{traceback.format_exc()}", file=sys.stderr)
        if isinstance(e, torch.jit.Error):
            # TorchScript's interpreter error (whatever the script raised)
            # reaches torch's callers as a RuntimeError with its text.
            raise RuntimeError(str(e)) from None
        raise
    if async_name is not None:
        return True, _as_cfuture(result, async_name)
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
            if kind is remote:
                # A missing method fails here, as under torch, not later in
                # the new RRef: its type comes from the owner (once, cached).
                value_type = rref._get_type(timeout=timeout)
                if not hasattr(value_type, method_name):
                    raise AttributeError(f"'{value_type.__name__}' object has no attribute "
                                         f"'{method_name}'")
            return kind(rref.owner(), _invoke_method,
                        args=(rref, method_name, args, kwargs), timeout=timeout)
        call.__name__ = method_name
        return call


T = TypeVar("T")


class RRef(Generic[T]):
    """A reference to a value on its owner worker (torch.distributed.rpc.RRef).

    RRef(value) makes one owned by this worker. Copies sent to other workers
    are counted by the owner (baton's RRef protocol, G1-G10): the value lives
    exactly as long as some reference to it does.
    """

    def __init__(self, value, type_hint=None):
        if isinstance(value, torch.jit.ScriptModule) and type_hint is None:
            # torch's check and phrase: scripted code sees the module through
            # its interface.
            raise RuntimeError("The RRef being created contains a ScriptModule, must provide "
                               "its ModuleInterface type hint.")
        if type_hint is not None and not isinstance(value, torch.jit.ScriptModule):
            raise RuntimeError("type_hint should only be specified when the RRef being created "
                               f"contains a ScriptModule, not a {type(value).__name__}")
        self._c = _current(_NO_CURRENT_AGENT).make_owned(value)
        self._what = type(value).__name__
        if type_hint is not None:
            _script_module_hints[value] = type_hint  # what TorchScript sees it as
        self._generation = _generation

    @classmethod
    def _wrap(cls, c, what=None):
        self = cls.__new__(cls)
        self._c = c
        self._what = what
        self._generation = _generation
        return self

    def _check_not_deleted(self, use):
        """A user RRef that a shutdown released (graceful: every user RRef
        goes) cannot be used: torch's error, naming `use`."""
        if self._generation == _generation:
            if _agent is None and _initializing.is_set():
                # A call that another worker made while this worker's
                # init_rpc() still runs: its RRefs are live, and its
                # function goes on once init_rpc() returns (as _current()).
                _ready.wait(timeout=600)
            if _agent is not None:
                return
        if self._c.is_owner():
            return
        rref_id, fork_id = self._c.ids()
        raise RpcRuntimeError(
            f"User RRef with RRefId={_unique_id_text(rref_id)} and "
            f"ForkId={_unique_id_text(fork_id)} has been deleted. Cannot call {use} after "
            "deletion.")

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
        self._check_not_deleted("to_here() on it")
        agent = _current()
        try:
            return _value_of(self._c.to_here(_timeout(timeout)).wait())
        except _C.StatusError as e:
            raise _errors.translate(e, _describe_to(agent, self._c.owner_id()),
                                    f"to_here() of {self._describe()}") from None

    def local_value(self):
        """The value itself; on the owner only."""
        if not self.is_owner():
            rref_id, fork_id = self._c.ids()
            raise _errors.from_status(
                9,  # FAILED_PRECONDITION
                f"For UserRRef(rref_id={_unique_id_text(rref_id)}, "
                f"fork_id={_unique_id_text(fork_id)}), can't call localValue() on user "
                f"{get_worker_info()}. Call it on owner {self.owner()}")
        try:
            return _value_of(self._c.local_value())
        except _C.StatusError as e:
            raise _errors.translate(e, None, f"local_value() of {self._describe()}") from None

    def _get_type(self, timeout=UNSET_RPC_TIMEOUT, blocking=True):
        """The type of the value, asked of its owner once and remembered.
        blocking=False returns a torch.futures.Future of it: the first
        call's future, as torch returns it (a failed one is forgotten, so
        the next call asks again)."""
        future = getattr(self, "_type_future", None)
        if future is None:
            future = rpc_async(self._c.owner_id(), _rref_typeof_on_owner, args=(self,),
                               timeout=timeout)
            self._type_future = future

            def remember(f):
                try:
                    self._type = f.value()
                except Exception:  # noqa: BLE001  (the error stays the future's)
                    self._type_future = None
            future.add_done_callback(remember)
        if not blocking:
            return future
        known = getattr(self, "_type", None)
        return known if known is not None else future.wait()

    def _get_future(self):
        """A torch.futures.Future completed when the value exists on its
        owner (failed with the creating call's error)."""
        out = torch.futures.Future()
        created = self._c.created()

        def settle():
            try:
                created.wait()
            except _C.StatusError as e:
                _C.fail_torch_future(out, _errors.translate(e, None, f"creating {self._describe()}"))
            else:
                out.set_result(None)
        created.then(settle)
        return out

    def _get_profiling_future(self):
        """Inside a legacy profile, the future completed when this RRef's
        creation and its owner's events joined the caller's profile; a
        completed one for an RRef not made under a profile."""
        future = getattr(self, "_profiling_future", None)
        if future is None:
            future = torch.futures.Future()
            future.set_result(None)
        return future

    def backward(self, dist_autograd_ctx_id=-1, retain_graph=False):
        """Backward from the value (a scalar tensor) on its owner: in the
        distributed autograd context given, or with local autograd (into
        .grad) when it is -1, on the owner only."""
        if dist_autograd_ctx_id == -1 and not self.is_owner():
            raise RpcRuntimeError("User RRefs require 'dist_autograd_ctx_id' to be specified: "
                                  "without one, RRef.backward() runs local autograd, on the "
                                  "owner only")
        if self.is_owner():
            value = self.local_value()
            if not isinstance(value, torch.Tensor):
                raise RpcRuntimeError("RRef should contain a tensor for .backward(), not "
                                      f"{type(value).__name__}")
            if dist_autograd_ctx_id == -1:
                torch.autograd.backward(value, retain_graph=retain_graph)
                return
            from baton.distributed import autograd
            autograd.backward(dist_autograd_ctx_id, [value], retain_graph)
            return
        rpc_sync(self._c.owner_id(), _backward_on_owner,
                 args=(self, int(dist_autograd_ctx_id), bool(retain_graph)))

    def rpc_sync(self, timeout=UNSET_RPC_TIMEOUT):
        """rref.rpc_sync().method(*args): runs the method on the owner."""
        return _Proxy(self, rpc_sync, timeout)

    def rpc_async(self, timeout=UNSET_RPC_TIMEOUT):
        return _Proxy(self, rpc_async, timeout)

    def remote(self, timeout=UNSET_RPC_TIMEOUT):
        return _Proxy(self, remote, timeout)

    def __repr__(self):
        rref_id, fork_id = self._c.ids()
        if self.is_owner():
            return f"OwnerRRef({_unique_id_text(rref_id)})"
        return (f"UserRRef(RRefId = {_unique_id_text(rref_id)}, "
                f"ForkId = {_unique_id_text(fork_id)})")

    def __reduce__(self):
        raise RpcRuntimeError("Can not pickle rref in python pickler: an RRef is sent as an "
                              "argument or result of an RPC, not pickled by hand")

    @property
    def __class__(self):
        """What isinstance() sees besides the real type: in drop-in mode,
        while the agent runs (when a baton RRef can enter TorchScript), a
        subclass of torch's PyRRef too, as torch's RRef is one
        (_TorchVisibleRRef), so that TorchScript types a module attribute
        holding baton RRefs as RRef[T] when it infers it (its check is
        isinstance(value, PyRRef)) and then converts each at the boundary
        (_torch_rref). Otherwise, and for type() always, RRef."""
        if _agent is not None and _torch_rpc.installed():
            return _REPORTED_CLASS
        return RRef


_TorchPyRRef = getattr(getattr(torch._C, "_distributed_rpc", None), "PyRRef", None)
if _TorchPyRRef is not None:
    class _TorchVisibleRRef(RRef, _TorchPyRRef):
        """The class a baton RRef reports (RRef.__class__): never made, only
        asked by isinstance(); the real type of every baton RRef is RRef."""
    _REPORTED_CLASS = _TorchVisibleRRef
else:  # a torch built without RPC: TorchScript has no RRef type to infer
    _REPORTED_CLASS = RRef


def _unique_id_text(worker_and_local):
    """An RRef or fork id as torch prints it: its creator and the creator's
    count of ids before it. baton's ids also carry the creator's
    incarnation (docs/peer_failures.md), shown after a restart."""
    worker, local = worker_and_local
    incarnation, count = local >> 48, local & ((1 << 48) - 1)
    text = f"GloballyUniqueId(created_on={worker}, local_id={count - 1}"
    return text + (f", incarnation={incarnation})" if incarnation > 1 else ")")


def _torch_rref(rref: "RRef") -> Any:
    """torch's RRef for a baton RRef that enters TorchScript (drop-in mode;
    python/src/torch_agent.h): scripted code runs torch's RRef operators,
    which take torch's C++ RRef. On the owner, a torch OwnerRRef over the
    same value; on a user, a fork of one that the owner makes for it, by
    torch's own fork protocol (carried by baton's TorchAgent)."""
    if not _torch_rpc.installed():
        raise RpcRuntimeError("a baton RRef enters TorchScript in drop-in mode only "
                              "(python -m baton.torch_rpc): scripted code takes torch's RRefs")
    if rref.is_owner():
        return _torch_owner_rref_of(rref)
    return _C.torch_user_rref(rpc_sync(rref.owner(), _torch_fork_on_owner,
                                       args=(rref, get_worker_info().name)))


def _torch_fork_on_owner(rref, user):
    """On a baton RRef's owner: a torch OwnerRRef over its value, with a
    fork registered for the asking user (torch's fork protocol). A
    ScriptModule stays on its owner, as torch keeps it (its users' to_here()
    fails with this message): its class exists only where it was scripted."""
    if _initializing.is_set():
        # A user that finished init_rpc() first: torch's agent here starts
        # at the end of this worker's init_rpc().
        _ready.wait(timeout=600)
    value = rref.local_value()
    # A module scripted code returned is torch._C's, not torch.jit's.
    module = value._c if isinstance(value, torch.jit.ScriptModule) else value
    if isinstance(module, torch._C.ScriptModule) and _script_module_hint(value) is None:
        raise RpcRuntimeError(
            f"{module._type().qualified_name()} is an RRef to a ScriptModule. It can't be "
            f"sent through RPC from owner, {get_worker_info()}, to user, {user}. Call its "
            "methods on the owner (rref.rpc_sync().forward(...)) instead")
    return _C.torch_fork_for_user(_torch_owner_rref_of(rref))


def _torch_owner_rref_of(rref):
    """On a baton RRef's owner: a torch OwnerRRef over its value (the one
    that holds it, for a _ScriptValue)."""
    live, value = rref._c.local_value()
    if type(value) is _ScriptValue:
        return value.torch_rref
    value = _value_of((live, value))
    return _C.torch_owner_rref(value, _script_module_hint(value))


# The interface a ScriptModule owned here was given when an RRef of it was
# made (RRef(module, type_hint)): what scripted code on any worker sees it
# as. Keyed by the module, while it lives.
_script_module_hints: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _script_module_hint(value):
    if not isinstance(value, torch.jit.ScriptModule):
        return None
    return _script_module_hints.get(value)


def _torch_rref_from_fork(fork):
    return torch._C._distributed_rpc.PyRRef._deserialize(fork)


def _reduce_torch_rref(torch_rref):
    """A torch RRef (one scripted code returned) travels through baton's RPC
    as torch's RPC pickler sends it: a fork by torch's protocol."""
    return _torch_rref_from_fork, (torch_rref._serialize(),)


def _rref_typeof_on_owner(rref):
    """On an RRef's owner: its value's type (torch's function of the same
    name, which profiles name the call after)."""
    return type(rref.local_value())


def _rref_typeof_on_user(rref, timeout=UNSET_RPC_TIMEOUT, blocking=True):
    """On an RRef's user: its value's type, asked of the owner (torch's
    function of the same name)."""
    fut = rpc_async(rref.owner(), _rref_typeof_on_owner, args=(rref,), timeout=timeout)
    return fut.wait() if blocking else fut


def _backward_on_owner(rref, context_id, retain_graph):
    rref.backward(context_id, retain_graph)


_pickle.RREF_TYPES = (RRef,)
_pickle.WRAP_RREF = RRef._wrap
