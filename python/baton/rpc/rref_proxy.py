"""torch.distributed.rpc.rref_proxy: what RRef.rpc_sync(), rpc_async() and
remote() return; calling a method on it calls that method on the RRef's
owner."""
from baton.rpc.api import _Proxy as RRefProxy  # noqa: F401

__all__ = ["RRefProxy"]
