#!/usr/bin/env bash
# Supervision through baton-run (group/supervisor.h SV2, SV4, SV5;
# env/launcher_request.h LR2-LR4): tests/group/supervision_job.cc's boss
# finds a member's call hung, has baton-run restart that member alone, sees
# its successor answer, drops another member, and the job then ends with
# exit code 0 (a dropped worker's end is no failure). Twice: on one node,
# and on two nodes (two baton-runs on this machine) with both members on
# the node that does not run the boss, so each request crosses the
# rendezvous store (LR2).
set -uo pipefail
RUNFILES="${TEST_SRCDIR:-$0.runfiles}/baton"
RUN="$RUNFILES/launcher/baton-run"
JOB="$RUNFILES/tests/group/supervision_job"
# Ports drawn from below the ephemeral range (testing/ports.h): a port that
# bind(0) hands out can go to any process's outgoing connection before
# baton-run listens on it.
FREE_PORT="$RUNFILES/testing/free_port"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
fail() {
  for f in "$@"; do [ -f "$f" ] && cat "$f"; done
  echo "FAIL: ${*: -1}"
  exit 1
}
FLAGS=(--restart_policy member=worker --max_restarts 2 --stop_timeout 5 --tee)

# One node: boss rank 0, members 0-2 ranks 1-3; member0 hangs, member1 goes.
LOG="$TMP/one_node.log"
timeout 240 "$RUN" --standalone --role boss:1 --role member:3 "${FLAGS[@]}" "$JOB" \
  --victim=0 --drop=1 >"$LOG" 2>&1
code=$?
[ $code -eq 0 ] || fail "$LOG" "one node: baton-run exited $code"
grep -q "\[boss\] RESULT OK" "$LOG" || fail "$LOG" "one node: no RESULT OK"
# LR3: the request reached baton-run, which restarted member0 alone.
grep -q "restart of rank 1 asked by rank 0: its call hung: sent SIGTERM" "$LOG" ||
  fail "$LOG" "one node: baton-run did not carry out the restart"
grep -q "restarting that worker alone" "$LOG" || fail "$LOG" "one node: member0 was not restarted alone"
[ "$(grep -c '\[member0\] pid' "$LOG")" -eq 2 ] || fail "$LOG" "one node: member0 did not start twice"
[ "$(grep -c '\[member2\] pid' "$LOG")" -eq 1 ] || fail "$LOG" "one node: member2 was restarted"
# LR4: member1 was stopped for good, and its end was no failure.
grep -q "drop of rank 2 asked by rank 0: not needed any more" "$LOG" ||
  fail "$LOG" "one node: baton-run did not carry out the drop"
grep -q "): dropped at the request of rank 0: not needed any more; the round goes on" "$LOG" ||
  fail "$LOG" "one node: member1's end was not a drop"
[ "$(grep -c '\[member1\] pid' "$LOG")" -eq 1 ] || fail "$LOG" "one node: member1 was restarted"
grep -q "all workers succeeded" "$LOG" || fail "$LOG" "one node: no success"
# LR2: a request that cannot be read is named and does nothing.
grep -q "ignored a worker's request (0-junk.req): launcher request: action must be restart or drop, got 'reboot'" "$LOG" ||
  fail "$LOG" "one node: the unreadable request was not reported"
grep -q "restart of rank 99 asked by rank 0: test: no worker of this job has that rank; nothing done" "$LOG" ||
  fail "$LOG" "one node: the request about no worker was not reported"
echo "== one node: PASS"

# Two nodes: bosses ranks 0 (node 0) and 1 (node 1); members 0-1 ranks 2-3
# on node 0, members 2-3 ranks 4-5 on node 1. boss0 restarts member2 and
# drops member3, both on node 1.
read -r MP RP < <("$FREE_PORT" 2 | tr '\n' ' ')
[ -n "$RP" ] || fail "no free ports for the two-node run"
export BATON_JOB_TOKEN=supervision-test-token
L0="$TMP/node0.log"
L1="$TMP/node1.log"
for n in 0 1; do
  timeout 240 "$RUN" --nnodes 2 --node_rank $n --master_addr 127.0.0.1 --master_port "$MP" \
    --rdzv_port "$RP" --role boss:1 --role member:2 "${FLAGS[@]}" "$JOB" --victim=2 --drop=3 \
    >"$TMP/node$n.log" 2>&1 &
  eval "pid$n=\$!"
done
wait "$pid0"
code0=$?
wait "$pid1"
code1=$?
[ $code0 -eq 0 ] || fail "$L0" "$L1" "two nodes: node 0's baton-run exited $code0"
[ $code1 -eq 0 ] || fail "$L0" "$L1" "two nodes: node 1's baton-run exited $code1"
grep -q "\[boss\] RESULT OK" "$L0" || fail "$L0" "$L1" "two nodes: no RESULT OK"
grep -q "restart of rank 4 asked by rank 0: its call hung: sent SIGTERM" "$L1" ||
  fail "$L0" "$L1" "two nodes: node 1 did not carry out the restart"
[ "$(grep -c '\[member2\] pid' "$L1")" -eq 2 ] || fail "$L0" "$L1" "two nodes: member2 did not start twice"
grep -q "drop of rank 5 asked by rank 0: not needed any more" "$L1" ||
  fail "$L0" "$L1" "two nodes: node 1 did not carry out the drop"
[ "$(grep -c '\[member3\] pid' "$L1")" -eq 1 ] || fail "$L0" "$L1" "two nodes: member3 was restarted"
cat "$L0" "$L1"
echo "== two nodes: PASS"
