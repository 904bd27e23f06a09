#!/usr/bin/env bash
# Runs every test: installs what is missing, then `bazel test //...`.
# Builds come from the disk cache when nothing changed, but the tests always
# run: a cached pass would hide a test that fails on this machine now.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bazel test //... --nocache_test_results "$@"
