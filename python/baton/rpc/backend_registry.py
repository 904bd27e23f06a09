"""torch.distributed.rpc.backend_registry: backend names and options.

baton runs torch's backend names (TENSORPIPE) and its own (BATON) on its
agent; `construct_rpc_backend_options` builds the options init_rpc reads.

A program may register a backend of its own, as with torch:
`register_backend(name, construct_options_handler, init_backend_handler)`
adds BackendType[name]. init_rpc(backend=that) meets the other workers
through a torch.distributed store (from the options' init_method), then
calls init_backend_handler(store, name, rank, world_size,
rpc_backend_options), which returns the agent. RPC in this process runs on
baton's agent, so the handler wraps baton's: it starts it with
`init_backend(BackendType.TENSORPIPE, store, name, rank, world_size,
options)` (doing its own work around it) and returns what that returned.
As with torch, once the handler made an agent current, what it returns is
not used; a handler that made none and returns any agent but baton's gets a
TypeError when init_rpc makes it the current agent. The group is fixed at
the rendezvous: a world_size is required.
"""
import collections
import enum
from typing import Any, Callable

from baton.rpc import constants

__all__ = ["BackendType", "BackendValue", "backend_registered", "register_backend",
           "construct_rpc_backend_options", "init_backend"]

BackendValue = collections.namedtuple(
    "BackendValue", ["construct_rpc_backend_options_handler", "init_backend_handler"])

def _backend_type_repr(self) -> str:
    return f"BackendType.{self.name}"


class BackendType(enum.Enum):
    """torch's backend names (BackendType.TENSORPIPE,
    BackendType["TENSORPIPE"]), baton's (BATON), and those registered."""
    TENSORPIPE = "TENSORPIPE"
    BATON = "BATON"

    __repr__ = _backend_type_repr


def backend_registered(backend_name: str) -> bool:
    return backend_name in BackendType.__members__


def is_built_in(backend: Any) -> bool:
    """Whether `backend` (a BackendType member) is one baton serves itself
    rather than one a program registered."""
    return not isinstance(backend.value, BackendValue)


def register_backend(backend_name: str, construct_rpc_backend_options_handler: Callable,
                     init_backend_handler: Callable):
    """Adds BackendType[backend_name] (torch's function): the enum is
    rebuilt with the new member, so read it as backend_registry.BackendType
    (a name imported before still lists the old members, as with torch)."""
    global BackendType
    if backend_registered(backend_name):
        raise RuntimeError(f"RPC backend {backend_name}: already registered")
    members = {member.name: member.value for member in BackendType}
    members[backend_name] = BackendValue(
        construct_rpc_backend_options_handler=construct_rpc_backend_options_handler,
        init_backend_handler=init_backend_handler)
    BackendType = enum.Enum(value="BackendType", names=members)  # type: ignore[misc]
    BackendType.__repr__ = _backend_type_repr  # type: ignore[assignment]
    return BackendType[backend_name]


def is_backend(backend: Any) -> bool:
    """Whether `backend` is a member of BackendType, of the enum as it is or
    as it was before a registration rebuilt it (a name imported earlier)."""
    return (isinstance(backend, enum.Enum) and type(backend).__name__ == "BackendType"
            and backend_registered(backend.name)
            and BackendType[backend.name].value == backend.value)


def _check_member(backend: Any) -> None:
    if not is_backend(backend):
        raise TypeError(f"backend must be a BackendType, not {type(backend).__name__}")


def construct_rpc_backend_options(backend: Any,
                                  rpc_timeout: float = constants.DEFAULT_RPC_TIMEOUT_SEC,
                                  init_method: str = constants.DEFAULT_INIT_METHOD,
                                  **kwargs: Any):
    """The options init_rpc reads for `backend`: TensorPipeRpcBackendOptions
    for the built-in ones, what its handler builds for a registered one."""
    _check_member(backend)
    if not is_built_in(backend):
        return backend.value.construct_rpc_backend_options_handler(rpc_timeout, init_method,
                                                                   **kwargs)
    from baton.rpc.options import TensorPipeRpcBackendOptions
    return TensorPipeRpcBackendOptions(rpc_timeout=rpc_timeout, init_method=init_method,
                                       **kwargs)


def init_backend(backend: Any, *args: Any, **kwargs: Any):
    """Starts `backend`'s agent: (store, name, rank, world_size,
    rpc_backend_options), as torch's function. A built-in backend starts
    baton's agent over the store (rpc._init_rpc_backend) and returns it
    (rpc.api.RpcAgent); a registered one returns what its handler does."""
    _check_member(backend)
    if not is_built_in(backend):
        return backend.value.init_backend_handler(*args, **kwargs)
    from baton.rpc import api
    api._init_rpc_backend(backend, *args, **kwargs)
    return api._get_current_rpc_agent()
