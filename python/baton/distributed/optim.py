"""DistributedOptimizer (torch.distributed.optim's API).

    opt = DistributedOptimizer(torch.optim.SGD, param_rrefs, lr=0.05)
    with dist_autograd.context() as cid:
        ...; dist_autograd.backward(cid, [loss]); opt.step(cid)

Each worker that owns parameters keeps one optimizer for them and steps it
with the context's gradients there; steps on one owner are serialized.
- SGD, Adam, AdamW, Adagrad and RMSprop (the fast path): baton's functional
  optimizers (dist_optim/functional_optimizer.h), which compute exactly what
  LibTorch's compute, stepped in C++ without pickling or the GIL.
- Any other torch.optim.Optimizer (custom ones included), as torch runs
  them: an instance on each owner over its parameters; a step puts the
  context's gradients into the parameters' .grad and calls its step().
"""
import itertools
import os
import threading

import torch

from baton import _C, _errors
from baton import rpc as _rpc

__all__ = ["DistributedOptimizer"]

_SUPPORTED = {
    torch.optim.SGD: "SGD",
    torch.optim.Adam: "Adam",
    torch.optim.AdamW: "AdamW",
    torch.optim.Adagrad: "Adagrad",
    torch.optim.RMSprop: "RMSprop",
}


# Keys of hosted optimizers: unique per creating process and object. Steps
# name the key, not the optimizer's RRef: an RRef sent to its owner on every
# step would cost a protocol message (the owner confirms the sender's fork).
_KEYS = itertools.count(1)
# Tells this process's keys from those of an earlier incarnation of its rank.
_PROCESS = os.urandom(8).hex()
# The owner steps through a function registered in C++
# (python/src/hosted_optimizer.h): no pickling and no GIL on the owner.
_STEP = _rpc.CppFunction(*_C.OPTIMIZER_STEP)


class _LocalOptimizer:
    """Lives on a parameter owner (created there by remote()); listed on the
    owner's agent under `key` while it lives."""

    def __init__(self, kind, kwargs, param_rrefs, key=None):
        self._params = [r.local_value() for r in param_rrefs]
        if key is None:
            key = f"local/{_PROCESS}/{next(_KEYS)}"
        try:
            self._opt = _C.HostedOptimizer(_rpc._current(), key, kind, kwargs, list(self._params))
        except _C.StatusError as e:
            raise _errors.translate(e, None, f"{kind} on this worker") from None

    def step(self, context_id):
        try:
            self._opt.step(int(context_id))
        except _C.StatusError as e:
            raise _errors.translate(e, None, "optimizer step") from None
        return True


class _TorchLocalOptimizer:
    """Any torch.optim.Optimizer class on a parameter owner (created there
    by remote()), stepped as torch's DistributedOptimizer steps one."""

    # Steps of every such optimizer in this process, one at a time: two
    # optimizers over one parameter would otherwise race on its .grad.
    _lock = threading.Lock()

    def __init__(self, optimizer_class, param_rrefs, args, kwargs):
        self._params = [r.local_value() for r in param_rrefs]
        self._opt = optimizer_class(self._params, *args, **kwargs)

    def step(self, context_id):
        from baton.distributed import autograd
        grads = autograd.get_gradients(context_id)
        with self._lock:
            for param, grad in grads.items():
                param.grad = grad
            self._opt.step()
        return True


def _step_torch_optimizer(optimizer_rref, context_id):
    return optimizer_rref.local_value().step(context_id)


class DistributedOptimizer:
    """optimizer_class: any torch.optim.Optimizer class (SGD, Adam, AdamW,
    Adagrad and RMSprop take the fast path); params_rref: RRefs of the
    parameters (on any workers); args, kwargs: the optimizer's options (lr,
    momentum, betas, ...)."""

    def __init__(self, optimizer_class, params_rref, *args, **kwargs):
        kind = _SUPPORTED.get(optimizer_class)
        if kind is None:
            self._init_torch(optimizer_class, params_rref, args, kwargs)
            return
        if args:
            if "lr" in kwargs or len(args) > 1:
                raise TypeError("pass the optimizer's options by keyword (lr=..., ...)")
            kwargs["lr"] = args[0]
        if "lr" not in kwargs and kind == "SGD":
            raise TypeError("torch.optim.SGD needs lr")
        kwargs = dict(kwargs)
        if "betas" in kwargs:
            kwargs["betas"] = tuple(float(b) for b in kwargs["betas"])
        by_owner = {}
        for r in params_rref:
            by_owner.setdefault(r.owner().name, []).append(r)
        if not by_owner:
            raise ValueError("DistributedOptimizer got no parameters")
        # Unique per creating process and object.
        creator = f"{_rpc.get_worker_info().name}/{_PROCESS}"
        self._keys = []
        self._optimizers = []
        for owner, rrefs in by_owner.items():
            key = f"{creator}/{next(_KEYS)}"
            self._keys.append(key)
            self._optimizers.append(
                _rpc.remote(owner, _LocalOptimizer, args=(kind, kwargs, rrefs, key)))
        for o in self._optimizers:  # an owner's refusal (bad option, parameter) surfaces here
            try:
                o._c.created().wait()
            except _C.StatusError as e:
                raise _errors.translate(e, o.owner().name, f"creating {kind} there") from None

    def _init_torch(self, optimizer_class, params_rref, args, kwargs):
        if not (isinstance(optimizer_class, type)
                and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"DistributedOptimizer needs a torch.optim.Optimizer class, not "
                            f"{optimizer_class!r}")
        by_owner = {}
        for r in params_rref:
            by_owner.setdefault(r.owner().name, []).append(r)
        if not by_owner:
            raise ValueError("DistributedOptimizer got no parameters")
        self._keys = None
        self._optimizers = [
            _rpc.remote(owner, _TorchLocalOptimizer,
                        args=(optimizer_class, rrefs, tuple(args), dict(kwargs)))
            for owner, rrefs in by_owner.items()]
        what = getattr(optimizer_class, "__qualname__", repr(optimizer_class))
        for o in self._optimizers:  # an owner's refusal (bad option, parameter) surfaces here
            try:
                o._c.created().wait()
            except _C.StatusError as e:
                raise _errors.translate(e, o.owner().name, f"creating {what} there") from None

    def step(self, context_id):
        """Steps every owner's optimizer with the context's gradients there,
        all at once; returns when all are done (raising the first error)."""
        if self._keys is None:
            futures = [_rpc.rpc_async(o.owner(), _step_torch_optimizer, args=(o, int(context_id)))
                       for o in self._optimizers]
            first = None
            for f in futures:
                try:
                    f.wait()
                except Exception as e:  # noqa: BLE001  (every owner's step is waited for)
                    first = first or e
            if first is not None:
                raise first
            return
        agent = _rpc._current()
        calls = [(o, _rpc._invoke(agent, o._c.owner_id(), _STEP, (key, int(context_id)), None,
                                  None)) for o, key in zip(self._optimizers, self._keys)]
        first = None
        for o, call in calls:
            try:
                call.wait()
            except _C.StatusError as e:
                first = first or _errors.translate(e, o.owner().name, "optimizer step")
        if first is not None:
            raise first
