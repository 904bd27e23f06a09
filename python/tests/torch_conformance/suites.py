"""PyTorch's RPC test suites, assembled as upstream's
test/distributed/rpc/test_tensorpipe_agent.py assembles them (GENERIC_TESTS
and TENSORPIPE_TESTS of torch.testing._internal.distributed.rpc_utils) or,
with BATON_CONFORMANCE_CUDA=1, as its cuda/test_tensorpipe_agent.py does
(GENERIC_CUDA_TESTS and TENSORPIPE_CUDA_TESTS), over the fixture of the
agent named by BATON_CONFORMANCE_AGENT:

- "baton": BatonRpcAgentTestFixture below, in drop-in mode (this module
  must be imported after baton.torch_rpc.install(); the spawned test
  processes get drop-in mode from their environment);
- "torch": torch's own TensorPipeRpcAgentTestFixture, the reference.

The suites' files are PyTorch's, unedited. Tests listed in excluded.py are
skipped with their reason. Every spawned test process imports this module
by name (torch's MultiProcessTestCase pickles the test class), so both
choices come from the environment that run.py sets before importing it.

Importing this module must not initialise CUDA: the fork server imports it,
and a process forked after CUDA's initialisation cannot use CUDA (each test
worker creates its own context). torch's testing modules import
torch.utils.cpp_extension, which asks torch.cuda.is_available() where it
finds a CUDA toolkit, and that initialises the driver unless
PYTORCH_NVML_BASED_CUDA_CHECK=1 (NVML answers then): run.py --cuda sets it,
checks that a child of the fork server can use the GPU
(fork_server_children_use_cuda), and else starts the workers with spawn. The
CUDA suites' GPU checks (skip_if_lt_x_gpu) run in the workers.
"""
import os
import sys
import unittest

import torch
import torch.distributed.rpc as rpc

try:
    import expecttest  # noqa: F401  (torch's testing modules import it)
    EXPECTTEST_STANDIN = False
except ImportError:
    # pip's torch does not require it: a stand-in with what torch's
    # common_utils takes from it (TestCase, ACCEPT); no RPC suite test asserts
    # expected output inline.
    import types

    expecttest = types.ModuleType("expecttest")
    expecttest.ACCEPT = None
    expecttest.TestCase = type("TestCase", (unittest.TestCase,), {"longMessage": True})
    sys.modules["expecttest"] = expecttest
    EXPECTTEST_STANDIN = True

# After the stand-in (these import it).
from torch.testing._internal.distributed import rpc_utils
from torch.testing._internal.distributed.rpc.rpc_agent_test_fixture import RpcAgentTestFixture
from torch.testing._internal.distributed.rpc.tensorpipe_rpc_agent_test_fixture import (
    TensorPipeRpcAgentTestFixture)

import excluded

AGENT = os.environ.get("BATON_CONFORMANCE_AGENT", "baton")
if AGENT not in ("baton", "torch"):
    raise ValueError(f"BATON_CONFORMANCE_AGENT={AGENT!r}: expected 'baton' or 'torch'")
_CUDA = os.environ.get("BATON_CONFORMANCE_CUDA", "0")
if _CUDA not in ("0", "1"):
    raise ValueError(f"BATON_CONFORMANCE_CUDA={_CUDA!r}: expected '0' or '1'")
CUDA = _CUDA == "1"
if AGENT == "baton" and not rpc.__name__.startswith("baton"):
    raise RuntimeError("suites.py imported without baton's drop-in mode: torch.distributed.rpc "
                       f"is {rpc.__name__} (run it through run.py)")


class _ForkServerWorkers:
    """How both fixtures start a test's worker processes: from a fork
    server that imported torch, baton (in drop-in mode) and the suites once.
    Upstream spawns a fresh interpreter per worker, which imports torch each
    time: most of a test's time on two cores, where the whole run would take
    over an hour instead of minutes. With START = "spawn" (run.py sets it
    where the fork server's children cannot use CUDA), upstream's way.

    The init method is tcp:// at a port picked per test; it reaches the
    workers in a file beside the test's own, not in their environment (a
    forked child has the fork server's). Upstream's SpawnHelper picks
    MASTER_PORT (RPC_INIT_WITH_TCP=1) by binding port 0, from the kernel's
    ephemeral range, where any process's outgoing connection may take it
    before rank 0's store listens there; the port here is from below that
    range (the pytest harness's free_port), and MASTER_PORT says it too."""

    def _spawn_processes(self):
        from harness import free_port  # python/tests, on run.py's path
        os.environ["MASTER_PORT"] = str(free_port())
        with open(self._port_file, "w") as f:
            f.write(os.environ["MASTER_PORT"])
        context = _fork_server() if START == "forkserver" else \
            torch.multiprocessing.get_context("spawn")
        self._start_processes(context.Process)

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


def _use_cuda():
    """A fork server's child: exits 3 when CUDA is unusable here because the
    fork server initialised it (torch marks its children), raises if a
    tensor cannot be placed on the GPU."""
    bad_fork = getattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    if bad_fork():
        sys.exit(3)
    x = torch.ones(4, device="cuda")
    if (x + x).sum().item() != 8:
        sys.exit(4)
    torch.cuda.synchronize()


def fork_server_children_use_cuda(timeout=300):
    """Whether a process that the fork server forks can use CUDA, on a
    machine whose GPUs this process sees: False when importing this module
    initialised CUDA in the fork server (with torch's cuda.is_available()
    not NVML-based, importing torch.utils.cpp_extension does where it finds
    a CUDA toolkit). Starts the fork server (the tests use the same)."""
    probe = _fork_server().Process(target=_use_cuda, name="cuda-probe")
    probe.start()
    probe.join(timeout)
    if probe.exitcode is None:
        probe.kill()
        probe.join()
    return probe.exitcode == 0


# How the tests start their workers: "forkserver" or "spawn" (set by run.py).
START = "forkserver"


class TorchRpcAgentTestFixture(_ForkServerWorkers, TensorPipeRpcAgentTestFixture):
    """torch's own agent (TensorPipe), the reference."""


if CUDA:
    SUITES = rpc_utils.GENERIC_CUDA_TESTS + rpc_utils.TENSORPIPE_CUDA_TESTS
else:
    SUITES = rpc_utils.GENERIC_TESTS + rpc_utils.TENSORPIPE_TESTS
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

