"""DistributedOptimizer (torch.distributed.optim's API).

    opt = DistributedOptimizer(torch.optim.SGD, param_rrefs, lr=0.05)
    with dist_autograd.context() as cid:
        ...; dist_autograd.backward(cid, [loss]); opt.step(cid)

Each worker that owns parameters keeps one optimizer for them and steps it
with the context's gradients there. The update rules are baton's functional
optimizers (dist_optim/functional_optimizer.h), which compute exactly what
LibTorch's SGD, Adam, AdamW, Adagrad and RMSprop compute; steps on one owner
are serialized.
"""
import itertools
import os

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


class DistributedOptimizer:
    """optimizer_class: torch.optim.SGD, Adam, AdamW, Adagrad or RMSprop;
    params_rref: RRefs of the parameters (on any workers); kwargs: the
    optimizer's options (lr, momentum, betas, ...)."""

    def __init__(self, optimizer_class, params_rref, *args, **kwargs):
        kind = _SUPPORTED.get(optimizer_class)
        if kind is None:
            names = ", ".join(f"torch.optim.{k}" for k in _SUPPORTED.values())
            raise ValueError(
                f"DistributedOptimizer supports {names}; not "
                f"{getattr(optimizer_class, '__qualname__', optimizer_class)!r}")
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

    def step(self, context_id):
        """Steps every owner's optimizer with the context's gradients there,
        all at once; returns when all are done (raising the first error)."""
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
