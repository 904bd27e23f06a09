#!/usr/bin/env bash
# ThreadSanitizer build (gcc, --config=tsan in .bazelrc, its own output tree)
# of the RPC, RRef and distributed-autograd tests that run in one process:
# executor and futures, the batcher, the shared-memory channel and
# transport, flow control, and agents over the loopback transport (the call
# protocol, RRef G1-G4, dist-autograd D1/D4/D6). Part of .ci/run.
#
# TSan must see every lock. Debian's abseil is not instrumented, so an
# absl::Mutex would look like no synchronization at all; this script builds
# the same abseil release from Debian's source package with
# -fsanitize=thread once (about 2 minutes, kept under ~/.cache/baton) and
# puts it first on the tests' LD_LIBRARY_PATH.
#
# Not covered: tests that run gRPC (the store, the gRPC transport, the
# multi-process suites). Debian's gRPC is not instrumented and synchronizes
# through its own atomics and lock-free queues, which TSan cannot see: every
# buffer gRPC hands between its threads is reported as a race (a trial run
# of rpc_multiprocess_test gave ~1,700 such reports, none in baton's code).
# Covering them needs gRPC built from source with -fsanitize=thread.
#   tools/tsan.sh [bazel test flags or targets...]
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(
  //tests:future_test
  //tests:batcher_test
  //tests:shm_channel_test
  //tests:shm_transport_test
  //tests:flow_control_test
  //tests:loopback_agent_test
  //tests:protocols_loopback_test
  //tests:restart_test
  //tests:rref_protocol_test
)
if [ $# -gt 0 ]; then TARGETS=("$@"); fi

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

# halt_on_error: the first report fails the test (tools/tsan_suppressions.txt
# lists the reports that are not baton's, and why); OMP_NUM_THREADS=1 keeps
# LibTorch's OpenMP pool (uninstrumented) out of the way.
bazel test --config=tsan --nocache_test_results \
  --test_env=LD_LIBRARY_PATH="$prefix/lib" \
  --test_env=TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 suppressions=$PWD/tools/tsan_suppressions.txt" \
  --test_env=OMP_NUM_THREADS=1 \
  "${TARGETS[@]}"
echo "tsan.sh: ${#TARGETS[@]} test targets clean under ThreadSanitizer in $(( $(date +%s) - start ))s"
