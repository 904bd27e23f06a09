"""Distributed autograd (torch.distributed.autograd's API).

    with dist_autograd.context() as context_id:
        loss = rpc.rpc_sync("ps", forward, args=(x,)).sum()
        dist_autograd.backward(context_id, [loss])
        grads = dist_autograd.get_gradients(context_id)   # {tensor: grad}, this worker's

Python's autograd is LibTorch's engine in this process, so baton's send and
recv functions (dist_autograd/dist_autograd.h) record Python forward passes
as they record C++ ones: inside a context, every RPC's tensors that require
grad are linked to the backward pass on the worker that sent them.
"""
from baton import _C, _errors
from baton.rpc import _current

__all__ = ["context", "backward", "get_gradients"]


def _get_debug_info():
    """torch's debug counts of distributed autograd on this worker (values
    are strings): the contexts alive here."""
    return {"num_autograd_contexts": str(len(_current().live_autograd_contexts()))}


class context:
    """A distributed autograd context, current on this thread inside `with`;
    released on every worker that took part when the block ends."""

    def __enter__(self):
        self._c = _current().autograd_context()
        return self._c.id()

    def __exit__(self, exc_type, exc, tb):
        self._c.release()
        return False


def backward(context_id, roots, retain_graph=False):
    """Runs the backward pass from `roots` (scalars) across every worker."""
    if not isinstance(roots, (list, tuple)):
        raise TypeError("roots must be a list of tensors")
    try:
        _current().backward(int(context_id), list(roots), bool(retain_graph), None)
    except _C.StatusError as e:
        raise _errors.translate(e, None, f"backward of context {context_id}") from None


def get_gradients(context_id):
    """{tensor: gradient} for the leaves on this worker that got a gradient."""
    try:
        return dict(_current().get_gradients(int(context_id)))
    except _C.StatusError as e:
        raise _errors.translate(e, None, f"get_gradients of context {context_id}") from None
