#!/usr/bin/env bash
# The venv with pip's PyTorch 2.x that the CMake build, the wheel and their
# tests use for the 2.x line (docs/build.md, "Torch versions"). Made once per
# machine under ~/.cache/baton/ from /usr/bin/python3. The wheels (torch's
# Linux wheel and its CUDA libraries, about 4 GB) are downloaded once into
# ~/.cache/baton/wheels/ and installed from there (pip's own HTTP cache does
# not keep them here), so a rebuilt venv downloads nothing again. Prints the
# venv's python.
#
#   py="$(bash tools/torch2_venv.sh)"        # TORCH2_VERSION=2.15.0 by default
set -euo pipefail
# The newest torch that pip installs here and CI checks; CMakeLists.txt's
# BATON_TORCH_NEWEST names its release.
version="${TORCH2_VERSION:-2.15.0}"
venv="${HOME}/.cache/baton/venv-torch${version}"
stamp="$venv/.baton-ready"
if [ ! -f "$stamp" ]; then
  echo "torch2_venv: creating $venv (torch==$version)" >&2
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  # torchvision (the release pip pairs with this torch): pytorch/examples'
  # parameter server; numpy: torch's tensor<->array paths; pytest and
  # expecttest: the pytest suite and PyTorch's RPC suites run on the wheel.
  reqs=("torch==$version" torchvision numpy pytest expecttest==0.2.1)
  wheels="${HOME}/.cache/baton/wheels/torch-${version}"
  if [ ! -f "$wheels/.complete" ]; then
    mkdir -p "$wheels"
    "$venv/bin/pip" download -q -d "$wheels" "${reqs[@]}" >&2
    touch "$wheels/.complete"
  fi
  "$venv/bin/pip" install -q --no-index --find-links "$wheels" "${reqs[@]}" >&2
  "$venv/bin/python" -c "import torch; assert torch.__version__.startswith('$version'), torch.__version__"
  touch "$stamp"
fi
echo "$venv/bin/python"
