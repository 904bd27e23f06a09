"""baton.nn.RemoteModule: torch.distributed.nn.RemoteModule's API.

    layer = RemoteModule("ps/cpu", torch.nn.Linear, args=(4, 2))
    y = layer(x)                          # forward runs on worker "ps"
    params = layer.remote_parameters()    # RRefs for DistributedOptimizer
"""
import torch

from baton import rpc as _rpc

__all__ = ["RemoteModule"]

# The attributes of a RemoteModule that travel when it is sent through RPC
# (torch's list; the rest of an nn.Module's state stays behind).
_REMOTE_MODULE_PICKLED_ATTRIBUTES = (
    "on", "device", "is_device_map_set", "is_scriptable", "generated_methods", "module_rref")


def _create(module_cls, args, kwargs, device):
    module = module_cls(*args, **kwargs)
    if device and device != "cpu":
        module = module.to(device)
    return module


def _forward(module_rref, args, kwargs):
    return module_rref.local_value()(*args, **kwargs)


def _parameter_rrefs(module_rref, recurse):
    return [_rpc.RRef(p) for p in module_rref.local_value().parameters(recurse)]


def _parse_remote_device(remote_device):
    worker, _, device = remote_device.partition("/")
    if not worker:
        raise ValueError(f"remote_device '{remote_device}' is not '<worker>/<device>'")
    if worker.startswith("rank:"):
        rank = worker[len("rank:"):]
        if not rank.isdigit():
            raise ValueError(f"remote_device '{remote_device}': bad rank")
        worker = int(rank)
    return worker, device or "cpu"


class RemoteModule(torch.nn.Module):
    """A module created and run on another worker. remote_device is
    "<worker name>/<device>" or "rank:<n>/<device>"."""

    def __init__(self, remote_device, module_cls, args=None, kwargs=None):
        super().__init__()
        self.on, self.device = _parse_remote_device(remote_device)
        self.module_rref = _rpc.remote(
            self.on, _create, args=(module_cls, tuple(args or ()), dict(kwargs or {}), self.device))
        self.is_scriptable = False

    def forward(self, *args, **kwargs):
        return _rpc.rpc_sync(self.on, _forward, args=(self.module_rref, args, kwargs))

    def forward_async(self, *args, **kwargs):
        return _rpc.rpc_async(self.on, _forward, args=(self.module_rref, args, kwargs))

    def remote_parameters(self, recurse=True):
        return _rpc.rpc_sync(self.on, _parameter_rrefs, args=(self.module_rref, recurse))

    def get_module_rref(self):
        return self.module_rref

    def _unsupported(self, *args, **kwargs):
        raise ValueError("this method is not supported on a RemoteModule: "
                         "call it on the module itself through get_module_rref()")

    parameters = named_parameters = buffers = named_buffers = children = _unsupported
    cuda = cpu = to = half = float = double = type = share_memory = _unsupported
    state_dict = load_state_dict = apply = zero_grad = _unsupported


# torch's base class name (its TorchScript interface argument aside).
_RemoteModule = RemoteModule
