"""torch.distributed.rpc.constants: the defaults of baton's RPC API."""

__all__ = ["UNSET_RPC_TIMEOUT", "DEFAULT_RPC_TIMEOUT_SEC", "DEFAULT_INIT_METHOD",
           "DEFAULT_NUM_WORKER_THREADS", "DEFAULT_SHUTDOWN_TIMEOUT"]

UNSET_RPC_TIMEOUT: float = -1.0  # a call's timeout: the agent's default
DEFAULT_RPC_TIMEOUT_SEC: float = 60.0
DEFAULT_INIT_METHOD: str = "env://"
# Accepted for compatibility: baton's executor sizes itself (docs/threading.md).
DEFAULT_NUM_WORKER_THREADS: int = 16
# shutdown()'s and _wait_all_workers()'s default: no time limit.
DEFAULT_SHUTDOWN_TIMEOUT: float = 0.0
