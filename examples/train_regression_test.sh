#!/usr/bin/env bash
# Runs the main job exactly as the README does (through baton-run) and checks
# that it converged.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-$0.runfiles}/baton"
out=$(timeout 300 "$RUNFILES/launcher/baton-run" --standalone --nproc_per_node 3 --tee \
      "$RUNFILES/examples/train_regression" --steps 80 2>&1)
echo "$out"
grep -q "RESULT OK" <<<"$out"
grep -q "all workers succeeded" <<<"$out"
