#!/usr/bin/env bash
# Runs the PyTorch peer (../shared/peer/torch_allreduce_bench.py, Gloo) and
# baton's allreduce_bench back to back on 2 ranks and prints a side-by-side
# table. "speedup" is how many times faster baton is (peer latency / ours, or
# our GB/s / theirs); the issue's targets are in the last column. The peer
# runs under Debian's torch 1.13 (/usr/bin/python3) or under the interpreter
# that BATON_PEER_PYTHON names (bench/compare.sh --peer-python), for example
# the venv of pip's torch 2.x.
#
#   comm/bench/compare_allreduce.sh            # from the repository root
#   BATON_ALLREDUCE_BENCH=path/to/binary comm/bench/compare_allreduce.sh
#   BATON_PEER_PYTHON="$(bash tools/torch2_venv.sh)" comm/bench/compare_allreduce.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
peer="$root/../shared/peer/torch_allreduce_bench.py"
ours="${BATON_ALLREDUCE_BENCH:-$(cd "$root" && bazel info bazel-bin 2>/dev/null)/comm/bench/allreduce_bench}"
if [[ ! -x "$ours" ]]; then
  (cd "$root" && bazel build //comm/bench:allreduce_bench)
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
port="$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
peer_python="${BATON_PEER_PYTHON:-/usr/bin/python3}"
echo "== allreduce peer under $peer_python: torch $("$peer_python" -c 'import torch; print(torch.__version__)')" >&2
MASTER_PORT="$port" timeout 600 "$peer_python" "$peer" --ranks 2 >"$tmp/peer.jsonl"
timeout 600 "$ours" --ranks 2 >"$tmp/ours.jsonl"
/usr/bin/python3 - "$tmp/peer.jsonl" "$tmp/ours.jsonl" <<'PY'
import json, sys
def load(path):
    return {r["metric"]: r for r in map(json.loads, filter(str.strip, open(path)))}
peer, ours = load(sys.argv[1]), load(sys.argv[2])
targets = {"allreduce_4KB_algbw": ">= 10x (latency)",
           "allreduce_65536KB_algbw": ">= 1.5x",
           "ddp_step_mlp_784_1024_1024_10": ">= 5x"}
print(f"{'metric':34} {'peer':>18} {'baton':>18} {'speedup':>8}  target")
for metric in peer:
    p, o = peer[metric], ours.get(metric)
    if o is None:
        print(f"{metric:34} {'':>18} {'missing':>18}"); continue
    if p["unit"] == "GB/s":
        pv = f"{p['value']:.3f} GB/s ({p['latency_us']:.0f}us)"
        ov = f"{o['value']:.3f} GB/s ({o['latency_us']:.0f}us)"
        speedup = o["value"] / p["value"]
    else:
        pv, ov = f"{p['value']/1e3:.1f} ms/step", f"{o['value']/1e3:.1f} ms/step"
        speedup = p["value"] / o["value"]
    print(f"{metric:34} {pv:>18} {ov:>18} {speedup:>7.2f}x  {targets.get(metric, '')}")
PY
