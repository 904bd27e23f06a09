"""Fashion-MNIST for the Python examples: Debian's dataset-fashion-mnist
(IDX files under /usr/share/datasets/fashion-mnist), as normalized float
images [n, 784] and int64 labels."""
import gzip
import os

import numpy as np
import torch

DATA = "/usr/share/datasets/fashion-mnist"


def load(kind):
    """kind: "train" (60,000 images) or "t10k" (10,000)."""
    with gzip.open(os.path.join(DATA, f"{kind}-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(os.path.join(DATA, f"{kind}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    if len(images) != len(labels):
        raise ValueError(f"{kind}: {len(images)} images but {len(labels)} labels")
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    return (x - 0.2860) / 0.3530, torch.from_numpy(labels.astype(np.int64))
