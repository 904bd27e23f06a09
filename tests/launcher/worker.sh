#!/bin/bash
# Worker program for the launcher tests. Usage: worker.sh MODE OUTDIR [ARG]
# Every mode first records its environment in OUTDIR/env.<RANK>.<RESTART>.
set -u
mode=$1
out=$2
arg=${3:-}
record() {
  local f="$out/env.$RANK.$BATON_RESTART_COUNT"
  env | grep -E '^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|BATON_[A-Z_]+)=' \
    | sort > "$f.tmp.$$"
  # The start first: a worker whose environment file exists has both.
  echo "$RANK $BATON_RESTART_COUNT $$" >> "$out/starts.$BATON_ROLE"
  mv "$f.tmp.$$" "$f"
}
record
case "$mode" in
  env)
    exit 0 ;;
  fail_once)
    # Rank 1 fails in the first attempt only, once rank 0 has recorded its
    # first start (the group's restart stops rank 0; bounded: 50 s).
    if [ "$RANK" = 1 ] && [ "$BATON_RESTART_COUNT" = 0 ]; then
      for _ in $(seq 250); do
        [ -e "$out/env.0.0" ] && break
        sleep 0.2
      done
      echo "rank 1 is failing on purpose"
      exit 7
    fi
    exit 0 ;;
  fail_always)
    if [ "$RANK" = 1 ]; then
      echo "last words of rank 1 (restart $BATON_RESTART_COUNT)"
      echo "{\"message\": \"planned failure $BATON_RESTART_COUNT\"}" > "$BATON_ERROR_FILE"
      exit 42
    fi
    sleep 30 & wait $!
    exit 0 ;;
  sleep_trap)
    # Rank 0 exits on SIGTERM; the others ignore it and must be killed.
    # Each leaves a grandchild behind, which must not survive either.
    sleep 300 &
    if [ "$RANK" = 0 ]; then
      trap 'touch "$out/term.$RANK"; exit 0' TERM
    else
      trap '' TERM
    fi
    touch "$out/ready.$RANK"
    while true; do sleep 1 & wait $!; done ;;
  elastic)
    # Succeed once the world has ARG workers; wait to be stopped otherwise.
    touch "$out/ready.$RANK.$WORLD_SIZE"
    if [ "$WORLD_SIZE" = "$arg" ]; then exit 0; fi
    sleep 300 & wait $!
    exit 0 ;;
  roles)
    if [ "$BATON_ROLE" = ps ]; then
      # Outlives the trainers' restart, then ends the job. Its own bound
      # (50 s) stays under the test's (60 s): a loaded machine may take
      # longer than a few seconds to restart the role, and that must not
      # fail the job (it once waited only 10 s).
      for _ in $(seq 250); do
        [ -e "$out/trainers_restarted" ] && exit 0
        sleep 0.2
      done
      exit 9
    fi
    if [ "$BATON_RESTART_COUNT" = 0 ]; then
      if [ "$BATON_ROLE_RANK" = 0 ]; then
        # Fail once the other trainer (the next rank) has recorded its
        # first start: the role's restart stops it, and the test reads
        # every trainer's first environment (bounded: 50 s).
        for _ in $(seq 250); do
          [ -e "$out/env.$((RANK + 1)).0" ] && break
          sleep 0.2
        done
        exit 5
      fi
      sleep 300 & wait $!
    fi
    touch "$out/trainers_restarted"
    exit 0 ;;
  worker_restart)
    # Observer 0 fails once; observer 1 must keep running through its
    # restart (it waits for the restarted one, then ends the job).
    if [ "$BATON_ROLE" = agent ]; then
      # Bounded under the test's 60 s, not by a guess of the restart's time.
      for _ in $(seq 500); do
        [ -e "$out/observer0_back" ] && [ -e "$out/observer1_done" ] && exit 0
        sleep 0.1
      done
      exit 9
    fi
    if [ "$BATON_ROLE_RANK" = 0 ]; then
      [ "$BATON_RESTART_COUNT" = 0 ] && exit 5
      touch "$out/observer0_back"
      exit 0
    fi
    for _ in $(seq 500); do
      [ -e "$out/observer0_back" ] && { touch "$out/observer1_done"; exit 0; }
      sleep 0.1
    done
    exit 8 ;;
  *)
    echo "unknown mode $mode" >&2
    exit 99 ;;
esac
