#!/usr/bin/env bash
# What mutual TLS costs: bench/rpc_bench over loopback gRPC with and without
# TLS, alternating, N rounds (default 3), on the path between hosts
# (BATON_SHM=0: large tensors on the network bulk channel, whose connections
# are TLS too under TLS; BATON_NET_BULK=0 in the environment keeps them on the
# stream instead). Prints, per metric, the median of each
# side and the TLS cost of every round (the ratio within a round, so that the
# machine's noise between rounds cancels out), for the table in docs/performance.md.
#   bench/tls_cost.sh [rounds] [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
QUICK=${2:-}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

bazel build -c opt //bench:rpc_bench >/dev/null 2>&1 || bazel build -c opt //bench:rpc_bench
BENCH="$(bazel info -c opt bazel-bin 2>/dev/null)/bench/rpc_bench"
bash tools/make_certs.sh "$OUT/certs" node >/dev/null
for r in $(seq 1 "$ROUNDS"); do
  for t in grpc tls; do
    tls_env=()
    if [ "$t" = tls ]; then
      tls_env=(BATON_TLS_CA="$OUT/certs/ca.pem" BATON_TLS_CERT="$OUT/certs/node.pem"
               BATON_TLS_KEY="$OUT/certs/node.key")
    fi
    echo "== round $r: $t" >&2
    env "${tls_env[@]}" BATON_SHM=0 BATON_TRANSPORT=grpc MASTER_PORT=$((20000 + RANDOM % 20000)) \
      "$BENCH" $QUICK | grep '^{' >"$OUT/$t.$r.jsonl"
  done
done

/usr/bin/python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(p):
    d = {}
    for line in open(p):
        try:
            m = json.loads(line)
            d[m["metric"]] = m
        except Exception:
            pass
    return d
runs = {t: [load(f"{out}/{t}.{r}.jsonl") for r in range(1, rounds + 1)] for t in ("grpc", "tls")}
print(f"| metric | gRPC (median of {rounds}) | gRPC + mutual TLS (median) | TLS cost per round |")
print("| --- | ---: | ---: | --- |")
for m, first in runs["grpc"][0].items():
    if m.startswith("shm_"):
        continue  # the shared-memory floors: no gRPC, no TLS
    unit = first["unit"]
    higher = unit in ("GB/s", "calls/s")
    g = [r[m]["value"] for r in runs["grpc"] if m in r]
    t = [r[m]["value"] for r in runs["tls"] if m in r]
    costs = [(gi / ti if higher else ti / gi) for gi, ti in zip(g, t) if gi and ti]
    fmt = lambda v: f"{v:.2f}" if v < 10 else f"{v:.0f}"
    print(f"| {m} | {fmt(statistics.median(g))} {unit} | {fmt(statistics.median(t))} {unit} | "
          + ", ".join(f"{c:.2f}x" for c in costs) + " |")
PY
