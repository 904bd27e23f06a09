#!/usr/bin/env bash
# Builds every Bazel target: what tools/test.sh leaves out (the benchmarks
# under bench/ and comm/bench/, and binaries no test runs) beside what it
# built. The same configuration as the tests, so everything the tests built
# comes from the disk cache and only those targets compile. CI's second stage
# (.ci/run), so a benchmark that stops compiling fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //... "$@"
