"""torch.distributed.rpc.internal: the names programs and tests import from
it that baton implements (the execution modes, the profiling key, the
Python function record), and the functions torch's C++ RPC handler looks up
here when drop-in mode makes baton torch's RPC agent (serialize,
deserialize, _run_function, _handle_exception; python/src/torch_agent.h)."""
import collections
import enum
import sys
import traceback
from typing import Any, List, Tuple

import torch

from baton import _pickle
from baton._errors import RemoteException  # noqa: F401

__all__ = ["RPCExecMode", "PythonUDF", "RemoteException", "_build_rpc_profiling_key",
           "_InternalRPCPickler", "_internal_rpc_pickler", "serialize", "deserialize",
           "_run_function", "_handle_exception"]


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


class _InternalRPCPickler:
    """The pickler of RPC calls (torch's _InternalRPCPickler): serialize()
    returns the pickle and the tensors taken out of it, which travel
    beside it; deserialize() puts them back. RRefs travel only as arguments
    or results of an RPC, where the agent counts them."""

    def serialize(self, obj: Any) -> Tuple[bytes, List[torch.Tensor]]:
        data, tensors, rrefs = _pickle.dumps(obj)
        if rrefs:
            raise RuntimeError("RRefs can only be pickled as arguments or results of an RPC "
                               "(RRef pickling is only allowed inside RPC calls)")
        return data, tensors

    def deserialize(self, binary_data: bytes, tensor_table: List[torch.Tensor]) -> Any:
        return _pickle.loads(binary_data, list(tensor_table), [])

    def _serialize_call(self, func, args, kwargs):
        """(pickle, tensors, rrefs) of a call, as the agent sends it."""
        return _pickle.dumps((func, args, kwargs))


_internal_rpc_pickler = _InternalRPCPickler()


# torch's C++ handler (PythonRpcHandler) takes these by name when it starts.
serialize = _internal_rpc_pickler.serialize
deserialize = _internal_rpc_pickler.deserialize


def _run_function(python_udf: Any) -> Any:
    """Runs a PythonUDF for torch's handler: its result, or a
    RemoteException that names this worker and carries the traceback."""
    try:
        if isinstance(python_udf, AttributeError):
            raise python_udf
        return python_udf.func(*python_udf.args, **python_udf.kwargs)
    except Exception as e:  # noqa: BLE001 (travels to the caller)
        from baton.rpc.api import get_worker_info
        text = f"On {get_worker_info()}:\n{e!r}\n{traceback.format_exc()}"
        print(text, file=sys.stderr)
        return _RemoteFailure(text, type(e))


# A Python function's failure as torch's handler passes it back.
_RemoteFailure = collections.namedtuple("_RemoteFailure", ["msg", "exception_type"])


def _handle_exception(result: Any) -> None:
    """Raises the exception a failed _run_function result stands for."""
    if isinstance(result, _RemoteFailure):
        try:
            exc = result.exception_type(result.msg)
        except BaseException as e:  # noqa: BLE001 (a constructor that wants other arguments)
            raise RuntimeError(
                f"Failed to create original exception type. Error msg was {e} Original "
                f"exception on remote side was {result.msg}") from e
        raise exc
