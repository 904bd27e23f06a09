#!/usr/bin/env bash
# Reinforcement learning: PyTorch's RPC tutorials' agent/observer pattern (the
# peer torch_rl_bench.py) against baton's rl/ on the same workload, one after
# the other on this machine, and prints a markdown table: each metric for the
# peer and baton and their ratio.
#   bench/compare_rl.sh [--quick] [--solve] [--out DIR]
#     --quick   N = 1,4 at 2 s per point (default 1,4,16 at 6 s)
#     --solve   also train until solved, per seed (3 seeds; --quick: 1)
#     --solve-only  only that (no throughput points)
#     --out DIR keep every run's JSON lines and stderr in DIR
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
    --solve) ARGS+=(--solve) ;;
    --solve-only) ARGS+=(--solve --observers=) ;;
    --out) KEEP=$2; shift ;;
    *) echo "usage: $0 [--quick] [--solve | --solve-only] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
source bench/compare_lib.sh
compare_init
LIMIT=${BATON_RL_RUN_TIMEOUT:-3600}  # seconds per run

build_benches rl_bench

run() {  # run <system> <command...>: the run's JSON lines go to $OUT/<system>.jsonl
  run_logged "$LIMIT" "$1" "$@"
}

: >"$OUT/peer.jsonl"
if [ -f "$PEER_DIR/torch_rl_bench.py" ]; then
  run peer "${BATON_PEER_PYTHON:-/usr/bin/python3}" "$PEER_DIR/torch_rl_bench.py" "${ARGS[@]}"
else
  echo "peer script not found in $PEER_DIR; showing baton only" >&2
fi
run baton "$BIN/rl_bench" "${ARGS[@]}"

if [ -n "$KEEP" ]; then
  mkdir -p "$KEEP"
  cp "$OUT"/* "$KEEP"/
fi

/usr/bin/python3 - "$OUT/peer.jsonl" "$OUT/baton.jsonl" <<'PY'
import json, sys

def load(path):
    out, solve = {}, {}
    for line in open(path):
        try:
            d = json.loads(line)
        except Exception:
            continue
        if d["metric"] in ("rl_episodes_to_solve", "rl_seconds_to_solve"):
            solve.setdefault(d["metric"], []).append(d)
        else:
            out[d["metric"]] = d
    return out, solve

(peer, peer_solve), (ours, our_solve) = load(sys.argv[1]), load(sys.argv[2])
print("| metric | unit | peer (torch) | baton | baton vs peer |")
print("| --- | --- | ---: | ---: | --- |")
for m in list(dict.fromkeys(list(peer) + list(ours))):
    p, o = peer.get(m), ours.get(m)
    unit = (o or p)["unit"]
    f = lambda d: "n/a" if d is None or d["value"] is None else f"{d['value']:.0f}"
    ratio = ""
    if p and o and p["value"]:
        r = o["value"] / p["value"]
        ratio = f"{r:.2f}x the peer's" if unit == "steps/s" else f"{r:.2f} of the peer's time"
    print(f"| {m} | {unit} | {f(p)} | {f(o)} | {ratio} |")
for m in ("rl_episodes_to_solve", "rl_seconds_to_solve"):
    ps, os_ = peer_solve.get(m, []), our_solve.get(m, [])
    if not ps and not os_:
        continue
    show = lambda ds: ", ".join("unsolved" if d["value"] is None or d.get("solved") in (False, "false")
                                else f"{d['value']:.0f}" for d in ds) or "n/a"
    def mean(ds):
        v = [d["value"] for d in ds if d["value"] is not None and d.get("solved") not in (False, "false")]
        return sum(v) / len(v) if v and len(v) == len(ds) else None
    mp, mo = mean(ps), mean(os_)
    ratio = f"{mo / mp:.2f} of the peer's (mean)" if mp and mo else ""
    print(f"| {m} (per seed) | {(os_ or ps)[0]['unit']} | {show(ps)} | {show(os_)} | {ratio} |")
PY
