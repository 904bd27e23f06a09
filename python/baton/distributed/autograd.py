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
import operator
import threading
from typing import Any, Dict, List, Set, Tuple

import torch
from torch.jit import _builtins as _jit_builtins

from baton import _C, _errors
from baton.rpc import _current, get_worker_info

__all__ = ["context", "backward", "get_gradients"]


def _init(worker_id: int) -> None:
    """Distributed autograd's setup for this worker id (torch's function;
    init_rpc calls it). baton's contexts live in its agent, which init_rpc
    starts; what this sets up is torch's own container, which TorchScript's
    RPC operators consult in drop-in mode (python/src/torch_agent.h)."""
    if not isinstance(worker_id, int) or not 0 <= worker_id <= 0xFFFF:
        raise ValueError(f"worker_id needs to be in the range [0, 65535], not {worker_id!r}")
    from baton import torch_rpc
    if torch_rpc.installed():
        torch._C._distributed_autograd._init(worker_id)


def _get_debug_info() -> Dict[str, str]:
    """torch's debug counts of distributed autograd on this worker (values
    are strings): the contexts alive here, and the backward passes running
    here (one started here until it ends, the local part of one started
    elsewhere while it runs)."""
    agent = _current()
    return {"num_current_backward_passes": str(agent.backward_passes_running()),
            "num_autograd_contexts": str(len(agent.live_autograd_contexts()))}


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


def _first(pair):
    return pair[0]


class DistAutogradContext:
    """A context on this worker as torch's DistAutogradContext shows it: its
    id, the workers it exchanged messages with, its send functions and its
    recv functions (autograd nodes), by message id. Each accessor reads what
    the context holds now; once the context is released here, what it held
    when last read."""

    def __init__(self, described):
        self._id = described[0]
        self._take(described)

    def _take(self, described):
        _, workers, sends, recvs = described
        self._workers = set(workers)
        # By message id, as torch's are: a worker's ids grow, so the first
        # send function is its first message's (a nested call's before the
        # response that follows it).
        self._sends = {mid: _SendFunction(edges) for mid, edges in sorted(sends, key=_first)}
        self._recvs = dict(sorted(recvs, key=_first))

    def _refresh(self):
        try:
            self._take(_current().describe_autograd_context(self._id))
        except (_C.StatusError, RuntimeError):
            pass  # released here (or RPC shut down): what it last held

    def _context_id(self) -> int:
        return self._id

    def _known_worker_ids(self) -> Set[int]:
        self._refresh()
        return set(self._workers)

    def _send_functions(self) -> Dict[int, _SendFunction]:
        self._refresh()
        return dict(self._sends)

    def _recv_functions(self) -> Dict[int, Any]:
        self._refresh()
        return dict(self._recvs)


def _retrieve_context(context_id: int) -> DistAutogradContext:
    """The context with that id on this worker; RuntimeError if it has none
    (never made here, or released)."""
    try:
        return DistAutogradContext(_current().describe_autograd_context(int(context_id)))
    except _C.StatusError as e:
        raise _errors.translate(e) from None


# Contexts made by _new_context(), until _release_context(): id -> (the
# context, the thread that made it and has it current).
_unmanaged: Dict[int, Tuple[Any, int]] = {}


def _new_context() -> DistAutogradContext:
    """A new context, current on this thread until _release_context(id) on
    this thread (torch's; `with context()` is the usual form). Refused
    inside another context: contexts do not nest."""
    agent = _current()
    if agent.current_context_id() != 0:
        raise RuntimeError("Already have an autograd context id for this thread: "
                           "distributed autograd contexts do not nest")
    c = agent.autograd_context()
    _unmanaged[c.id()] = (c, threading.get_ident())
    return _retrieve_context(c.id())


def _release_context(context_id: int) -> None:
    """Releases a context made by _new_context() on this thread, here and on
    every worker it reached."""
    entry = _unmanaged.get(int(context_id))
    if entry is None:
        raise RuntimeError(f"Could not find autograd context with id: {context_id} "
                           "(among the contexts _new_context() made on this worker)")
    if entry[1] != threading.get_ident():
        raise RuntimeError(f"autograd context {context_id} is current on the thread that made "
                           "it with _new_context(); release it on that thread")
    del _unmanaged[int(context_id)]
    entry[0].release()


def _get_max_id() -> int:
    """The largest context or message id this worker can make: its worker id
    in the top 16 bits, as in torch."""
    return (get_worker_info().id << 48) + (1 << 48) - 1


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


def _check_roots(context_id: Any, roots: Any) -> None:
    """Refuses what torch's backward refuses, in its words (programs and
    PyTorch's suites match them), saying which argument or root is wrong."""
    try:
        operator.index(context_id)
    except TypeError:
        raise TypeError("backward(): incompatible function arguments: context_id must be an "
                        f"int, got {type(context_id).__name__}") from None
    if not isinstance(roots, (list, tuple)) or not all(isinstance(r, torch.Tensor)
                                                       for r in roots):
        raise TypeError("backward(): incompatible function arguments: roots must be a list of "
                        f"tensors, got {type(roots).__name__}")
    if not roots:
        raise RuntimeError("No tensors provided for gradient computation.")
    for i, root in enumerate(roots):
        if not root.requires_grad:
            raise RuntimeError(f"requires_grad not set on root {i} of the backward pass")
        if root.numel() != 1:
            raise RuntimeError(f"Root {i} of shape {tuple(root.shape)} is not a scalar, all roots "
                               "need to be scalar")
        if root.grad_fn is None:
            raise RuntimeError(f"Root {i} is a leaf: it does not have a valid gradient function")


def backward(context_id: int, roots: List[torch.Tensor], retain_graph: bool = False) -> None:
    """Runs the backward pass from `roots` (scalars) across every worker."""
    _check_roots(context_id, roots)
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


# In TorchScript, backward and get_gradients compile to baton's operators
# (python/src/torch_agent.cc), as torch's compile to its own: scripted code
# runs them without Python, in drop-in mode.
_jit_builtins._register_builtin(backward, "baton::dist_backward")
_jit_builtins._register_builtin(get_gradients, "baton::get_gradients")
