#!/usr/bin/env bash
# Quick start: installs what is missing, builds, and runs the main job on
# this machine through the launcher: 3 worker processes training a model
# over RPC (examples/train_regression.cc). The job checks its own result.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bazel build //launcher:baton-run //examples:train_regression
BIN=$(bazel info bazel-bin 2>/dev/null)
exec "$BIN/launcher/baton-run" --standalone --nproc_per_node 3 --tee \
  "$BIN/examples/train_regression" "$@"
