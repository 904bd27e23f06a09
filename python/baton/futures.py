"""baton's futures are torch.futures.Future: every RPC returns one, so
torch.futures.wait_all/collect_all, then() and add_done_callback work on them
unchanged."""
from torch.futures import Future, collect_all, wait_all  # noqa: F401

__all__ = ["Future", "collect_all", "wait_all"]
