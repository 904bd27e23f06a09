#!/usr/bin/env bash
# Builds comm/ with the NCCL backend and runs its suite, without Bazel: for
# the lent GPU machine (nvcc, CMake, g++, a CUDA PyTorch; no internet).
#
#   comm/cuda/build_and_test.sh [build-dir]
#
# LibTorch comes from the CUDA PyTorch that `python3` imports. Cases that need
# more GPUs than the machine has are skipped and say so (NCCL allows one rank
# per GPU). Set NCCL_ROOT if nccl.h/libnccl live somewhere unusual.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-/tmp/baton-comm-cuda}"
py="${PYTHON:-python3}"
torch_prefix="$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
torch_site="$("$py" -c 'import torch, os; print(os.path.dirname(torch.__file__))')"
"$py" -c 'import torch; assert torch.cuda.is_available(), "PyTorch has no CUDA"; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DTORCH_SITE="$torch_site" \
  ${NCCL_ROOT:+-DNCCL_ROOT="$NCCL_ROOT"}
cmake --build "$build" -j"$(nproc)"
export LD_LIBRARY_PATH="$torch_site/lib:${LD_LIBRARY_PATH:-}"
"$build/process_group_nccl_test" --gtest_color=no
