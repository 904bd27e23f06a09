#!/usr/bin/env bash
# ThreadSanitizer build (gcc, --config=tsan in .bazelrc, its own output tree)
# of the RPC, RRef and distributed-autograd tests, in two groups. Part of
# .ci/run.
#
# in_process: the tests that run in one process without gRPC: executor and
#   futures, the batcher, the shared-memory channel and transport, flow
#   control, and agents over the loopback transport (the call protocol, RRef
#   G1-G8, dist-autograd D1/D4/D6, restarts P1-P4). Every report fails.
# grpc: the tests that run gRPC: the gRPC transport, the store, and the
#   multi-process RPC and RRef suites (real workers, both local transports).
#   Debian's gRPC is not instrumented and synchronizes through its own
#   atomics and lock-free queues, which TSan cannot see, so every buffer
#   gRPC hands between its threads would be reported (a trial run of
#   rpc_multiprocess_test gave ~1,700 reports, none in baton's code).
#   tools/tsan_grpc_suppressions.txt suppresses every report with a gRPC
#   frame: this group checks baton's own threads against each other in real
#   jobs, not races on gRPC's threads (that needs gRPC built with TSan).
#   Left out: the two shared-memory large-tensor tests, which move 256 MiB
#   each way; TSan slows them past the callee's 30 s shutdown barrier. Their
#   code paths run under TSan in shm_channel_test and shm_transport_test.
#
# TSan must see every lock. Debian's abseil is not instrumented, so an
# absl::Mutex would look like no synchronization at all; this script builds
# the same abseil release from Debian's source package with
# -fsanitize=thread once (about 2 minutes, kept under ~/.cache/baton) and
# puts it first on the tests' LD_LIBRARY_PATH.
#   tools/tsan.sh                      both groups
#   tools/tsan.sh in_process|grpc [bazel test flags or targets...]
set -euo pipefail
cd "$(dirname "$0")/.."

IN_PROCESS=(
  //tests/rpc:future_test
  //tests/rpc:batcher_test
  //tests/rpc:shm_channel_test
  //tests/rpc:shm_transport_test
  //tests/rpc:bulk_channel_test
  //tests/rpc:flow_control_test
  //tests/rpc:loopback_agent_test
  //tests/rpc:membership_test
  //tests/group:group_test
  //tests/group:supervisor_test
  //tests/rref:protocols_loopback_test
  //tests/rpc:restart_test
  //tests/rref:rref_protocol_test
  //tests/ps:shared_tables_test
)
GRPC=(
  //tests/rpc:grpc_transport_test
  //tests/store:store_test
  //tests/rpc:rpc_multiprocess_test
  //tests/rref:rref_multiprocess_test
)
GROUPS_TO_RUN=(in_process grpc)
EXTRA=()
if [ $# -gt 0 ]; then
  case "$1" in
    in_process|grpc) GROUPS_TO_RUN=("$1"); shift; EXTRA=("$@") ;;
    *) echo "usage: tools/tsan.sh [in_process|grpc [bazel flags or targets...]]" >&2; exit 2 ;;
  esac
fi

start=$(date +%s)
version=$(dpkg-query -W -f='${source:Version}' libabsl-dev)
prefix="${BATON_TSAN_ABSEIL:-$HOME/.cache/baton/tsan-abseil-$version}"
if [ ! -f "$prefix/.complete" ]; then
  echo "tsan.sh: building abseil $version with -fsanitize=thread into $prefix" >&2
  if ! apt-cache showsrc abseil 2>/dev/null | grep -q "^Version: $version"; then
    # Debian's source packages (deb-src) are not configured by default.
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO tee /etc/apt/sources.list.d/baton-deb-src.sources >/dev/null <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    $SUDO apt-get update -qq
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && apt-get source -qq "abseil=$version" >/dev/null 2>&1)
  src=$(find "$work" -maxdepth 1 -mindepth 1 -type d | head -1)
  # The same options as Debian's shared build (debian/rules), plus TSan.
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -O1 -g1" \
    -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
    -DCMAKE_INSTALL_PREFIX="$prefix" >"$work/cmake.log"
  make -C "$work/build" -j"$(nproc)" >"$work/make.log" 2>&1 ||
    { tail -30 "$work/make.log" >&2; exit 1; }
  make -C "$work/build" install >/dev/null
  touch "$prefix/.complete"
fi

# halt_on_error: the first report fails the test (the suppression files
# list the reports that are not baton's, and why); OMP_NUM_THREADS=1 keeps
# LibTorch's OpenMP pool (uninstrumented) out of the way.
run_group() {
  local group=$1 suppressions=$2
  shift 2
  local t0
  t0=$(date +%s)
  bazel test --config=tsan --nocache_test_results \
    --test_env=LD_LIBRARY_PATH="$prefix/lib" \
    --test_env=TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 suppressions=$suppressions" \
    --test_env=OMP_NUM_THREADS=1 \
    "$@"
  echo "tsan.sh: group $group clean under ThreadSanitizer in $(( $(date +%s) - t0 ))s"
}

for group in "${GROUPS_TO_RUN[@]}"; do
  case "$group" in
    in_process)
      if [ ${#EXTRA[@]} -eq 0 ]; then targets=("${IN_PROCESS[@]}"); else targets=("${EXTRA[@]}"); fi
      run_group in_process "$PWD/tools/tsan_suppressions.txt" "${targets[@]}"
      ;;
    grpc)
      if [ ${#EXTRA[@]} -eq 0 ]; then targets=("${GRPC[@]}"); else targets=("${EXTRA[@]}"); fi
      supp="$prefix/../tsan_grpc_suppressions.txt"  # both files in one
      cat tools/tsan_suppressions.txt tools/tsan_grpc_suppressions.txt >"$supp"
      # One test at a time: real multi-process jobs under TSan on two cores.
      run_group grpc "$supp" --local_test_jobs=1 \
        --test_filter='-Transports/RpcMultiProcess.LargeTensors*/shm' "${targets[@]}"
      ;;
  esac
done
echo "tsan.sh: done in $(( $(date +%s) - start ))s"
