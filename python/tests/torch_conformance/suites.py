"""PyTorch's RPC test suites, assembled as upstream's
test/distributed/rpc/test_tensorpipe_agent.py assembles them (GENERIC_TESTS
and TENSORPIPE_TESTS of torch.testing._internal.distributed.rpc_utils),
over the fixture of the agent named by BATON_CONFORMANCE_AGENT:

- "baton": BatonRpcAgentTestFixture below, in drop-in mode (this module
  must be imported after baton.torch_rpc.install(); the spawned test
  processes get drop-in mode from their environment);
- "torch": torch's own TensorPipeRpcAgentTestFixture, the reference.

The suites' files are PyTorch's, unedited. Tests listed in excluded.py are
skipped with their reason. Every spawned test process imports this module
by name (torch's MultiProcessTestCase pickles the test class).
"""
import os
import unittest

import torch.distributed.rpc as rpc
from torch.testing._internal.distributed import rpc_utils
from torch.testing._internal.distributed.rpc.rpc_agent_test_fixture import RpcAgentTestFixture
from torch.testing._internal.distributed.rpc.tensorpipe_rpc_agent_test_fixture import (
    TensorPipeRpcAgentTestFixture)

import excluded

AGENT = os.environ.get("BATON_CONFORMANCE_AGENT", "baton")
if AGENT not in ("baton", "torch"):
    raise ValueError(f"BATON_CONFORMANCE_AGENT={AGENT!r}: expected 'baton' or 'torch'")
if AGENT == "baton" and not rpc.__name__.startswith("baton"):
    raise RuntimeError("suites.py imported without baton's drop-in mode: torch.distributed.rpc "
                       f"is {rpc.__name__} (run it through run.py)")


class BatonRpcAgentTestFixture(RpcAgentTestFixture):
    """baton's agent: torch's options class and backend name (both are
    baton's in drop-in mode), rendezvous over tcp:// (RPC_INIT_WITH_TCP=1:
    upstream's SpawnHelper picks a free MASTER_PORT per test)."""

    @property
    def rpc_backend(self):
        return rpc.backend_registry.BackendType["TENSORPIPE"]

    @property
    def rpc_backend_options(self):
        return rpc.backend_registry.construct_rpc_backend_options(
            self.rpc_backend, init_method=self.init_method)

    def get_shutdown_error_regex(self):
        return ".*"

    def get_timeout_error_regex(self):
        return "RPC ran for more than"


SUITES = rpc_utils.GENERIC_TESTS + rpc_utils.TENSORPIPE_TESTS
_FIXTURE = BatonRpcAgentTestFixture if AGENT == "baton" else TensorPipeRpcAgentTestFixture
_PREFIX = "Baton" if AGENT == "baton" else "TensorPipe"


def _exclude(classes):
    """Marks every listed test skipped, with its reason."""
    for cls in classes.values():
        for name in dir(cls):
            if not name.startswith("test"):
                continue
            reason = excluded.reason_for(cls.__name__[len(_PREFIX):], name)
            if reason is not None:
                setattr(cls, name, unittest.skip(f"listed: {reason}")(getattr(cls, name)))


_classes = rpc_utils.generate_tests(_PREFIX, _FIXTURE, SUITES, __name__)
if AGENT == "baton":
    _exclude(_classes)
globals().update(_classes)

