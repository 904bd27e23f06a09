#!/usr/bin/env bash
# What metrics cost: bench/rpc_bench with metrics collected (BATON_METRICS=1,
# as under baton-run --metrics_port or --node_metrics_port) and without,
# alternating, RUNS times each (default 3), on the same-host transport.
# Prints each metric's values and the ratio on/off per run.
#   bench/metrics_cost.sh [RUNS] [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
QUICK=${2:-}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
bazel build -c opt //bench:rpc_bench >/dev/null 2>&1 || bazel build -c opt //bench:rpc_bench
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)/bench/rpc_bench"
for r in $(seq "$RUNS"); do
  for m in 0 1; do
    BATON_METRICS=$m MASTER_PORT=$((20000 + RANDOM % 20000)) "$BIN" $QUICK | grep '^{' >"$OUT/$m.$r.jsonl"
  done
done
/usr/bin/python3 - "$OUT" "$RUNS" <<'PY'
import json, sys
out, runs = sys.argv[1], int(sys.argv[2])
def load(p):
    return {d["metric"]: d for d in (json.loads(l) for l in open(p))}
rows = {}
for r in range(1, runs + 1):
    off, on = load(f"{out}/0.{r}.jsonl"), load(f"{out}/1.{r}.jsonl")
    for m in off:
        if m in on:
            rows.setdefault(m, []).append((off[m]["value"], on[m]["value"], off[m]["unit"]))
print("| metric | unit | metrics off | metrics on | on / off, per run |")
print("| --- | --- | --- | --- | --- |")
for m, vals in rows.items():
    unit = vals[0][2]
    fmt = lambda v: f"{v:.2f}" if v < 10 else f"{v:.0f}"
    print(f"| {m} | {unit} | {', '.join(fmt(a) for a, _, _ in vals)} | "
          f"{', '.join(fmt(b) for _, b, _ in vals)} | "
          f"{', '.join(f'{b / a:.2f}' for a, b, _ in vals if a)} |")
PY
