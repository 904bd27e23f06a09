"""baton: an RPC runtime for distributed training, with torch.distributed.rpc's API.

    import baton.rpc as rpc                       # was: torch.distributed.rpc
    import baton.distributed.autograd as dist_autograd
    from baton.distributed.optim import DistributedOptimizer

Values are torch's own tensors, in the same process as torch (baton links the
LibTorch that python3-torch uses), so nothing is converted or copied to cross
into baton.
"""
import os as _os

import torch  # noqa: F401  (baton._C needs LibTorch's Python bindings loaded)

from baton import _torch_check

_torch_check.check()  # before baton._C loads: it was built for one torch

from baton import _C  # noqa: F401

__all__ = ["rpc", "distributed", "nn", "ps", "futures", "is_elastic_launched",
           "is_torchelastic_launched"]


def is_elastic_launched() -> bool:
    """Whether baton-run started this process (it sets BATON_ELASTIC_LAUNCHED=1)."""
    return _os.environ.get("BATON_ELASTIC_LAUNCHED") == "1"


# torch.distributed.elastic's name for the same question.
is_torchelastic_launched = is_elastic_launched

from baton import futures, rpc, distributed, nn, ps  # noqa: E402,F401
