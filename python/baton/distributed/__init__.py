"""baton.distributed: autograd and optim, as torch.distributed.autograd and
torch.distributed.optim."""
from baton.distributed import autograd, optim  # noqa: F401
