#!/usr/bin/env bash
# The RL example trains until CartPole is solved, through baton-run as the
# README runs it (one agent, four observers, batched), bounded in time.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-$0.runfiles}/baton"
out=$(timeout 600 "$RUNFILES/launcher/baton-run" --standalone --role agent:1 --role observer:4 \
      --restart_policy observer=worker --max_restarts 3 \
      "$RUNFILES/examples/rl/rl_cartpole" --log_every 20 --job_timeout 540 2>&1) ||
  { echo "$out"; echo "FAILED: the job exited non-zero"; exit 1; }
echo "$out"
grep -q "RESULT OK: solved at episode" <<<"$out" || { echo "FAILED: no RESULT OK"; exit 1; }
grep -q "all workers succeeded" <<<"$out" || { echo "FAILED: no launcher success"; exit 1; }
# Progress lines say what the issue asks for.
grep -Eq "round [0-9]+ episode [0-9]+ running reward [0-9.]+ steps/s [0-9]+ batch 4.0 observers 4" \
  <<<"$out" || { echo "FAILED: no progress line with a full batch of 4"; exit 1; }
for k in 0 1 2 3; do
  grep -q "\[observer$k\] left: " <<<"$out" || { echo "FAILED: observer$k did not leave"; exit 1; }
done
echo PASS
