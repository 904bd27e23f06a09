#!/usr/bin/env bash
# CI for the CMake build and the wheel, on pip's PyTorch 2.x (Bazel builds
# and tests everything against Debian's 1.13; this stage keeps the 2.x line
# and the GPU machine's build from rotting):
#  1. the venv with pip's torch (tools/torch2_venv.sh, downloads cached);
#  2. one configuration against that torch (a CUDA build): every library,
#     test and benchmark, baton._C and baton-run, and the CUDA targets (the
#     NCCL backend, CUDA IPC, the CUDA tests and benchmarks) compiled and
#     linked against pip's CUDA LibTorch, its NCCL and the CUDA 13 toolkit
#     under /usr/local/cuda (the C++ tests are built, not run: see below);
#  3. the wheel from that build (pip wheel, tools/pybuild/baton_build.py),
#     installed into a fresh venv that sees only the torch venv's packages;
#     tools/pybuild/check_wheel.py checks what its files load, then, with the
#     system's copies of the bundled libraries hidden, trains
#     python/examples/train_remote_layers.py under the wheel's baton-run
#     (prints RESULT OK);
#  4. the pytest suite (python/tests) on the installed wheel, and PyTorch's
#     RPC suites from torch 2.x's wheel in drop-in mode (tools/conformance.sh
#     runs Debian's 1.13 suites);
#  5. (first) a configure against a torch it does not support fails, naming it.
#
#   bash tools/cmake_ci.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
# Inside the checkout (build/ is git-ignored), so that ccache's base_dir
# makes every path relative and a fresh clone elsewhere hits the cache.
build="${1:-$root/build/cmake-ci}"
rm -rf "$build"
jobs="$(nproc)"
# ccache is to this build what Bazel's disk cache is to Bazel's
# (~/.cache/baton/bazel-disk): compiled objects kept on this machine between
# runs, found by content, so an unchanged file is not compiled again.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/baton/ccache}" CCACHE_BASEDIR="$root"
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-6G}" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  ccache -z >/dev/null
fi
stage_start=$(date +%s)
stage() {
  local now
  now=$(date +%s)
  echo "cmake_ci: [$((now - stage_start)) s] $*" >&2
}

py="$(bash tools/torch2_venv.sh)"
eval "$("$py" - <<'PY'
import glob, os, torch, torch.utils
site = os.path.dirname(os.path.dirname(torch.__file__))
nccl = glob.glob(os.path.join(site, "nvidia", "**", "include", "nccl.h"), recursive=True)
print(f"torch_prefix={torch.utils.cmake_prefix_path}")
print(f"torch_version={torch.__version__}")
print(f"torch_site={site}")
print(f"nccl_root={os.path.dirname(os.path.dirname(nccl[0])) if nccl else ''}")
PY
)"
stage "torch $torch_version ($py)"

# A torch the build does not support is refused at configure time, naming
# it and the versions supported (a stand-in config that reports torch 3.1).
stage "configure against an unsupported torch: refused"
fake="$build/fake-torch/share/cmake/Torch"
mkdir -p "$fake"
printf 'set(TORCH_INSTALL_PREFIX "%s")\nset(TORCH_LIBRARIES "")\nset(Torch_FOUND TRUE)\n' \
  "$build/fake-torch" >"$fake/TorchConfig.cmake"
printf 'set(PACKAGE_VERSION "3.1.0")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n' \
  >"$fake/TorchConfigVersion.cmake"
if cmake -S . -B "$build/fake" -DCMAKE_PREFIX_PATH="$build/fake-torch/share/cmake" \
  >"$build/fake.log" 2>&1; then
  echo "cmake_ci: FAILED: configuring against torch 3.1 succeeded" >&2
  exit 1
fi
if ! tr -s ' \n' ' ' <"$build/fake.log" |
  grep -q "does not support the torch found: 3.1.0 .* Supported: 1.13 and 2.x up to"; then
  cat "$build/fake.log" >&2
  echo "cmake_ci: FAILED: the refusal does not name the torch found and those supported" >&2
  exit 1
fi

if [ ! -f /usr/local/cuda/include/nccl.h ] || [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "cmake_ci: FAILED: no CUDA 13 toolkit under /usr/local/cuda" >&2
  exit 1
fi
export PATH="/usr/local/cuda/bin:$PATH"
# One configuration for the whole 2.x line: pip's torch is a CUDA build, so
# the CUDA targets (the NCCL backend, CUDA IPC, the CUDA tests and
# benchmarks) compile and link in the same build as everything else, against
# pip's NCCL and the toolkit.
stage "configure against pip's torch in $build/t2 (CUDA, Python)"
# Warnings are errors here, as in the Bazel build.
cmake -G Ninja -S . -B "$build/t2" -DBATON_CUDA=ON -DBATON_GLOO=OFF -DBATON_PYTHON=ON \
  -DBATON_WERROR=ON \
  -DPython3_EXECUTABLE="$py" -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DTORCH_SITE="$torch_site/torch" ${nccl_root:+-DNCCL_ROOT="$nccl_root"} \
  -DCMAKE_CUDA_ARCHITECTURES=90 "${launcher[@]}" >/dev/null
stage "build: every library, test and benchmark, baton._C, baton-run"
ninja -C "$build/t2" -j"$jobs"
cuda_targets=(cuda_rpc_bench nccl_latency_bench cm_process_group_test cm_ddp_test
  cm_cuda_rpc_test pipeline_bench ps_bench)
for t in "${cuda_targets[@]}"; do
  [ -x "$build/t2/$t" ] || { echo "cmake_ci: FAILED: $t was not linked" >&2; exit 1; }
done
# The C++ tests are built (they compile against this torch) but not run
# here: Bazel runs them against Debian's 1.13 in the test command, and the
# GPU machine runs them against its pip torch (tools/gpu/build_and_test.sh).
# On this torch, what runs is the Python side: the wheel, its pytest suite
# and PyTorch's own RPC suites (below).

stage "the wheel"
rm -rf "$build/wheels" "$build/venv"
BATON_BUILD_DIR="$build/t2" "$py" -m pip wheel -q --no-build-isolation --no-deps \
  -w "$build/wheels" .
wheel=$(ls "$build/wheels"/*.whl)
echo "cmake_ci: $(basename "$wheel") $(du -h "$wheel" | cut -f1)" >&2
# A fresh venv that sees the torch venv's packages and nothing else of this
# machine's Python (no --system-site-packages).
/usr/bin/python3 -m venv "$build/venv"
vpy="$build/venv/bin/python"
torch_purelib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$torch_purelib" >"$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch-venv.pth"
# torch's own requirements (a newer setuptools than the venv's) come from
# the wheels tools/torch2_venv.sh keeps: no download.
"$vpy" -m pip install -q --no-index --find-links "${HOME}/.cache/baton/wheels/torch-${torch_version%%+*}" "$wheel"
stage "check_wheel, then train_remote_layers.py with the system's copies hidden"
(cd python/examples && "$vpy" "$root/tools/pybuild/check_wheel.py" --python "$vpy" -- \
  "$build/venv/bin/baton-run" --standalone --role trainer:1 --role ps:2 \
  "$vpy" train_remote_layers.py --epochs 1)

stage "pytest on the installed wheel"
(cd python/tests && BATON_RUN="$build/venv/bin/baton-run" BATON_CPP_PEER="$build/t2/bin/cpp_peer" \
  PYTHONPATH="$root/python/tests" PYTHONDONTWRITEBYTECODE=1 \
  "$vpy" -m pytest -p no:cacheprovider -q -ra .)

# The share of the tests passing under torch 2.x's own agent that pass on
# baton (python/tests/torch_conformance/torch_reference_2.15.json); the
# level reached so far, raise it as it grows (docs/conformance.md).
stage "PyTorch's RPC suites from torch $torch_version's wheel, on the installed wheel"
# Each test's output (torch 2.x logs every process it starts) goes to a log.
if ! (cd python/tests/torch_conformance && PYTHONDONTWRITEBYTECODE=1 \
  "$vpy" run.py --agent baton --timeout 30 --min-share "${BATON_CONFORMANCE_MIN_SHARE_2X:-0.98}" \
  >"$build/conformance-2x.log" 2>&1); then
  tail -n 60 "$build/conformance-2x.log" >&2
  echo "cmake_ci: FAILED: PyTorch's RPC suites on the wheel (log above)" >&2
  exit 1
fi
grep -E "^conformance:|^\|" "$build/conformance-2x.log" >&2

[ ${#launcher[@]} -gt 0 ] && ccache -s | grep -E "Hits|Misses" | tr -s ' ' >&2
stage "passed: the build and its tests, ${#cuda_targets[@]} CUDA targets linked, the wheel and its tests"
rm -rf "$build"
