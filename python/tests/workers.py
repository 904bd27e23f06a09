"""Scenarios run by the pytest suite in real worker processes (harness.py).

Each scenario is `scenario_<name>(rank, world_size)`: it calls init_rpc
itself, asserts what it checks (a failed assert exits non-zero with its
traceback), prints 'SCENARIO OK' and shuts down. Functions and classes that
travel by reference live at module level, as in any RPC job.
"""
import collections
import copy
import json
import os
import sys
import threading
import time

import torch

import baton
from baton import _C
import baton.distributed.autograd as dist_autograd
import baton.rpc as rpc
from baton.distributed.optim import DistributedOptimizer
from baton.nn import RemoteModule


def name(rank):
    return f"worker{rank}"


def init(rank, world_size, ps_server=None, **options):
    rpc.init_rpc(name(rank), rank=rank, world_size=world_size,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(**options),
                 ps_server=ps_server)


# ---- Functions called remotely ----

def add(a, b=0, *, scale=1):
    return (a + b) * scale


def whoami():
    return rpc.get_worker_info().name


def echo(x):
    return x


def sleep_then(seconds, value):
    time.sleep(seconds)
    return value


class Counter:
    def __init__(self, start):
        self.n = start
        self.lock = threading.Lock()

    def add(self, k):
        with self.lock:
            self.n += k
            return self.n

    def get(self):
        return self.n

    @rpc.functions.async_execution
    def add_later(self, k):
        # Completes from another worker's reply: no thread waits meanwhile.
        return rpc.rpc_async(rpc.get_worker_info().name, add, args=(self.n, k))


def sum_rrefs(rrefs):
    return sum(r.to_here() for r in rrefs)


def make_rrefs(n):
    return [rpc.RRef(torch.full((2,), float(i))) for i in range(n)]


def fetch_from_third(rref):
    return rref.to_here() * 10


@rpc.functions.async_execution
def async_add_via(peer, a, b):
    return rpc.rpc_async(peer, add, args=(a, b)).then(lambda fut: fut.wait() * 2)


_parked = []
_parked_lock = threading.Lock()


@rpc.functions.async_execution
def parked(i):
    fut = torch.futures.Future()
    with _parked_lock:
        _parked.append((i, fut))
    return fut


def release_parked():
    with _parked_lock:
        items = list(_parked)
        _parked.clear()
    for i, fut in items:
        fut.set_result(i * i)
    return len(items)


def parked_count():
    with _parked_lock:
        return len(_parked)


class CustomError(Exception):
    pass


def raise_value_error(x):
    raise ValueError(f"bad value {x}")


def raise_custom():
    raise CustomError("custom failure")


class TwoArgumentError(Exception):
    """Cannot be built from a message alone."""

    def __init__(self, flag, msg):
        self.flag = flag
        super().__init__(msg)


def raise_two_argument_error():
    raise TwoArgumentError(True, "needs two")


def nested_call_back(caller, depth):
    # Blocks in a nested call to the worker that is itself blocked calling us.
    if depth == 0:
        return rpc.get_worker_info().name
    return rpc.rpc_sync(caller, nested_call_back, args=(rpc.get_worker_info().name, depth - 1))


def agent_threads():
    return rpc._current().stats()["executor_threads"]


def incoming_functions():
    """The names this worker's state snapshot gives its incoming calls."""
    state = json.loads(rpc._current().state_json())
    return sorted({c["function"] for c in state.get("incoming", [])})


def rref_state():
    return rpc._current().rref_state()


def wait_rrefs_empty():
    rpc._current().wait_rrefs_empty(30)  # raises with the table's state if not
    return rpc._current().rref_state()["text"]


# ---- Scenarios ----

def scenario_api(rank, world_size):
    """Every call form, futures, RRefs and their proxies, async_execution."""
    init(rank, world_size)
    me = rpc.get_worker_info()
    assert (me.name, me.id) == (name(rank), rank), me
    assert rpc.get_worker_info("worker1") == rpc.WorkerInfo("worker1", 1)
    if rank == 0:
        x = torch.arange(6.0).reshape(2, 3)
        # Destinations by name, rank and WorkerInfo; builtins; kwargs.
        assert torch.equal(rpc.rpc_sync("worker1", torch.add, args=(x, 1)), x + 1)
        assert torch.equal(rpc.rpc_sync(1, add, args=(x,), kwargs={"b": 2, "scale": 3}),
                           (x + 2) * 3)
        assert rpc.rpc_sync(rpc.get_worker_info("worker2"), whoami) == "worker2"
        assert rpc.rpc_sync("worker0", whoami) == "worker0"  # to itself
        assert rpc.rpc_sync("worker1", add, args=[1, 2]) == 3  # args as a list
        # Futures are torch.futures.Future.
        futs = [rpc.rpc_async(f"worker{1 + i % 2}", add, args=(i, i)) for i in range(10)]
        assert all(isinstance(f, torch.futures.Future) for f in futs)
        assert torch.futures.wait_all(futs) == [2 * i for i in range(10)]
        chained = futs[3].then(lambda f: f.value() + 100)
        assert chained.wait() == 106
        seen = []
        done = threading.Event()
        futs[4].add_done_callback(lambda f: (seen.append(f.value()), done.set()))
        assert done.wait(10) and seen == [8]
        all_done = torch.futures.collect_all(futs[:3]).wait()
        assert [f.value() for f in all_done] == [0, 2, 4]
        assert futs[0].done()
        # Remote objects and the proxies.
        counter = rpc.remote("worker1", Counter, args=(10,))
        assert not counter.is_owner()
        assert counter.owner() == rpc.WorkerInfo("worker1", 1)
        assert counter.owner_name() == "worker1"
        assert counter.rpc_sync().add(5) == 15
        assert counter.rpc_async().add(1).wait() == 16
        n_rref = counter.remote().get()
        assert n_rref.to_here() == 16
        assert counter.confirmed_by_owner()
        assert counter.rpc_sync().add_later(4) == 20  # async method through the proxy
        # A method the value's type lacks fails at the call, as under torch,
        # the remote() proxy's too (not later in the RRef it would make).
        for proxy in (counter.rpc_sync(), counter.remote()):
            try:
                proxy.no_such_method()
                raise AssertionError("a missing method must raise AttributeError")
            except AttributeError as e:
                assert "has no attribute 'no_such_method'" in str(e), e
        try:
            counter.local_value()
            raise AssertionError("local_value on a non-owner must fail")
        except rpc.RpcError as e:
            assert e.code == "FAILED_PRECONDITION", e
            # torch's words: the RRef, this worker and the owner to call.
            assert "can't call localValue() on user WorkerInfo(id=0, name=worker0)" in str(e), e
            assert "Call it on owner WorkerInfo(id=1, name=worker1)" in str(e), e
        # RRef(value): owned here; its to_here is the value itself.
        local = rpc.RRef(torch.ones(2))
        assert local.is_owner() and local.confirmed_by_owner()
        assert local.to_here() is local.local_value()
        # Outside drop-in mode a baton RRef is no torch RRef, to isinstance
        # too: TorchScript skips a module attribute that holds one.
        assert type(local) is rpc.RRef and isinstance(local, rpc.RRef)
        assert not isinstance(local, torch._C._distributed_rpc.PyRRef)
        holder = torch.nn.Module()
        holder.rref = local
        assert torch.jit.script(holder) is not None
        # RRefs inside containers, both ways, and forwarded to a third worker.
        rrefs = rpc.rpc_sync("worker1", make_rrefs, args=(4,))
        assert [r.owner().name for r in rrefs] == ["worker1"] * 4
        assert torch.equal(sum(r.to_here() for r in rrefs), torch.full((2,), 6.0))
        assert torch.equal(rpc.rpc_sync("worker2", sum_rrefs, args=(rrefs,)), torch.full((2,), 6.0))
        assert torch.equal(rpc.rpc_sync("worker2", fetch_from_third, args=(local,)),
                           torch.full((2,), 10.0))
        # An RRef sent to its own owner resolves to the owner's value.
        assert torch.equal(rpc.rpc_sync("worker0", fetch_from_third, args=(local,)),
                           torch.full((2,), 10.0))
        slow = rpc.remote("worker2", sleep_then, args=(0.3, torch.ones(1)))
        assert torch.equal(rpc.rpc_sync("worker1", fetch_from_third, args=(slow,)),
                           torch.full((1,), 10.0))  # waits for the creation there
        # async_execution: chained futures, and futures completed later.
        assert rpc.rpc_sync("worker1", async_add_via, args=("worker2", 3, 4)) == 14
        pending = [rpc.rpc_async("worker1", parked, args=(i,)) for i in range(40)]
        deadline = time.monotonic() + 20
        while rpc.rpc_sync("worker1", parked_count) < 40:
            assert time.monotonic() < deadline, "the parked calls never arrived"
        # 40 calls are parked, yet worker1 holds no thread for them: it still
        # answers, and its executor did not grow by 40.
        assert rpc.rpc_sync("worker1", agent_threads) < 40
        # Python calls are named after their function on the callee (the
        # call's label), not after the one C++ entry point they share.
        names = rpc.rpc_sync("worker1", incoming_functions)
        assert any(n.endswith(".parked") for n in names), names
        assert any(n.endswith(".incoming_functions") for n in names), names
        assert "__baton.py.call" not in names, names
        assert rpc.rpc_sync("worker1", release_parked) == 40
        assert [f.wait() for f in pending] == [i * i for i in range(40)]
        # A Future made by the user.
        f = torch.futures.Future()
        threading.Timer(0.05, lambda: f.set_result(7)).start()
        assert f.wait() == 7
        del counter, n_rref, rrefs, local, slow
    rpc.shutdown()
    print("SCENARIO OK")


DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.complex128]


def make(dtype, shape):
    g = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def describe(t):
    return (t.dtype, tuple(t.shape), tuple(t.stride()), t.is_contiguous(),
            t.untyped_storage().nbytes() if hasattr(t, "untyped_storage") else None)


def agent_stats():
    return rpc._current().stats()


def storage_bytes(t):
    return t.storage().nbytes()


def scenario_dtypes(rank, world_size):
    """Every dtype, small and large (shared memory), views and nested values."""
    init(rank, world_size)
    if rank == 0:
        for dtype in DTYPES:
            for shape in [(3,), (4, 5), (300, 301)]:  # the last goes through shared memory
                t = make(dtype, shape)
                back = rpc.rpc_sync("worker1", echo, args=(t,))
                assert back.dtype == dtype and back.shape == t.shape, (dtype, shape)
                assert torch.equal(back, t), (dtype, shape)
        big = torch.randn(1000, 1000)
        views = {"transposed": big.t(), "strided": big[::7, 3:900:5],
                 "row": big[500], "narrow": big.narrow(1, 100, 10), "scalar": big[3, 4]}
        for label, v in views.items():
            back = rpc.rpc_sync("worker1", echo, args=(v,))
            assert torch.equal(back, v), label
            # Only what the view views travels: the copy on the callee holds
            # its elements, not the 4 MB base.
            held = rpc.rpc_sync("worker1", storage_bytes, args=(v,))
            assert held == v.numel() * v.element_size(), (label, held)
        # As under torch's RPC, a view keeps its strides unless the storage
        # it spans is at least 8 KiB and twice its own bytes (then it arrives
        # compact, as the strided, narrow and row views above).
        small = torch.rand(5, 5).narrow(1, 2, 2)
        for label, v in {"small": small, "transposed": views["transposed"]}.items():
            back = rpc.rpc_sync("worker1", echo, args=(v,))
            assert torch.equal(back, v) and back.stride() == v.stride(), (label, back.stride())
            assert not back.is_contiguous(), label
        assert views["strided"].stride() != rpc.rpc_sync("worker1", echo, args=(views["strided"],)).stride()
        # Copies on one host: a 4 MB tensor crosses through shared memory,
        # copied once into a segment by each sender; each receiver's tensor
        # is the segment's pages (no copy out), and the Python layer adds
        # none (the runtime counts the copies).
        big = torch.randn(1024, 1024)
        before = rpc._current().stats()
        callee_before = rpc.rpc_sync("worker1", agent_stats)
        back = rpc.rpc_sync("worker1", echo, args=(big,))
        after = rpc._current().stats()
        callee_after = rpc.rpc_sync("worker1", agent_stats)
        assert torch.equal(back, big)
        n = big.numel() * big.element_size()
        for key, side, was, now, want in [("out", "caller", before, after, n),
                                          ("in", "caller", before, after, 0),
                                          ("out", "callee", callee_before, callee_after, n),
                                          ("in", "callee", callee_before, callee_after, 0)]:
            copied = now[f"shm_bulk_bytes_copied_{key}"] - was[f"shm_bulk_bytes_copied_{key}"]
            assert copied == want, (side, key, copied, want)
        # The received tensor is usable like any other, in place included.
        back.add_(1)
        assert torch.equal(back, big + 1)
        nested = {"a": [torch.ones(2), (torch.zeros(3, dtype=torch.int64), "s")],
                  "b": {"c": torch.eye(3)[1:]}, "n": None, "f": 1.5}
        back = rpc.rpc_sync("worker1", echo, args=(nested,))
        assert back["n"] is None and back["f"] == 1.5 and back["a"][1][1] == "s"
        assert torch.equal(back["b"]["c"], torch.eye(3)[1:])
        # A tensor that appears twice stays one tensor.
        t = torch.arange(4.0)
        pair = rpc.rpc_sync("worker1", echo, args=([t, t],))
        assert pair[0] is pair[1]
        p = torch.nn.Parameter(torch.ones(3))
        q = rpc.rpc_sync("worker1", echo, args=(p,))
        assert isinstance(q, torch.nn.Parameter) and q.requires_grad
        # Sparse COO tensors travel as their indices and values, coalesced or not.
        sp = torch.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3.0, 4.0, 5.0], (2, 3))
        hybrid = torch.arange(12.0).view(4, 3).to_sparse(1)
        for t in (sp, sp.coalesce(), hybrid):
            back = rpc.rpc_sync("worker1", echo, args=(t,))
            assert back.is_sparse and back.is_coalesced() == t.is_coalesced(), t
            assert back.sparse_dim() == t.sparse_dim(), t
            assert torch.equal(back.to_dense(), t.to_dense()), t
    rpc.shutdown()
    print("SCENARIO OK")


@torch.jit.script
def scripted_add(x: torch.Tensor, y: float) -> torch.Tensor:
    return x + y


def scenario_errors(rank, world_size):
    """Every error class, and nothing lost after one."""
    try:  # torch's phrase before init_rpc
        rpc.RRef(torch.ones(1))
        raise AssertionError("RRef() before init_rpc did not raise")
    except RuntimeError as e:
        assert "Current RPC agent is not set! Did you initialize the RPC framework" in str(e), e
    init(rank, world_size, rpc_timeout=20)
    if rank == 0:
        def expect(exc_type, fn, *args, **kwargs):
            try:
                fn(*args, **kwargs)
            except exc_type as e:
                return e
            raise AssertionError(f"{fn} did not raise {exc_type}")

        e = expect(TimeoutError, rpc.rpc_sync, "worker1", sleep_then, args=(3, 1), timeout=0.2)
        assert isinstance(e, rpc.RpcTimeoutError) and e.code == "DEADLINE_EXCEEDED", e
        assert e.worker == "worker1" and "sleep_then" in e.function, (e.worker, e.function)
        e = expect(TimeoutError, rpc.rpc_async("worker1", sleep_then, args=(3, 1), timeout=0.2).wait)
        e = expect(ValueError, rpc.rpc_sync, "worker1", raise_value_error, args=(5,))
        assert "bad value 5" in str(e) and "Traceback" in str(e) and "raise_value_error" in str(e)
        assert "worker1" in str(e), e
        e = expect(CustomError, rpc.rpc_sync, "worker1", raise_custom)
        assert "custom failure" in str(e)
        # A type that cannot be rebuilt from a message: a RuntimeError with
        # torch's phrase, naming the type and carrying the remote message.
        e = expect(RuntimeError, rpc.rpc_sync, "worker1", raise_two_argument_error)
        assert "Original exception on remote side was" in str(e), e
        assert "TwoArgumentError" in str(e) and "needs two" in str(e), e
        fut = rpc.rpc_async("worker1", raise_value_error, args=(6,))
        expect(ValueError, fut.wait)
        expect(ValueError, fut.wait)  # the same error each time it is waited for
        # Timeouts are RuntimeErrors too, with torch's phrase.
        e = expect(RuntimeError, rpc.rpc_sync, "worker1", sleep_then, args=(3, 1), timeout=0.2)
        assert "RPC ran for more than" in str(e), e
        # A failed call fails its future (torch's wait_all returns at the
        # first error instead of waiting for the slow call).
        slow = rpc.rpc_async("worker1", sleep_then, args=(5, 1))
        started = time.monotonic()
        expect(ValueError, torch.futures.wait_all,
               [slow, rpc.rpc_async("worker1", raise_value_error, args=(7,))])
        assert time.monotonic() - started < 4, time.monotonic() - started
        assert slow.wait() == 1
        # A TorchScript function travels by name.
        assert torch.equal(rpc.rpc_sync("worker1", scripted_add, args=(torch.ones(2), 2.0)),
                           torch.full((2,), 3.0))
        # Unpicklable argument: a clear TypeError here; nothing was sent.
        e = expect(TypeError, rpc.rpc_sync, "worker1", echo, args=(lambda: 1,))
        assert "cannot send" in str(e), e
        e = expect(TypeError, rpc.rpc_sync, "worker1", echo, args=(threading.Lock(),))
        # A function the callee does not have (defined here only).
        globals()["only_here"] = lambda: 1
        only_here.__qualname__ = "only_here"  # noqa: F821
        only_here.__module__ = "missing_module_xyz"  # noqa: F821
        e = expect(Exception, rpc.rpc_sync, "worker1", only_here)  # noqa: F821
        assert "missing_module_xyz" in str(e), e
        e = expect(rpc.RpcError, rpc.rpc_sync, "nobody", echo, args=(1,))
        assert e.code == "NOT_FOUND" and "nobody" in str(e), e
        e = expect(ValueError, rpc.rpc_sync, 3.5, echo, args=(1,))  # torch's class
        # Still works after all of that.
        assert rpc.rpc_sync("worker1", echo, args=(41,)) == 41
        # A result the callee cannot pickle fails the call with its reason.
        e = expect(Exception, rpc.rpc_sync, "worker1", threading.Lock)
        assert "cannot send" in str(e) or "pickle" in str(e), e
        # to_here of a failed remote() raises its error.
        rr = rpc.remote("worker1", raise_value_error, args=(9,))
        e = expect(ValueError, rr.to_here)
        assert "bad value 9" in str(e)
    rpc.shutdown()
    print("SCENARIO OK")


def scenario_killed(rank, world_size):
    """A worker that dies: calls to it raise ConnectionError, in time."""
    init(rank, world_size, rpc_timeout=10)
    if rank == 1:
        rpc.rpc_sync("worker0", echo, args=(1,))
        sys.stdout.flush()
        os._exit(3)  # dies without a word
    if rank == 0:
        deadline = time.monotonic() + 20
        while True:
            try:
                rpc.rpc_sync("worker1", echo, args=(1,), timeout=2)
            except ConnectionError as e:
                assert isinstance(e, rpc.WorkerUnavailableError) and e.code == "UNAVAILABLE", e
                break
            except TimeoutError:
                pass
            assert time.monotonic() < deadline, "the dead worker was never reported"
        print("DEAD reported")
    rpc.shutdown(graceful=False)
    print("SCENARIO OK")


def scenario_gil(rank, world_size):
    """Blocking calls release the GIL; Python functions that block in nested
    calls do not deadlock the agent."""
    init(rank, world_size)
    if rank == 0:
        ticks = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                ticks[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        before = ticks[0]
        rpc.rpc_sync("worker1", sleep_then, args=(0.5, 1))
        during = ticks[0] - before
        stop.set()
        t.join()
        assert during > 1000, f"the other thread advanced only {during} times"
        # Nested calls back to this worker while it blocks, many at once.
        futs = [rpc.rpc_async("worker1", nested_call_back, args=("worker0", 4))
                for _ in range(16)]
        assert [f.wait() for f in futs] == ["worker1"] * 16
        assert rpc.rpc_sync("worker1", nested_call_back, args=("worker0", 7)) == "worker0"
        # A Python thread of ours issuing calls while the main thread waits.
        results = []
        th = threading.Thread(target=lambda: results.append(
            rpc.rpc_sync("worker1", add, args=(2, 3))))
        th.start()
        rpc.rpc_sync("worker1", sleep_then, args=(0.2, 0))
        th.join(10)
        assert results == [5]
    rpc.shutdown()
    print("SCENARIO OK")


class RemoteLinear:
    def __init__(self, w):
        self.w = torch.nn.Parameter(w.clone())

    def forward(self, x):
        return x @ self.w

    def param_rrefs(self):
        return [rpc.RRef(self.w)]

    def weight(self):
        return self.w.detach().clone()


class SignSGD(torch.optim.Optimizer):
    """A custom optimizer (none of baton's five fast-path classes):
    p -= lr * sign(grad)."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"])


class PassesDuringBackward(torch.autograd.Function):
    """Identity; its backward records the debug counts as they are then."""
    seen = []

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        PassesDuringBackward.seen.append(dist_autograd._get_debug_info())
        return grad


class SameGradTwice(torch.autograd.Function):
    """a + b, whose backward gives both inputs one gradient tensor."""

    @staticmethod
    def forward(ctx, a, b):
        return a + b

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


class FailsBackward(torch.autograd.Function):
    """Identity whose backward raises while `failing` is set."""
    failing = True

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if FailsBackward.failing:
            raise ValueError("backward refused on purpose")
        return grad


def through_failing_backward(t):
    return FailsBackward.apply(t * 2)


def set_backward_failing(value):
    FailsBackward.failing = value


def sparse_mm_loss(sparse, dense):
    return torch.sparse.mm(sparse, dense).pow(2).sum()


def grads_on_owner(rref, context_id):
    grads = dist_autograd.get_gradients(context_id)
    return grads.get(rref.local_value().w)


def forward_remote(rref, x):
    return rref.local_value().forward(x)


def scenario_autograd(rank, world_size):
    """Gradients equal local autograd; DistributedOptimizer equals torch.optim."""
    init(rank, world_size)
    if rank == 0:
        torch.manual_seed(0)
        w0 = torch.randn(4, 3)
        local_w = torch.nn.Parameter(torch.randn(3, 2))
        x = torch.randn(5, 4)
        layer = rpc.remote("worker1", RemoteLinear, args=(w0,))
        with dist_autograd.context() as cid:
            h = layer.rpc_sync().forward(x)
            loss = (h @ local_w).pow(2).sum()
            dist_autograd.backward(cid, [loss])
            remote_grad = rpc.rpc_sync("worker1", grads_on_owner, args=(layer, cid))
            local_grad = dist_autograd.get_gradients(cid)[local_w]
        assert local_w.grad is None  # D2: nothing accumulates into .grad
        w_ref = w0.clone().requires_grad_(True)
        lw_ref = local_w.detach().clone().requires_grad_(True)
        ((x @ w_ref) @ lw_ref).pow(2).sum().backward()
        assert torch.allclose(remote_grad, w_ref.grad, atol=1e-5), (remote_grad, w_ref.grad)
        assert torch.allclose(local_grad, lw_ref.grad, atol=1e-5)

        # A sparse leaf sent to a remote function gets its gradient back,
        # sparse, as local autograd gives it.
        sp = torch.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3.2, 4.1, 5.3], (3, 3),
                                     requires_grad=True)
        dense = torch.randn(3, 2, requires_grad=True)
        with dist_autograd.context() as cid:
            loss = rpc.rpc_sync("worker1", sparse_mm_loss, args=(sp, dense))
            dist_autograd.backward(cid, [loss])
            grads = dist_autograd.get_gradients(cid)
        sp_ref = sp.detach().clone().requires_grad_(True)
        dense_ref = dense.detach().clone().requires_grad_(True)
        sparse_mm_loss(sp_ref, dense_ref).backward()
        assert grads[sp].is_sparse, grads[sp]
        assert torch.allclose(grads[sp].to_dense(), sp_ref.grad.to_dense(), atol=1e-5)
        assert torch.allclose(grads[dense], dense_ref.grad, atol=1e-5)

        # A leaf's hooks run as local autograd runs them: its tensor hook
        # changes the gradient the context keeps (not .grad), and its
        # accumulator's post-hooks see that gradient once per backward.
        leaf = torch.ones(3, 3, requires_grad=True)
        leaf.register_hook(lambda g: g * 2)
        seen = []
        y = leaf * 3
        y.grad_fn.next_functions[0][0].register_hook(
            lambda outputs, inputs: seen.append(inputs[0].clone()))
        with dist_autograd.context() as cid:
            loss = rpc.rpc_sync("worker1", torch.add, args=(y, 1)).sum()
            dist_autograd.backward(cid, [loss])
            hooked = dist_autograd.get_gradients(cid)[leaf]
        assert torch.equal(hooked, torch.full((3, 3), 6.0)), hooked
        assert len(seen) == 1 and torch.equal(seen[0], hooked), seen
        assert leaf.grad is None

        # Two leaves given one gradient tensor keep a copy each: an in-place
        # change to one (clipping, say) leaves the other as it was.
        a = torch.ones(2, 2, requires_grad=True)
        b = torch.ones(2, 2, requires_grad=True)
        with dist_autograd.context() as cid:
            out = rpc.rpc_sync("worker1", torch.mul, args=(SameGradTwice.apply(a, b), 3))
            dist_autograd.backward(cid, [out.sum()])
            ga, gb = dist_autograd.get_gradients(cid)[a], dist_autograd.get_gradients(cid)[b]
            assert ga.data_ptr() != gb.data_ptr()
            ga.mul_(0.5)
            assert torch.equal(gb, torch.full((2, 2), 3.0)), gb

        # A Python function that raises in a backward pass on the callee
        # fails that pass with its own message, pass after pass, and leaves
        # the callee's runtime threads able to run Python: other calls and,
        # once it stops raising, the same backward on the same graph.
        t = torch.ones(2, 2, requires_grad=True)
        with dist_autograd.context() as cid:
            loss = rpc.rpc_sync("worker1", through_failing_backward, args=(t,)).sum()
            for _ in range(20):
                try:
                    dist_autograd.backward(cid, [loss], retain_graph=True)
                    raise AssertionError("the backward function's error was lost")
                except RuntimeError as e:
                    assert "backward refused on purpose" in str(e), e
                futs = [rpc.rpc_async("worker1", add, args=(i, 1)) for i in range(8)]
                assert [f.wait() for f in futs] == [i + 1 for i in range(8)]
            rpc.rpc_sync("worker1", set_backward_failing, args=(False,))
            for _ in range(5):
                dist_autograd.backward(cid, [loss], retain_graph=True)
            assert torch.equal(dist_autograd.get_gradients(cid)[t], torch.full((2, 2), 10.0))

        # torch's context API: a context made without `with`, read while it
        # records (its send functions grow), released on its thread; the
        # debug counts while a backward pass runs here and after.
        assert dist_autograd._get_max_id() == (0 << 48) + (1 << 48) - 1
        made = dist_autograd._new_context()
        cid = made._context_id()
        assert cid >> 48 == 0 and dist_autograd._current_context()._context_id() == cid
        chain = torch.ones(2, requires_grad=True)
        for _ in range(3):
            chain = rpc.rpc_sync("worker1", torch.add, args=(chain, 1))
        assert len(made._send_functions()) == 3, made._send_functions()
        loss = PassesDuringBackward.apply(chain).sum()
        dist_autograd.backward(cid, [loss])
        during = PassesDuringBackward.seen[-1]
        assert during["num_current_backward_passes"] == "1", during
        assert set(during) == {"num_current_backward_passes", "num_autograd_contexts"}, during
        assert dist_autograd._get_debug_info()["num_current_backward_passes"] == "0"
        dist_autograd._release_context(cid)
        try:
            dist_autograd._retrieve_context(cid)
            raise AssertionError("a released context is still retrievable")
        except RuntimeError as e:
            assert f"Could not find autograd context with id: {cid}" in str(e), e
        try:
            dist_autograd.backward(cid, 1)
            raise AssertionError("backward took an int for its roots")
        except TypeError as e:
            assert "incompatible function arguments: roots must be a list" in str(e), e

        for opt_cls, kwargs in [(torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
                                (torch.optim.Adam, {"lr": 0.01, "betas": (0.8, 0.99)}),
                                (torch.optim.AdamW, {"lr": 0.01}),
                                (torch.optim.Adagrad, {"lr": 0.1}),
                                (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5}),
                                # Not on the fast path: run as torch runs them.
                                (torch.optim.Adadelta, {"lr": 1.0}),
                                (SignSGD, {"lr": 0.01})]:
            layer = rpc.remote("worker1", RemoteLinear, args=(w0,))
            lw = torch.nn.Parameter(local_w.detach().clone())
            params = layer.rpc_sync().param_rrefs() + [rpc.RRef(lw)]
            opt = DistributedOptimizer(opt_cls, params, **kwargs)
            ref_w = torch.nn.Parameter(w0.clone())
            ref_lw = torch.nn.Parameter(local_w.detach().clone())
            ref_opt = opt_cls([ref_w, ref_lw], **kwargs)
            for step in range(3):
                with dist_autograd.context() as cid:
                    loss = (layer.rpc_sync().forward(x) @ lw).pow(2).sum()
                    dist_autograd.backward(cid, [loss])
                    opt.step(cid)
                ref_opt.zero_grad()
                ((x @ ref_w) @ ref_lw).pow(2).sum().backward()
                ref_opt.step()
            remote_w = layer.rpc_sync().weight()
            assert torch.allclose(remote_w, ref_w.detach(), atol=1e-5), (opt_cls, remote_w, ref_w)
            assert torch.allclose(lw.detach(), ref_lw.detach(), atol=1e-5), opt_cls
        try:
            DistributedOptimizer(dict, params, lr=1)
            raise AssertionError("a class that is not an optimizer must be refused")
        except TypeError as e:
            assert "torch.optim.Optimizer" in str(e) and "dict" in str(e), e
        # Owners step through a C++ function by key; an unknown key is named.
        step = rpc.CppFunction(*_C.OPTIMIZER_STEP)
        try:
            rpc.rpc_sync("worker1", step, args=("no-such-optimizer", 1))
            raise AssertionError("an unknown optimizer key must be refused")
        except rpc.RpcError as e:
            assert e.code == "NOT_FOUND" and "no optimizer 'no-such-optimizer'" in str(e), e
        # RemoteModule, trained through remote_parameters().
        torch.manual_seed(1)
        remote_fc = RemoteModule("worker1/cpu", torch.nn.Linear, args=(4, 2))
        opt = DistributedOptimizer(torch.optim.SGD, remote_fc.remote_parameters(), lr=0.1)
        first = last = None
        for _ in range(20):
            with dist_autograd.context() as cid:
                loss = (remote_fc(x) - 1).pow(2).mean()
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
            first = first if first is not None else loss.item()
            last = loss.item()
        assert last < first * 0.5, (first, last)
    rpc.shutdown()
    print("SCENARIO OK")


def torch_ops():
    t = torch.ones(4, 4)
    return (t + t).mul(2).sum()


def scenario_profiler(rank, world_size):
    """Inside torch's legacy profiler, each call is an event named torch's
    way on the caller, and the callee's events join the caller's profile,
    carrying the callee's id; outside one nothing is recorded."""
    from torch.autograd.profiler_legacy import profile
    from baton.rpc.internal import RPCExecMode, _build_rpc_profiling_key
    init(rank, world_size)
    if rank == 0:
        for mode in (RPCExecMode.SYNC, RPCExecMode.ASYNC, RPCExecMode.REMOTE):
            with profile(record_shapes=True) as prof:
                if mode is RPCExecMode.SYNC:
                    value = rpc.rpc_sync("worker1", torch_ops)
                elif mode is RPCExecMode.ASYNC:
                    value = rpc.rpc_async("worker1", torch_ops).wait()
                else:
                    rref = rpc.remote("worker1", torch_ops)
                    value = rref.to_here()
                    rref._get_profiling_future().wait()
            assert value.item() == 64.0, value
            key = _build_rpc_profiling_key(mode, "torch_ops", "worker0", "worker1")
            events = prof.function_events
            calls = [e for e in events if e.name == key]
            assert len(calls) == 1 and calls[0].node_id == 0, [e.name for e in events]
            remote = {e.name: e for e in events if e.is_remote}
            for op in ("aten::ones", "aten::add", "aten::mul", "aten::sum"):
                name = key + "#remote_op: " + op
                assert name in remote, (name, sorted(remote))
                assert remote[name].node_id == 1, remote[name].node_id
            add = remote[key + "#remote_op: aten::add"]
            assert add.input_shapes[:2] == [[4, 4], [4, 4]], add.input_shapes
        # A failing call fails its future with the callee's error, profiled
        # or not, and the profile still closes.
        with profile() as prof:
            try:
                rpc.rpc_sync("worker1", raise_value_error, args=("profiled",))
                raise AssertionError("the call must fail")
            except ValueError as e:
                assert "profiled" in str(e), e
        assert any("raise_value_error" in e.name for e in prof.function_events)
        # Outside a profile, the callee runs the function unprofiled.
        assert rpc.rpc_sync("worker1", torch_ops).item() == 64.0
        assert rpc.remote("worker1", torch_ops)._get_profiling_future().done()
    rpc.shutdown()
    print("SCENARIO OK")


def scenario_rrefs_10k(rank, world_size):
    """10,000 RRefs created and dropped from Python leave every owner table empty."""
    # The other workers wait at shutdown while rank 0 works.
    init(rank, world_size, shutdown_timeout=120)
    t0 = time.monotonic()
    if rank == 0:
        made = [rpc.remote("worker1", torch.ones, args=(1,)) for _ in range(5000)]
        forwarded = rpc.rpc_sync("worker2", sum_rrefs, args=(made[:100],))
        assert forwarded.item() == 100.0
        mine = [rpc.RRef(torch.zeros(1)) for _ in range(5000)]
        back = rpc.rpc_sync("worker1", echo, args=(mine[:500],))  # forks there and back
        assert all(b.is_owner() for b in back)
        assert made[-1].to_here().item() == 1.0
        print("TIMING made", time.monotonic() - t0)
        del made, mine, back, forwarded
        # Every owner table (and every holder's) empties once the deletions
        # are answered.
        for w in range(world_size):
            state = rpc.rpc_sync(w, wait_rrefs_empty)
            print("EMPTY", w, state)
        print("TIMING empty", time.monotonic() - t0)
    rpc.shutdown()  # settles every fork (G6) before the tables are read
    print("SCENARIO OK")


def scenario_launched():
    """Started by baton-run: rank, world size and names come from its environment."""
    assert baton.is_elastic_launched() and baton.is_torchelastic_launched()
    rpc.init_rpc(_role_name())
    me = rpc.get_worker_info()
    if me.id == 0:
        peers = [rpc.rpc_sync(i, whoami) for i in range(int(os.environ["WORLD_SIZE"]))]
        print("PEERS", ",".join(peers))
    rpc.shutdown()
    print("SCENARIO OK")


def scenario_cpp_interop(rank, world_size):
    """Python calls functions a C++ worker (cpp_peer.cc, rank 1) registered."""
    init(rank, world_size)
    add = rpc.CppFunction("cpp.add", "(Tensor, Tensor) -> Tensor")
    a, b = torch.arange(4.0), torch.full((4,), 2.0)
    assert torch.equal(rpc.rpc_sync("cpp1", add, args=(a, b)), a + b)
    assert torch.equal(rpc.rpc_async(1, add, args=(a, b)).wait(), a + b)
    describe = rpc.CppFunction(
        "cpp.describe",
        "(vector<int64>,map<string,double>,optional<string>)->tuple<int64,double,string>")
    assert rpc.rpc_sync("cpp1", describe, args=([1, 2, 3], {"x": 0.5, "y": 2.0}, None)) == \
        (6, 2.5, "none")
    assert rpc.rpc_sync("cpp1", describe, args=([], {}, "note")) == (0, 0.0, "note")
    make = rpc.CppFunction("cpp.make", "(int32,bool)->vector<Tensor>")
    made = rpc.rpc_sync("cpp1", make, args=(3, True))
    assert [t.tolist() for t in made] == [[1.0], [1.0, 1.0], [1.0, 1.0, 1.0]]

    def expect(exc_type, *call_args, **kw):
        try:
            rpc.rpc_sync(*call_args, **kw)
        except exc_type as e:
            return e
        raise AssertionError(f"{call_args} did not raise {exc_type}")

    fail = rpc.CppFunction("cpp.fail", "(string)->void")
    e = expect(rpc.RpcError, "cpp1", fail, args=("no",))
    assert e.code == "FAILED_PRECONDITION" and "cpp_peer refuses: no" in str(e), e
    # A value that does not fit its type is refused here, naming where.
    e = expect(rpc.RpcError, "cpp1", describe, args=([1, "two"], {}, None))
    assert e.code == "INVALID_ARGUMENT" and "argument 0[1]" in str(e), e
    e = expect(rpc.RpcError, "cpp1", make, args=(2 ** 40, True))
    assert "int32" in str(e), e
    # A signature that differs from the registered one: the callee says so.
    wrong = rpc.CppFunction("cpp.add", "(Tensor)->Tensor")
    e = expect(rpc.RpcError, "cpp1", wrong, args=(a,))
    assert e.code == "INVALID_ARGUMENT" and "(Tensor,Tensor)->Tensor" in str(e), e
    try:
        rpc.CppFunction("cpp.x", "(MyType)->int64")
        raise AssertionError("a user type must be refused")
    except ValueError as e:
        assert "MyType" in str(e), e
    e = expect(rpc.RpcError, "cpp1", rpc.CppFunction("cpp.nothing", "()->void"))
    assert e.code == "NOT_FOUND", e
    rpc.shutdown()
    print("SCENARIO OK")


def scenario_ps(rank, world_size):
    """baton.ps: a server hosted in Python (rank 1), a trainer (rank 0)."""
    import baton.ps as ps
    spec = ps.PsSpec([ps.Dense("w", (2, 3), optimizer=torch.optim.SGD, lr=0.5),
                      ps.Embedding("emb", rows=1000, dim=4, optimizer="sgd", lr=0.1)],
                     consistency="sync", num_trainers=1)
    if rank == 1:
        server = ps.PsServer(spec, server=0, num_servers=1)
        init(rank, world_size, ps_server=server)
        rpc.shutdown()
        print("STATS", server.stats().splitlines()[0])
        print("SCENARIO OK")
        return
    init(rank, world_size)
    client = ps.PsClient(spec, servers=["worker1"], trainer=0)
    client.init_dense({"w": torch.ones(2, 3)})
    assert torch.equal(client.pull("w").wait(), torch.ones(2, 3))
    client.push("w", torch.full((2, 3), 2.0), end_step=True).wait()
    assert torch.equal(client.pull("w").wait(), torch.zeros(2, 3))  # 1 - 0.5 * 2
    ids = torch.tensor([[3, 7], [3, 999]])
    rows = client.pull_rows("emb", ids).wait()
    assert rows.shape == (2, 2, 4) and torch.equal(rows, torch.zeros(2, 2, 4))
    client.push_rows("emb", ids, torch.ones(2, 2, 4), end_step=True).wait()
    after = client.pull_rows("emb", torch.tensor([3, 7, 999, 5])).wait()
    # id 3 appeared twice: its gradients were summed (2 * 0.1).
    assert torch.allclose(after, torch.tensor([[-0.2] * 4, [-0.1] * 4, [-0.1] * 4, [0.0] * 4]))
    # A module bound to dense tables.
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    spec2 = ps.PsSpec(ps.ModuleBinding.tables(net, "m", torch.optim.SGD, lr=0.1))
    try:
        client.pull("nope").wait()
        raise AssertionError("an unknown table must fail")
    except rpc.RpcError as e:
        assert e.code == "INVALID_ARGUMENT" and "nope" in str(e), e
    try:
        ps.PsClient(spec2, servers=["worker1"], trainer=0)
        raise AssertionError("a client with another spec must be refused")
    except rpc.RpcError as e:
        assert e.code == "FAILED_PRECONDITION", e
    try:
        ps.PsSpec([ps.Dense("bad", (0, 2))])
        ps.PsServer(ps.PsSpec([ps.Dense("bad", (-1, 2))]), server=0, num_servers=1)
        raise AssertionError("a bad spec must be refused")
    except rpc.RpcError as e:
        assert e.code == "INVALID_ARGUMENT" and "bad" in str(e), e
    print("CLOCK", client.clock())
    rpc.shutdown()
    print("SCENARIO OK")


def my_incarnation():
    return rpc._current().incarnation()


def scenario_restarts():
    """Under baton-run --restart_policy helper=worker: helper1 dies after it
    joined; its restarted process rejoins the running job, and the leader's
    calls (with restart_wait) reach the new incarnation."""
    role, role_rank = os.environ["BATON_ROLE"], int(os.environ["BATON_ROLE_RANK"])
    restarts = int(os.environ.get("BATON_RESTART_COUNT", "0"))
    options = rpc.TensorPipeRpcBackendOptions(restart_wait=20, rpc_timeout=30)
    rpc.init_rpc(_role_name(), rpc_backend_options=options)
    if role == "helper" and role_rank == 1 and restarts == 0:
        os._exit(3)  # dies after joining; baton-run starts it again
    if role == "leader":
        deadline = time.monotonic() + 60
        while True:
            try:
                incarnation = rpc.rpc_sync("helper1", my_incarnation, timeout=25)
            except (ConnectionError, TimeoutError):
                incarnation = None
            if incarnation == 2:
                break
            assert time.monotonic() < deadline, f"helper1 never came back ({incarnation})"
        print("REJOINED incarnation 2")
        assert rpc.rpc_sync("helper0", my_incarnation) == 1
    rpc.shutdown()
    print("SCENARIO OK")


def expect_device_map_refused(options, rank, world_size, want):
    """init_rpc with `options` fails on this worker with a ValueError (as
    torch's) whose message holds `want`, and leaves no agent behind."""
    try:
        rpc.init_rpc(name(rank), rank=rank, world_size=world_size, rpc_backend_options=options)
        raise AssertionError(f"init_rpc accepted a device map it should refuse ({want})")
    except ValueError as e:
        assert want in str(e), e
    assert not rpc._is_current_rpc_agent_set()


def scenario_device_maps(rank, world_size):
    """set_device_map reaches the agent, and every worker checks the whole
    job's maps at init (docs/cuda.md): each worker's init_rpc fails alike,
    with torch's words, naming the first worker at fault (worker0 here,
    although every worker set a bad map). A device that is neither the CPU
    nor a CUDA device is refused before that."""
    gpus = torch.cuda.device_count()
    peer = name(1 - rank)
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=30, init_timeout=20)
    options.set_device_map(peer, {"cpu": gpus})
    expect_device_map_refused(
        options, rank, world_size,
        f"Node worker0 has target devices with invalid indices in its device map for worker1: "
        f"cpu to cuda:{gpus}, but worker1 has {gpus} CUDA device(s)")
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=30, init_timeout=20)
    options.set_device_map(peer, {f"cuda:{gpus}": torch.device("cuda", 0)})
    expect_device_map_refused(
        options, rank, world_size,
        f"Node worker0 has source devices with invalid indices in its device map for worker1: "
        f"cuda:{gpus}, but worker0 has {gpus} CUDA device(s)")
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=30, init_timeout=20)
    options.set_device_map(peer, {"cpu": "cpu", 0: "cpu"})
    expect_device_map_refused(
        options, rank, world_size,
        "Node worker0 has duplicated target devices in its device map for worker1: cpu is the "
        "target of both cpu and cuda:0")
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=30, init_timeout=20)
    options.set_devices(["cpu", f"cuda:{gpus}"])
    expect_device_map_refused(
        options, rank, world_size,
        f"Node worker0 has devices with invalid indices: cuda:{gpus}, but worker0 has {gpus} "
        "CUDA device(s)")
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=30, init_timeout=20)
    options.set_device_map("none_exist", {"cpu": "cpu"})
    expect_device_map_refused(
        options, rank, world_size,
        "Node worker0 has invalid target node names in its device maps: 'none_exist'")
    try:
        init(rank, world_size, device_maps={peer: {"meta": 0}}, init_timeout=20)
        raise AssertionError("a map of the meta device was accepted")
    except ValueError as e:
        assert "'meta' is neither the CPU nor a CUDA device" in str(e), e
    # The host to the host: accepted, nothing moves.
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=30, init_timeout=20)
    options.set_device_map(peer, {"cpu": "cpu"})
    rpc.init_rpc(name(rank), rank=rank, world_size=world_size, rpc_backend_options=options)
    back = rpc.rpc_sync(peer, torch.add, args=(torch.ones(2), 1))
    assert back.device.type == "cpu" and back.tolist() == [2.0, 2.0], back
    rpc.shutdown()
    print("SCENARIO OK")


Out = collections.namedtuple("Out", "doubled parts")


class _Pair(torch.nn.Module):
    """A module whose result nests tensors (and names them), with a forward
    hook that RemoteModule must not run (torch's calls forward())."""

    def __init__(self):
        super().__init__()
        self.register_forward_hook(lambda module, args, out: Out(out.doubled + 100, out.parts))

    def forward(self, x, scale=1.0):
        return Out(x * 2 * scale, [x, {"neg": -x}])


def scenario_remote_module_devices(rank, world_size):
    """RemoteModule's remote_device is parsed as torch's is, with torch's
    errors (the words of torch's CudaRemoteModuleTest.test_invalid_devices);
    "<worker>" alone and "rank:<n>/<device>" name a worker; is_device_map_set
    says whether this worker set a device map for the module's; forward()
    runs without the module's hooks, as torch's; and a result's tensors,
    nested anywhere, come back in their structure."""
    from baton.nn import _to_cpu
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=30)
    if rank == 0:
        options.set_device_map("worker1", {"cpu": "cpu"})
    rpc.init_rpc(name(rank), rank=rank, world_size=world_size, rpc_backend_options=options)
    if rank == 0:
        refused = [
            ("worker1/foo", RuntimeError, "device type at start of device string"),
            ("worker1/cpu2", RuntimeError, "Invalid device string: 'cpu2'"),
            ("worker1/", RuntimeError, "Device string must not be empty"),
            ("worker1/cuda:0/cuda:1", ValueError,
             "Could not parse remote_device: worker1/cuda:0/cuda:1. The valid format is "
             "'<workername>/<device>'"),
            ("/", ValueError, "Could not parse remote_device: /. The valid format is "
             "'<workername>/<device>'"),
            ("/cuda:0", ValueError, "Could not parse remote_device: /cuda:0. The valid format "
             "is '<workername>/<device>'"),
            ("rank:x/cpu", ValueError, "Could not parse remote_device: rank:x/cpu."),
        ]
        for remote_device, error, words in refused:
            try:
                RemoteModule(remote_device, torch.nn.Linear, args=(2, 2))
                raise AssertionError(f"RemoteModule accepted {remote_device!r}")
            except error as e:
                assert words in str(e), (remote_device, e)
        by_name = RemoteModule("worker1", _Pair)
        by_rank = RemoteModule("rank:1/cpu", _Pair)
        assert (by_name.on, by_name.device) == ("worker1", "cpu"), (by_name.on, by_name.device)
        assert (by_rank.on, by_rank.device) == (1, "cpu"), (by_rank.on, by_rank.device)
        # worker0 set a map for worker1 ({"cpu": "cpu"}), as torch's agent tells.
        assert by_name.is_device_map_set and by_rank.is_device_map_set
        x = torch.arange(3.0)
        out = by_rank(x, scale=2.0)
        assert type(out).__name__ == "Out", type(out)
        assert out.doubled.tolist() == [0.0, 4.0, 8.0], out
        assert out.parts[0].tolist() == x.tolist() and out.parts[1]["neg"].tolist() == (-x).tolist()
        moved = _to_cpu(out)
        assert type(moved) is type(out) and isinstance(moved.parts, list), moved
        assert torch.equal(moved.parts[1]["neg"], -x)
    else:
        # worker1 set no map for worker0.
        assert not RemoteModule("worker0/cpu", torch.nn.Linear, args=(2, 2)).is_device_map_set
    rpc.shutdown()
    print("SCENARIO OK")


# ---- CUDA scenarios (docs/cuda.md): two workers sharing one GPU ----
#
# test_rpc.py skips them where no CUDA device is visible. Both workers use
# cuda:0; where a scenario sets a device map it is {0: 0} to the other worker.

CUDA = torch.device("cuda", 0)
# float32 results compared across processes or between GPU and host.
RTOL, ATOL = 1e-4, 1e-5


def cuda_prepare():
    """The start of every CUDA scenario, before init_rpc: cuda:0 current,
    both RNGs seeded, TF32 off (so matrix products equal their float32
    reference on any GPU)."""
    torch.cuda.set_device(CUDA)
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def cuda_init(rank, world_size, map_to_peer, ps_server=None):
    """init_rpc with rpc_timeout 60 and, where map_to_peer, the device map
    {0: 0} to the other worker (set_device_map)."""
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=60)
    if map_to_peer:
        options.set_device_map(name(1 - rank), {0: 0})
    rpc.init_rpc(name(rank), rank=rank, world_size=world_size, rpc_backend_options=options,
                 ps_server=ps_server)


def expect_close(actual, expected, what, rtol=RTOL, atol=ATOL):
    """Asserts `actual` is a tensor with expected's device, dtype, shape and
    values (within rtol/atol; 0 and 0: equal)."""
    assert isinstance(actual, torch.Tensor), (
        f"{what}: got {type(actual).__name__} {actual!r}, want a tensor")
    assert actual.device == expected.device, (
        f"{what}: the tensor is on {actual.device}, want {expected.device}")
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, want {expected.dtype}"
    assert actual.shape == expected.shape, (
        f"{what}: shape {tuple(actual.shape)}, want {tuple(expected.shape)}")
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    except AssertionError as e:
        raise AssertionError(f"{what}: values differ (rtol {rtol}, atol {atol}): {e}\n"
                             f"got  {actual}\nwant {expected}") from None


def expect_close_numbers(actual, expected, what, rtol=RTOL, atol=ATOL):
    assert abs(actual - expected) <= atol + rtol * abs(expected), (
        f"{what}: {actual!r}, want {expected!r} (rtol {rtol}, atol {atol})")


def arrived_as(*tensors):
    """Runs on the callee: (device, dtype, shape) of each argument as it
    arrived here, and the argument doubled here, on its device."""
    return [(str(t.device), str(t.dtype), tuple(t.shape), t * 2) for t in tensors]


def check_arrived(record, sent, what):
    """record: arrived_as's entry for `sent`. The callee got it on sent's
    device with its dtype and shape, and its double came back to sent's
    device with the right values."""
    device, dtype, shape, doubled = record
    assert device == str(sent.device), (
        f"{what}: the callee got the tensor on {device}, want {sent.device}")
    assert (dtype, shape) == (str(sent.dtype), tuple(sent.shape)), (
        f"{what}: the callee got {dtype}{list(shape)}, want {sent.dtype}{list(sent.shape)}")
    expect_close(doubled, sent * 2, f"{what}: its double computed by the callee, returned")


def cuda_arange(n):
    """Runs on the callee: a CUDA tensor made there."""
    return torch.arange(n, dtype=torch.float32, device=CUDA) * 3


def scenario_cuda_tensors(rank, world_size):
    """CUDA tensors through rpc_sync, rpc_async and remote(), with a device
    map {0: 0} set by the caller (worker0) only: the callee (worker1) sends
    its replies, and its own calls to worker0, through the inverse map."""
    cuda_prepare()
    cuda_init(rank, world_size, map_to_peer=(rank == 0))
    peer = name(1 - rank)
    if rank == 0:
        base = torch.randn(6, 8, device=CUDA)
        view = base.t()[1:7:2, 2:5]  # transposed, every other row, some columns
        assert not view.is_contiguous(), view.stride()
        cases = [("float32", torch.randn(3, 4, device=CUDA)),
                 ("non-contiguous float32 view", view),
                 ("bfloat16", torch.randn(5, device=CUDA).to(torch.bfloat16)),
                 ("int64", torch.arange(-3, 9, device=CUDA).reshape(3, 4))]
        for what, t in cases:
            check_arrived(rpc.rpc_sync(peer, arrived_as, args=(t,))[0], t,
                          f"rpc_sync of a {what} CUDA tensor")
            check_arrived(rpc.rpc_async(peer, arrived_as, args=(t,)).wait()[0], t,
                          f"rpc_async of a {what} CUDA tensor")
            check_arrived(rpc.remote(peer, arrived_as, args=(t,)).to_here()[0], t,
                          f"remote() with a {what} CUDA tensor, then to_here()")
        # A CUDA tensor made by the callee, held there in an RRef, fetched.
        made = rpc.remote(peer, cuda_arange, args=(5,))
        expect_close(made.to_here(), torch.arange(5, dtype=torch.float32, device=CUDA) * 3,
                     "to_here() of a CUDA tensor made by the callee in remote()")
        # A CPU tensor beside a CUDA one keeps its device, both ways.
        cpu = torch.arange(4, dtype=torch.float32) + 0.5
        gpu = torch.arange(4, dtype=torch.float32, device=CUDA) - 0.25
        on_cpu, on_gpu = rpc.rpc_sync(peer, arrived_as, args=(cpu, gpu))
        check_arrived(on_cpu, cpu, "a CPU tensor beside a CUDA tensor in one call")
        check_arrived(on_gpu, gpu, "a CUDA tensor beside a CPU tensor in one call")
        # A call to itself keeps the device.
        t = cases[0][1]
        check_arrived(rpc.rpc_sync(name(rank), arrived_as, args=(t,))[0], t,
                      "rpc_sync of a CUDA tensor to the caller itself")
        print("CHECKED worker0's calls")
    else:
        # worker1 set no map: its calls to worker0 use the inverse of worker0's.
        t = torch.randn(2, 3, device=CUDA)
        check_arrived(rpc.rpc_sync(peer, arrived_as, args=(t,))[0], t,
                      "rpc_sync of a CUDA tensor from worker1 (no map of its own) to worker0")
        print("CHECKED worker1's call")
    rpc.shutdown()
    print("SCENARIO OK")


def expect_no_device_map(call, to, what):
    """call() must fail as docs/cuda.md says a CUDA tensor sent to a worker
    with no device map fails: naming the device and that worker."""
    want = f"cannot send a tensor on device cuda:0 to worker '{to}': no device map applies"
    try:
        result = call()
    except Exception as e:  # noqa: BLE001  (the class is checked by its message)
        assert want in str(e), (f"{what}: failed with {type(e).__name__}: {e}\n"
                                f"but the message should contain: {want}")
        print(f"REFUSED {what}: {type(e).__name__} code {getattr(e, 'code', None)}")
        return
    raise AssertionError(f"{what}: succeeded without a device map (returned {result!r}); "
                         f"docs/cuda.md says it fails with: {want}")


def scenario_cuda_no_map(rank, world_size):
    """No worker sets a device map (docs/cuda.md, "No map, no send"): a CUDA
    tensor sent to the other worker fails the call naming the device and the
    worker, in a request and in a reply, both ways; CPU tensors and calls to
    itself still work, and so does the job after the failures."""
    cuda_prepare()
    cuda_init(rank, world_size, map_to_peer=False)
    peer = name(1 - rank)
    t = torch.arange(6, dtype=torch.float32, device=CUDA).reshape(2, 3)
    expect_no_device_map(lambda: rpc.rpc_sync(peer, arrived_as, args=(t,)), peer,
                         f"rpc_sync of a CUDA tensor from {name(rank)} to {peer}")
    expect_no_device_map(lambda: rpc.rpc_async(peer, arrived_as, args=(t,)).wait(), peer,
                         f"rpc_async of a CUDA tensor from {name(rank)} to {peer}")
    if rank == 0:
        # The reply: the callee makes a CUDA tensor and cannot send it back.
        expect_no_device_map(lambda: rpc.rpc_sync(peer, cuda_arange, args=(3,)), name(rank),
                             f"a CUDA result returned by {peer} to {name(rank)}")
    check_arrived(rpc.rpc_sync(name(rank), arrived_as, args=(t,))[0], t,
                  "rpc_sync of a CUDA tensor to the caller itself, with no map")
    cpu = torch.arange(3, dtype=torch.float32)
    check_arrived(rpc.rpc_sync(peer, arrived_as, args=(cpu,))[0], cpu,
                  "rpc_sync of a CPU tensor with no map, after the refused calls")
    rpc.shutdown()
    print("SCENARIO OK")


class CudaLinear:
    """An nn.Linear on this worker's cuda:0 with the given weight and bias
    (sent from the caller's GPU)."""

    def __init__(self, weight, bias):
        for what, t in (("weight", weight), ("bias", bias)):
            assert t.device == CUDA, f"CudaLinear's {what} arrived on {t.device}, want {CUDA}"
        # Made on the host, then moved: its (overwritten) initial values come
        # from the seeded CPU generator, as a run on the host would draw them.
        self.fc = torch.nn.Linear(weight.shape[1], weight.shape[0]).to(CUDA)
        with torch.no_grad():
            self.fc.weight.copy_(weight)
            self.fc.bias.copy_(bias)

    def forward(self, x):
        assert x.device == CUDA, f"CudaLinear.forward's input arrived on {x.device}, want {CUDA}"
        return self.fc(x)

    def param_rrefs(self):
        return [rpc.RRef(p) for p in self.fc.parameters()]

    def values(self):
        return [p.detach().clone() for p in self.fc.parameters()]

    def grads(self, context_id):
        """The context's gradients of the weight and the bias here (None: none)."""
        grads = dist_autograd.get_gradients(context_id)
        return [grads.get(p) for p in self.fc.parameters()]


def local_linear(weight, bias):
    fc = torch.nn.Linear(weight.shape[1], weight.shape[0]).to(weight.device)
    with torch.no_grad():
        fc.weight.copy_(weight)
        fc.bias.copy_(bias)
    return fc


def scenario_cuda_autograd(rank, world_size):
    """scenario_autograd on the GPU, with a device map {0: 0} set by both
    workers: worker1 owns an nn.Linear on its cuda:0 (in an RRef), worker0
    runs it through RPC with CUDA inputs and its own CUDA parameter after
    it. Distributed autograd's gradients equal local autograd's on worker0's
    GPU; the DistributedOptimizer (SGD) equals torch.optim.SGD on worker0's
    GPU over 3 steps; a RemoteModule on worker1/cuda:0 trains."""
    cuda_prepare()
    cuda_init(rank, world_size, map_to_peer=True)
    if rank == 0:
        # Drawn on the host (seeded), then moved to the GPU.
        x = torch.randn(5, 4).to(CUDA)
        w0 = (torch.randn(3, 4) * 0.5).to(CUDA)
        b0 = (torch.randn(3) * 0.1).to(CUDA)
        local_w = torch.nn.Parameter((torch.randn(3, 2) * 0.5).to(CUDA))
        target = torch.randn(5, 2).to(CUDA)

        def loss_of(h, lw):
            return ((h @ lw) - target).pow(2).mean()

        # Gradients against local autograd.
        layer = rpc.remote("worker1", CudaLinear, args=(w0, b0))
        with dist_autograd.context() as cid:
            h = layer.rpc_sync().forward(x)
            assert h.device == CUDA, f"the remote forward's result arrived on {h.device}"
            loss = loss_of(h, local_w)
            dist_autograd.backward(cid, [loss])
            remote_grads = layer.rpc_sync().grads(cid)
            local_grad = dist_autograd.get_gradients(cid).get(local_w)
        assert local_w.grad is None, "distributed backward accumulated into .grad"
        ref = local_linear(w0, b0)
        lw_ref = local_w.detach().clone().requires_grad_(True)
        ref_loss = loss_of(ref(x), lw_ref)
        ref_loss.backward()
        expect_close_numbers(loss.item(), ref_loss.item(), "the loss through RPC vs local")
        expect_close(remote_grads[0], ref.weight.grad,
                     "worker1's weight gradient (dist autograd) vs local autograd")
        expect_close(remote_grads[1], ref.bias.grad,
                     "worker1's bias gradient (dist autograd) vs local autograd")
        expect_close(local_grad, lw_ref.grad,
                     "worker0's own parameter's gradient (dist autograd) vs local autograd")
        print("CHECKED gradients")

        # The DistributedOptimizer against torch.optim.SGD, 3 steps.
        kwargs = {"lr": 0.05, "momentum": 0.9}
        layer = rpc.remote("worker1", CudaLinear, args=(w0, b0))
        lw = torch.nn.Parameter(local_w.detach().clone())
        opt = DistributedOptimizer(torch.optim.SGD, layer.rpc_sync().param_rrefs() + [rpc.RRef(lw)],
                                   **kwargs)
        ref = local_linear(w0, b0)
        ref_lw = torch.nn.Parameter(local_w.detach().clone())
        ref_opt = torch.optim.SGD(list(ref.parameters()) + [ref_lw], **kwargs)
        for step in range(3):
            with dist_autograd.context() as cid:
                loss = loss_of(layer.rpc_sync().forward(x), lw)
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
            ref_opt.zero_grad()
            ref_loss = loss_of(ref(x), ref_lw)
            ref_loss.backward()
            ref_opt.step()
            expect_close_numbers(loss.item(), ref_loss.item(),
                                 f"step {step}: the loss through RPC vs local")
        remote_w, remote_b = layer.rpc_sync().values()
        expect_close(remote_w, ref.weight.detach(),
                     "worker1's weight after 3 DistributedOptimizer SGD steps vs torch.optim.SGD")
        expect_close(remote_b, ref.bias.detach(),
                     "worker1's bias after 3 DistributedOptimizer SGD steps vs torch.optim.SGD")
        expect_close(lw.detach(), ref_lw.detach(),
                     "worker0's parameter after 3 DistributedOptimizer SGD steps vs "
                     "torch.optim.SGD")
        print("CHECKED optimizer")

        # A RemoteModule on worker1's GPU, trained through remote_parameters().
        remote_fc = RemoteModule("worker1/cuda:0", torch.nn.Linear, args=(4, 2))
        opt = DistributedOptimizer(torch.optim.SGD, remote_fc.remote_parameters(), lr=0.1)
        losses = []
        for _ in range(20):
            with dist_autograd.context() as cid:
                out = remote_fc(x)
                assert out.device == CUDA, f"RemoteModule's output arrived on {out.device}"
                loss = (out - 1).pow(2).mean()
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
            losses.append(loss.item())
        assert losses[-1] < losses[0] * 0.5, f"RemoteModule on cuda:0 did not learn: {losses}"
        print("CHECKED RemoteModule, loss", f"{losses[0]:.5f}", f"{losses[-1]:.5f}")
    rpc.shutdown()
    print("SCENARIO OK")


def ps_net():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def scenario_cuda_ps(rank, world_size):
    """scenario_ps's ModuleBinding with the trainer's module on cuda:0: a
    server hosted by worker1 (host tensors), worker0 trains. No device map:
    no CUDA tensor travels (pushes send host copies, pulls copy onto the
    GPU). The parameters stay on cuda:0, equal the server's values after
    every pull, follow torch.optim.SGD on the GPU, and the loss goes down."""
    import baton.ps as ps
    cuda_prepare()
    steps, lr = 20, 0.1
    net = ps_net()  # seeded: the same on both workers (the server reads its shapes)
    spec = ps.PsSpec(ps.ModuleBinding.tables(net, "net", torch.optim.SGD, lr=lr),
                     consistency="sync", num_trainers=1)
    if rank == 1:
        server = ps.PsServer(spec, server=0, num_servers=1)
        cuda_init(rank, world_size, map_to_peer=False, ps_server=server)
        rpc.shutdown()
        print("STATS", server.stats().splitlines()[0])
        print("SCENARIO OK")
        return
    cuda_init(rank, world_size, map_to_peer=False)
    net = net.to(CUDA)
    names = [f"net.{n}" for n, _ in net.named_parameters()]
    params = list(net.parameters())
    ref = copy.deepcopy(net)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g).to(CUDA)
    y = (x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]], device=CUDA)).tanh()

    def expect_server_values(when):
        """The parameters are on cuda:0 and equal the server's values."""
        server = client.pull_dense(names).wait()
        for n, p, s in zip(names, params, server):
            assert p.device == CUDA, f"{when}: parameter {n} is on {p.device}, want {CUDA}"
            expect_close(p.detach().cpu(), s, f"{when}: parameter {n} on the GPU vs the server's",
                         rtol=0, atol=0)

    client = ps.PsClient(spec, servers=["worker1"], trainer=0)
    binding = ps.ModuleBinding(client, net, "net")
    now = list(net.parameters())
    assert len(now) == len(params) and all(a is b for a, b in zip(now, params)), (
        "ModuleBinding replaced the module's parameters (it must load them in place)")
    expect_server_values("after binding")
    for p, r in zip(params, ref.parameters()):
        expect_close(p.detach(), r.detach(), "after binding: a parameter vs its initial value",
                     rtol=0, atol=0)
    losses = []
    for step in range(steps):
        net.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        binding.push()
        binding.pull()
        losses.append(loss.item())
        ref_opt.zero_grad()
        ref_loss = torch.nn.functional.mse_loss(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        expect_close_numbers(loss.item(), ref_loss.item(),
                             f"step {step}: the bound module's loss vs torch.optim.SGD's")
    expect_server_values(f"after {steps} steps")
    for n, p, r in zip(names, params, ref.parameters()):
        expect_close(p.detach(), r.detach(),
                     f"after {steps} steps: {n} trained through the server vs torch.optim.SGD")
    assert losses[-1] < losses[0] * 0.8, f"the loss did not go down: {losses}"
    assert client.clock() == steps, f"clock {client.clock()} after {steps} steps"
    print("LOSS", f"{losses[0]:.5f}", f"{losses[-1]:.5f}")
    rpc.shutdown()
    print("SCENARIO OK")


def scenario_after_process_group(rank, world_size):
    """torch.distributed's process group first, then RPC, both told to meet
    at the same MASTER_ADDR and MASTER_PORT (pytorch/examples' batch
    parameter server does this): torch's TCPStore holds the port in rank 0's
    process, and baton's store meets through it on another port. Twice, as a
    job that restarts RPC would."""
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    for round_ in range(2):
        init(rank, world_size, rpc_timeout=30)
        got = rpc.rpc_sync(name((rank + 1) % world_size), add, args=(torch.ones(2), round_))
        assert got.tolist() == [1.0 + round_] * 2, got
        rpc.shutdown()
    dist.barrier()
    dist.destroy_process_group()
    print("SCENARIO OK")


def _remote_linear_forward(module_rref, x):
    return module_rref.local_value()(x)


def scenario_ddp_under_dist_autograd(rank, world_size):
    """torch's DistributedDataParallel on each trainer under baton's
    distributed autograd (the DDP+RPC hybrid, torch's own classes): a
    remote layer on the last worker, a DDP layer on each trainer. DDP's
    hooks average the trainers' gradients in the context, as a local
    backward averages them in .grad; .grad is left alone."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    trainers = world_size - 1
    init(rank, world_size, rpc_timeout=60)
    if rank < trainers:
        # The trainers' own group (gloo), on the rendezvous' host and a port
        # of its own.
        dist.init_process_group("gloo", rank=rank, world_size=trainers,
                                init_method=f"tcp://127.0.0.1:{os.environ['DDP_PORT']}")
        torch.manual_seed(0)
        remote = rpc.remote(name(trainers), torch.nn.Linear, args=(3, 4))
        torch.manual_seed(rank + 1)  # different data on each trainer
        net = torch.nn.Linear(4, 2)
        ddp = DistributedDataParallel(net)
        for step in range(3):
            x = torch.randn(5, 3)
            with dist_autograd.context() as cid:
                hidden = rpc.rpc_sync(name(trainers), _remote_linear_forward, args=(remote, x))
                loss = ddp(hidden).pow(2).sum()
                dist_autograd.backward(cid, [loss])
                grads = dist_autograd.get_gradients(cid)
            for p in net.parameters():
                assert p.grad is None, ("dist backward left .grad", step)
            # The same step through local autograd: DDP averages in .grad.
            local = remote.to_here()
            loss = ddp(local(x)).pow(2).sum()
            loss.backward()
            for p in net.parameters():
                assert torch.allclose(grads[p], p.grad, atol=1e-6), (step, grads[p], p.grad)
                p.grad = None
        # The average is the trainers': every trainer holds the same.
        mine = torch.cat([grads[p].flatten() for p in net.parameters()])
        gathered = [torch.empty_like(mine) for _ in range(trainers)]
        dist.all_gather(gathered, mine)
        assert all(torch.allclose(g, mine) for g in gathered), gathered
        dist.destroy_process_group()
    rpc.shutdown()
    print("SCENARIO OK")


def scenario_shutdown_steps(rank, world_size):
    """torch's backend step and shutdown steps, as torch's programs and tests
    reach them: _init_rpc_backend over a torch TCPStore (a duplicate name
    refused on every rank, then a job that works); a graceful shutdown calls
    rpc.api's _wait_all_workers(timeout) and
    _delete_all_user_and_unforked_owner_rrefs() as they are when it runs (a
    program may replace them); with _ignore_rref_leak False a worker that
    still holds user RRefs after that step gets "Leaking RRef"; a step that
    raises still stops the agent, and a peer that stopped this way fails the
    others' calls to it at once (not at their timeout)."""
    import datetime
    import torch.distributed as dist
    from baton.rpc import api
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world_size, rank == 0,
                          timeout=datetime.timedelta(seconds=60))

    def barrier(tag):  # through torch's store, independent of RPC
        store.set(f"{tag}/{rank}", "1")
        store.wait([f"{tag}/{r}" for r in range(world_size)])

    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=30)
    try:
        api._init_rpc_backend(store=store, name="same", rank=rank, world_size=world_size,
                              rpc_backend_options=options)
        raise AssertionError("a duplicate name was accepted")
    except RuntimeError as e:
        assert "is not unique" in str(e), e
    def start():  # MASTER_PORT is the TCPStore's: baton's store meets through it
        api._init_rpc_backend(store=store, name=name(rank), rank=rank, world_size=world_size,
                              rpc_backend_options=options)

    start()
    got = rpc.rpc_sync(name((rank + 1) % world_size), add, args=(torch.ones(2), rank))
    assert got.tolist() == [1.0 + rank] * 2, got

    calls = []
    original_wait, original_delete = api._wait_all_workers, api._delete_all_user_and_unforked_owner_rrefs

    def wait_all_workers(timeout):
        calls.append(("wait", timeout))
        original_wait(timeout)

    def delete_all():
        calls.append(("delete", None))
        original_delete()

    api._wait_all_workers, api._delete_all_user_and_unforked_owner_rrefs = wait_all_workers, delete_all
    try:
        rpc.shutdown(timeout=7)
    finally:
        api._wait_all_workers, api._delete_all_user_and_unforked_owner_rrefs = \
            original_wait, original_delete
    assert calls == [("wait", 7.0), ("delete", None)], calls

    # The leak check: every worker keeps an RRef that worker rank+1 owns.
    start()
    kept = rpc.remote(name((rank + 1) % world_size), add, args=(torch.ones(1), 1))
    assert kept.to_here().tolist() == [2.0]
    api._ignore_rref_leak = False
    api._delete_all_user_and_unforked_owner_rrefs = lambda: None
    try:
        rpc.shutdown()
        raise AssertionError("no leak reported")
    except RuntimeError as e:
        assert f"Leaking RRef {rank}:" in str(e) and f"(owner {(rank + 1) % world_size})" in str(e), e
    finally:
        api._ignore_rref_leak = True
        api._delete_all_user_and_unforked_owner_rrefs = original_delete
    assert not api._is_current_rpc_agent_set()

    # A worker that stopped (its process lives on) fails the others' calls
    # to it at once, not at their timeout.
    start()
    barrier("started")
    if rank == 1:
        rpc.shutdown(graceful=False)
        barrier("stopped")
    else:
        barrier("stopped")
        begin = time.monotonic()
        try:
            rpc.rpc_sync(name(1), echo, args=(1,), timeout=20)
            raise AssertionError("a call to a stopped worker returned")
        except RuntimeError as e:
            assert isinstance(e, rpc.WorkerUnavailableError), e
        assert time.monotonic() - begin < 5, time.monotonic() - begin
        rpc.shutdown(graceful=False)

    # A step that raises on worker 1: its agent stops anyway, with that
    # error; the others' gather fails within their timeout.
    start()
    barrier("restarted")
    if rank == 1:
        def failing(timeout):
            raise RuntimeError("step failed")
        api._wait_all_workers = failing
        try:
            rpc.shutdown()
            raise AssertionError("the step's error was not raised")
        except RuntimeError as e:
            assert str(e) == "step failed", e
        finally:
            api._wait_all_workers = original_wait
    else:
        try:
            rpc.shutdown(timeout=3)
            raise AssertionError("the gather without worker 1 did not fail")
        except RuntimeError as e:
            assert "timed out in _all_gather" in str(e), e
    assert not api._is_current_rpc_agent_set()
    barrier("done")
    # Rank 0 serves the store: it leaves last, once every rank is past the
    # barrier (a follower still waiting on a store that went away reads
    # "Broken pipe").
    if rank == 0:
        store.wait([f"gone/{r}" for r in range(1, world_size)])
    else:
        store.set(f"gone/{rank}", "1")
    print("SCENARIO OK")


def _role_name():
    return f"{os.environ.get('BATON_ROLE', 'worker')}{os.environ.get('BATON_ROLE_RANK', '0')}"


# ---- A dynamic group: init_rpc without a world size ----

_arrived = threading.Condition()
_arrivals = []
_released = threading.Event()


def arrive(rank):
    with _arrived:
        _arrivals.append(rank)
        _arrived.notify_all()


def release_member():
    _released.set()


def scenario_dynamic(rank, world_size):
    """Workers that join one by one, without a world size, and leave alone
    (rpc/agent.h, M1-M4): every member reaches every other by name, and a
    member's leave shrinks the others' worker list."""
    os.environ.pop("WORLD_SIZE")  # no size anywhere: the group is dynamic
    options = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}")
    rpc.init_rpc(name(rank), rank=rank, rpc_backend_options=options)
    me = rpc.get_worker_info()
    assert me.name == name(rank) and me.id == rank, me
    if rank != 0:
        # Rank 0 serves the store: whoever joined, it is in the group.
        rpc.rpc_sync("worker0", arrive, args=(rank,))
        assert _released.wait(60), "rank 0 never released this member"
        rpc.shutdown()
        print("SCENARIO OK")
        return
    with _arrived:
        assert _arrived.wait_for(lambda: len(_arrivals) == world_size - 1, 60), _arrivals
    names = sorted(w.name for w in rpc._get_current_rpc_agent().get_worker_infos())
    print("MEMBERS " + ",".join(names))
    for r in range(1, world_size):
        assert rpc.rpc_sync(name(r), add, args=(torch.ones(2), r)).tolist() == [1.0 + r] * 2
        assert rpc.remote(name(r), add, args=(r, 1)).to_here() == r + 1
    # Each leaves once released; this worker then sees the group shrink.
    for r in range(1, world_size):
        rpc.rpc_sync(name(r), release_member)
    deadline = time.monotonic() + 60
    while len(rpc._get_current_rpc_agent().get_worker_infos()) > 1:
        assert time.monotonic() < deadline, "the members never left"
        time.sleep(0.01)
    try:
        rpc.rpc_sync(name(1), echo, args=(1,))
        raise AssertionError("a member that left was called")
    except RuntimeError as e:
        print("LEFT " + ("left the group" in str(e) or "no worker named" in str(e)).__repr__())
    rpc.shutdown()
    print("SCENARIO OK")


if __name__ == "__main__":
    scenario = globals()["scenario_" + sys.argv[1]]
    if sys.argv[1] in ("launched", "restarts"):  # rank and world size from baton-run
        scenario()
    else:
        scenario(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
