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
from typing import Any, Dict, Set, Tuple

from baton import _C, _errors
from baton.rpc import _current

__all__ = ["context", "backward", "get_gradients"]


def _get_debug_info():
    """torch's debug counts of distributed autograd on this worker (values
    are strings): the contexts alive here."""
    return {"num_autograd_contexts": str(len(_current().live_autograd_contexts()))}


class _SendFunction:
    """A send function of a context: where the gradients that come back for
    one message's tensors go (torch's SendRpcBackward node, as seen from
    Python)."""

    def __init__(self, next_functions):
        self._next = tuple(next_functions)

    @property
    def next_functions(self) -> Tuple[Tuple[Any, int], ...]:
        return self._next

    def name(self) -> str:
        return "torch::distributed::autograd::SendRpcBackward"


class DistAutogradContext:
    """What a context recorded on this worker, when it was retrieved
    (torch's DistAutogradContext): its id, the workers it exchanged messages
    with, its send functions and its recv functions (autograd nodes), by
    message id."""

    def __init__(self, described):
        self._id, workers, sends, recvs = described
        self._workers = set(workers)
        self._sends = {mid: _SendFunction(edges) for mid, edges in sends}
        self._recvs = dict(recvs)

    def _context_id(self) -> int:
        return self._id

    def _known_worker_ids(self) -> Set[int]:
        return set(self._workers)

    def _send_functions(self) -> Dict[int, _SendFunction]:
        return dict(self._sends)

    def _recv_functions(self) -> Dict[int, Any]:
        return dict(self._recvs)


def _retrieve_context(context_id: int) -> DistAutogradContext:
    """The context with that id on this worker; RuntimeError if it has none
    (never made here, or released)."""
    try:
        return DistAutogradContext(_current().describe_autograd_context(int(context_id)))
    except _C.StatusError as e:
        raise _errors.translate(e) from None


def _current_context() -> DistAutogradContext:
    """The context current on this thread; RuntimeError outside one."""
    context_id = _current().current_context_id()
    if context_id == 0:
        raise RuntimeError("Current thread doesn't have a valid autograd context. Please wrap "
                           "your code using: `with torch.distributed.autograd.context() as "
                           "context_id` to generate a valid context")
    return _retrieve_context(context_id)


class context:
    """A distributed autograd context, current on this thread inside `with`;
    released on every worker that took part when the block ends. Contexts do
    not nest (as in torch)."""

    def __enter__(self):
        agent = _current()
        if agent.current_context_id() != 0:
            raise RuntimeError("Already have an autograd context id for this thread: "
                               "distributed autograd contexts do not nest")
        self._c = agent.autograd_context()
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
