#!/usr/bin/env bash
# Soak test driver (issue 15): runs soak_job (see soak_job.cc for the load
# and the checks) through baton-run with a hub, a parameter server and three
# trainers, SIGKILLs a random READY trainer SOAK_KILLS times at random moments
# of the load (baton-run restarts it alone: --restart_policy trainer=worker),
# and afterwards checks:
#   - baton-run exited 0, the hub printed RESULT OK (values, leaks, deaths);
#   - the hub and the PS ran once (no group restart), every kill was
#     restarted and nothing else failed (restarts == kills);
#   - every FAILURE line has a named cause (no UNEXPLAINED or WRONG_VALUE
#     class) and every PEER_FAILURE names the dead trainer;
#   - every worker's Shutdown() returned OK;
#   - no /dev/shm object of any of the job's processes is left.
# It prints a summary table (kills, restarts, load served, leaks, failures
# by cause). Bounds: the job is killed after 240 s; a run takes about 60 s.
# Environment: SOAK_SEED (kill schedule), SOAK_KILLS (5),
# SOAK_DURATION_S (55: five kills within 30 s, well inside the two minutes
# issue 15 set; set it longer for a longer soak); arguments go to soak_job.
set -uo pipefail
RUNFILES="${TEST_SRCDIR:-$0.runfiles}/baton"
RUN="$RUNFILES/launcher/baton-run"
JOB="$RUNFILES/tests/soak/soak_job"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
LOG="$TMP/soak.log"
KILLS=${SOAK_KILLS:-5}
DURATION=${SOAK_DURATION_S:-55}
WARM=3
TRAINERS=3
SEED=${SOAK_SEED:-$(( $(date +%s) % 100000 ))}
RANDOM=$SEED
FAILED=0
fail() { echo "FAIL: $*"; FAILED=1; }
now() { date +%s.%N; }
elapsed() { echo "$(now) $1" | awk '{printf "%.1f", $1 - $2}'; }

# Every child is reaped: baton-run gets SIGTERM (it stops its workers), then
# SIGKILL; workers die with it (PR_SET_PDEATHSIG), and any of the job's
# processes still alive is killed by pid.
job=""
cleanup() {
  if [ -n "$job" ] && kill -0 "$job" 2>/dev/null; then
    kill -TERM "$job" 2>/dev/null
    for _ in $(seq 1 150); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$job" 2>/dev/null
  fi
  local ns pid
  ns=$(stat -L -c %i /proc/self/ns/pid)
  for pid in $(grep -o '\] pid [0-9]* up' "$LOG" 2>/dev/null | awk '{print $3}'); do
    if grep -q soak_job "/proc/$pid/cmdline" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; fi
  done
  wait 2>/dev/null
  # What a failed run left in /dev/shm (checked before): only this job's.
  for pid in $(grep -o '\] pid [0-9]* up' "$LOG" 2>/dev/null | awk '{print $3}'); do
    kill -0 "$pid" 2>/dev/null || rm -f /dev/shm/baton."$ns"."$pid".*
  done
}
trap cleanup EXIT
trap 'exit 1' INT TERM

: >"$LOG"
start=$(now)
echo "== soak: seed $SEED, $KILLS kills, ${DURATION}s of load, log $LOG"
timeout 240 "$RUN" --standalone --role hub:1 --role ps:1 --role trainer:$TRAINERS \
  --restart_policy trainer=worker --max_restarts $((KILLS + 3)) --stop_timeout 5 \
  "$JOB" --duration_s="$DURATION" --warm_s=$WARM "$@" >"$LOG" 2>&1 &
job=$!

# Waits (bounded) for a line matching $1 in the log; 1 if the job ended first.
wait_for() {
  local pattern=$1 limit=$2 waited=0
  until grep -q -- "$pattern" "$LOG"; do
    kill -0 "$job" 2>/dev/null || return 1
    [ "$waited" -ge $((limit * 10)) ] && return 1
    sleep 0.1
    waited=$((waited + 1))
  done
}

if ! wait_for "\[hub0\] WARM" 150; then
  cat "$LOG"
  fail "the job never warmed up"
  exit 1
fi
warm_at=$(now)
echo "== warm after $(elapsed "$start")s"

# The kill schedule: KILLS random moments in [WARM+2, DURATION-20] s after
# the warm line, so every restarted trainer rejoins and works before STOP.
window=$((DURATION - WARM - 22))
times=$(for _ in $(seq 1 "$KILLS"); do
  echo $((2000 + (RANDOM * 32768 + RANDOM) % (window * 1000)))
done | sort -n)
kills=0
declare -A killed_of=()
# Pids already killed: a process keeps its cmdline for a moment after
# SIGKILL, and two close kill times must not count one death twice.
declare -A killed_pid=()
for t_ms in $times; do
  while :; do
    ms=$(echo "$(now) $warm_at" | awk '{printf "%d", ($1 - $2) * 1000}')
    [ "$ms" -ge "$t_ms" ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  # A victim: a trainer whose latest READY incarnation is alive.
  victim="" pid=""
  for _ in $(seq 1 200); do
    candidates=()
    for k in $(seq 0 $((TRAINERS - 1))); do
      p=$(grep -o "\[trainer$k\] READY incarnation=[0-9]* pid=[0-9]*" "$LOG" | tail -1 |
        sed 's/.*pid=//')
      if [ -n "$p" ] && [ -z "${killed_pid[$p]:-}" ] && grep -q soak_job "/proc/$p/cmdline" 2>/dev/null; then
        candidates+=("trainer$k:$p")
      fi
    done
    [ ${#candidates[@]} -gt 0 ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  if [ ${#candidates[@]} -eq 0 ]; then
    fail "no READY trainer to kill at $(elapsed "$warm_at")s"
    break
  fi
  pick=${candidates[$((RANDOM % ${#candidates[@]}))]}
  victim=${pick%%:*} pid=${pick##*:}
  echo "== $(elapsed "$warm_at")s after warm: SIGKILL $victim (pid $pid)"
  if kill -KILL "$pid"; then
    killed_pid[$pid]=1
    kills=$((kills + 1))
    killed_of[$victim]=$((${killed_of[$victim]:-0} + 1))
  fi
done

wait "$job"
code=$?
job=""
total=$(elapsed "$start")
echo "== job exited $code after ${total}s"
# Bazel keeps the whole log with the test's outputs (outputs.zip).
[ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ] && cp "$LOG" "$TEST_UNDECLARED_OUTPUTS_DIR/"

# ---- Checks ----
[ "$code" -eq 0 ] || fail "baton-run exited $code"
grep -q "\[hub0\] RESULT OK" "$LOG" ||
  fail "the hub did not print RESULT OK: $(grep -o '\[hub0\] RESULT.*' "$LOG")"
[ "$(grep -c '\[hub0\] pid [0-9]* up' "$LOG")" -eq 1 ] || fail "the hub ran more than once"
[ "$(grep -c '\[ps0\] pid [0-9]* up' "$LOG")" -eq 1 ] || fail "the PS ran more than once"
[ "$kills" -eq "$KILLS" ] || fail "$kills kills instead of $KILLS"
restarts=$(grep -c "restarting that worker alone" "$LOG")
[ "$restarts" -eq "$kills" ] || fail "$restarts restarts for $kills kills (a worker failed by itself?)"
unexplained=$(grep -E "FAILURE op=.* class=(UNEXPLAINED|WRONG_VALUE)" "$LOG")
[ -z "$unexplained" ] ||
  fail "$(echo "$unexplained" | wc -l) failures without a named cause or with wrong values, e.g.:
$(echo "$unexplained" | sort -u -t' ' -k3,4 | head -10)"
bad_peer=$(grep "PEER_FAILURE" "$LOG" | grep -v "class=named/UNAVAILABLE/trainer")
[ -z "$bad_peer" ] || fail "peer failures that do not name a dead trainer:
$bad_peer"
for v in "${!killed_of[@]}"; do
  n=$(grep "\[hub0\] PEER_FAILURE" "$LOG" | grep -c "named/UNAVAILABLE/$v ")
  [ "$n" -ge "${killed_of[$v]}" ] ||
    fail "$v killed ${killed_of[$v]} times, the hub confirmed $n deaths"
  n=$(grep "\[ps0\] PEER_FAILURE" "$LOG" | grep -c "named/UNAVAILABLE/$v ")
  [ "$n" -ge "${killed_of[$v]}" ] ||
    fail "$v killed ${killed_of[$v]} times, the PS confirmed $n deaths"
done
shutdowns=$(grep -c "\] shutdown: OK" "$LOG")
[ "$shutdowns" -eq $((TRAINERS + 2)) ] || fail "$shutdowns of $((TRAINERS + 2)) workers shut down OK:
$(grep '\] shutdown:' "$LOG")"
ns=$(stat -L -c %i /proc/self/ns/pid)
pids=$(grep -o '\] pid [0-9]* up' "$LOG" | awk '{print $3}' | sort -u)
left=""
for pid in $pids; do
  for f in /dev/shm/baton."$ns"."$pid".*; do [ -e "$f" ] && left="$left ${f#/dev/shm/}"; done
done
[ -z "$left" ] || fail "shared-memory objects left in /dev/shm: $left"

# ---- Summary ----
field() { grep -o "$1 .*" "$LOG" | tail -1 | grep -o " $2=[0-9-]*" | head -1 | cut -d= -f2; }
row() { printf "  %-36s %s\n" "$1" "$2"; }
hub='\[hub0\] SUMMARY served' ps='\[ps0\] SUMMARY served'
echo
echo "== soak summary (seed $SEED, ${total}s, $(echo "$pids" | wc -w) processes)"
row "kills (SIGKILL)" "$kills ($(for v in "${!killed_of[@]}"; do printf "%s:%s " "$v" "${killed_of[$v]}"; done))"
row "restarts by baton-run" "$restarts"
row "plain calls served by the hub" "$(field "$hub" ticks)"
row "remote() values made" "$(field "$hub" makes)"
row "values lent (owner + user forks)" "$(field "$hub" lends)"
row "autograd steps (forward / apply 2/2)" "$(field "$hub" forwards) / $(field "$hub" full_applies)"
row "PS pushes / pulls" "$(field "$ps" ps_pushes) / $(field "$ps" ps_pulls)"
row "deaths confirmed (hub / ps)" \
  "$(grep -c '\[hub0\] PEER_FAILURE' "$LOG") / $(grep -c '\[ps0\] PEER_FAILURE' "$LOG")"
for what in WARM LEAKS LEAK KNOWN_LIMITATION DEATHS; do
  grep -o "\[hub0\] $what .*" "$LOG" | head -20 | sed 's/^/  /'
done
grep -o "\[[a-z0-9]*\] FDS .*" "$LOG" | sed 's/^/  /'
row "/dev/shm objects left by the job" "${left:-none}"
echo "  failures by cause:"
grep -o "FAILURE op=[^ ]* class=[^ ]*" "$LOG" | sed 's/FAILURE op=[^ ]* class=//' | sort | uniq -c |
  sed 's/^/    /'
grep -q 'FAILURE op=' "$LOG" || echo "    (none)"
grep -o "\[hub0\] RESULT.*" "$LOG" | sed 's/^/  /'
if [ "$FAILED" -ne 0 ]; then
  echo "== log tail:"
  tail -n 80 "$LOG"
  echo "FAIL (seed $SEED)"
  exit 1
fi
echo "PASS (seed $SEED)"
