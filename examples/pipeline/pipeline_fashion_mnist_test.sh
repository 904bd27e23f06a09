#!/usr/bin/env bash
# The pipeline example, short: 1F1B over 2 stage workers (150 steps) and over
# 4 (100 steps), through baton-run. Each prints progress lines and a checked
# test accuracy; the 2-stage run also writes its trace and timeline. Then,
# on a machine without CUDA, --device cuda is refused at start by every
# worker, naming the flag.
set -uo pipefail
RUNFILES="${TEST_SRCDIR:-$0.runfiles}/baton"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

run() {  # run <log> <stages> <args...>
  local log=$1 stages=$2
  shift 2
  timeout 600 "$RUNFILES/launcher/baton-run" --standalone --role driver:1 --role "stage:$stages" \
    "$RUNFILES/examples/pipeline/pipeline_fashion_mnist" "$@" >"$log" 2>&1
  local code=$?
  cat "$log"
  [ $code -eq 0 ] || fail "baton-run exited $code ($stages stages)"
  grep -q "RESULT OK: test accuracy" "$log" || fail "no RESULT OK ($stages stages)"
  grep -Eq "\[driver0\] step [0-9]+ loss [0-9.]+ test accuracy [0-9.]+ \(1000 images\) samples/s [0-9]+ bubble [0-9.]+ measured / [0-9.]+ theoretical" "$log" ||
    fail "no progress line ($stages stages)"
}

run "$TMP/p2.log" 2 --steps 150 --log_every 50 --min_accuracy 0.75 \
  --trace "$TMP/p2.json" --svg "$TMP/p2.svg"
grep -q "1f1b on 2 stage workers, 8 micro-batches of 16" "$TMP/p2.log" || fail "not 1F1B over 2 stages"
grep -q '"traceEvents"' "$TMP/p2.json" || fail "no Chrome trace"
grep -q '"cat":"backward"' "$TMP/p2.json" || fail "the trace has no backward spans"
grep -q "<svg" "$TMP/p2.svg" || fail "no SVG timeline"

run "$TMP/p4.log" 4 --steps 100 --log_every 50 --min_accuracy 0.70
grep -q "1f1b on 4 stage workers" "$TMP/p4.log" || fail "not 1F1B over 4 stages"
grep -q "peak stash 4/3/2/1" "$TMP/p4.log" || fail "1F1B's stash is not p - w on worker w"

if ! /usr/bin/python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  out=$(timeout 120 "$RUNFILES/launcher/baton-run" --standalone --role driver:1 --role stage:2 \
        "$RUNFILES/examples/pipeline/pipeline_fashion_mnist" --device cuda --steps 10 2>&1)
  code=$?
  echo "$out" | tail -5
  [ $code -ne 0 ] || fail "--device cuda without a CUDA device exited 0"
  grep -q "\-\-device: 'cuda', but this process sees 0 CUDA device(s)" <<<"$out" ||
    fail "--device cuda without a CUDA device: no error naming the flag"
fi
echo "PASS"
