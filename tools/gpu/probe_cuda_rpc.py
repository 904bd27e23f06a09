"""What a lent GPU machine offers the CUDA RPC path (issue "GPU, part 2"), and
the peer figures that path is measured against, one JSON line each:

  d2d_copy_64MB_GBps      cudaMemcpy device-to-device of 64 MB in one process
                          (bytes copied per second: the bandwidth limit)
  cuda_ipc_works          a CUDA tensor passed to a second process on the same
                          GPU through CUDA IPC (torch.multiprocessing) arrives
                          with its values, and a write there is seen here
  torch_rpc_echo_64MB_GBps  torch.distributed.rpc (TensorPipe) with a device
                          map, a 64 MB CUDA tensor echoed between two
                          processes on one GPU (bytes each way per second)
  torch_rpc_small_cuda_us / torch_rpc_small_cpu_us   median rpc_sync of a
                          4-element tensor, CUDA with the device map and CPU

  python3 tools/gpu/probe_cuda_rpc.py
"""
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp


def report(metric, value, **extra):
    print(json.dumps({"metric": metric, "value": value, **extra}), flush=True)


def d2d_bandwidth():
    n = 64 * 1024 * 1024
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(5):
        dst.copy_(src)
    torch.cuda.synchronize()
    reps = 50
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    torch.cuda.synchronize()
    return n * reps / (time.perf_counter() - t0) / 1e9


def ipc_child(queue, done):
    t = queue.get()
    ok = bool((t == 7).all().item())
    t.fill_(9)
    torch.cuda.synchronize()
    done.put(ok)


def ipc_works():
    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=ipc_child, args=(queue, done))
    p.start()
    t = torch.full((1024,), 7.0, device="cuda")
    torch.cuda.synchronize()
    queue.put(t)
    ok = done.get(timeout=60)
    p.join(timeout=30)
    return ok and bool((t == 9).all().item())


def echo(t):
    return t


def rpc_worker(rank, port, results):
    import torch.distributed.rpc as rpc
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=60)
    other = f"w{1 - rank}"
    options.set_device_map(other, {0: 0})
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    if rank == 0:
        big = torch.ones(16 * 1024 * 1024, device="cuda")  # 64 MB
        for _ in range(3):
            rpc.rpc_sync(other, echo, args=(big,))
        reps = 10
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            out = rpc.rpc_sync(other, echo, args=(big,))
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        results.put(("torch_rpc_echo_64MB_GBps", 2 * big.numel() * 4 * reps / elapsed / 1e9))
        results.put(("torch_rpc_echo_device", str(out.device)))
        for name, dev in (("torch_rpc_small_cuda_us", "cuda"), ("torch_rpc_small_cpu_us", "cpu")):
            small = torch.ones(4, device=dev)
            times = []
            for i in range(520):
                t0 = time.perf_counter()
                rpc.rpc_sync(other, echo, args=(small,))
                if i >= 20:
                    times.append((time.perf_counter() - t0) * 1e6)
            results.put((name, statistics.median(times)))
    rpc.shutdown()


def torch_rpc():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=rpc_worker, args=(r, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        if p.is_alive():
            p.kill()
    out = {}
    while not results.empty():
        k, v = results.get()
        out[k] = v
    return out


def main():
    report("torch", torch.__version__, gpu=torch.cuda.get_device_name(0))
    report("d2d_copy_64MB_GBps", round(d2d_bandwidth(), 1))
    try:
        report("cuda_ipc_works", ipc_works())
    except Exception as e:  # the probe reports, it does not stop
        report("cuda_ipc_works", False, error=repr(e))
    try:
        for k, v in torch_rpc().items():
            report(k, round(v, 2) if isinstance(v, float) else v)
    except Exception as e:
        report("torch_rpc", "failed", error=repr(e))


if __name__ == "__main__":
    sys.exit(main())
