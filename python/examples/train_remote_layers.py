"""A model whose first and last layers live on other workers, trained on
Fashion-MNIST through distributed autograd and DistributedOptimizer.

    bash tools/python.sh
    bazel-bin/launcher/baton-run --standalone --role trainer:1 --role ps:2 \\
        .venv/bin/python python/examples/train_remote_layers.py [--epochs 1]

ps0 holds Linear(784, 256), ps1 holds Linear(128, 10); the trainer holds
Linear(256, 128) and drives: each batch's forward pass crosses both servers,
one backward pass runs on all three workers, and one optimizer step (Adam)
updates every layer where it lives. After training, the trainer measures
the accuracy on the 10,000 test images and prints RESULT OK if it reaches
--min_accuracy (default 0.80), else RESULT FAIL and exits 1.
"""
import argparse
import sys
import time

import torch

import baton.distributed.autograd as dist_autograd
import baton.rpc as rpc
from baton.distributed.optim import DistributedOptimizer
from fashion_mnist import load

class Layer:
    """A layer held by a server; the trainer calls its methods through an RRef."""

    def __init__(self, n_in, n_out, seed):
        torch.manual_seed(seed)
        self.module = torch.nn.Linear(n_in, n_out)

    def forward(self, x):
        return self.module(x)

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.module.parameters()]


def train(args):
    train_x, train_y = load("train")
    test_x, test_y = load("t10k")
    first = rpc.remote("ps0", Layer, args=(784, 256, 1))
    last = rpc.remote("ps1", Layer, args=(128, 10, 2))
    torch.manual_seed(3)
    middle = torch.nn.Linear(256, 128)

    def model(x):
        h = torch.relu(first.rpc_sync().forward(x))
        h = torch.relu(middle(h))
        return last.rpc_sync().forward(h)

    params = (first.rpc_sync().parameter_rrefs() + last.rpc_sync().parameter_rrefs() +
              [rpc.RRef(p) for p in middle.parameters()])
    opt = DistributedOptimizer(torch.optim.Adam, params, lr=1e-3)
    start = time.monotonic()
    g = torch.Generator().manual_seed(0)
    for epoch in range(args.epochs):
        order = torch.randperm(len(train_x), generator=g)
        total = 0.0
        for i in range(0, len(order), args.batch):
            idx = order[i:i + args.batch]
            with dist_autograd.context() as cid:
                loss = torch.nn.functional.cross_entropy(model(train_x[idx]), train_y[idx])
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
            total += loss.item() * len(idx)
        print(f"epoch {epoch}: loss {total / len(order):.4f} "
              f"({time.monotonic() - start:.1f} s)", flush=True)
    with torch.no_grad():
        correct = sum((model(test_x[i:i + 1000]).argmax(1) == test_y[i:i + 1000]).sum().item()
                      for i in range(0, len(test_x), 1000))
    accuracy = correct / len(test_x)
    print(f"test accuracy {accuracy:.4f}", flush=True)
    return accuracy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--min_accuracy", type=float, default=0.80)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rpc.init_rpc()  # name, rank and world size from baton-run (trainer0, ps0, ps1)
    ok = True
    if rpc.get_worker_info().name == "trainer0":
        accuracy = train(args)
        ok = accuracy >= args.min_accuracy
        print("RESULT OK" if ok else f"RESULT FAIL: accuracy {accuracy:.4f} < "
              f"{args.min_accuracy}", flush=True)
    rpc.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
