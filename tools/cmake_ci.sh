#!/usr/bin/env bash
# CI for the CMake build (CMakeLists.txt), which the GPU machine uses
# (tools/gpu/build_and_test.sh): so that it cannot rot between GPU runs,
#  1. the CPU configuration builds every library and test and runs the tests
#     (ctest; Gloo is the backend, NCCL cases skip saying it is not compiled);
#  2. the CUDA configuration's sources (the NCCL backend, the CUDA tests, the
#     latency benchmark) compile against the CUDA 13 headers under
#     /usr/local/cuda and the CPU LibTorch's c10/cuda headers, as C++20 (what
#     newer LibTorch needs); nothing links there.
#
#   bash tools/cmake_ci.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-$(mktemp -d /tmp/baton-cmake.XXXXXX)}"
jobs="$(nproc)"
echo "cmake_ci: CPU build in $build/cpu" >&2
cmake -G Ninja -S . -B "$build/cpu" >/dev/null
ninja -C "$build/cpu" -j"$jobs"
(cd "$build/cpu" && ctest --output-on-failure --timeout 600)

if [ ! -f /usr/local/cuda/include/nccl.h ] || [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "cmake_ci: FAILED: no CUDA 13 toolkit with nccl.h under /usr/local/cuda;" \
       "the CUDA sources cannot be compile-checked" >&2
  exit 1
fi
echo "cmake_ci: CUDA compile check in $build/cuda-check" >&2
cmake -G Ninja -S . -B "$build/cuda-check" -DBATON_CUDA=ON \
  -DBATON_CUDA_COMPILE_CHECK=ON -DBATON_GLOO=OFF -DCMAKE_CXX_STANDARD=20 >/dev/null
mapfile -t objects < <(ninja -C "$build/cuda-check" -t targets all |
  grep -oE 'CMakeFiles/(baton_comm|baton_comm_test_util|cm_process_group_test|cm_ddp_test|nccl_latency_bench|cuda_rpc_bench|pipeline_bench|baton_rpc_cuda|cm_cuda_rpc_test)\.dir/[^:]*\.o' |
  sort -u)
if [ "${#objects[@]}" -lt 10 ]; then
  echo "cmake_ci: FAILED: expected the CUDA configuration's objects, found ${#objects[@]}" >&2
  exit 1
fi
ninja -C "$build/cuda-check" -j"$jobs" "${objects[@]}"
echo "cmake_ci: CPU build and tests passed; ${#objects[@]} CUDA-configuration objects compiled" >&2
rm -rf "$build"
