#!/usr/bin/env bash
# Kills each role of a parameter-server job with SIGKILL mid-training, through
# baton-run, and checks that training finishes with its accuracy and every
# table (ps_fault_job prints RESULT OK only then):
#   1. a trainer, under --restart_policy trainer=role: the trainers restart
#      alone, rejoin the running servers and resume at the servers' clock;
#   2. a server, under the default group restart: every worker restarts, the
#      servers restore their newest checkpoint (every 20 clocks; the kill
#      waits until ps1 wrote the one of clock 100), and the trainers resume
#      from there;
#   3. rank 0, a trainer (the trainer role first), under
#      --restart_policy trainer=role with the job's store on a real etcd
#      (--rdzv_backend etcd): no rank serves the store, so rank 0 restarts
#      alone with its role and rejoins, as any trainer does;
#   4. the node hosting an elastic job's rendezvous (3 nodes, one server and
#      one trainer each, on etcd): the other two take over the rendezvous and
#      finish the training as a 2-node job. Its checkpoints are per server
#      count (serverS-of-N), so the 2-server job trains from its own start.
set -uo pipefail
RUNFILES="${TEST_SRCDIR:-$0.runfiles}/baton"
RUN="$RUNFILES/launcher/baton-run"
JOB="$RUNFILES/tests/ps/ps_fault_job"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

# In run_and_kill (its locals job, log, name): polls until "$@" succeeds
# (every 0.2 s, up to 2 minutes); fails with WHAT, after the log, if the job
# ends or the time is up first.
job_wait() {
  local what=$1 waited=0
  shift
  until "$@"; do
    sleep 0.2
    waited=$((waited + 1))
    if [ $waited -gt 600 ] || ! kill -0 "$job" 2>/dev/null; then
      cat "$log"
      fail "$name: $what"
    fi
  done
}

# In run_and_kill (its locals sdir, want): whether the newest checkpoint in
# sdir is of clock want or later.
checkpoint_reached() {
  local newest
  newest=$(ls "$sdir" 2>/dev/null | sed -n 's/^ckpt-0*\([0-9][0-9]*\)-.*/\1/p' | sort -n | tail -1)
  [ -n "$newest" ] && [ "$newest" -ge "$want" ]
}

# run_and_kill NAME VICTIM BATON_RUN_FLAGS...: starts the job, waits until
# trainer0 holds after step 100 (the trainers wait there for the release
# file, so the kill lands mid-training however slow this machine is),
# SIGKILLs VICTIM (e.g. "trainer1"), releases the trainers, waits for the
# job, and leaves its output in $TMP/NAME.log.
run_and_kill() {
  local name=$1 victim=$2
  shift 2
  local log="$TMP/$name.log"
  local release="$TMP/$name.release"
  rm -rf "$TMP/$name.ckpt" "$release"
  # shellcheck disable=SC2086
  timeout 240 "$RUN" --standalone ${ROLES:---role ps:2 --role trainer:2} --tee "$@" \
    "$JOB" --checkpoint_dir="$TMP/$name.ckpt" --steps=300 \
    --hold_at=100 --release_file="$release" >"$log" 2>&1 &
  local job=$!
  job_wait "the job never reached step 100" grep -qs "\[trainer0\] holding at step" "$log"
  # With WAIT_CHECKPOINT="DIR CLOCK" (e.g. "server1-of-2 100"), the kill
  # waits until that server's newest checkpoint is of CLOCK or later: the
  # servers write checkpoints beside training, and a loaded machine's fsync
  # may take longer than the clocks between two of them.
  if [ -n "${WAIT_CHECKPOINT:-}" ]; then
    local sdir="$TMP/$name.ckpt/${WAIT_CHECKPOINT% *}" want=${WAIT_CHECKPOINT#* }
    job_wait "no checkpoint of clock $want or later in $sdir" checkpoint_reached
  fi
  local pid
  pid=$(grep -o "\[$victim\] pid [0-9]*" "$log" | head -1 | awk '{print $3}')
  [ -n "$pid" ] || fail "$name: no pid for $victim"
  echo "== $name: SIGKILL $victim (pid $pid) at step 100"
  kill -9 "$pid"
  touch "$release"
  wait $job
  local code=$?
  cat "$log"
  [ $code -eq 0 ] || fail "$name: baton-run exited $code"
  grep -q "RESULT OK" "$log" || fail "$name: no RESULT OK"
}

# 1. A trainer dies: only the trainers restart and rejoin.
run_and_kill trainer_kill trainer1 --restart_policy trainer=role --max_restarts 2
log="$TMP/trainer_kill.log"
grep -q "restarting the role's workers" "$log" || fail "trainer_kill: the role was not restarted"
[ "$(grep -c '\[ps0\] pid' "$log")" -eq 1 ] || fail "trainer_kill: the servers were restarted"
grep -Eq "\[trainer1\] resuming at step ([1-9][0-9]+)" "$log" ||
  fail "trainer_kill: the restarted trainer did not resume at the servers' clock"

# 2. A server dies: the group restarts and the servers restore a checkpoint.
# The trainers hold after step 100, so the progress clock has reached the
# multiple 100 and ps1 writes that checkpoint; the kill waits for it.
WAIT_CHECKPOINT="server1-of-2 100" run_and_kill server_kill ps1 --max_restarts 2
log="$TMP/server_kill.log"
restored=$(grep -o "\[ps1\] restored clock [0-9-]*" "$log" | tail -1 | awk '{print $4}')
[ -n "$restored" ] && [ "$restored" -ge 100 ] ||
  fail "server_kill: ps1 restored clock '$restored', expected its newest checkpoint (100 or later)"
resumed=$(grep -o "\[trainer0\] resuming at step [0-9]*" "$log" | tail -1 | awk '{print $5}')
[ -n "$resumed" ] && [ "$resumed" -ge 100 ] ||
  fail "server_kill: trainer0 resumed at '$resumed', expected the restored clock (100 or later)"
# 3. Rank 0 dies, with the job's store on etcd: it rejoins alone.
# Two distinct free ports from below the ephemeral range (as testing/ports.h).
read -r client_port peer_port < <(/usr/bin/python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
ports = []
while len(ports) < 2:
    p = random.randrange(10000, low if low > 11000 else 32768)
    with socket.socket() as s:
        try:
            s.bind(("", p))
        except OSError:
            continue
    if p not in ports:
        ports.append(p)
print(*ports)')
/usr/bin/etcd --name ps-fault --data-dir "$TMP/etcd" \
  --listen-client-urls "http://127.0.0.1:$client_port" \
  --advertise-client-urls "http://127.0.0.1:$client_port" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "ps-fault=http://127.0.0.1:$peer_port" >"$TMP/etcd.log" 2>&1 &
etcd_pid=$!
trap 'kill $etcd_pid 2>/dev/null; wait $etcd_pid 2>/dev/null' EXIT
waited=0
until grep -q "serving client traffic\|ready to serve client requests" "$TMP/etcd.log"; do
  sleep 0.1
  waited=$((waited + 1))
  if [ $waited -gt 300 ] || ! kill -0 $etcd_pid 2>/dev/null; then
    cat "$TMP/etcd.log"
    fail "etcd did not start"
  fi
done
ROLES="--role trainer:2 --role ps:2" run_and_kill rank0_kill trainer0 \
  --restart_policy trainer=role --max_restarts 2 \
  --rdzv_backend etcd --rdzv_endpoint "127.0.0.1:$client_port" --rdzv_id ps-fault-rank0
log="$TMP/rank0_kill.log"
grep -q "restarting the role's workers" "$log" || fail "rank0_kill: the role was not restarted"
[ "$(grep -c '\[ps0\] pid' "$log")" -eq 1 ] || fail "rank0_kill: the servers were restarted"
grep -Eq "\[trainer0\] resuming at step ([1-9][0-9]+)" "$log" ||
  fail "rank0_kill: rank 0 did not resume at the servers' clock"
# 4. The node hosting an elastic job's rendezvous dies.
host_logs=()
host_pids=()
for n in 0 1 2; do
  log="$TMP/host_kill.$n.log"
  host_logs+=("$log")
  BATON_JOB_TOKEN=ps-fault-test-token-0123456789 \
    timeout 240 "$RUN" --nnodes 2:3 --rdzv_last_call 5 --heartbeat_timeout 2 \
    --role ps:1 --role trainer:1 --tee --max_restarts 2 \
    --rdzv_backend etcd --rdzv_endpoint "127.0.0.1:$client_port" --rdzv_id ps-fault-host \
    "$JOB" --checkpoint_dir="$TMP/host_kill.ckpt" --steps=300 \
    --hold_at=100 --release_file="$TMP/host_kill.release" >"$log" 2>&1 &
  host_pids+=($!)
done
waited=0
until cat "${host_logs[@]}" | grep -q "\[trainer0\] holding at step"; do
  sleep 0.2
  waited=$((waited + 1))
  alive=0
  for p in "${host_pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  if [ $waited -gt 600 ] || [ $alive -eq 0 ]; then
    cat "${host_logs[@]}"
    fail "host_kill: the job never reached step 100"
  fi
done
victim=-1
for n in 0 1 2; do
  grep -q "this node hosts the rendezvous" "${host_logs[$n]}" && victim=$n
done
[ $victim -ge 0 ] || { cat "${host_logs[@]}"; fail "host_kill: no node hosts the rendezvous"; }
# The node agent is timeout's child; its workers die with it (PDEATHSIG).
agent_pid=$(pgrep -P "${host_pids[$victim]}" | head -1)
[ -n "$agent_pid" ] || fail "host_kill: no baton-run under node $victim's timeout"
echo "== host_kill: SIGKILL the node agent hosting the rendezvous (node $victim, pid $agent_pid)"
kill -9 "$agent_pid"
touch "$TMP/host_kill.release"
wait "${host_pids[$victim]}" 2>/dev/null
ok=0
for n in 0 1 2; do
  [ $n -eq $victim ] && continue
  wait "${host_pids[$n]}"
  code=$?
  cat "${host_logs[$n]}"
  [ $code -eq 0 ] || fail "host_kill: node $n exited $code"
  grep -q "RESULT OK" "${host_logs[$n]}" && ok=1
done
[ $ok -eq 1 ] || fail "host_kill: no RESULT OK from the survivors"
[ "$(cat "${host_logs[@]}" | grep -c "hosts the rendezvous now")" -eq 1 ] ||
  fail "host_kill: not exactly one node took over the rendezvous"
echo "PASS: trainer kill (rejoin), server kill (restore from clock $restored), rank 0 kill on etcd (rejoin), rendezvous host node kill on etcd (2 nodes finish)"
