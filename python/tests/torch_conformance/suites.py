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

import torch
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


class _ForkServerWorkers:
    """How both fixtures start a test's worker processes: from a fork
    server that imported torch, baton (in drop-in mode) and the suites once.
    Upstream spawns a fresh interpreter per worker, which imports torch each
    time: most of a test's time on two cores, where the whole run would take
    over an hour instead of minutes.

    The init method is tcp:// at the MASTER_PORT that upstream's SpawnHelper
    picks per test (RPC_INIT_WITH_TCP=1); it reaches the workers in a file
    beside the test's own, not in their environment (a forked child has the
    fork server's)."""

    def _spawn_processes(self):
        with open(self._port_file, "w") as f:
            f.write(os.environ["MASTER_PORT"])
        self._start_processes(_fork_server().Process)

    def tearDown(self):
        super().tearDown()
        try:
            os.remove(self._port_file)
        except FileNotFoundError:
            pass

    @property
    def _port_file(self):
        return self.file_name + ".port"

    @property
    def init_method(self):
        with open(self._port_file) as f:
            return f"tcp://127.0.0.1:{f.read().strip()}"


class BatonRpcAgentTestFixture(_ForkServerWorkers, RpcAgentTestFixture):
    """baton's agent: torch's options class and backend name (both are
    baton's in drop-in mode)."""

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


_SERVER = None


def _fork_server():
    """multiprocessing's forkserver context, its server preloaded with this
    module (so torch, baton in drop-in mode, and PyTorch's suites)."""
    global _SERVER
    if _SERVER is None:
        _SERVER = torch.multiprocessing.get_context("forkserver")
        _SERVER.set_forkserver_preload([__name__])
    return _SERVER


SUITES = rpc_utils.GENERIC_TESTS + rpc_utils.TENSORPIPE_TESTS
class TorchRpcAgentTestFixture(_ForkServerWorkers, TensorPipeRpcAgentTestFixture):
    """torch's own agent (TensorPipe), the reference."""


_FIXTURE = BatonRpcAgentTestFixture if AGENT == "baton" else TorchRpcAgentTestFixture
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

