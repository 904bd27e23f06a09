#!/usr/bin/env bash
# Runs the main job (examples/ps_fashion_mnist.cc) as the README does, through
# baton-run with 2 servers and 2 trainers, shortened to a few hundred steps:
#  1. the default consistency (ssp:2) for 300 steps must reach 75% test
#     accuracy (the full 2-epoch run is held to 84%);
#  2. sync for 300 steps, and sync for 200 steps with server checkpoints, then
#     a new job resumed from them up to 300: synchronous training is
#     deterministic (PS1, PS2 in ps/server_shard.h) and a checkpoint restores
#     parameters and momentum exactly (PS8), so both report the same accuracy;
#  3. --device names a device this machine lacks (a CPU-only LibTorch sees no
#     CUDA device): every worker refuses it at once, naming the flag.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-$0.runfiles}/baton"
CKPT="${TEST_TMPDIR:-$(mktemp -d)}/ckpt"

run() {  # runs the job with the given flags; prints its output; fails unless it succeeded
  local out
  out=$(timeout 300 "$RUNFILES/launcher/baton-run" --standalone --role ps:2 --role trainer:2 \
        "$RUNFILES/examples/ps_fashion_mnist" --trainer_timeout 120 --job_timeout 240 \
        --min_accuracy 0.75 "$@" 2>&1) || { echo "$out"; echo "FAILED: the job ($*) exited non-zero"; return 1; }
  echo "$out"
  grep -q "RESULT OK" <<<"$out" || { echo "FAILED: no RESULT OK ($*)"; return 1; }
  grep -q "all workers succeeded" <<<"$out" || { echo "FAILED: no launcher success ($*)"; return 1; }
}
accuracy() { grep -o "test accuracy [0-9.]*" <<<"$1" | head -1; }

echo "=== default (ssp:2), 300 steps"
run --steps 300

echo "=== sync, 300 steps"
straight=$(run --consistency sync --steps 300) || { echo "$straight"; exit 1; }
echo "$straight"

echo "=== sync, 200 steps with checkpoints, then resumed to 300"
run --consistency sync --steps 200 --checkpoint_dir "$CKPT" --checkpoint_every 50
resumed=$(run --consistency sync --steps 300 --checkpoint_dir "$CKPT") || { echo "$resumed"; exit 1; }
echo "$resumed"
grep -q "resuming at step 200" <<<"$resumed" || { echo "FAILED: the trainers did not resume at 200"; exit 1; }
a=$(accuracy "$straight"); b=$(accuracy "$resumed")
if [[ -z "$a" || "$a" != "$b" ]]; then
  echo "FAILED: straight sync run: '$a', resumed from checkpoints: '$b'"
  exit 1
fi
echo "PASSED: straight and resumed sync runs agree ($a)"

if ! /usr/bin/python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "=== --device cuda without a CUDA device"
  set +e
  out=$(timeout 120 "$RUNFILES/launcher/baton-run" --standalone --role ps:1 --role trainer:1 \
        "$RUNFILES/examples/ps_fashion_mnist" --device cuda --steps 10 2>&1)
  code=$?
  set -e
  if [[ $code -eq 0 ]] || ! grep -q "\-\-device: 'cuda', but this process sees 0 CUDA device(s)" <<<"$out"; then
    echo "$out"
    echo "FAILED: --device cuda on a machine without CUDA (exit $code)"
    exit 1
  fi
  echo "PASSED: --device cuda refused with a clear error (exit $code)"
fi
