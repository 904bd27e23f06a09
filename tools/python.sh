#!/usr/bin/env bash
# Makes `import baton` work for /usr/bin/python3 (the Python that has torch):
# builds the extension with Bazel, puts it beside the package in python/baton/,
# and creates the virtual environment .venv (with --system-site-packages, so
# Debian's torch, torchvision and numpy stay visible) whose site-packages
# points at python/. Afterwards either
#   .venv/bin/python job.py
# or, without the venv,
#   PYTHONPATH=$PWD/python /usr/bin/python3 job.py
# Idempotent; run it again after pulling changes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bazel build //python:_C.so //launcher:baton-run "$@"
install -m 0755 bazel-bin/python/_C.so python/baton/_C.so
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages --without-pip .venv
fi
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD/python" > "$site/baton.pth"
.venv/bin/python -c 'import baton, baton.rpc; print("baton", baton.__file__)'
