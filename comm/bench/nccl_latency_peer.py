"""The PyTorch peer of comm/bench/nccl_latency_bench.cc: torch.distributed's
own NCCL process group at world size 1 on one GPU, the same work and metric
names, JSON lines on stdout.

  op_wait_us        median of (all_reduce of 1024 float32 + synchronize)
  queued_us_per_op  1000 all_reduces issued back to back, then synchronize:
                    total / 1000
  plain_step_us     median step of an MLP 784-1024-1024-10, batch 64
  ddp_step_us       the same step under torch's DistributedDataParallel
  ddp_overhead      ddp_step_us / plain_step_us
  dp_step_us        the same step under torch.nn.DataParallel over every GPU
  dp_overhead       dp_step_us / plain_step_us
  gpus              how many GPUs that is

  python3 comm/bench/nccl_latency_peer.py [--iters 2000]
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def report(metric, value, unit):
    print(json.dumps({"system": "torch", "torch": torch.__version__,
                      "metric": metric, "value": round(value, 6), "unit": unit}),
          flush=True)


def mlp():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                         nn.ReLU(), nn.Linear(1024, 10)).cuda()


def step_us(model, iters):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 784, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    times = []
    for i in range(iters + 20):
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= 20:
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()
    torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl", init_method=f"file://{os.path.join(tmp, 'store')}",
                                rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        small = torch.ones(1024, device="cuda")
        times = []
        for i in range(args.iters + 200):
            t0 = time.perf_counter()
            dist.all_reduce(small)
            torch.cuda.synchronize()
            if i >= 200:
                times.append((time.perf_counter() - t0) * 1e6)
        report("op_wait_us", statistics.median(times), "us")

        per_op = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(1000):
                dist.all_reduce(small)
            torch.cuda.synchronize()
            per_op.append((time.perf_counter() - t0) * 1e6 / 1000)
        report("queued_us_per_op", statistics.median(per_op), "us")

        torch.manual_seed(0)
        plain = step_us(mlp(), args.iters // 4)
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(mlp(), device_ids=[0])
        wrapped = step_us(ddp, args.iters // 4)
        report("plain_step_us", plain, "us")
        report("ddp_step_us", wrapped, "us")
        report("ddp_overhead", wrapped / plain, "x")
        torch.manual_seed(0)
        gpus = torch.cuda.device_count()
        replicated = step_us(nn.DataParallel(mlp(), device_ids=list(range(gpus))),
                             args.iters // 4)
        report("gpus", gpus, "")
        report("dp_step_us", replicated, "us")
        report("dp_overhead", replicated / plain, "x")
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
