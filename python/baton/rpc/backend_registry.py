"""torch.distributed.rpc.backend_registry: backend names and options.

baton has one backend. Every name torch defines is accepted by init_rpc
and runs on baton's agent; `construct_rpc_backend_options` builds the
options init_rpc reads.
"""
import enum
from typing import Any

from baton.rpc import constants

__all__ = ["BackendType", "construct_rpc_backend_options", "backend_registered"]


class BackendType(enum.Enum):
    """torch's backend names (BackendType.TENSORPIPE,
    BackendType["TENSORPIPE"]); both run on baton's agent."""
    TENSORPIPE = "TENSORPIPE"
    BATON = "BATON"

    def __repr__(self) -> str:
        return f"BackendType.{self.name}"


def backend_registered(backend_name: str) -> bool:
    return backend_name in BackendType.__members__


def construct_rpc_backend_options(backend: Any,
                                  rpc_timeout: float = constants.DEFAULT_RPC_TIMEOUT_SEC,
                                  init_method: str = constants.DEFAULT_INIT_METHOD,
                                  **kwargs: Any):
    """The options init_rpc reads (TensorPipeRpcBackendOptions), as torch's
    function builds them for a backend; `backend` is any BackendType."""
    if not isinstance(backend, BackendType):
        raise TypeError(f"backend must be a BackendType, not {type(backend).__name__}")
    from baton.rpc.options import TensorPipeRpcBackendOptions
    return TensorPipeRpcBackendOptions(rpc_timeout=rpc_timeout, init_method=init_method,
                                       **kwargs)
