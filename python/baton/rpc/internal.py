"""torch.distributed.rpc.internal: the names programs and tests import from
it that baton implements (the execution modes, the profiling key, the
Python function record)."""
import collections
import enum

from baton._errors import RemoteException  # noqa: F401

__all__ = ["RPCExecMode", "PythonUDF", "RemoteException", "_build_rpc_profiling_key"]


class RPCExecMode(enum.Enum):
    SYNC = "sync"
    ASYNC = "async"
    ASYNC_JIT = "async_jit"
    REMOTE = "remote"


# A Python function call as it travels: the function and its arguments.
PythonUDF = collections.namedtuple("PythonUDF", ["func", "args", "kwargs"])


def _build_rpc_profiling_key(exec_type: RPCExecMode, func_name: str, current_worker_name: str,
                             dst_worker_name: str) -> str:
    """The profiler's event name for a call, as torch names it:
    'rpc_async#fn(worker0 -> worker1)'."""
    return f"rpc_{exec_type.value}#{func_name}({current_worker_name} -> {dst_worker_name})"
