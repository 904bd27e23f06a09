# Shared by bench/compare_*.sh (sourced, after `cd` to the repository root):
#   compare_init            sets PEER_DIR ($BATON_PEER_DIR, else ../shared/peer)
#                           and OUT (a temporary directory removed on exit)
#   build_benches T...      builds //bench:T with -c opt and sets BIN to its folder
#   run_logged LIMIT SYSTEM STEM COMMAND...
#                           runs COMMAND with a random MASTER_PORT, killed (with
#                           its process group) after LIMIT seconds; stdout and
#                           stderr go to $OUT/STEM.out and .err, and its JSON
#                           lines are appended to $OUT/SYSTEM.jsonl. A failure
#                           prints the end of its stderr and is not fatal.

compare_init() {
  PEER_DIR=${BATON_PEER_DIR:-$(cd .. && pwd)/shared/peer}
  OUT=$(mktemp -d)
  trap 'rm -rf "$OUT"' EXIT
}

build_benches() {
  local targets=()
  for t in "$@"; do targets+=("//bench:$t"); done
  bazel build -c opt "${targets[@]}" >/dev/null 2>&1 || bazel build -c opt "${targets[@]}"
  BIN="$(bazel info -c opt bazel-bin 2>/dev/null)/bench"
}

run_logged() {
  local limit=$1 system=$2 stem=$3
  shift 3
  echo "== $system: $*" >&2
  if MASTER_PORT=$((20000 + RANDOM % 20000)) timeout "$limit" "$@" \
      >"$OUT/$stem.out" 2>"$OUT/$stem.err"; then
    :
  else
    echo "   failed (exit $?); its stderr ends with:" >&2
    tail -n 5 "$OUT/$stem.err" >&2 || true
  fi
  grep '^{' "$OUT/$stem.out" >>"$OUT/$system.jsonl" || true
}
