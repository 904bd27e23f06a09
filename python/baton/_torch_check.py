"""The check `import baton` makes before loading baton._C.

baton._C is C++ compiled against one LibTorch; loaded beside another it
fails with an undefined symbol or, worse, crashes later. A build made by the
CMake build (the wheel, ``pip install``) records the torch it was compiled
against in baton/_build_info.py; the Bazel build runs from the source tree
against Debian's torch and writes no such file, so there is nothing to check.
"""
import importlib
from types import ModuleType
from typing import Optional

import torch


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def check(build_info: Optional[ModuleType] = None) -> None:
    """Raises ImportError when baton._C was built for another torch release.

    Releases are compared by major.minor: LibTorch's C++ ABI changes between
    them, not between patch releases.
    """
    if build_info is None:
        try:
            build_info = importlib.import_module("baton._build_info")
        except ModuleNotFoundError:
            return
    built = build_info.TORCH_VERSION
    found = torch.__version__
    if _major_minor(built) != _major_minor(found):
        raise ImportError(
            f"baton's extension (baton._C) was built against torch {built}, but this "
            f"Python imports torch {found} from {torch.__file__}. Reinstall baton "
            f"against this torch: pip install --no-build-isolation --force-reinstall "
            f"<baton source or sdist>")
