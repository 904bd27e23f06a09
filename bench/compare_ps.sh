#!/usr/bin/env bash
# Parameter servers: PyTorch-RPC parameter servers (the peer scripts
# torch_ps_bench.py and torch_ps_sparse_bench.py) against baton's ps/ on the
# same workloads, one after the other on this machine, and prints a markdown
# table: each metric for the peer and baton, their ratio, and for training
# throughput the fraction of the same system's compute-only bound (its
# --mode local run: the same trainers with no server and no communication).
#   bench/compare_ps.sh [--quick] [--out DIR]
#     --quick   dense: 50 timed steps instead of 200; sparse: the scripts'
#               --quick (300 timed steps instead of 1500)
#     --out DIR keep every run's JSON lines and stderr in DIR
# Runs, each peer first: dense local, sync, async; sparse local, ps.
# The peer scripts are looked up in $BATON_PEER_DIR, else ../shared/peer
# beside the repository. Needs Debian's python3 with python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0
KEEP=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --out) KEEP=$2; shift ;;
    *) echo "usage: $0 [--quick] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
source bench/compare_lib.sh
compare_init
LIMIT=${BATON_PS_RUN_TIMEOUT:-1800}  # seconds per run
build_benches ps_bench ps_sparse_bench

DENSE_ARGS=()
SPARSE_ARGS=()
if [ "$QUICK" = 1 ]; then
  DENSE_ARGS=(--steps 50)
  SPARSE_ARGS=(--quick)
fi

# run <system> <tag> <command...>: appends the run's JSON lines to $OUT/<system>.jsonl.
run() {
  local system=$1 tag=$2
  shift 2
  run_logged "$LIMIT" "$system" "$system.$tag" "$@"
}

: >"$OUT/peer.jsonl"
: >"$OUT/baton.jsonl"
HAVE_PEER=1
for f in torch_ps_bench.py torch_ps_sparse_bench.py; do
  [ -f "$PEER_DIR/$f" ] || HAVE_PEER=0
done
[ "$HAVE_PEER" = 1 ] || echo "peer scripts not found in $PEER_DIR; showing baton only" >&2

for mode in local sync async; do
  [ "$HAVE_PEER" = 1 ] &&
    run peer "dense-$mode" /usr/bin/python3 "$PEER_DIR/torch_ps_bench.py" --mode "$mode" "${DENSE_ARGS[@]}"
  run baton "dense-$mode" "$BIN/ps_bench" --mode "$mode" "${DENSE_ARGS[@]}"
done
for mode in local ps; do
  [ "$HAVE_PEER" = 1 ] &&
    run peer "sparse-$mode" /usr/bin/python3 "$PEER_DIR/torch_ps_sparse_bench.py" --mode "$mode" "${SPARSE_ARGS[@]}"
  run baton "sparse-$mode" "$BIN/ps_sparse_bench" --mode "$mode" "${SPARSE_ARGS[@]}"
done

if [ -n "$KEEP" ]; then
  mkdir -p "$KEEP"
  cp "$OUT"/* "$KEEP"/
fi

/usr/bin/python3 - "$OUT/peer.jsonl" "$OUT/baton.jsonl" <<'PY'
import json, sys

def load(path):
    out = {}
    for line in open(path):
        try:
            d = json.loads(line)
            out[d["metric"]] = d
        except Exception:
            pass
    return out

peer, ours = load(sys.argv[1]), load(sys.argv[2])
# Throughput metric -> the same system's compute-only bound.
BOUND = {
    "ps_sync_train_throughput": "ps_local_train_throughput",
    "ps_async_train_throughput": "ps_local_train_throughput",
    "ps_sparse_train_throughput": "ps_sparse_local_train_throughput",
}
ORDER = ["ps_local_train_throughput", "ps_local_final_loss",
         "ps_sync_train_throughput", "ps_sync_final_loss",
         "ps_async_train_throughput", "ps_async_final_loss"]
for prefix in ("ps_sparse_local", "ps_sparse"):
    for m in ("train_throughput", "pull_latency_p50_us", "push_latency_p50_us",
              "unique_ids_per_batch", "initial_loss", "final_loss"):
        ORDER.append(f"{prefix}_{m}")
names = ORDER + [m for m in list(ours) + list(peer) if m not in ORDER]

def fmt(d):
    if d is None:
        return "n/a"
    v, unit = d["value"], d["unit"]
    if unit in ("samples/s", "us", "ids"):
        return f"{v:.0f}"
    return f"{v:.4f}"

def of_bound(table, m):
    b = BOUND.get(m)
    if b is None or m not in table or b not in table or not table[b]["value"]:
        return ""
    return f"{table[m]['value'] / table[b]['value']:.2f}"

print("| metric | unit | peer (torch) | baton | baton vs peer | peer: of its local bound | baton: of its local bound |")
print("| --- | --- | ---: | ---: | --- | ---: | ---: |")
seen = set()
for m in names:
    if m in seen or (m not in ours and m not in peer):
        continue
    seen.add(m)
    p, o = peer.get(m), ours.get(m)
    unit = (o or p)["unit"]
    ratio = ""
    if p is not None and o is not None and p["value"]:
        r = o["value"] / p["value"]
        if unit == "samples/s":
            ratio = f"{r:.2f}x the peer's"
        elif unit == "us":
            ratio = f"{r:.2f} of the peer's time"
        else:
            ratio = f"{r:.3f}"
    print(f"| {m} | {unit} | {fmt(p)} | {fmt(o)} | {ratio} | {of_bound(peer, m)} | {of_bound(ours, m)} |")
PY
