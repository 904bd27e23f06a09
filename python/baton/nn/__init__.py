"""baton.nn.RemoteModule: torch.distributed.nn.RemoteModule's API.

    layer = RemoteModule("ps/cpu", torch.nn.Linear, args=(4, 2))
    y = layer(x)                          # forward runs on worker "ps"
    params = layer.remote_parameters()    # RRefs for DistributedOptimizer

As torch's: the module is created on the remote worker; forward and
forward_async are installed on each RemoteModule (and on every copy that
arrives through RPC); train()/eval() set the remote module's mode; the
nn.Module methods that would act on a local copy raise ValueError. A
RemoteModule travels as an argument or result of an RPC with exactly the
attributes in _REMOTE_MODULE_PICKLED_ATTRIBUTES; pickling one by hand
(torch.save) raises RuntimeError.

TorchScript (drop-in mode): made with torch's `_module_interface_cls` (a
@torch.jit.interface class), a RemoteModule is created as a scripted module
held by an RRef typed by that interface, and its forward methods are the
ones torch's template instantiator generates for the interface (scriptable:
torch.jit.script(remote_module) works, and scripted code calls it through
TorchScript's RPC). A scripted RemoteModule is not sent through RPC
(RuntimeError): send its module_rref and make a RemoteModule there.
"""
import copy
import types
from typing import Any, Dict, List, Optional, Tuple, Type

import torch

from baton import _pickle
from baton import rpc as _rpc

__all__ = ["RemoteModule"]

# The attributes of a RemoteModule that travel when it is sent through RPC
# (torch's list; the rest of an nn.Module's state stays behind).
_REMOTE_MODULE_PICKLED_ATTRIBUTES = (
    "on", "device", "is_device_map_set", "is_scriptable", "generated_methods", "module_rref")


def _create(module_cls, args, kwargs, device):
    """Runs on the remote worker: the module itself."""
    module = module_cls(*args, **kwargs)
    if not isinstance(module, torch.nn.Module):
        raise ValueError("Expect `module_cls(*args, **kwargs)` returns an instance of "
                         f"<class nn.Module>, but it returns an instance of {type(module)}.")
    if device and device != "cpu":
        module = module.to(device)
    return module


def _instantiate_template(module_interface_cls, enable_moving_cpu_tensors_to_cuda):
    """Runs on the remote worker: compiles the scripted _remote_forward that
    the generated methods call there (torch's instantiator)."""
    from torch.distributed.nn.jit import instantiator
    instantiator.instantiate_scriptable_remote_module_template(
        module_interface_cls, enable_moving_cpu_tensors_to_cuda)


def _generated_methods(on, device, module_interface_cls):
    """The scriptable forward methods torch's instantiator generates for
    the interface, here and (for the _remote_forward they call) on `on`."""
    from torch.distributed.nn.jit import instantiator
    to_cuda = torch.device(device).type == "cuda"
    generated = instantiator.instantiate_scriptable_remote_module_template(
        module_interface_cls, to_cuda)
    _rpc.rpc_sync(on, _instantiate_template, args=(module_interface_cls, to_cuda))
    return tuple(generated._generated_methods)


def _create_with_interface(module_cls, args, kwargs, device, module_interface_cls):
    """Runs on the remote worker: the module, scripted, in an RRef that
    scripted code sees through `module_interface_cls`."""
    module = torch.jit.script(_create(module_cls, args, kwargs, device))
    return _rpc.RRef(module, module_interface_cls)


def _to_cpu(value):
    """`value` with every tensor in it (nested in tuples, lists and dicts)
    moved to the CPU, each container of its own type where that type can be
    rebuilt from its items (else a plain tuple or list)."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, (tuple, list)):
        items = [_to_cpu(v) for v in value]
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*items)
        try:
            return type(value)(items)
        except TypeError:
            return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        out = copy.copy(value)  # keeps a defaultdict's factory, an OrderedDict's order
        for k, v in value.items():
            out[k] = _to_cpu(v)
        return out
    return value


def _forward(module_rref, device, is_device_map_set, args, kwargs):
    """Runs on the module's worker, as torch's _remote_forward: for a module
    on a GPU, the tensors among the arguments move to its device, and unless
    the caller has a device map for this worker the tensors in the result
    come back through the CPU (torch moves those of a tuple result; baton
    those nested anywhere in it, so a single tensor stays one tensor).
    As torch's, it calls the module's forward(), so the module's forward
    hooks do not run."""
    module = module_rref.local_value()
    if torch.device(device).type != "cuda":
        return module.forward(*args, **kwargs)
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    out = module.forward(*args, **kwargs)
    return out if is_device_map_set else _to_cpu(out)


def _parameter_rrefs(module_rref, recurse):
    return [_rpc.RRef(p) for p in module_rref.local_value().parameters(recurse)]


def _set_training(module_rref, mode):
    module_rref.local_value().train(mode)


def _parse_remote_device(remote_device):
    """(worker name or rank, device) of "<worker>/<device>",
    "rank:<n>/<device>" or "<worker>" (the CPU), with torch's errors
    (torch.distributed.remote_device): ValueError for the form, and
    torch.device's RuntimeError for the device."""
    parse_error = (f"Could not parse remote_device: {remote_device}. The valid format is "
                   "'<workername>/<device>' or 'rank:<rank>/<device>'")
    if not isinstance(remote_device, str):
        raise TypeError(f"Invalid type for remote_device: {type(remote_device)}")
    fields = remote_device.split("/")
    if len(fields) == 2:
        worker, device = fields
    elif len(fields) == 1:
        worker, device = fields[0], "cpu"
    else:
        raise ValueError(parse_error)
    if not worker:
        raise ValueError(parse_error)
    device = torch.device(device)
    parts = worker.split(":")
    if len(parts) == 2:
        if parts[0] != "rank" or not parts[1].isdigit():
            raise ValueError(parse_error)
        worker = int(parts[1])
    elif len(parts) > 2:
        raise ValueError(parse_error)
    return worker, str(device)


# The methods installed on every RemoteModule (torch's generated methods).
def forward_async(self, *args, **kwargs):
    """Runs the remote module's forward; returns a torch.futures.Future."""
    return _rpc.rpc_async(self.module_rref.owner(), _forward,
                          args=(self.module_rref, self.device, self.is_device_map_set, args,
                                kwargs))


def forward(self, *args, **kwargs):
    """Runs the remote module's forward and returns its result."""
    return _rpc.rpc_sync(self.module_rref.owner(), _forward,
                         args=(self.module_rref, self.device, self.is_device_map_set, args,
                               kwargs))


_GENERATED_METHODS = (forward_async, forward)


def _not_supported(name):
    hint = ("Please use ``remote_parameters`` instead." if name == "parameters" else
            "Call it on the module itself, through get_module_rref().")

    def method(self, *args, **kwargs):
        raise ValueError(f"Method ``{name}`` not supported for RemoteModule. {hint}")
    method.__name__ = name
    return method


class _RemoteModule(torch.nn.Module):
    """A module created and run on another worker. remote_device is
    "<worker name>/<device>" or "rank:<n>/<device>"."""

    def __init__(self, remote_device: str, module_cls: Type[torch.nn.Module],
                 args: Optional[Tuple] = None, kwargs: Optional[Dict[str, Any]] = None,
                 _module_interface_cls: Any = None):
        super().__init__()
        on, device = _parse_remote_device(remote_device)
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        if _module_interface_cls is None:
            self._attach(on, device, _rpc.remote(on, _create, args=(module_cls, args, kwargs,
                                                                    device)))
            return
        methods = _generated_methods(on, device, _module_interface_cls)
        module_rref = _rpc.rpc_sync(on, _create_with_interface,
                                    args=(module_cls, args, kwargs, device, _module_interface_cls))
        self._attach(on, device, module_rref, methods)

    @classmethod
    def init_from_module_rref(cls, remote_device: str, module_rref: "_rpc.RRef",
                              _module_interface_cls: Any = None) -> "RemoteModule":
        """A RemoteModule over a module that already lives on its worker
        (module_rref, as get_module_rref() of another RemoteModule gives);
        scriptable with the interface the module was made with."""
        remote_module = object.__new__(RemoteModule)
        torch.nn.Module.__init__(remote_module)
        on, device = _parse_remote_device(remote_device)
        methods = None
        if _module_interface_cls is not None:
            methods = _generated_methods(on, device, _module_interface_cls)
        remote_module._attach(on, device, module_rref, methods)
        return remote_module

    def _attach(self, on, device, module_rref, scripted_methods=None):
        self.on, self.device = on, device
        # Whether this worker has a device map for the module's: then the
        # result's tensors travel as they are, not through the CPU.
        agent = _rpc._get_current_rpc_agent()
        self.is_device_map_set = bool(agent._get_device_map(agent.get_worker_info(on)))
        self.is_scriptable = scripted_methods is not None
        self.generated_methods = scripted_methods or _GENERATED_METHODS
        self.module_rref = module_rref
        self._install_generated_methods()

    def _install_generated_methods(self):
        for method in self.generated_methods:
            # Exported: torch.jit.script(remote_module) compiles them (the
            # scriptable ones; baton's own take *args and are not).
            setattr(self, method.__name__, types.MethodType(torch.jit.export(method), self))

    def remote_parameters(self, recurse: bool = True) -> List["_rpc.RRef"]:
        """RRefs of the remote module's parameters (for DistributedOptimizer)."""
        return _rpc.rpc_sync(self.module_rref.owner(), _parameter_rrefs,
                             args=(self.module_rref, recurse))

    def get_module_rref(self) -> "_rpc.RRef":
        return self.module_rref

    def train(self, mode: bool = True):
        """Sets the remote module's training mode."""
        _rpc.rpc_sync(self.module_rref.owner(), _set_training, args=(self.module_rref, mode))
        self.training = mode
        return self

    def eval(self):
        return self.train(False)

    @torch.jit.export
    def __getstate__(self):
        raise RuntimeError("Cannot pickle RemoteModule in python pickler. RemoteModule can only "
                           "be pickled when using RPC")

    @torch.jit.export
    def __setstate__(self, state):
        raise RuntimeError("Cannot unpickle RemoteModule in python pickler. RemoteModule can "
                           "only be unpickled when using RPC")

    for _name in ("register_buffer", "register_parameter", "add_module", "apply", "cuda", "ipu",
                  "xpu", "cpu", "type", "float", "double", "half", "bfloat16", "to",
                  "register_backward_hook", "register_full_backward_hook",
                  "register_forward_pre_hook", "register_forward_hook", "state_dict",
                  "load_state_dict", "parameters", "named_parameters", "buffers",
                  "named_buffers", "children", "named_children", "modules", "named_modules",
                  "requires_grad_", "zero_grad", "share_memory", "extra_repr"):
        locals()[_name] = _not_supported(_name)
    del _name


class RemoteModule(_RemoteModule):
    """torch.distributed.nn.RemoteModule (see _RemoteModule)."""


def _remote_module_receiver(*attributes):
    """Rebuilds a RemoteModule sent through RPC: its pickled attributes, and
    the generated methods installed again."""
    remote_module = object.__new__(RemoteModule)
    remote_module.__dict__.update(zip(_REMOTE_MODULE_PICKLED_ATTRIBUTES, attributes))
    remote_module._install_generated_methods()
    return remote_module


def _remote_module_reducer(remote_module):
    return (_remote_module_receiver,
            tuple(remote_module.__dict__[name] for name in _REMOTE_MODULE_PICKLED_ATTRIBUTES))


def _refuse_scripted_remote_module(module):
    """A scripted RemoteModule holds its module_rref in TorchScript, where
    no fork of it can be made for the receiver (torch refuses it too, by the
    same test: a scripted module with a module_rref attribute)."""
    if hasattr(module._c, "module_rref"):
        raise _pickle.NotSendable(
            "Passing a script RemoteModule over RPC is not supported. Please create a "
            "RemoteModule in the sender, send the `module_rref` to the receiver, and create a "
            "new instance on the receiver end by passing this `module_rref`.")


_pickle.SCRIPT_MODULE_CHECKS.append(_refuse_scripted_remote_module)
_pickle.register_reducer(_RemoteModule, _remote_module_reducer)
_pickle.register_reducer(RemoteModule, _remote_module_reducer)
