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
# R3 batching: forward passes answer several observers at once. Unbatched,
# every pass answers one (batch 1.0); with all four in the round the mean
# is near 4, lower when observers miss the 5 ms batch window on a loaded
# machine (3.7-3.9 during a cold build), so the check is at least 2.
awk '/round [0-9]+ episode [0-9]+ running reward .* batch [0-9.]+ observers 4/ {
       for (i = 1; i < NF; ++i) if ($i == "batch" && $(i + 1) >= 2.0) found = 1 }
     END { exit !found }' <<<"$out" ||
  { echo "FAILED: no progress line with a mean batch of at least 2 of 4 observers"; exit 1; }
for k in 0 1 2 3; do
  grep -q "\[observer$k\] left: " <<<"$out" || { echo "FAILED: observer$k did not leave"; exit 1; }
done
echo PASS
