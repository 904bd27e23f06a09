#!/usr/bin/python3
"""What an idle Python RPC worker costs (issue 48): N workers on this host
call init_rpc, and once it returned each reports its resident memory, its
PSS (shared pages divided among the processes that map them) and its
threads, before any call; then they shut down together. The same for
torch.distributed.rpc (TensorPipe) with --agent torch.

  PYTHONPATH=python /usr/bin/python3 bench/python/idle_footprint.py [--workers 16] [--agent baton|torch]

Prints one JSON line per metric: the median over the workers, and the
largest.
"""
import argparse
import json
import os
import socket
import statistics

import torch.multiprocessing as mp


def _proc_value(path, key):
    with open(path) as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return -1


def _usage():
    return {"rss_mib": _proc_value("/proc/self/status", "VmRSS:") / 1024,
            "pss_mib": _proc_value("/proc/self/smaps_rollup", "Pss:") / 1024,
            "threads": _proc_value("/proc/self/status", "Threads:")}


def _worker(rank, world_size, port, agent, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if agent == "torch":
        import torch.distributed.rpc as rpc
    else:
        import baton.rpc as rpc
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}",
                                              rpc_timeout=120)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size, rpc_backend_options=options)
    # init_rpc returns past the rendezvous: every worker's process is up, so
    # the shared pages are divided among all of them.
    results.put((rank, _usage()))
    rpc.shutdown()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--agent", choices=("baton", "torch"), default="baton")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(args.workers, port, args.agent, results),
                       nprocs=args.workers, join=True, start_method="spawn")
    usage = [results.get()[1] for _ in range(args.workers)]
    for key, unit in (("rss_mib", "MiB"), ("pss_mib", "MiB"), ("threads", "threads")):
        values = [u[key] for u in usage]
        print(json.dumps({"system": args.agent, "metric": f"python_idle_worker_{key}",
                          "workers": args.workers, "value": statistics.median(values),
                          "max": max(values), "unit": unit}), flush=True)


if __name__ == "__main__":
    main()
