#!/usr/bin/env bash
# Builds the core libraries (base, store, rpc, rref, dist_autograd) and their
# fast tests with AddressSanitizer + UndefinedBehaviorSanitizer (gcc;
# --config=asan in .bazelrc, its own output tree) and runs the tests: a
# use-after-free, overflow, leak or undefined behaviour fails the run. Part
# of .ci/run. The multi-process RPC suite runs too, on both transports.
#   tools/sanitizers.sh [bazel test flags or targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=(
  //tests/base:status_test
  //tests/rpc:codec_test
  //tests/rpc:batcher_test
  //tests/rpc:future_test
  //tests/rpc:agent_options_test
  //tests/rpc:shm_channel_test
  //tests/rpc:shm_transport_test
  //tests/rpc:bulk_channel_test
  //tests/rref:rref_protocol_test
  //tests/rpc:flow_control_test
  //tests/rpc:loopback_agent_test
  //tests/rpc:membership_test
  //tests/group:group_test
  //tests/group:supervisor_test
  //tests/rref:protocols_loopback_test
  //tests/rpc:restart_test
  //tests/rpc:rpc_multiprocess_test
  //tests/ps:shared_tables_test
)
if [ $# -gt 0 ]; then TARGETS=("$@"); fi
start=$(date +%s)
bazel test --config=asan --nocache_test_results "${TARGETS[@]}"
if [ $# -eq 0 ]; then
  # The store's suite but its TLS case: Debian's gRPC 1.51 leaks 576 bytes
  # (gpr_realloc, no deeper frames) once a process opens a TLS client
  # channel, so LeakSanitizer fails any test that does.
  bazel test --config=asan --nocache_test_results //tests/store:store_test \
    --test_filter=-EtcdStore.MutualTlsToEtcd
fi
echo "sanitizers.sh: $(( ${#TARGETS[@]} + ($# == 0) )) test targets clean under ASan+UBSan in $(( $(date +%s) - start ))s"
