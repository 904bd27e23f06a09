#!/usr/bin/python3
"""One call to every other worker of a job (issue 48's scale table): rank 0
calls a no-op on the N - 1 others, as a flat loop of rpc_async followed by
a wait for every future (what a torch.distributed.rpc program does), and,
on baton, as one group call through a tree (baton.rpc.group.Group).

  PYTHONPATH=python /usr/bin/python3 bench/python/group_call.py \
      [--workers 16] [--agent baton|torch] [--calls 20] [--fanout 8] [--start fork|spawn]

The workers are processes of this host. --start fork (the default) forks
them from this process once it imported torch and the RPC package, so the
interpreters share those pages and a hundred or more fit in memory;
--start spawn starts a fresh interpreter each, as a launcher would. Prints
one JSON line per way of calling: the median over the calls, in ms, and
the time from the first worker's init_rpc call to the last return.
"""
import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.multiprocessing as mp


def _noop():
    return None


def _import_rpc(agent):
    if agent == "torch":
        import torch.distributed.rpc as rpc
    else:
        import baton.rpc as rpc
    return rpc


def _timed(fn, calls):
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def _worker(rank, args, port, results):
    rpc = _import_rpc(args.agent)
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}",
                                              rpc_timeout=300)
    start = time.monotonic()
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=args.workers, rpc_backend_options=options)
    results.put(("init", rank, start, time.monotonic()))
    if rank == 0:
        others = [f"w{r}" for r in range(1, args.workers)]

        def loop():
            torch.futures.wait_all([rpc.rpc_async(w, _noop) for w in others])

        ways = {"loop": loop}
        if args.agent == "baton":
            from baton.rpc.group import Group
            group = Group(others, fanout=args.fanout)
            ways["tree"] = lambda: group.rpc_sync(_noop)
        for fn in ways.values():
            _timed(fn, 3)  # warm-up: every connection made
        times = {way: [] for way in ways}
        # Alternating, so that both see the same machine.
        for _ in range(args.calls):
            for way, fn in ways.items():
                times[way] += _timed(fn, 1)
        results.put(("times", times))
    rpc.shutdown()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--agent", choices=("baton", "torch"), default="baton")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--fanout", type=int, default=8)
    ap.add_argument("--start", choices=("fork", "spawn"), default="fork")
    args = ap.parse_args()
    if args.start == "fork":
        _import_rpc(args.agent)  # imported once, shared by the forked workers
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    ctx = mp.get_context(args.start)
    results = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(args, port, results), nprocs=args.workers, join=True,
                       start_method=args.start)
    inits, times = [], {}
    while not results.empty():
        item = results.get()
        if item[0] == "init":
            inits.append(item[2:])
        else:
            times = item[1]
    rendezvous = max(end for _, end in inits) - max(start for start, _ in inits)
    for way, values in times.items():
        print(json.dumps({"system": args.agent, "metric": f"group_call_{way}_ms",
                          "workers": args.workers, "fanout": args.fanout if way == "tree" else None,
                          "value": round(statistics.median(values), 3),
                          "min": round(min(values), 3), "calls": len(values),
                          "init_s": round(rendezvous, 3), "start": args.start}), flush=True)


if __name__ == "__main__":
    main()
