#!/usr/bin/env bash
# Runs PyTorch's RPC (the peer) and baton one after the other on this machine
# and prints the metrics side by side with ratios.
#   bench/compare.sh [--quick]
# The peer script is looked up in $BATON_PEER_DIR, else ../shared/peer beside
# the repository. Needs Debian's python3 with python3-torch (tools/install_deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=${1:-}
PEER_DIR=${BATON_PEER_DIR:-$(cd .. && pwd)/shared/peer}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

bazel build -c opt //bench:rpc_bench >/dev/null 2>&1 || bazel build -c opt //bench:rpc_bench

if [ -f "$PEER_DIR/torch_rpc_bench.py" ]; then
  echo "== peer: torch.distributed.rpc ($PEER_DIR/torch_rpc_bench.py $QUICK)" >&2
  MASTER_PORT=$((20000 + RANDOM % 20000)) /usr/bin/python3 "$PEER_DIR/torch_rpc_bench.py" $QUICK \
    2>"$OUT/peer.err" | grep '^{' >"$OUT/peer.jsonl" || { cat "$OUT/peer.err" >&2; }
else
  echo "peer script not found in $PEER_DIR; showing baton only" >&2
  : >"$OUT/peer.jsonl"
fi
echo "== baton: bench/rpc_bench $QUICK" >&2
MASTER_PORT=$((20000 + RANDOM % 20000)) "$(bazel info -c opt bazel-bin 2>/dev/null)/bench/rpc_bench" $QUICK | grep '^{' >"$OUT/baton.jsonl"

/usr/bin/python3 - "$OUT/peer.jsonl" "$OUT/baton.jsonl" <<'PY'
import json, sys
def load(p):
    out = {}
    for line in open(p):
        try:
            d = json.loads(line)
            out[d["metric"]] = d
        except Exception:
            pass
    return out
peer, ours = load(sys.argv[1]), load(sys.argv[2])
higher_better = lambda unit: unit in ("GB/s", "calls/s")
print(f"| metric | unit | peer (torch) | baton | baton vs peer |")
print(f"| --- | --- | ---: | ---: | --- |")
for m, d in ours.items():
    p = peer.get(m)
    unit = d["unit"]
    if p is None:
        print(f"| {m} | {unit} | n/a | {d['value']:.1f} | |")
        continue
    if higher_better(unit):
        ratio = f"{d['value'] / p['value']:.2f}x the peer's"
    else:
        ratio = f"{d['value'] / p['value']:.2f} of the peer's time"
    fmt = (lambda v: f"{v:.2f}") if unit == "GB/s" else (lambda v: f"{v:.0f}")
    print(f"| {m} | {unit} | {fmt(p['value'])} | {fmt(d['value'])} | {ratio} |")
for m, p in peer.items():
    if m not in ours:
        print(f"| {m} | {p['unit']} | {p['value']:.1f} | not yet | |")
PY

# Collectives and DDP (comm/), against PyTorch's Gloo process group and DDP.
if [ -f "$PEER_DIR/torch_allreduce_bench.py" ] && [ "${BATON_SKIP_COMM:-0}" != 1 ]; then
  echo >&2
  echo "== collectives: comm/bench/compare_allreduce.sh" >&2
  (cd comm/bench && bash ./compare_allreduce.sh)
fi

# Parameter servers (ps/), against PyTorch-RPC parameter servers.
if [ -f "$PEER_DIR/torch_ps_bench.py" ] && [ "${BATON_SKIP_PS:-0}" != 1 ]; then
  echo >&2
  echo "== parameter servers: bench/compare_ps.sh $QUICK" >&2
  BATON_PEER_DIR="$PEER_DIR" bash bench/compare_ps.sh $QUICK
fi

# Reinforcement learning (rl/), against the RPC tutorials' agent/observer.
if [ -f "$PEER_DIR/torch_rl_bench.py" ] && [ "${BATON_SKIP_RL:-0}" != 1 ]; then
  echo >&2
  echo "== reinforcement learning: bench/compare_rl.sh $QUICK" >&2
  BATON_PEER_DIR="$PEER_DIR" bash bench/compare_rl.sh $QUICK
fi
