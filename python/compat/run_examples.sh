#!/usr/bin/env bash
# Runs pytorch/examples' RPC programs (distributed/rpc/) on baton, changing
# nothing but their import lines:
#   torch.distributed.rpc      -> baton.rpc
#   torch.distributed.autograd -> baton.distributed.autograd
#   torch.distributed.optim    -> baton.distributed.optim
#   torch.distributed.nn       -> baton.nn            (RemoteModule)
# Usage: python/compat/run_examples.sh EXAMPLES_CHECKOUT [PROGRAM...]
#   EXAMPLES_CHECKOUT: a checkout of github.com/pytorch/examples (not part of
#   this repository; bring it with any git client).
#   PROGRAM: rnn rl parameter_server batch_parameter_server batch_reinforce
#   pipeline ddp_rpc (default: all). Each runs in a fresh temporary copy;
#   prints one "RESULT <program> PASS|FAIL|NEEDS-GPU <detail>" line each.
# Environment: BATON_EXAMPLES_TORCH=1 runs the unchanged programs on torch's
# own RPC instead (the comparison); BATON_EXAMPLES_DROPIN=1 runs the
# unchanged programs on baton in drop-in mode (python3 -m baton.torch_rpc,
# no line edited); BATON_EXAMPLES_TIMEOUT (seconds, default 900) bounds each
# program; BATON_EXAMPLES_PYTHON runs them under another interpreter whose
# baton is installed (a venv with pip's torch 2.x and the wheel: docs/build.md)
# instead of /usr/bin/python3 with the source tree's baton (tools/python.sh).
# What is supplied from outside the programs (python/compat/shims):
# torch.accelerator for torch 1.13 (CPU-only), a local gymnasium CartPole,
# and Fashion-MNIST in MNIST's layout where a program downloads MNIST.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
src="${1:?usage: run_examples.sh EXAMPLES_CHECKOUT [PROGRAM...]}/distributed/rpc"
shift
programs=("$@")
[ ${#programs[@]} -eq 0 ] && programs=(rnn rl parameter_server batch_parameter_server
                                       batch_reinforce pipeline ddp_rpc)
timeout_s="${BATON_EXAMPLES_TIMEOUT:-900}"
PY="${BATON_EXAMPLES_PYTHON:-/usr/bin/python3}"
# Where baton comes from: the source tree (built by tools/python.sh) for
# Debian's python3, the interpreter's own site-packages otherwise.
BATON_PATH="$repo/python"
[ -n "${BATON_EXAMPLES_PYTHON:-}" ] && BATON_PATH=""
# How each program's Python starts: drop-in mode puts baton under the
# unchanged torch.distributed.rpc imports.
RUN="$PY"
[ "${BATON_EXAMPLES_DROPIN:-0}" = 1 ] && RUN="$PY -m baton.torch_rpc"
if [ -n "$BATON_PATH" ]; then
  [ -f "$repo/python/baton/_C.so" ] || { echo "run tools/python.sh first" >&2; exit 2; }
fi
echo "run_examples: $PY, torch $($PY -c 'import torch; print(torch.__version__)')" >&2

work="$(mktemp -d /tmp/baton-examples.XXXXXX)"
trap 'rm -rf "$work"' EXIT

fashion_as_mnist() {  # $1: the data root the program reads (../data)
  local raw="$1/MNIST/raw" f
  mkdir -p "$raw"
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte \
           t10k-labels-idx1-ubyte; do
    gunzip -c "/usr/share/datasets/fashion-mnist/$f.gz" > "$raw/$f"
  done
}

# Whether nothing listens on TCP port $1: ss (iproute2) where it is there,
# else the interpreter binds the port (SO_REUSEADDR: a port left in TIME_WAIT
# counts as free, as ss -l sees it; a listener on any address, v4 or v6, not).
port_free() {
  if command -v ss > /dev/null 2>&1; then
    ! ss -ltn "( sport = :$1 )" | grep -q ":$1"
  else
    $PY -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("", int(sys.argv[1])))
except OSError:
    sys.exit(1)' "$1"
  fi
}

run_one() {  # $1 program, $2 dir, $3 expected output (regex), then the command
  local program="$1" dir="$2" expect="$3"; shift 3
  local copy="$work/$program/$(basename "$dir")" log="$work/$program.log"
  mkdir -p "$work/$program"
  cp -r "$src/$dir" "$copy"
  if [ "${BATON_EXAMPLES_TORCH:-0}" != 1 ] && [ "${BATON_EXAMPLES_DROPIN:-0}" != 1 ]; then
    sed -i -E \
      -e 's/^(\s*)import torch\.distributed\.rpc as/\1import baton.rpc as/' \
      -e 's/^(\s*)from torch\.distributed\.rpc import/\1from baton.rpc import/' \
      -e 's/^(\s*)import torch\.distributed\.autograd as/\1import baton.distributed.autograd as/' \
      -e 's/^(\s*)from torch\.distributed\.optim import/\1from baton.distributed.optim import/' \
      -e 's/^(\s*)from torch\.distributed\.nn import/\1from baton.nn import/' \
      "$copy"/*.py
  fi
  diff -r "$src/$dir" "$copy" > "$work/$program.diff"
  for port in 29500 29501; do
    port_free "$port" || { echo "RESULT $program FAIL port $port is busy"; return; }
  done
  local start=$SECONDS rc
  (cd "$copy" && PYTHONPATH="$here/shims${BATON_PATH:+:$BATON_PATH}" timeout -k 10 "$timeout_s" "$@") \
    > "$log" 2>&1
  rc=$?
  local took=$((SECONDS - start))
  if [ $rc -eq 0 ] && grep -Eq "$expect" "$log"; then
    echo "RESULT $program PASS ${took}s"
  else
    echo "RESULT $program FAIL rc=$rc after ${took}s; last lines:"
    tail -n 15 "$log" | sed 's/^/    /'
  fi
  cp "$log" "/tmp/baton-example-$program.log"
  cp "$work/$program.diff" "/tmp/baton-example-$program.diff"
}

has_gpus() { $PY -c "import torch,sys; sys.exit(0 if torch.cuda.device_count() >= $1 else 1)"; }

for program in "${programs[@]}"; do
  case "$program" in
    rnn) run_one rnn rnn "Training epoch 9" $RUN main.py ;;
    rl) run_one rl rl "Solved!" $RUN main.py ;;
    parameter_server)
      fashion_as_mnist "$work/parameter_server/data"
      # One command per rank, as its README says: 1 server, 1 trainer. With
      # two or more trainers the program fails under torch's own RPC as under
      # baton: one trainer's optimizer step updates in place the weights that
      # another trainer's backward pass still needs ("modified by an inplace
      # operation").
      run_one parameter_server parameter_server "Accuracy" bash -c "
        $RUN rpc_parameter_server.py --world_size=2 --rank=0 & s=\$!
        $RUN rpc_parameter_server.py --world_size=2 --rank=1; c=\$?
        wait \$s; p=\$?; exit \$((c || p))" ;;
    batch_parameter_server|batch_reinforce)
      # What shows the program finished: parameter_server.py's server logs
      # "Finish training" once every trainer's batches are in; reinforce.py's
      # last line is "<world size>, <seconds batched>, <seconds unbatched>",
      # printed after both of its runs (batched and not) joined.
      if has_gpus 1; then
        if [ "$program" = batch_parameter_server ]; then
          run_one "$program" batch "Finish training" $RUN parameter_server.py
        else
          run_one "$program" batch "^[0-9]+, [0-9.]+, [0-9.]+$" $RUN reinforce.py
        fi
      else
        echo "RESULT $program NEEDS-GPU it calls .cuda() unconditionally"
      fi ;;
    pipeline)
      if has_gpus 2; then run_one pipeline pipeline "execution time" $RUN main.py
      else echo "RESULT pipeline NEEDS-GPU it places its shards on cuda:0 and cuda:1"; fi ;;
    ddp_rpc)
      if has_gpus 2; then run_one ddp_rpc ddp_rpc "completed successfully" $RUN main.py
      else echo "RESULT ddp_rpc NEEDS-GPU it needs 2 GPUs (it exits 0 saying so without them)"; fi ;;
    *) echo "unknown program $program" >&2; exit 2 ;;
  esac
done
