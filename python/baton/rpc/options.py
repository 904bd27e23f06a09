"""torch.distributed.rpc.options: the backend options init_rpc reads."""
from baton.rpc.api import RpcBackendOptions, TensorPipeRpcBackendOptions  # noqa: F401

__all__ = ["RpcBackendOptions", "TensorPipeRpcBackendOptions"]
