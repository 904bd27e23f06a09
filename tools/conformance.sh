#!/usr/bin/env bash
# PyTorch's own RPC test suites against baton in drop-in mode
# (python/tests/torch_conformance/run.py; docs/conformance.md has the
# per-suite table). Builds the extension, assembles the package in a
# temporary directory, runs every test (a few minutes: the workers start
# from a fork server), prints the table against the committed torch
# reference, and fails if fewer of the tests that pass under torch pass on
# baton than the share below (the level reached so far; raise it as it
# grows). Extra arguments go to run.py (--filter REGEX, --table FILE, ...).
#   bash tools/conformance.sh [--table docs/conformance.md]
set -euo pipefail
cd "$(dirname "$0")/.."
MIN_SHARE="${BATON_CONFORMANCE_MIN_SHARE:-0.98}"
bash tools/install_deps.sh
bazel build //python:_C.so
pkg=$(mktemp -d)
trap 'rm -rf "$pkg"' EXIT
cp -r python/baton "$pkg/baton"
install -m 0755 bazel-bin/python/_C.so "$pkg/baton/_C.so"
cd python/tests/torch_conformance
PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$pkg:${HOME}/.cache/baton/pydeps" \
  /usr/bin/python3 run.py --agent baton --timeout 30 --min-share "$MIN_SHARE" "$@"
