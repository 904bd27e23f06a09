"""How Python values are packed for baton's wire (the Python side of PyObj).

A value is pickled with its tensors and RRefs taken out: tensors travel
through baton's tensor codec (no copy to hand them to the runtime, shared
memory for large ones on one host, views send only what they view) and RRefs as
forks of baton's RRef protocol. Functions and classes are pickled by
reference, as torch.distributed.rpc does, so the callee must be able to
import them (for a job started by baton-run or mp.spawn, __main__ is the same
script on every worker).
"""
import copyreg
import importlib
import io
import pickle
from typing import Any, Callable, List

import torch

# Filled in by baton.rpc (the RRef class), to keep this module free of cycles.
RREF_TYPES = ()
WRAP_RREF = None

_PLAIN, _PARAMETER = 0, 1

# Layouts and devices baton's tensor codec carries (with their autograd
# edges); others take torch's own reducers. CUDA tensors arrive on the
# device the sender's device map names, through CUDA IPC between the
# processes of one host where the build has it (docs/cuda.md).
_CODEC_LAYOUTS = (torch.strided, torch.sparse_coo)
_CODEC_DEVICES = ("cpu", "cuda")

_TORCHSCRIPT_PREFIX = "__torch__."


def _script_function(qualified_name):
    """The TorchScript function (@torch.jit.script) of that qualified name,
    from its Python module: functions travel by name, as Python functions
    do, and the callee imports the module that defines them."""
    path = qualified_name[len(_TORCHSCRIPT_PREFIX):] if qualified_name.startswith(
        _TORCHSCRIPT_PREFIX) else qualified_name
    module_name, _, name = path.rpartition(".")
    # TorchScript leaves __main__ out of the names of the script's functions.
    fn = getattr(importlib.import_module(module_name or "__main__"), name, None)
    # @async_execution over @torch.jit.script: the module holds the wrapper.
    fn = getattr(fn, "_wrapped_async_rpc_function", fn)
    if not isinstance(fn, torch.jit.ScriptFunction):
        raise pickle.UnpicklingError(f"TorchScript function {qualified_name} is not defined at "
                                     f"the top level of module {module_name}")
    return fn


def _reduce_script_function(fn):
    return _script_function, (fn.qualified_name,)


# torch's reducers, and TorchScript functions by name (torch refuses to
# pickle them; its RPC sends their qualified name).
_DISPATCH = copyreg.dispatch_table.copy()
_DISPATCH[torch.jit.ScriptFunction] = _reduce_script_function


def register_reducer(cls, reducer):
    """How objects of exactly type `cls` travel through RPC (pickling them
    by hand takes the class's own way); what torch's internal pickler's
    _register_reducer does."""
    _DISPATCH[cls] = reducer


def _script_module_from(saved):
    return torch.jit.load(io.BytesIO(saved))


class _Pickler(pickle.Pickler):
    dispatch_table = _DISPATCH

    def __init__(self, buffer, tensors, rrefs):
        super().__init__(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self._tensors = tensors
        self._rrefs = rrefs
        # id(obj) -> persistent id: an object met twice travels once (pickle
        # does not memoize persistent ids). The objects stay referenced by
        # the lists, so their ids are not reused meanwhile.
        self._seen = {}

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor) or (RREF_TYPES and isinstance(obj, RREF_TYPES)):
            pid = self._seen.get(id(obj))
            if pid is None:
                pid = self._new_id(obj)
                if pid is not None:
                    self._seen[id(obj)] = pid
            return pid
        return None

    def _new_id(self, obj):
        if isinstance(obj, torch.Tensor):
            kind = type(obj)
            if kind is torch.nn.Parameter:
                tag = _PARAMETER
            elif kind is torch.Tensor:
                tag = _PLAIN
            else:
                return None  # a tensor subclass pickles itself
            if (obj.is_quantized or obj.device.type not in _CODEC_DEVICES or
                    obj.layout not in _CODEC_LAYOUTS or
                    (obj.device.type == "cuda" and obj.layout != torch.strided)):
                return None  # quantized, other devices' and other sparse tensors pickle themselves
            self._tensors.append(obj)
            return ("t", len(self._tensors) - 1, tag, obj.requires_grad and obj.is_leaf)
        if RREF_TYPES and isinstance(obj, RREF_TYPES):
            obj._check_not_deleted("fork an UserRRef")
            self._rrefs.append(obj._c)
            return ("r", len(self._rrefs) - 1)
        return None


class NotSendable(RuntimeError):
    """A value that can never travel through RPC (the message says why):
    raised as it is, not retried another way."""


# Called with each ScriptModule before it is saved to travel; one raises
# NotSendable to refuse it (baton.nn: a scripted RemoteModule).
SCRIPT_MODULE_CHECKS: List[Callable[[Any], None]] = []


class _ScriptModulePickler(_Pickler):
    """The pickler for values that hold a ScriptModule (of any class:
    scripted modules and subclasses of torch.jit.ScriptModule), which
    travels as torch.jit.save writes it, as torch's RPC sends it. dumps()
    takes it only when the plain pickler failed: reducer_override costs a
    Python call for every object that is not of a type pickle writes itself."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.jit.ScriptModule):
            for check in SCRIPT_MODULE_CHECKS:
                check(obj)
            saved = io.BytesIO()
            torch.jit.save(obj, saved)
            return _script_module_from, (saved.getvalue(),)
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    def __init__(self, buffer, tensors, rrefs):
        super().__init__(buffer)
        self._tensors = tensors
        self._rrefs = rrefs

    def persistent_load(self, pid):
        if pid[0] == "t":
            _, index, tag, leaf_requires_grad = pid
            t = self._tensors[index]
            if t.grad_fn is None:
                if tag == _PARAMETER:
                    return torch.nn.Parameter(t, requires_grad=leaf_requires_grad)
                if leaf_requires_grad and not t.requires_grad:
                    t.requires_grad_(True)
            return t
        if pid[0] == "r":
            return WRAP_RREF(self._rrefs[pid[1]])
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def dumps(obj):
    """obj -> (bytes, [Tensor], [baton._C.RRef])."""
    tensors, rrefs = [], []
    buffer = io.BytesIO()
    try:
        _Pickler(buffer, tensors, rrefs).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise TypeError(f"baton cannot send {_describe(obj)}: {e}") from e
    except (RuntimeError, torch.jit.Error) as e:
        # A ScriptModule inside refuses the plain pickler (torch's
        # RuntimeError, or the TorchScript error its own exported
        # __getstate__ raises): once more, saving it as torch's RPC does. Nothing
        # the failed attempt collected is kept; any other error stays as it
        # was raised.
        tensors, rrefs = [], []
        buffer = io.BytesIO()
        try:
            _ScriptModulePickler(buffer, tensors, rrefs).dump(obj)
        except NotSendable:
            raise
        except Exception:  # noqa: BLE001  (the first error is the one to see)
            raise e from None
    return buffer.getvalue(), tensors, rrefs


def loads(data, tensors, rrefs):
    if not tensors and not rrefs:
        return pickle.loads(data)  # no persistent ids were written
    return _Unpickler(io.BytesIO(data), tensors, rrefs).load()


def _describe(obj):
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001  (a repr that raises still gets named)
        text = f"<{type(obj).__qualname__} object>"
    return text if len(text) <= 120 else text[:117] + "..."

