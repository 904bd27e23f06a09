#!/usr/bin/env bash
# Runs every test: installs what is missing, then `bazel test //...`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bazel test //... "$@"
