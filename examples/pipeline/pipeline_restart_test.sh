#!/usr/bin/env bash
# A stage worker is SIGKILLed mid-training; baton-run (--max_restarts 1)
# restarts the job, the driver resumes from the last checkpoint, and training
# ends exactly where an uninterrupted run with the same flags ends.
set -uo pipefail
RUNFILES="${TEST_SRCDIR:-$0.runfiles}/baton"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }
BIN="$RUNFILES/examples/pipeline/pipeline_fashion_mnist"
FLAGS=(--steps 60 --log_every 20 --checkpoint_every 20 --min_accuracy 0)

echo "== uninterrupted"
timeout 600 "$RUNFILES/launcher/baton-run" --standalone --role driver:1 --role stage:2 \
  "$BIN" "${FLAGS[@]}" --checkpoint_dir "$TMP/a" >"$TMP/a.log" 2>&1 || { cat "$TMP/a.log"; fail "the uninterrupted run failed"; }
want=$(grep -o "final loss [0-9.]*" "$TMP/a.log")
[ -n "$want" ] || { cat "$TMP/a.log"; fail "no final loss"; }

echo "== killed after the first checkpoint"
timeout 600 "$RUNFILES/launcher/baton-run" --standalone --role driver:1 --role stage:2 --max_restarts 1 \
  "$BIN" "${FLAGS[@]}" --checkpoint_dir "$TMP/b" >"$TMP/b.log" 2>&1 &
job=$!
waited=0
until grep -q "checkpoint at step 20" "$TMP/b.log"; do
  sleep 0.1
  waited=$((waited + 1))
  if [ $waited -gt 3000 ] || ! kill -0 $job 2>/dev/null; then
    cat "$TMP/b.log"
    fail "the job never checkpointed"
  fi
done
pid=$(grep -o "\[stage1\] pid [0-9]*" "$TMP/b.log" | head -1 | awk '{print $3}')
[ -n "$pid" ] || fail "no pid for stage1"
echo "== SIGKILL stage1 (pid $pid)"
kill -9 "$pid"
wait $job
code=$?
cat "$TMP/b.log"
[ $code -eq 0 ] || fail "baton-run exited $code"
grep -Eq "resumed from the checkpoint of step (20|40)" "$TMP/b.log" || fail "the driver did not resume"
got=$(grep -o "final loss [0-9.]*" "$TMP/b.log" | tail -1)
[ "$got" = "$want" ] || fail "resumed run ended with '$got', uninterrupted with '$want'"
echo "PASS: resumed and ended with the uninterrupted run's $want"
