#!/usr/bin/env bash
# Runs the remote-layers example exactly as its header comment does (through
# baton-run), once per optimizer, and checks that it converged and left no
# distributed-autograd context behind.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-$0.runfiles}/baton"
for optimizer in adam sgd; do
  out=$(timeout 120 "$RUNFILES/launcher/baton-run" --standalone --nproc_per_node 3 --tee \
        "$RUNFILES/examples/train_remote_layers" --steps 200 --optimizer "$optimizer" 2>&1)
  echo "$out"
  grep -q "RESULT OK" <<<"$out"
  grep -q "all workers succeeded" <<<"$out"
done
