"""The parameter-server job on Fashion-MNIST, from Python (baton.ps).

    bash tools/python.sh
    bazel-bin/launcher/baton-run --standalone --role ps:2 --role trainer:2 \\
        .venv/bin/python python/examples/ps_fashion_mnist.py [--consistency ssp:2]

Both servers hold half of every parameter of an MLP 784-256-128-10 (SGD with
momentum 0.9 applied on the servers); each trainer takes its half of the
training images, and for each batch of 64 pulls the parameters, computes the
cross-entropy gradient and pushes it (baton.ps.ModuleBinding). After
--epochs (2), trainer 0 measures the accuracy on the 10,000 test images and
prints RESULT OK if it reaches --min_accuracy (0.80), else RESULT FAIL and
exits 1. The servers could be the C++ example's processes: the spec is the
same declaration.
"""
import argparse
import os
import sys
import time

import torch

import baton.ps as ps
import baton.rpc as rpc
from fashion_mnist import load


def model():
    torch.manual_seed(0)  # the same initial values on every trainer
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


def consistency(text):
    if text.startswith("ssp:"):
        return ("ssp", int(text[4:]))
    return text


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--consistency", default="ssp:2")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--min_accuracy", type=float, default=0.80)
    args = parser.parse_args()
    torch.set_num_threads(1)
    role = os.environ.get("BATON_ROLE", "")
    index = int(os.environ.get("BATON_ROLE_RANK", "0"))
    size = int(os.environ.get("BATON_ROLE_WORLD_SIZE", "1"))
    trainers = int(os.environ.get("WORLD_SIZE", "2")) - size if role == "ps" else size
    servers = int(os.environ.get("WORLD_SIZE", "2")) - trainers
    spec = ps.PsSpec(ps.ModuleBinding.tables(model(), "mlp", torch.optim.SGD, lr=args.lr,
                                             momentum=0.9),
                     consistency=consistency(args.consistency), num_trainers=trainers)
    if role == "ps":
        server = ps.PsServer(spec, server=index, num_servers=size)
        rpc.init_rpc(ps_server=server)
        rpc.shutdown()  # serves until every trainer is done
        print(f"ps{index}: {server.stats()}", flush=True)
        return
    rpc.init_rpc()
    net = model()
    client = ps.PsClient(spec, servers=[f"ps{k}" for k in range(servers)], trainer=index)
    binding = ps.ModuleBinding(client, net, "mlp")
    train_x, train_y = load("train")
    g = torch.Generator().manual_seed(1)
    start = time.monotonic()
    for epoch in range(args.epochs):
        order = torch.randperm(len(train_x), generator=g)[index::size]
        total = 0.0
        for i in range(0, len(order), args.batch):
            idx = order[i:i + args.batch]
            binding.pull()
            net.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(train_x[idx]), train_y[idx])
            loss.backward()
            binding.push()
            total += loss.item() * len(idx)
        print(f"trainer{index} epoch {epoch}: loss {total / len(order):.4f} "
              f"({time.monotonic() - start:.1f} s)", flush=True)
    binding.pull()
    ok = True
    if index == 0:
        test_x, test_y = load("t10k")
        with torch.no_grad():
            accuracy = (net(test_x).argmax(1) == test_y).float().mean().item()
        print(f"test accuracy {accuracy:.4f}; servers: {client.stats()}", flush=True)
        ok = accuracy >= args.min_accuracy
        print("RESULT OK" if ok else f"RESULT FAIL: accuracy {accuracy:.4f} < "
              f"{args.min_accuracy}", flush=True)
    rpc.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
