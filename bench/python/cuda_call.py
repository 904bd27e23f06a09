"""Small calls with CUDA tensors from Python: two processes on one GPU, the
caller mapping its cuda:0 to the callee's cuda:0 (docs/cuda.md).

    python3 bench/python/cuda_call.py [--agent baton|torch] [--calls 500]

JSON lines, one per figure, as bench/cuda_rpc_bench.cc writes them:
    small_cuda_call_us   median rpc_sync of a 4-element CUDA tensor (echoed)
    small_cpu_call_us    the same with a CPU tensor
    cuda_over_cpu_call   their ratio (the target: at most 2 under MPS)
    cuda_echo_64MB_GBps  a 64 MB CUDA tensor echoed, bytes each way per
                         second, counted until the last copy has run
"agent" says whose RPC ran (baton.rpc, or torch.distributed.rpc for the
comparison), "gpu_sharing" what BATON_BENCH_GPU_SHARING says (tools/gpu/
sets it to "mps" under an MPS daemon). Each worker is this file run again
with --rank; both are reaped, bounded by --timeout.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import torch


def echo(t: torch.Tensor) -> torch.Tensor:
    return t


def _rpc(agent: str):
    if agent == "baton":
        import baton.rpc as rpc
    else:
        import torch.distributed.rpc as rpc
    return rpc


def _report(agent: str, metric: str, value: float) -> None:
    print(json.dumps({"system": agent, "agent": agent, "path": "python",
                      "gpu_sharing": os.environ.get("BATON_BENCH_GPU_SHARING", "time-sliced"),
                      "metric": metric, "value": round(value, 4)}), flush=True)


def _median_us(rpc, t: torch.Tensor, calls: int) -> float:
    times = []
    for i in range(calls + 20):
        start = time.perf_counter()
        rpc.rpc_sync("w1", echo, args=(t,))
        if i >= 20:
            times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def worker(args) -> None:
    rpc = _rpc(args.agent)
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{args.port}",
                                              rpc_timeout=60)
    if not args.cpu_only:
        torch.cuda.set_device(0)
        if args.rank == 0:
            options.set_device_map("w1", {0: 0})
    rpc.init_rpc(f"w{args.rank}", rank=args.rank, world_size=2, rpc_backend_options=options)
    if args.rank == 0 and args.cpu_only:
        _report(args.agent, "small_cpu_call_us", _median_us(rpc, torch.ones(4), args.calls))
    elif args.rank == 0:
        cuda_us = _median_us(rpc, torch.ones(4, device="cuda"), args.calls)
        cpu_us = _median_us(rpc, torch.ones(4), args.calls)
        _report(args.agent, "small_cuda_call_us", cuda_us)
        _report(args.agent, "small_cpu_call_us", cpu_us)
        _report(args.agent, "cuda_over_cpu_call", cuda_us / cpu_us)
        big = torch.ones(16 << 20, device="cuda")
        for _ in range(3):
            rpc.rpc_sync("w1", echo, args=(big,))
        torch.cuda.synchronize()
        reps = 20
        start = time.perf_counter()
        for _ in range(reps):
            back = rpc.rpc_sync("w1", echo, args=(big,))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        assert back.device == big.device and torch.equal(back, big), "the echo came back changed"
        _report(args.agent, "cuda_echo_64MB_GBps", 2 * reps * big.nbytes / seconds / 1e9)
    rpc.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", choices=["baton", "torch"], default="baton")
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--cpu-only", action="store_true",
                    help="the CPU call alone (checks the script on a machine without a GPU)")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        worker(args)
        return 0
    if not torch.cuda.is_available() and not args.cpu_only:
        print("python_cuda_call: no CUDA device (--cpu-only checks the script)", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, __file__, "--agent", args.agent, "--calls", str(args.calls),
            "--port", str(port)] + (["--cpu-only"] if args.cpu_only else [])
    procs = [subprocess.Popen(argv + ["--rank", str(rank)], start_new_session=True)
             for rank in range(2)]
    deadline = time.monotonic() + args.timeout
    rc = 0
    try:
        for p in procs:
            code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            rc = rc or code
    except subprocess.TimeoutExpired:
        print(f"python_cuda_call: timed out after {args.timeout} s", file=sys.stderr)
        rc = 124
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return rc


if __name__ == "__main__":
    sys.exit(main())
