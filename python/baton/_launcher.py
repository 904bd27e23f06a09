"""The ``baton-run`` command of an installed wheel: runs the launcher binary
that the wheel carries in baton/bin (launcher/README.md has its flags)."""
import os
import sys
from typing import List, Optional


def binary() -> str:
    """The path of the wheel's baton-run binary."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "baton-run")


def main(argv: Optional[List[str]] = None) -> None:
    path = binary()
    if not os.access(path, os.X_OK):
        sys.exit(f"baton-run: {path} is missing: this baton was not installed from a wheel "
                 f"(in a source tree, build //launcher:baton-run with Bazel)")
    args = sys.argv[1:] if argv is None else argv
    os.execv(path, [path] + args)
