#!/usr/bin/env bash
# Runs PyTorch's RPC (the peer) and baton one after the other on this machine
# and prints the metrics side by side with ratios.
#   bench/compare.sh [--quick] [--peer-python PATH]
# The peer script is looked up in $BATON_PEER_DIR, else ../shared/peer beside
# the repository. The peers run under Debian's python3 with python3-torch
# 1.13 (tools/install_deps.sh), or under the interpreter --peer-python names
# (BATON_PEER_PYTHON for the compare_*.sh scripts), for example the venv of
# pip's torch 2.x: --peer-python "$(bash tools/torch2_venv.sh)".
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=""
export BATON_PEER_PYTHON="${BATON_PEER_PYTHON:-/usr/bin/python3}"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=--quick ;;
    --peer-python) BATON_PEER_PYTHON="$2"; shift ;;
    *) echo "usage: bench/compare.sh [--quick] [--peer-python PATH]" >&2; exit 2 ;;
  esac
  shift
done
echo "== peers under $BATON_PEER_PYTHON: torch $("$BATON_PEER_PYTHON" -c 'import torch; print(torch.__version__)')" >&2
PEER_DIR=${BATON_PEER_DIR:-$(cd .. && pwd)/shared/peer}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

bazel build -c opt //bench:rpc_bench >/dev/null 2>&1 || bazel build -c opt //bench:rpc_bench

if [ -f "$PEER_DIR/torch_rpc_bench.py" ]; then
  echo "== peer: torch.distributed.rpc ($PEER_DIR/torch_rpc_bench.py $QUICK)" >&2
  MASTER_PORT=$((20000 + RANDOM % 20000)) "$BATON_PEER_PYTHON" "$PEER_DIR/torch_rpc_bench.py" $QUICK \
    2>"$OUT/peer.err" | grep '^{' >"$OUT/peer.jsonl" || { cat "$OUT/peer.err" >&2; }
  # The fair peer of the gRPC column: TensorPipe as between hosts (TCP
  # through libuv, the basic channel).
  echo "== peer: PEER_NETWORK_ONLY=1 $PEER_DIR/torch_rpc_bench.py $QUICK" >&2
  PEER_NETWORK_ONLY=1 MASTER_PORT=$((20000 + RANDOM % 20000)) "$BATON_PEER_PYTHON" "$PEER_DIR/torch_rpc_bench.py" $QUICK \
    2>"$OUT/peer_net.err" | grep '^{' >"$OUT/peer_net.jsonl" || { cat "$OUT/peer_net.err" >&2; }
else
  echo "peer script not found in $PEER_DIR; showing baton only" >&2
  : >"$OUT/peer.jsonl"
  : >"$OUT/peer_net.jsonl"
fi
# baton three times: the same-host transport (shared-memory rings, the
# default on one host), gRPC forced (what calls between hosts use), and gRPC
# with mutual TLS (certificates made by tools/make_certs.sh for 127.0.0.1).
bash tools/make_certs.sh "$OUT/certs" node
for t in shm grpc tls bulk; do
  tls_env=()
  if [ "$t" = tls ]; then
    tls_env=(BATON_TLS_CA="$OUT/certs/ca.pem" BATON_TLS_CERT="$OUT/certs/node.pem"
             BATON_TLS_KEY="$OUT/certs/node.key")
  fi
  echo "== baton: BATON_TRANSPORT=${t/tls/grpc} ${tls_env[*]:+(TLS)} bench/rpc_bench $QUICK" >&2
  # gRPC and TLS: large tensors on the stream too (BATON_SHM=0), as between hosts.
  shm_env=(BATON_SHM=1)
  [ "$t" != shm ] && shm_env=(BATON_SHM=0)
  # bulk: gRPC with the network bulk channel (the default between hosts,
  # docs/wire_format.md); the grpc row keeps every byte on the stream.
  [ "$t" = grpc ] && shm_env+=(BATON_NET_BULK=0)
  [ "$t" = bulk ] && shm_env+=(BATON_NET_BULK=1)
  transport=${t/tls/grpc}
  env "${tls_env[@]}" "${shm_env[@]}" BATON_TRANSPORT="${transport/bulk/grpc}" MASTER_PORT=$((20000 + RANDOM % 20000)) \
    "$(bazel info -c opt bazel-bin 2>/dev/null)/bench/rpc_bench" $QUICK | grep '^{' >"$OUT/baton.$t.jsonl"
done

# baton from Python (python/, built by tools/python.sh): the peer's own
# workload through baton.rpc, metrics prefixed python_.
if [ "${BATON_SKIP_PYTHON:-0}" != 1 ]; then
  bash tools/python.sh >/dev/null 2>&1 || bash tools/python.sh
  echo "== baton from Python: bench/python/rpc_bench.py $QUICK" >&2
  PYTHONPATH="$PWD/python" MASTER_PORT=$((20000 + RANDOM % 20000)) \
    /usr/bin/python3 bench/python/rpc_bench.py $QUICK | grep '^{' >"$OUT/baton.python.jsonl" || true
else
  : >"$OUT/baton.python.jsonl"
fi

/usr/bin/python3 - "$OUT/peer.jsonl" "$OUT/baton.shm.jsonl" "$OUT/baton.grpc.jsonl" "$OUT/baton.tls.jsonl" "$OUT/baton.python.jsonl" "$OUT/peer_net.jsonl" "$OUT/baton.bulk.jsonl" <<'PY'
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
peer, shm, grpc, tls = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3]), load(sys.argv[4])
# The TLS run keeps the bulk channel on (B9: its connections are TLS too), so
# its cost is against the bulk run where that has the metric.
bulk_run = load(sys.argv[7])
higher_better = lambda unit: unit in ("GB/s", "calls/s")
def ratio(d, p):
    if p is None or d is None or not p["value"]:
        return ""
    r = d["value"] / p["value"]
    return f"{r:.2f}x the peer's" if higher_better(d["unit"]) else f"{r:.2f} of the peer's time"
fmt = lambda d: "n/a" if d is None else (f"{d['value']:.2f}" if d["unit"] in ("GB/s", "us") and d["value"] < 10 else f"{d['value']:.0f}")
def tls_cost(t, g):
    if t is None or g is None or not g["value"] or not t["value"]:
        return ""
    # > 1: TLS is slower (more time, or less throughput).
    r = g["value"] / t["value"] if higher_better(t["unit"]) else t["value"] / g["value"]
    return f"{r:.2f}x"
print("| metric | unit | peer (torch) | baton, shm transport | vs peer | baton, gRPC | vs peer | baton, gRPC + bulk + TLS | TLS cost (vs gRPC + bulk) |")
print("| --- | --- | ---: | ---: | --- | ---: | --- | ---: | --- |")
for m in list(dict.fromkeys(list(shm) + list(grpc) + list(peer))):
    d, g, p, t = shm.get(m), grpc.get(m), peer.get(m), tls.get(m)
    unit = (d or g or p)["unit"]
    print(f"| {m} | {unit} | {fmt(p)} | {fmt(d)} | {ratio(d, p)} | {fmt(g)} | {ratio(g, p)} | {fmt(t)} | {tls_cost(t, bulk_run.get(m) or g)} |")
python = load(sys.argv[5])
if python:
    print()
    print("| metric (from Python) | unit | peer (torch) | baton Python | vs peer | baton C++ (shm) | Python layer cost |")
    print("| --- | --- | ---: | ---: | --- | ---: | --- |")
    for m, d in python.items():
        base = m[len("python_"):]
        p, c = peer.get(base), shm.get(base)
        print(f"| {m} | {d['unit']} | {fmt(p)} | {fmt(d)} | {ratio(d, p)} | {fmt(c)} | {tls_cost(d, c)} |")
net_peer, bulk = load(sys.argv[6]), load(sys.argv[7])
if net_peer:
    # Between hosts: baton's gRPC path, without and with the bulk channel
    # (on by default, two lanes), beside TensorPipe's TCP, and one TCP
    # connection's echo (the floor, measured by the bulk run) and two
    # connections' (what the lanes can reach).
    print()
    print("| network row | unit | peer (TensorPipe TCP) | baton, gRPC | vs peer | baton, gRPC + bulk | vs peer | TCP floor | bulk / floor | 2-connection floor | bulk / it |")
    print("| --- | --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for m in ("rpc_sync_noop_latency_p50", "rpc_async_echo_64B_throughput", "rpc_sync_echo_1MB_bandwidth",
              "rpc_sync_echo_16MB_bandwidth", "rpc_sync_echo_64MB_bandwidth", "dist_autograd_step_remote_linear256"):
        g, b, p = grpc.get(m), bulk.get(m), net_peer.get(m)
        if g is None and b is None:
            continue
        f = bulk.get(m.replace("rpc_sync_echo_", "tcp_echo_floor_")) if "echo_" in m and "MB" in m else None
        f2 = bulk.get(m.replace("rpc_sync_echo_", "tcp_echo_floor_2conn_")) if f else None
        share = f"{b['value'] / f['value']:.0%}" if b and f and f["value"] else ""
        share2 = f"{b['value'] / f2['value']:.0%}" if b and f2 and f2["value"] else ""
        print(f"| {m} | {(g or b)['unit']} | {fmt(p)} | {fmt(g)} | {ratio(g, p)} | {fmt(b)} | {ratio(b, p)} | {fmt(f) if f else ''} | {share} | {fmt(f2) if f2 else ''} | {share2} |")
floor = shm.get("shm_pingpong_floor_latency_p50")
noop = shm.get("rpc_sync_noop_latency_p50")
if floor and noop and floor["value"]:
    print(f"\nshm no-op call / floor: {noop['value'] / floor['value']:.0f}x")
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

# Pipeline parallelism (pipeline/), against PyTorch's RPC pipeline and Pipe.
if [ -f "$PEER_DIR/torch_pipeline_bench.py" ] && [ "${BATON_SKIP_PIPELINE:-0}" != 1 ]; then
  echo >&2
  echo "== pipeline parallelism: bench/compare_pipeline.sh $QUICK" >&2
  BATON_PEER_DIR="$PEER_DIR" bash bench/compare_pipeline.sh $QUICK
fi
