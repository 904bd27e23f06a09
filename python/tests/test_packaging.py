"""What `import baton` checks before loading its extension (baton/_torch_check.py)."""
import types

import pytest
import torch

from baton import _torch_check


def build_info(version):
    return types.SimpleNamespace(TORCH_VERSION=version, TORCH_PREFIX="/somewhere/torch")


def test_an_extension_built_for_this_torch_release_loads():
    # Patch releases and local labels (+cu132) share the C++ ABI.
    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    _torch_check.check(build_info(release + ".99+other"))


def test_an_extension_built_for_another_torch_is_refused_naming_both_versions():
    with pytest.raises(ImportError) as e:
        _torch_check.check(build_info("0.4.1"))
    message = str(e.value)
    assert "built against torch 0.4.1" in message
    assert f"imports torch {torch.__version__}" in message
    assert torch.__file__ in message
    assert "--no-build-isolation" in message


def test_the_loaded_extension_passes_its_own_check():
    # A wheel's _build_info.py names this torch; Bazel's extension (the
    # source tree, tools/python.sh) has none and is not checked.
    _torch_check.check()
