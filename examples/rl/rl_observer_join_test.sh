#!/usr/bin/env bash
# Observers come and go (2): a fifth observer joins mid-training. The agent
# starts with three (--min_observers 3); late_observer0 waits until the agent
# counted 150 episodes (--join_after_episodes), joins, is admitted at the next
# round, and contributes episodes; CartPole is still solved (--solve_reward
# 200: what this checks is membership).
set -uo pipefail
RUNFILES="${TEST_SRCDIR:-$0.runfiles}/baton"
PROG="$RUNFILES/examples/rl/rl_cartpole"
COMMON="--log_every 5 --job_timeout 540 --solve_reward 200"
fail() { echo "FAIL: $*"; exit 1; }

out=$(timeout 600 "$RUNFILES/launcher/baton-run" --standalone \
      --role "agent:1:$PROG $COMMON --min_observers 3" \
      --role "observer:3:$PROG $COMMON" \
      --role "late_observer:1:$PROG $COMMON --join_after_episodes 150" 2>&1)
code=$?
echo "$out"
[ $code -eq 0 ] || fail "baton-run exited $code"
grep -q "RESULT OK: solved at episode" <<<"$out" || fail "no RESULT OK"
joined_at=$(grep -o "\[late_observer0\] joining at episode [0-9]*" <<<"$out" | awk '{print $5}')
[ -n "$joined_at" ] && [ "$joined_at" -ge 150 ] || fail "late_observer0 did not wait for episode 150"
session=$(grep -o "observer 'late_observer0' (session [0-9]*) joined" <<<"$out" | grep -o "[0-9]*)" | tr -d ')')
[ -n "$session" ] || fail "the agent never saw late_observer0 join"
episodes=$(grep -o "episodes by session:.*" <<<"$out" | grep -o " $session:[0-9]*" | cut -d: -f2)
[ -n "$episodes" ] && [ "$episodes" -gt 0 ] || fail "late_observer0 contributed no episodes"
grep -q "\[late_observer0\] left: " <<<"$out" || fail "late_observer0 did not leave"
echo "PASS: late_observer0 joined at episode $joined_at and contributed $episodes episodes"
