#!/usr/bin/env bash
# Runs the embedding-table example (examples/ctr/ps_ctr.cc) through baton-run
# with 2 servers and 2 trainers, asynchronous, and checks that its loss fell
# (the job prints RESULT OK only then) and that the launcher saw success.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-$0.runfiles}/baton"
out=$(timeout 300 "$RUNFILES/launcher/baton-run" --standalone --role ps:2 --role trainer:2 \
      "$RUNFILES/examples/ctr/ps_ctr" --steps=200 --log_every=50 --job_timeout=240 2>&1) ||
  { echo "$out"; echo "FAILED: the job exited non-zero"; exit 1; }
echo "$out"
grep -q "RESULT OK" <<<"$out"
grep -q "all workers succeeded" <<<"$out"
grep -q "\[trainer1\] step 200 loss" <<<"$out"
