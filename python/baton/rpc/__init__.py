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
from baton.rpc.api import *  # noqa: F401,F403
from baton.rpc.api import (  # noqa: F401  (used by baton's other modules and tests)
    CppFunction, RemoteException, RpcError, RpcRuntimeError, RpcTimeoutError,
    WorkerUnavailableError, _current, _invoke, _Proxy, _torch_future)
from baton.rpc.api import (  # noqa: F401  (torch.distributed.rpc's private names)
    _delete_all_user_and_unforked_owner_rrefs, _get_current_rpc_agent, _init_rpc_backend, _get_debug_info, _is_current_rpc_agent_set,
    _rref_context_get_debug_info, _set_rpc_timeout, _set_and_start_rpc_agent,
    _set_profiler_node_id, _enable_jit_rref_pickle, _disable_jit_rref_pickle)
from baton.rpc._profiling import _server_process_global_profile  # noqa: E402,F401
from baton.rpc import (  # noqa: E402,F401  (torch.distributed.rpc layout)
    api, backend_registry, constants, functions, internal, options, rref_proxy)
