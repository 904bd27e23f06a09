"""torch.distributed.rpc.api: the calls of baton's RPC API, where torch's
programs import them from."""
from baton.rpc import (  # noqa: F401
    RRef, WorkerInfo, get_worker_info, get_worker_infos, init_rpc, remote, rpc_async, rpc_sync,
    shutdown)

__all__ = ["RRef", "WorkerInfo", "get_worker_info", "get_worker_infos", "init_rpc", "remote",
           "rpc_async", "rpc_sync", "shutdown"]
