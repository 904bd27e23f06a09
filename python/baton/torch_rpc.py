"""Drop-in mode: programs written for torch.distributed.rpc run on baton
with no edit.

    python3 -m baton.torch_rpc job.py [ARGS...]
    python3 -m baton.torch_rpc -m package.module [ARGS...]
    baton-run --role trainer:4 python3 -m baton.torch_rpc job.py [ARGS...]

In that process, and in every Python process it starts (multiprocessing's
spawn and forkserver children, subprocesses that keep its environment):

- `torch.distributed.rpc` and its submodules (`api`, `options`,
  `functions`, `backend_registry`, `constants`, `internal`) are baton's
  (`baton.rpc`), also for third-party code that imports them;
- `torch.distributed.autograd` is `baton.distributed.autograd`;
- `torch.distributed.optim.DistributedOptimizer` is baton's, and
  `torch.distributed.nn.RemoteModule` is baton's; the rest of
  `torch.distributed.optim` and `torch.distributed.nn` stays torch's;
- everything else of torch stays torch's.

`install()` does the same from inside a program (before it uses RPC).

How: `import torch` loads torch's own RPC modules (TorchScript refers to
them), so baton's are put in their place once torch finished importing:
in `sys.modules`, on the parent packages, and as the optimizer's and
RemoteModule's defining modules, which `torch.distributed.optim` and
`torch.distributed.nn` import from when a program first imports them. The
children get this through their environment: `BATON_TORCH_RPC=1` and a
directory on `PYTHONPATH` whose `sitecustomize` installs a hook that runs
`install()` right after `import torch` completes (and then runs the
interpreter's own `sitecustomize`).

Thread-safety: install() is idempotent and takes the import lock; call it
before starting threads that import torch.distributed modules.
"""
import importlib
import os
import runpy
import sys
from typing import Dict, List, Optional

__all__ = ["install", "installed", "ENV_FLAG", "main"]

ENV_FLAG = "BATON_TORCH_RPC"
_HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_dropin")

# torch's module name -> baton's module that takes its place.
_MODULES: Dict[str, str] = {
    "torch.distributed.rpc": "baton.rpc",
    "torch.distributed.rpc.api": "baton.rpc.api",
    "torch.distributed.rpc.options": "baton.rpc.options",
    "torch.distributed.rpc.functions": "baton.rpc.functions",
    "torch.distributed.rpc.backend_registry": "baton.rpc.backend_registry",
    "torch.distributed.rpc.constants": "baton.rpc.constants",
    "torch.distributed.rpc.internal": "baton.rpc.internal",
    "torch.distributed.rpc.rref_proxy": "baton.rpc.rref_proxy",
    "torch.distributed.autograd": "baton.distributed.autograd",
    # Where torch.distributed.optim and torch.distributed.nn import these
    # from: the packages stay torch's, these two names become baton's.
    "torch.distributed.optim.optimizer": "baton.distributed.optim",
    "torch.distributed.nn.api.remote_module": "baton.nn",
}

_installed = False


def installed() -> bool:
    """True once install() ran in this process."""
    return _installed


def _torch_submodules(prefix: str) -> List[str]:
    return [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]


def install() -> None:
    """Makes torch.distributed.rpc, torch.distributed.autograd,
    DistributedOptimizer and RemoteModule baton's in this process, and
    marks the environment so that the Python processes it starts do the
    same. Idempotent."""
    global _installed
    if _installed:
        return
    import torch  # noqa: F401  (torch first: it imports its own RPC modules)
    import torch.distributed  # noqa: F401

    replacements = {name: importlib.import_module(target) for name, target in _MODULES.items()}
    # torch's own RPC submodules that baton has no counterpart for (its
    # TensorPipe and profiler internals) are dropped, so that an import of
    # one fails by name instead of mixing torch's agent with baton's.
    for prefix in ("torch.distributed.rpc", "torch.distributed.autograd"):
        for name in _torch_submodules(prefix):
            if name not in replacements:
                del sys.modules[name]
    for name, module in replacements.items():
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        parent_module = sys.modules.get(parent)
        if parent_module is not None:
            setattr(parent_module, child, module)
    # Already imported (a program that imported them before install()).
    optim = sys.modules.get("torch.distributed.optim")
    if optim is not None:
        optim.DistributedOptimizer = replacements["torch.distributed.optim.optimizer"] \
            .DistributedOptimizer
    dnn = sys.modules.get("torch.distributed.nn")
    if dnn is not None:
        dnn.RemoteModule = replacements["torch.distributed.nn.api.remote_module"].RemoteModule
    # TorchScript recognizes RRef[T] annotations by torch's RRef class:
    # baton's takes its place there too, so scripted functions that name
    # RRef types compile.
    jit_internal = sys.modules.get("torch._jit_internal")
    if jit_internal is not None and hasattr(jit_internal, "RRef"):
        jit_internal.RRef = replacements["torch.distributed.rpc"].RRef
    _mark_environment(os.environ)
    _installed = True


def _mark_environment(env) -> None:
    """The hook directory first on PYTHONPATH, and the directory that holds
    the package (the hook imports baton) where it is, else last."""
    env[ENV_FLAG] = "1"
    package_root = os.path.dirname(os.path.dirname(_HOOK_DIR))
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != _HOOK_DIR]
    if package_root not in parts:
        parts.append(package_root)
    env["PYTHONPATH"] = os.pathsep.join([_HOOK_DIR] + parts)


def _usage() -> str:
    return ("usage: python3 -m baton.torch_rpc SCRIPT [ARGS...]\n"
            "       python3 -m baton.torch_rpc -m MODULE [ARGS...]\n"
            "Runs a torch.distributed.rpc program on baton (drop-in mode).")


def main(argv: Optional[List[str]] = None) -> int:
    """The `python3 -m baton.torch_rpc` entry point."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(), file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    install()
    if argv[0] == "-m":
        if len(argv) < 2:
            print(_usage(), file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = argv[0]
    if not os.path.exists(script):
        print(f"baton.torch_rpc: {script}: no such file", file=sys.stderr)
        return 2
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
