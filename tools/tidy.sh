#!/usr/bin/env bash
# clang-tidy over baton's library sources, with the checks that guard
# against bug classes this code can have (bugprone-*, performance-*), minus
# those that only produce noise here. Warnings are errors.
#   tools/tidy.sh [FILE.cc ...]   (default: the library sources that do not
#                                  include LibTorch, about 55 files)
# Excluded, with the reason (a triage of every finding on the library,
# 2026-12-01, found no real bug among them):
#   bugprone-easily-swappable-parameters        fires on every (key, value) pair
#   bugprone-narrowing-conversions              sizes here are bounded on purpose
#   bugprone-implicit-widening-of-multiplication-result  constant expressions
#   bugprone-unhandled-exception-at-new         the code does not handle bad_alloc
#   bugprone-macro-parentheses                  ASSIGN_OR_RETURN takes a declaration
#   performance-no-int-to-ptr                   the codec's pointer fix-up is meant
#   performance-unnecessary-value-param         handler types fix by-value params;
#                                               sinks and thread keep-alives
#   performance-inefficient-vector-operation    cold paths only
#   performance-unnecessary-copy-initialization cold paths only
# Kept, among others: use-after-move, dangling-handle, unused-raii,
# suspicious-*, infinite-loop, spuriously-wake-up-functions, move-const-arg,
# for-range-copy, noexcept-move-constructor, no-automatic-move. A finding
# judged wrong is silenced on its line with NOLINT(check) and the reason.
# Each file takes 3-20 s (about 3x a syntax-only parse); a file found clean
# is not checked again until it or a header it includes changes
# (tools/clang_result_cache.sh). Part of .ci/run (its budgeted tier).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-tidy >/dev/null || { echo "tidy.sh: clang-tidy not found (apt-get install clang-tidy)" >&2; exit 1; }
CHECKS="-*,bugprone-*,performance-*"
for c in bugprone-easily-swappable-parameters bugprone-narrowing-conversions \
  bugprone-implicit-widening-of-multiplication-result bugprone-unhandled-exception-at-new \
  bugprone-macro-parentheses performance-no-int-to-ptr performance-unnecessary-value-param \
  performance-inefficient-vector-operation performance-unnecessary-copy-initialization; do
  CHECKS="$CHECKS,-$c"
done
bazel build //proto:all >/dev/null 2>&1 || bazel build //proto:all
# Named through the workspace's link: the cache's keys hold the flags.
GEN=bazel-bin
# shellcheck source=tools/clang_result_cache.sh
source tools/clang_result_cache.sh
CHECK_ID="tidy $(clang-tidy --version | grep -o 'version [0-9.]*')"
if [ $# -gt 0 ]; then
  FILES=("$@")
else
  mapfile -t FILES < <(git ls-files 'base/*.cc' 'store/*.cc' 'env/*.cc' 'launcher/*.cc' \
    'launcher/internal/*.cc' 'obs/*.cc' 'rpc/*.cc' 'rpc/internal/*.cc' 'rpc/transport/*.cc' \
    'rpc/transport/*/*.cc' 'rpc/channel/*/*.cc' | grep -v -e '_test.cc$' -e '/bench/' |
    xargs grep -L -e '#include <torch/' -e '#include <ATen/')
fi
HEADER_FILTER='^\./(base|store|env|launcher|obs|rpc|rref|dist_autograd|dist_optim|ps|rl|pipeline|comm|data)/'
export CHECKS GEN CHECK_ID HEADER_FILTER
tidy() {
  local flags tidy_flags key out rc=0
  flags=(-std=c++17 -Wno-unknown-warning-option -I. -I"$GEN"
    -isystem /usr/include/torch/csrc/api/include -DBATON_HAVE_GLOO)
  tidy_flags=(-quiet -checks="$CHECKS" -warnings-as-errors='*' -header-filter="$HEADER_FILTER")
  key=$(clang_cache_key "$CHECK_ID ${tidy_flags[*]}" "$1" "${flags[@]}")
  clang_cache_hit "$key" && return 0
  out=$(clang-tidy "${tidy_flags[@]}" "$1" -- "${flags[@]}" 2>&1) || rc=$?
  grep -v -e '^[0-9]* warnings\? generated' -e '^Suppressed' -e '^Use -header-filter' <<<"$out" ||
    true
  # A crash or a kill is a failure too, and only a clean pass is kept.
  if [ $rc -ne 0 ] && ! grep -q "error:" <<<"$out"; then
    echo "$1: error: clang-tidy exited with status $rc"
  elif [ $rc -eq 0 ] && ! grep -q "error:" <<<"$out"; then
    clang_cache_keep "$key"
  fi
}
export -f tidy
OUT=$(printf '%s\n' "${FILES[@]}" | xargs -d '\n' -n 1 -P "$(nproc)" bash -c 'tidy "$1"' _)
if grep -q "error:" <<<"$OUT"; then
  echo "$OUT" >&2
  echo "tidy.sh: findings above (fix them, or NOLINT(check) with the reason)" >&2
  exit 1
fi
echo "tidy.sh: ${#FILES[@]} files, no findings"
