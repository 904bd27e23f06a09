"""baton's drop-in mode in a child process (baton/torch_rpc.py).

Python imports this at start-up because its directory comes first on
PYTHONPATH. With BATON_TORCH_RPC=1 it adds an import hook that runs
baton.torch_rpc.install() as soon as `import torch` completes; it imports
neither torch nor baton itself, so a process that never imports torch pays
nothing. Then it runs the `sitecustomize` that it shadows, if any.
"""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _RunAfterTorch(importlib.abc.Loader):
    """Wraps torch's own loader: executes torch, then installs baton."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        from baton import torch_rpc
        torch_rpc.install()

    def __getattr__(self, name):  # get_source, get_filename, resource readers
        return getattr(self._loader, name)


class _TorchImportHook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # once; and not for the lookup below
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _RunAfterTorch(spec.loader)
        return spec


def _run_shadowed_sitecustomize():
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # as Python treats a failing sitecustomize
        print(f"Error in sitecustomize (run by baton's drop-in hook): {e!r}", file=sys.stderr)


if os.environ.get("BATON_TORCH_RPC") == "1" and "torch" not in sys.modules:
    sys.meta_path.insert(0, _TorchImportHook())
_run_shadowed_sitecustomize()
