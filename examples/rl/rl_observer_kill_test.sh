#!/usr/bin/env bash
# Observers come and go (1): one of four observers is killed with SIGKILL
# mid-training. The agent drops it after --observer_timeout and trains on
# with the other three; baton-run restarts that observer alone
# (--restart_policy observer=worker), the new process rejoins the running job,
# joins the agent as a new session and contributes episodes; CartPole is
# still solved (--solve_reward 200: what this checks is membership).
set -uo pipefail
RUNFILES="${TEST_SRCDIR:-$0.runfiles}/baton"
LOG="${TEST_TMPDIR:-$(mktemp -d)}/kill.log"
fail() { echo "FAIL: $*"; exit 1; }

timeout 600 "$RUNFILES/launcher/baton-run" --standalone --role agent:1 --role observer:4 \
  --restart_policy observer=worker --max_restarts 3 \
  "$RUNFILES/examples/rl/rl_cartpole" --log_every 5 --observer_timeout 2 --job_timeout 540 \
  --solve_reward 200 \
  >"$LOG" 2>&1 &
job=$!
waited=0
until grep -q "\[agent0\] round 10 episode" "$LOG"; do
  sleep 0.2
  waited=$((waited + 1))
  if [ $waited -gt 1500 ] || ! kill -0 $job 2>/dev/null; then
    cat "$LOG"
    fail "the job never reached round 10"
  fi
done
pid=$(grep -o "\[observer1\] pid [0-9]*" "$LOG" | head -1 | awk '{print $3}')
[ -n "$pid" ] || fail "no pid for observer1"
echo "== SIGKILL observer1 (pid $pid) after round 10"
kill -9 "$pid"
wait $job
code=$?
cat "$LOG"
[ $code -eq 0 ] || fail "baton-run exited $code"
grep -q "RESULT OK: solved at episode" "$LOG" || fail "no RESULT OK"
grep -Eq "observer 'observer1' \(session [0-9]+\) was dropped after [0-9.]+m?s of silence" "$LOG" ||
  fail "the agent did not drop the killed observer"
grep -q "restarting that worker alone" "$LOG" || fail "baton-run did not restart the observer alone"
[ "$(grep -c '\[agent0\] REINFORCE on' "$LOG")" -eq 1 ] || fail "the agent was restarted"
grep -q "\[observer1\] pid [0-9]*, env seed [0-9]*, rejoining" "$LOG" ||
  fail "the restarted observer did not rejoin"
# The restarted observer's session (the last join of observer1) contributed.
session=$(grep -o "observer 'observer1' (session [0-9]*) joined" "$LOG" | tail -1 | grep -o "[0-9]*)" | tr -d ')')
[ -n "$session" ] && [ "$session" -gt 4 ] || fail "no new session for the restarted observer1"
episodes=$(grep -o "episodes by session:.*" "$LOG" | grep -o " $session:[0-9]*" | cut -d: -f2)
[ -n "$episodes" ] && [ "$episodes" -gt 0 ] ||
  fail "the restarted observer1 (session $session) contributed no episodes"
echo "PASS: observer1 killed, dropped, restarted as session $session with $episodes episodes; solved"
