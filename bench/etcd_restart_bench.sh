#!/usr/bin/env bash
# Time from a SIGKILLed rank 0 to the job training again, with the job's
# store on etcd (issue 26's target: at most 5 s plus the restart itself).
#
#   bazel build //launcher:baton-run //tests/ps:ps_fault_job
#   bash bench/etcd_restart_bench.sh [ROUNDS]
#
# Each round runs the parameter-server job of tests/ps/ps_fault_test.sh (two
# trainers, then two servers, so rank 0 is trainer0; --restart_policy
# trainer=worker) through baton-run --rdzv_backend etcd on a real etcd,
# SIGKILLs trainer0 at step 100, and splits the time until it trains again:
#   restart: the kill until the new process runs (its "pid" line: baton-run
#            noticed, forked, and the program loaded LibTorch);
#   rejoin:  from there until it is back at the servers' clock ("resuming":
#            its agent rejoined through etcd and its PS client reconnected).
# The target is on rejoin (the part the store decides). For reference, the
# same kill of rank 1 (trainer1) with baton-run's built-in store, which rank 0
# serves: what any other rank's rejoin costs there.
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
RUN=bazel-bin/launcher/baton-run
JOB=bazel-bin/tests/ps/ps_fault_job
[ -x "$RUN" ] && [ -x "$JOB" ] || {
  echo "build first: bazel build //launcher:baton-run //tests/ps:ps_fault_job" >&2
  exit 2
}
TMP=$(mktemp -d)
free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# Prefixes every line with the wall clock (seconds), unbuffered.
stamp() { /usr/bin/python3 -u -c 'import sys, time
for line in sys.stdin: print("%.3f %s" % (time.time(), line), end="")'; }

client_port=$(free_port)
peer_port=$(free_port)
/usr/bin/etcd --name bench --data-dir "$TMP/etcd" \
  --listen-client-urls "http://127.0.0.1:$client_port" \
  --advertise-client-urls "http://127.0.0.1:$client_port" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "bench=http://127.0.0.1:$peer_port" >"$TMP/etcd.log" 2>&1 &
etcd_pid=$!
trap 'kill $etcd_pid 2>/dev/null; wait $etcd_pid 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 300); do
  grep -q "serving client traffic" "$TMP/etcd.log" && break
  sleep 0.1
done

# one_round NAME VICTIM FLAGS...: prints "restart rejoin" in seconds.
one_round() {
  local name=$1 victim=$2
  shift 2
  local log="$TMP/$name.log"
  ( timeout 240 "$RUN" --standalone --role trainer:2 --role ps:2 --tee \
      --restart_policy trainer=worker --max_restarts 2 "$@" \
      "$JOB" --checkpoint_dir="$TMP/$name.ckpt" --steps=300 2>&1 | stamp ) >"$log" &
  local job=$!
  for _ in $(seq 1200); do
    grep -q "\[trainer0\] step 100 " "$log" && break
    sleep 0.1
  done
  local pid
  pid=$(grep -o "\[$victim\] pid [0-9]*" "$log" | head -1 | awk '{print $3}')
  local killed
  killed=$(/usr/bin/python3 -c 'import time; print("%.3f" % time.time())')
  kill -9 "$pid"
  wait $job
  grep -q "RESULT OK" "$log" || { cat "$log" >&2; echo "$name: the job failed" >&2; return 1; }
  local started resumed
  started=$(grep "\[$victim\] pid .* restart [1-9]" "$log" | head -1 | awk '{print $1}')
  resumed=$(grep "\[$victim\] resuming at step" "$log" | tail -1 | awk '{print $1}')
  /usr/bin/python3 -c "print('%.3f %.3f' % ($started - $killed, $resumed - $started))"
}

for r in $(seq "$ROUNDS"); do
  read -r restart rejoin < <(one_round "etcd$r" trainer0 --rdzv_backend etcd \
    --rdzv_endpoint "127.0.0.1:$client_port" --rdzv_id "restart-bench-$r") || exit 1
  echo "{\"system\": \"baton\", \"metric\": \"rank0_kill_etcd\", \"round\": $r," \
    "\"restart_s\": $restart, \"rejoin_s\": $rejoin, \"target\": \"rejoin <= 5\"}"
  read -r restart rejoin < <(one_round "builtin$r" trainer1) || exit 1
  echo "{\"system\": \"baton\", \"metric\": \"rank1_kill_builtin\", \"round\": $r," \
    "\"restart_s\": $restart, \"rejoin_s\": $rejoin}"
done
