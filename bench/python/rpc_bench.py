#!/usr/bin/python3
"""baton's Python front end on the workload of ../shared/peer/torch_rpc_bench.py.

The same two processes (rank 0 drives, rank 1 serves), the same calls and the
same metrics, each name prefixed with python_ (bench/compare.sh sets them
beside the peer's and beside the C++ agent's). Run after tools/python.sh:
  PYTHONPATH=python /usr/bin/python3 bench/python/rpc_bench.py [--quick]
"""
import json
import os
import sys
import time

import torch
import torch.multiprocessing as mp

import baton.distributed.autograd as dist_autograd
import baton.rpc as rpc
from baton.distributed.optim import DistributedOptimizer

QUICK = "--quick" in sys.argv


def echo(t):
    return t


def noop():
    return None


class Linear:
    def __init__(self, n):
        self.w = torch.randn(n, n, requires_grad=True)

    def forward(self, x):
        return x @ self.w

    def params(self):
        return [rpc.RRef(self.w)]


def _forward(rref, x):
    return rref.local_value().forward(x)


def _params(rref):
    return rref.local_value().params()


def report(name, value, unit, **extra):
    print(json.dumps(dict(system="baton-python", metric="python_" + name, value=value,
                          unit=unit, **extra)), flush=True)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def driver():
    n = 300 if QUICK else 3000
    peer = "w1"
    for _ in range(100):
        rpc.rpc_sync(peer, noop)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        rpc.rpc_sync(peer, noop)
        lat.append(time.perf_counter() - t0)
    report("rpc_sync_noop_latency_p50", pct(lat, 0.5) * 1e6, "us")
    report("rpc_sync_noop_latency_p99", pct(lat, 0.99) * 1e6, "us")

    small = torch.ones(16)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        rpc.rpc_sync(peer, echo, args=(small,))
        lat.append(time.perf_counter() - t0)
    report("rpc_sync_echo_64B_latency_p50", pct(lat, 0.5) * 1e6, "us")

    total = 2000 if QUICK else 20000
    window = 64
    t0 = time.perf_counter()
    futs = []
    for _ in range(total):
        futs.append(rpc.rpc_async(peer, echo, args=(small,)))
        if len(futs) >= window:
            futs.pop(0).wait()
    for f in futs:
        f.wait()
    dt = time.perf_counter() - t0
    report("rpc_async_echo_64B_throughput", total / dt, "calls/s", window=window)

    for mb in (1, 16, 64):
        big = torch.ones(mb * 1024 * 1024 // 4)
        reps = 5 if QUICK else 20
        rpc.rpc_sync(peer, echo, args=(big,))
        t0 = time.perf_counter()
        for _ in range(reps):
            rpc.rpc_sync(peer, echo, args=(big,))
        dt = time.perf_counter() - t0
        report(f"rpc_sync_echo_{mb}MB_bandwidth", 2 * mb * reps / 1024 / dt, "GB/s",
               note="bytes sent plus bytes returned")

    lat = []
    for _ in range(n // 3):
        t0 = time.perf_counter()
        r = rpc.remote(peer, echo, args=(small,))
        r.to_here()
        lat.append(time.perf_counter() - t0)
    report("remote_to_here_latency_p50", pct(lat, 0.5) * 1e6, "us")

    m = rpc.remote(peer, Linear, args=(256,))
    params = rpc.rpc_sync(peer, _params, args=(m,))
    opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.01)
    x = torch.randn(64, 256)
    steps = 50 if QUICK else 300
    for i in range(steps + 10):
        if i == 10:
            t0 = time.perf_counter()
        with dist_autograd.context() as ctx:
            y = rpc.rpc_sync(peer, _forward, args=(m, x))
            dist_autograd.backward(ctx, [y.sum()])
            opt.step(ctx)
    dt = time.perf_counter() - t0
    report("dist_autograd_step_remote_linear256", dt / steps * 1e6, "us/step")


def run(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29612")
    torch.set_num_threads(1)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(num_worker_threads=16,
                                                                     rpc_timeout=120))
    if rank == 0:
        driver()
    rpc.shutdown()


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2, join=True)
