#!/usr/bin/env bash
# Runs every check a change must pass before the long CI stages: installs
# what is missing, then the seconds-long checks (every protocol guarantee
# label defined once and the index of them current, tools/check_labels.py;
# no internal header exported to everyone, tools/check_visibility.py; every
# C++ file formatted, tools/format.sh --check), then `bazel test //...`, which builds the tests
# and what they run, not the benchmarks and tools (--build_tests_only; CI's
# next stage builds those, tools/build_all.sh). .ci/run starts with this
# script, so the README's test command and CI's first stage are one.
# Builds come from the disk cache when nothing changed, but the tests always
# run: a cached pass would hide a test that fails on this machine now.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
/usr/bin/python3 tools/check_labels.py
/usr/bin/python3 tools/check_visibility.py
bash tools/format.sh --check
bazel test //... --build_tests_only --nocache_test_results "$@"
