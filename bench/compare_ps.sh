#!/usr/bin/env bash
# Parameter servers: PyTorch-RPC parameter servers (the peer scripts
# torch_ps_bench.py and torch_ps_sparse_bench.py) against baton's ps/ on the
# same workloads, one after the other on this machine, and prints a markdown
# table: each metric for the peer and baton, their ratio, and for training
# throughput the fraction of the same system's compute-only bound (its
# --mode local run: the same trainers with no server and no communication);
# then baton's distance to that bound for the dense modes, split into the
# CPU a step costs beyond the bound's and the cores left idle.
#   bench/compare_ps.sh [--quick] [--out DIR]
#     --quick   dense: 50 timed steps instead of 200; sparse: the scripts'
#               --quick (300 timed steps instead of 1500)
#     --out DIR keep every run's JSON lines and stderr in DIR
# Runs, each peer first: dense local, sync, async; sparse local, ps.
# The peer scripts are looked up in $BATON_PEER_DIR, else ../shared/peer
# beside the repository. The peers run under Debian's python3 with python3-torch,
# or under $BATON_PEER_PYTHON (bench/compare.sh --peer-python).
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
    run peer "dense-$mode" "${BATON_PEER_PYTHON:-/usr/bin/python3}" "$PEER_DIR/torch_ps_bench.py" --mode "$mode" "${DENSE_ARGS[@]}"
  run baton "dense-$mode" "$BIN/ps_bench" --mode "$mode" "${DENSE_ARGS[@]}"
done
for mode in local ps; do
  [ "$HAVE_PEER" = 1 ] &&
    run peer "sparse-$mode" "${BATON_PEER_PYTHON:-/usr/bin/python3}" "$PEER_DIR/torch_ps_sparse_bench.py" --mode "$mode" "${SPARSE_ARGS[@]}"
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

# Issue 28's distance to the bound, split (baton's dense runs): a mode's
# fraction of the local bound is the product of
#   cpu: the CPU a local trainer step costs / the CPU a step costs here (the
#        trainer's own, plus its share of the server's), and
#   busy: how busy the cores were here / how busy in the local run
# (every process's CPU over wall time x cores), so what is lost is either
# work the bound does not do (copies, wake-ups, the server) or idle cores
# (waits). The step's wall time is split the same way the trainers saw it.
def val(m):
    d = ours.get(m)
    return None if d is None else d["value"]

local_cpu, local_busy = val("ps_local_trainer_cpu_ms_per_step"), val("ps_local_cpu_busy")
rows = []
for mode in ("sync", "async"):
    p = f"ps_{mode}_"
    need = [val(p + x) for x in ("trainer_cpu_ms_per_step", "server_cpu_ms_per_step",
                                 "cpu_busy", "train_throughput", "step_compute_ms",
                                 "step_pull_ms", "step_push_ms")]
    if None in need or not local_cpu or not local_busy or not val("ps_local_train_throughput"):
        continue
    trainer, server, busy, tput, compute, pull, push = need
    # Wall with fewer than 2 trainers computing (on 2 cores: a core the
    # trainers leave to the exchange, or idle).
    few = sum(val(p + f"wall_with_{k}_computing") or 0 for k in (0, 1))
    trainers = ours[p + "train_throughput"].get("trainers", 4) or 4
    step_cpu = trainer + server / trainers
    cpu = local_cpu / step_cpu
    busy_ratio = busy / local_busy
    rows.append(f"| {mode} | {tput / val('ps_local_train_throughput'):.2f} | {cpu * busy_ratio:.2f} "
                f"| {cpu:.2f} | {busy_ratio:.2f} | {local_cpu:.2f} | {trainer:.2f} "
                f"| {server / trainers:.2f} | {compute:.2f} / {pull:.2f} / {push:.2f} | {few:.2f} |")
if rows:
    print()
    print("Distance to the bound (baton, dense): of bound = cpu x busy")
    print()
    print("| mode | of bound, measured | cpu x busy | cpu: local step CPU / step CPU here "
          "| busy: cores busy here / in local | local trainer CPU ms/step "
          "| trainer CPU ms/step | server CPU ms per trainer step "
          "| trainer wall ms/step: compute / pull / push | wall with < 2 trainers computing |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for r in rows:
        print(r)
PY
