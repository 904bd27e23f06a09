#!/usr/bin/env bash
# Quick start: installs what is missing (Fashion-MNIST included), builds, and
# runs the main job on this machine through the launcher: parameter-server
# training of an MLP on Fashion-MNIST with 2 server and 2 trainer processes
# (examples/ps_fashion_mnist.cc). The job checks its own result (test
# accuracy), prints RESULT OK and exits 0, or exits non-zero. Extra arguments
# go to the job, e.g. `bash tools/quickstart.sh --consistency sync`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bazel build //launcher:baton-run //examples:ps_fashion_mnist
BIN=$(bazel info bazel-bin 2>/dev/null)
exec "$BIN/launcher/baton-run" --standalone --role ps:2 --role trainer:2 \
  "$BIN/examples/ps_fashion_mnist" "$@"
