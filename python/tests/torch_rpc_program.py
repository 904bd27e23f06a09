"""A program written for torch.distributed.rpc, with torch's imports only:
the drop-in test (test_rpc.py) runs it unchanged with
`python3 -m baton.torch_rpc`. It starts its two workers as torch's tutorials
do (torch.multiprocessing.spawn), so they get drop-in mode from the
environment, and prints what it checks: Python calls, an RRef, distributed
autograd and the optimizer, and TorchScript code that calls rpc_async and
remote itself (TorchScript's RPC operators, served by torch's C++ agent
interface, which baton implements in drop-in mode).
"""
import os
import sys
from typing import Dict, List

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rpc.api import rpc_async


def square(x):
    return x * x


class Table:
    def __init__(self, n):
        self.w = torch.nn.Parameter(torch.full((n,), 2.0))

    def forward(self, x):
        return (self.w * x).sum()

    def param_rrefs(self):
        return [rpc.RRef(self.w)]


@torch.jit.script
def script_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


@torch.jit.script
def script_fail(x: torch.Tensor) -> torch.Tensor:
    if bool(x.sum() > 0):
        raise RuntimeError("scripted failure on the callee")
    return x


@torch.jit.script
def rpc_async_in_script(dst: str, x: torch.Tensor) -> torch.Tensor:
    fut = rpc.rpc_async(dst, script_add, (x, x))
    return fut.wait()


@torch.jit.script
def remote_in_script(dst: str, x: torch.Tensor) -> torch.Tensor:
    rref = rpc.remote(dst, script_add, (x, torch.ones(1)))
    return rref.to_here()


@torch.jit.script
def failing_call_in_script(dst: str, x: torch.Tensor) -> torch.Tensor:
    return rpc.rpc_async(dst, script_fail, (x,)).wait()


@torch.jit.script
def script_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * y


@torch.jit.script
def rpc_async_mul(dst: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return rpc.rpc_async(dst, script_mul, (x, y)).wait()


@torch.jit.script
def forked_product(dst: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # The RPC runs on a TorchScript fork's thread, and the code after each
    # wait() on the thread that completed it: the context goes with them.
    fut = torch.jit._fork(rpc_async_mul, dst, x, y)
    z = fut.wait()
    return rpc.rpc_async(dst, script_mul, (z, y)).wait()


@torch.jit.script
def scripted_backward(context_id: int, loss: torch.Tensor) -> Dict[torch.Tensor, torch.Tensor]:
    dist_autograd.backward(context_id, [loss])
    return dist_autograd.get_gradients(context_id)


@torch.jit.script
def fetch_in_script(rref: rpc.RRef[torch.Tensor]) -> torch.Tensor:
    return rref.to_here() + 1


@torch.jit.script
def owner_in_script(rref: rpc.RRef[torch.Tensor]) -> bool:
    return rref.is_owner() and rref.confirmed_by_owner()


@torch.jit.script
def pass_on_in_script(rref: rpc.RRef[torch.Tensor]) -> rpc.RRef[torch.Tensor]:
    return rref


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def make_doubler():
    return torch.jit.script(Doubler())


@torch.jit.script
def make_list() -> List[int]:
    return [1, 2, 3]


@torch.jit.script
def append_in_script(rref: rpc.RRef[List[int]], item: int) -> None:
    rref.local_value().append(item)


class SumOfRRefs(torch.nn.Module):
    """A module whose attribute is a list of RRefs: TorchScript infers its
    type (List[RRef[Tensor]]) when the module is scripted."""

    def __init__(self, rrefs):
        super().__init__()
        self.rrefs = rrefs

    def forward(self) -> torch.Tensor:
        total = torch.zeros(1)
        for rref in self.rrefs:
            total += rref.to_here()
        return total


@torch.jit.interface
class DoublerInterface(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pass


@torch.jit.script
def forward_in_script(module: DoublerInterface, x: torch.Tensor) -> torch.Tensor:
    return module.forward(x)


def start_tensorpipe(store, name, rank, world_size, rpc_backend_options):
    """The init handler of a backend the program registers: it starts the
    TENSORPIPE backend and says so."""
    # Both workers print this to one pipe: one write(2) each, so that the
    # lines cannot interleave (print() writes its pieces one by one when
    # stdout is unbuffered).
    sys.stdout.write(f"BACKEND INIT {name}\n")
    sys.stdout.flush()
    return rpc.backend_registry.init_backend(rpc.BackendType.TENSORPIPE, store, name, rank,
                                             world_size, rpc_backend_options)


def tensorpipe_options(rpc_timeout, init_method, **kwargs):
    return rpc.TensorPipeRpcBackendOptions(rpc_timeout=rpc_timeout, init_method=init_method,
                                           **kwargs)


def run(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # A backend of the program's own, around torch's TENSORPIPE one.
    backend = rpc.backend_registry.register_backend("LOGGED_TENSORPIPE", tensorpipe_options,
                                                    start_tensorpipe)
    options = rpc.backend_registry.construct_rpc_backend_options(
        backend, rpc_timeout=30, init_method=f"tcp://127.0.0.1:{port}", num_worker_threads=8)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, backend=backend,
                 rpc_backend_options=options)
    if rank == 0:
        print("MODULE", rpc.__name__, dist_autograd.__name__, DistributedOptimizer.__module__,
              flush=True)
        print("SYNC", rpc.rpc_sync("worker1", square, args=(torch.tensor([3.0]),)).item(),
              flush=True)
        print("ASYNC", rpc_async("worker1", square, args=(torch.tensor([4.0]),)).wait().item(),
              flush=True)
        table = rpc.remote("worker1", Table, args=(3,))
        opt = DistributedOptimizer(torch.optim.SGD, table.rpc_sync().param_rrefs(), lr=0.5)
        with dist_autograd.context() as ctx:
            loss = table.rpc_sync().forward(torch.ones(3))
            dist_autograd.backward(ctx, [loss])
            opt.step(ctx)
        # d(sum(w * 1))/dw = 1; w = 2 - 0.5 * 1
        print("TRAINED", table.rpc_sync().forward(torch.ones(3)).item(), flush=True)
        print("SCRIPT RPC_ASYNC", rpc_async_in_script("worker1", torch.tensor([5.0])).item(),
              flush=True)
        print("SCRIPT REMOTE", remote_in_script("worker1", torch.tensor([5.0])).item(), flush=True)
        # Distributed autograd through scripted RPCs and scripted backward:
        # loss = sum(x * y * y), so dx = y * y and dy = 2 * x * y.
        with dist_autograd.context() as ctx:
            x = torch.tensor([1.0, 2.0], requires_grad=True)
            y = torch.tensor([3.0, 4.0], requires_grad=True)
            loss = forked_product("worker1", x, y).sum()
            grads = scripted_backward(ctx, loss)
            print("SCRIPT AUTOGRAD", grads[x].tolist(), grads[y].tolist(), flush=True)
        # RRefs made in Python, used by scripted code: a user's (fetched from
        # its owner by TorchScript), an owner's, and one scripted code
        # returns through an RPC.
        remote_rref = rpc.remote("worker1", square, args=(torch.tensor([6.0]),))
        local_rref = rpc.RRef(torch.tensor([7.0]))
        back = rpc.rpc_sync("worker1", pass_on_in_script, args=(remote_rref,))
        print("SCRIPT RREF", fetch_in_script(remote_rref).item(), owner_in_script(remote_rref),
              owner_in_script(local_rref),
              rpc.rpc_sync("worker1", fetch_in_script, args=(local_rref,)).item(),
              back.to_here().item(), flush=True)
        # A ScriptModule made on the callee comes back as one.
        module = rpc.rpc_sync("worker1", make_doubler)
        print("SCRIPT MODULE", isinstance(module, torch.jit.ScriptModule),
              module(torch.tensor([3.0])).item(), flush=True)
        # A list a scripted function made for remote() stays TorchScript's:
        # scripted code that takes its RRef changes it.
        list_rref = rpc.remote("worker1", make_list)
        rpc.rpc_sync("worker1", append_in_script, args=(list_rref, 4))
        print("SCRIPT LIST", list_rref.to_here(), flush=True)
        # RRefs as a scripted module's attribute (their type inferred).
        rrefs = [remote_rref, rpc.remote("worker1", square, args=(torch.tensor([2.0]),))]
        print("SCRIPT RREF ATTRIBUTE", torch.jit.script(SumOfRRefs(rrefs))().item(),
              isinstance(remote_rref, torch._C._distributed_rpc.PyRRef), flush=True)
        # A RemoteModule scripted code calls, through its interface.
        from torch.distributed.nn.api.remote_module import _RemoteModule
        remote_doubler = torch.jit.script(_RemoteModule(
            "worker1/cpu", make_doubler, _module_interface_cls=DoublerInterface))
        print("SCRIPT REMOTE MODULE",
              forward_in_script(remote_doubler, torch.tensor([4.0])).item(), flush=True)
        try:
            rpc.api._set_and_start_rpc_agent(object())
        except TypeError as e:
            print("FOREIGN AGENT REFUSED", "baton runs RPC on its own agent" in str(e), flush=True)
        try:
            failing_call_in_script("worker1", torch.ones(1))
            print("SCRIPT ERROR none", flush=True)
        except RuntimeError as e:
            print("SCRIPT ERROR", "scripted failure on the callee" in str(e), flush=True)
    rpc.shutdown()


if __name__ == "__main__":
    if len(sys.argv) > 1:  # the port to rendezvous on, as a launcher passes it
        port = int(sys.argv[1])
    else:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    mp.spawn(run, args=(2, port), nprocs=2, join=True)
    print("PROGRAM OK")
    sys.exit(0)
