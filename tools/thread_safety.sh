#!/usr/bin/env bash
# Checks the lock annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED,
# ...) with clang's thread-safety analysis, as LevelDB does: every library
# source is compiled (syntax only) by Debian's clang with
# -Werror=thread-safety. GCC, which builds everything else, ignores the
# annotations. Part of .ci/run.
#   tools/thread_safety.sh [FILE.cc ...]   (default: every library source)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang++ >/dev/null || { echo "thread_safety.sh: clang++ not found (apt-get install clang)" >&2; exit 1; }
# Generated protobuf headers, named through the workspace's bazel-bin link
# (paths relative to the checkout: see the cache below).
bazel build //proto:all >/dev/null 2>&1 || bazel build //proto:all
GEN=bazel-bin
# shellcheck source=tools/clang_result_cache.sh
source tools/clang_result_cache.sh
CHECK_ID="thread-safety $(clang++ --version | head -n 1)"
if [ $# -gt 0 ]; then
  FILES=("$@")
else
  # The libraries (not tests, benches or examples). The CUDA-only ones
  # (the NCCL backend, DataParallel, the CUDA IPC channel) are checked against the CUDA 13
  # headers and the CPU LibTorch's c10/cuda headers (comm/cuda/compat).
  mapfile -t FILES < <(git ls-files 'base/*.cc' 'store/*.cc' 'rpc/*.cc' 'rpc/internal/*.cc' 'testing/rpc/*.cc' \
    'rref/*.cc' 'rref/internal/*.cc' 'dist_autograd/*.cc' 'dist_autograd/internal/*.cc' \
    'dist_optim/*.cc' 'dist_optim/internal/*.cc' 'ps/*.cc' 'ps/internal/*.cc' 'rl/*.cc' 'pipeline/*.cc' \
    'data/*.cc' 'env/*.cc' 'comm/*.cc' 'launcher/*.cc' 'launcher/internal/*.cc' 'obs/*.cc' |
    grep -v -e '/bench/' -e '_test.cc$')
fi
check() {
  local cuda=() flags key out rc=0
  local check_flags=(-fsyntax-only -Wthread-safety -Werror=thread-safety -Wno-unknown-warning-option)
  case "$1" in
    comm/nccl_backend.cc|comm/data_parallel.cc|rpc/cuda/*)
      cuda=(-isystem /usr/local/cuda/include -I comm/cuda/compat) ;;
  esac
  flags=(-std=c++17 -I. -I"$GEN" -isystem /usr/include/torch/csrc/api/include "${cuda[@]}"
    -DBATON_HAVE_GLOO)
  key=$(clang_cache_key "$CHECK_ID ${check_flags[*]}" "$1" "${flags[@]}")
  clang_cache_hit "$key" && return 0
  out=$(clang++ "${flags[@]}" "${check_flags[@]}" "$1" 2>&1) || rc=$?
  grep -v "^$" <<<"$out" || true
  # A crash or a kill is a failure too, and only a clean pass is kept.
  if [ $rc -ne 0 ] && ! grep -q "error:" <<<"$out"; then
    echo "$1: error: clang++ exited with status $rc"
  elif [ $rc -eq 0 ] && ! grep -q "error:" <<<"$out"; then
    clang_cache_keep "$key"
  fi
}
export -f check
export GEN CHECK_ID
OUT=$(printf '%s\n' "${FILES[@]}" | xargs -d '\n' -n 1 -P "$(nproc)" bash -c 'check "$1"' _)
if grep -q "error:" <<<"$OUT"; then
  echo "$OUT" | grep -B2 -A6 "error:" >&2
  echo "thread_safety.sh: lock annotations violated (above)" >&2
  exit 1
fi
echo "thread_safety.sh: ${#FILES[@]} files, lock annotations hold"
