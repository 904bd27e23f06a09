#!/usr/bin/env bash
# Pipeline-parallel training: PyTorch's RPC pipeline in the tutorial's shape
# (the peer torch_pipeline_bench.py, with Pipe and the single-process
# baselines) against baton's pipeline/ (1F1B) on the same workload, one after
# the other on this machine. Prints a markdown table: throughput per (p, m)
# for the peer and baton and their ratio, baton's share of the bound
# p x (micro-batched single-process rate) x m / (m + p - 1) measured in
# baton's own run, its measured bubble, and the loss curves' largest relative
# difference from the single-process curve.
#   bench/compare_pipeline.sh [--quick] [--batch B] [--out DIR]
#     --quick    8 steps, p = 2 (default: 30 steps, p = 2 and 4)
#     --batch B  rows per step (default 128; the issue also asks for 512)
#     --out DIR  keep every run's JSON lines, stderr and baton's traces in DIR
# The peer script is looked up in $BATON_PEER_DIR, else ../shared/peer beside
# the repository. The peer runs under Debian's python3 with python3-torch, or
# under $BATON_PEER_PYTHON (bench/compare.sh --peer-python).
set -euo pipefail
cd "$(dirname "$0")/.."
ARGS=()
KEEP=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) ARGS+=(--quick) ;;
    --batch) ARGS+=(--batch "$2"); shift ;;
    --out) KEEP=$2; shift ;;
    *) echo "usage: $0 [--quick] [--batch B] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
source bench/compare_lib.sh
compare_init
LIMIT=${BATON_PIPELINE_RUN_TIMEOUT:-1800}  # seconds per run
# The peer prints every metric, then sometimes hangs in rpc.shutdown() (seen
# here in 1 of 4 runs): its lines are kept when the timeout kills it.
PEER_LIMIT=${BATON_PIPELINE_PEER_TIMEOUT:-400}

build_benches pipeline_bench

run() {  # run <system> <command...>: the run's JSON lines go to $OUT/<system>.jsonl
  local limit=$LIMIT
  [ "$1" = peer ] && limit=$PEER_LIMIT
  run_logged "$limit" "$1" "$@"
}

: >"$OUT/peer.jsonl"
if [ -f "$PEER_DIR/torch_pipeline_bench.py" ]; then
  run peer "${BATON_PEER_PYTHON:-/usr/bin/python3}" "$PEER_DIR/torch_pipeline_bench.py" "${ARGS[@]}"
else
  echo "peer script not found in $PEER_DIR; showing baton only" >&2
fi
mkdir -p "$OUT/traces"
run baton "$BIN/pipeline_bench" "${ARGS[@]}" --trace-dir "$OUT/traces"

if [ -n "$KEEP" ]; then
  mkdir -p "$KEEP"
  cp -r "$OUT"/* "$KEEP"/
fi

/usr/bin/python3 - "$OUT/peer.jsonl" "$OUT/baton.jsonl" <<'PY'
import json, sys

def load(path):
    out = {}
    for line in open(path):
        try:
            d = json.loads(line)
        except Exception:
            continue
        out[d["metric"]] = d
    return out

peer, ours = load(sys.argv[1]), load(sys.argv[2])
v = lambda d: None if d is None else d.get("value")
print("| metric | peer (torch) | baton | baton vs peer | baton / bound | bubble measured / theory | loss max rel diff (peer, baton) |")
print("| --- | ---: | ---: | --- | ---: | --- | --- |")
names = [m for m in dict.fromkeys(list(peer) + list(ours)) if m.endswith("samples_per_s") or
         "_samples_per_s_" in m]
for m in names:
    p, o = peer.get(m), ours.get(m)
    fmt = lambda d: "n/a" if v(d) is None else f"{v(d):.0f}"
    ratio = f"{v(o) / v(p):.2f}x" if v(p) and v(o) else ""
    bound = bubble = diff = ""
    if m.startswith("pipeline_train_samples_per_s_"):
        key = m[len("pipeline_train_samples_per_s_"):]
        b, bb = ours.get("pipeline_bound_fraction_" + key), ours.get("pipeline_bubble_" + key)
        if b:
            bound = f"{v(b):.2f}"
        if bb:
            bubble = f"{v(bb):.3f} / {bb.get('theoretical', 0):.3f}"
        pl, ol = peer.get("pipeline_final_loss_" + key), ours.get("pipeline_final_loss_" + key)
        show = lambda d: "n/a" if d is None or d.get("max_rel_diff_vs_single_process") is None \
            else f"{d['max_rel_diff_vs_single_process']:.1e}"
        diff = f"{show(pl)}, {show(ol)}"
    print(f"| {m} | {fmt(p)} | {fmt(o)} | {ratio} | {bound} | {bubble} | {diff} |")
PY
