"""torch.distributed.rpc.internal: the names programs and tests import from
it that baton implements (the execution modes, the profiling key, the
Python function record)."""
import collections
import enum
from typing import Any, List, Tuple

import torch

from baton import _pickle
from baton._errors import RemoteException  # noqa: F401

__all__ = ["RPCExecMode", "PythonUDF", "RemoteException", "_build_rpc_profiling_key",
           "_InternalRPCPickler", "_internal_rpc_pickler"]


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
