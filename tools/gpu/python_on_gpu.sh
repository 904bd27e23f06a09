#!/usr/bin/env bash
# The Python front end on a GPU machine, in one run (docs/cuda.md, "Python
# on a GPU"):
#   1. pip builds and installs baton against the machine's own torch, with
#      the command a user runs (README), CMake pointed at the Debian packages
#      that tools/gpu/fetch_debs.sh fetched, unpacked into a private prefix;
#      tools/pybuild/check_wheel.py checks what the installed files load;
#   2. the functional checks, side by side: the pytest suite's CUDA cases on
#      the installed wheel, PyTorch's own CUDA RPC tests (that torch's
#      torch/testing/_internal/distributed/rpc) under torch's agent and under
#      baton in drop-in mode, and the C++ GPU suites (CUDA IPC with I6, the
#      pipeline with PP9) through tools/gpu/build_and_test.sh, in the same
#      build folder;
#   3. the timings, one at a time: cuda_rpc_bench (tools/gpu/
#      build_and_test.sh), bench/python/cuda_call.py under baton and under
#      torch, time-sliced and under MPS, and pytorch/examples' one-GPU
#      programs (the batch-updating parameter server, batched RL) under
#      baton and under torch (python/compat/run_examples.sh).
#
#   bash tools/gpu/python_on_gpu.sh [build-dir]
#
# Expects what build_and_test.sh expects, the .debs in .gpu/debs, and a
# checkout of pytorch/examples in .gpu/examples (BATON_EXAMPLES). Each step
# is bounded; the timings are skipped, saying so, when less than their time
# is left of BATON_GPU_BUDGET_S (default 570 s). Logs and JSON go to
# <build>/logs, packed into $OUT/gpu-logs.tar.gz, and summary.txt beside it.
# Exit status: non-zero if a step failed.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-/tmp/baton-gpu}"
prefix="${BATON_DEPS_PREFIX:-/tmp/baton-deps}"
debs="${BATON_DEBS:-$root/.gpu/debs}"
examples="${BATON_EXAMPLES:-$root/.gpu/examples}"
py="${PYTHON:-python3}"
budget="${BATON_GPU_BUDGET_S:-570}"
logs="$build/logs"
mkdir -p "$logs" "$prefix"
summary="$logs/summary.txt"
failed=0
step() { echo "== $(date +%T) +${SECONDS}s $*" | tee -a "$summary"; }
note() { echo "$*" | tee -a "$summary"; }
left() { echo $((budget - SECONDS)); }
# Seconds a step may take: what is left of the budget, less a margin.
bound() { echo $(( $(left) > 20 ? $(left) - 15 : 5 )); }
# shellcheck source=tools/gpu/mps.sh
source "$root/tools/gpu/mps.sh"
pack() {
  mps_stop
  jobs -p | xargs -r kill 2>/dev/null
  if [ -n "${OUT:-}" ]; then
    cp "$summary" "$OUT/summary.txt"
    tar czf "$OUT/gpu-logs.tar.gz" -C "$build" logs
  fi
}
trap pack EXIT
trap "exit 143" TERM INT
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
clean_ld="${LD_LIBRARY_PATH:-}"

step "unpacking $(ls "$debs"/*.deb | wc -l) packages into $prefix"
for f in "$debs"/*.deb; do dpkg -x "$f" "$prefix" || exit 1; done
export PATH="$PATH:$prefix/usr/bin"  # patchelf; the system's tools first
nvidia-smi -L | tee -a "$summary"
note "$("$py" -c 'import sys, torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)")')"

# PyTorch's CUDA RPC tests under torch's own agent need nothing of baton:
# they run while baton builds.
conformance() {  # agent, then run.py's other arguments
  local agent=$1; shift
  (cd "$root/python/tests/torch_conformance" && PYTHONDONTWRITEBYTECODE=1 \
    LD_LIBRARY_PATH="$clean_ld" timeout 240 "$py" run.py --agent "$agent" --cuda \
      --json "$logs/conformance_${agent}_cuda.json" "$@") >"$logs/conformance_${agent}_cuda.log" 2>&1
}
# BATON_GPU_TORCH_CONFORMANCE=0 skips it (a rerun that has torch's figures).
torch_conformance=
if [ "${BATON_GPU_TORCH_CONFORMANCE:-1}" = 1 ]; then
  step "PyTorch's CUDA RPC tests under torch's agent (background)"
  conformance torch &
  torch_conformance=$!
fi

step "pip install --no-build-isolation . (against this machine's torch)"
# What a user runs (README), with CMake told where the dependencies are.
wheel=1
if ! (cd "$root" && CMAKE_ARGS="-DBATON_DEPS_PREFIX=$prefix" BATON_BUILD_DIR="$build" \
      BATON_BUILD_JOBS="${BATON_BUILD_JOBS:-14}" \
      LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${clean_ld:+:$clean_ld}" \
      timeout 420 "$py" -m pip install --no-build-isolation -v . >"$logs/pip_install.log" 2>&1); then
  failed=1
  wheel=0
  grep -E -A12 "error:|FAILED:|BuildError" "$logs/pip_install.log" | head -80 | tee -a "$summary"
  tail -20 "$logs/pip_install.log" | tee -a "$summary"
  step "the wheel did not install: the Python steps are skipped"
fi
if [ $wheel = 1 ]; then
  grep -E "bundled|Successfully installed|CUDA configuration|CPU configuration" \
    "$logs/pip_install.log" | tee -a "$summary"
  (cd /tmp && LD_LIBRARY_PATH="$clean_ld" "$py" "$root/tools/pybuild/check_wheel.py" \
     --python "$py") >"$logs/check_wheel.log" 2>&1 || failed=1
  tee -a "$summary" <"$logs/check_wheel.log"
  baton_run="$(dirname "$(LD_LIBRARY_PATH="$clean_ld" "$py" -c \
    'import baton, sys; print(baton.__file__)')")/bin/baton-run"

  step "functional checks (background): pytest's CUDA cases, PyTorch's CUDA RPC tests on baton"
  (cd "$root/python/tests" && BATON_RUN="$baton_run" BATON_CPP_PEER="$build/bin/cpp_peer" \
    LD_LIBRARY_PATH="$clean_ld" timeout 300 "$py" -m pytest -p no:cacheprovider -q -ra \
      -k "cuda or device_maps or remote_module" .) >"$logs/pytest_cuda.log" 2>&1 &
  pytest_job=$!
  conformance baton &
  baton_conformance=$!
fi

step "C++ GPU suites (CUDA IPC with I6, the pipeline with PP9), in the same build folder"
BATON_GPU_STEPS="suites" \
  BATON_GPU_SUITES="cm_cuda_rpc_test cm_pipeline_stage_test cm_data_parallel_test" \
  BATON_GPU_BUDGET_S=200 OUT= bash "$root/tools/gpu/build_and_test.sh" "$build" \
  >"$logs/cpp_suites.log" 2>&1 || failed=1
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|PASSED|FAILED|not built|error:" "$logs/cpp_suites.log" |
  tee -a "$summary"

wait_for() {  # pid label
  if wait "$1"; then note "$2: exit 0"; else note "$2: exit $?"; failed=1; fi
}
if [ $wheel = 1 ]; then
  wait_for $pytest_job "pytest CUDA cases"
  grep -E "passed|failed|skipped|^FAILED|^ERROR" "$logs/pytest_cuda.log" | tail -12 |
    tee -a "$summary"
  wait_for $baton_conformance "conformance, baton"
fi
[ -n "$torch_conformance" ] && wait_for $torch_conformance "conformance, torch's agent"
grep -h -E "^conformance:|^\|" "$logs"/conformance_*_cuda.log | tee -a "$summary"

# --- timings, one at a time --------------------------------------------------
if [ "$(left)" -gt 90 ]; then
  step "cuda_rpc_bench: the 64 MB echo and small calls ($(left) s left)"
  BATON_GPU_STEPS="cuda_rpc_bench" BATON_CUDA_RPC_ROUNDS=2 BATON_CUDA_RPC_MPS_ROUNDS=2 \
    BATON_CUDA_RPC_PATHS="cuda_ipc cuda_ipc_host_wait" \
    BATON_CUDA_RPC_MPS_PATHS="cuda_ipc cuda_ipc_host_wait" OUT= \
    timeout -k 5 "$(bound)" bash "$root/tools/gpu/build_and_test.sh" "$build" \
    >"$logs/cuda_rpc_bench.log" 2>&1 ||
    failed=1
  grep -E '"(d2d_copy_64MB_GBps|cuda_echo_64MB_GBps|cuda_over_cpu_call)"' \
    "$logs/cuda_rpc_bench.log" | tee -a "$summary"
else
  note "skipped: cuda_rpc_bench ($(left) s left)"
fi

examples() {  # label, then the environment's assignments
  local label=$1; shift
  (cd "$root" && env "$@" LD_LIBRARY_PATH="$clean_ld" BATON_EXAMPLES_PYTHON="$py" \
     BATON_EXAMPLES_TIMEOUT=120 timeout -k 5 "$(bound)" \
     bash python/compat/run_examples.sh "$examples" \
       batch_parameter_server batch_reinforce) >"$logs/examples_$label.log" 2>&1
  sed "s/^RESULT/RESULT $label/" "$logs/examples_$label.log" | grep "RESULT" | tee -a "$summary"
  for f in /tmp/baton-example-batch_*.log; do
    [ -f "$f" ] && cp "$f" "$logs/$(basename "${f%.log}")_$label.log"
  done
  rm -f /tmp/baton-example-batch_*
}
agents=(torch)
[ $wheel = 1 ] && agents=(baton torch)
for agent in "${agents[@]}"; do
  if [ "$(left)" -gt 100 ]; then
    step "pytorch/examples' one-GPU programs under $agent ($(left) s left)"
    if [ $agent = torch ]; then examples torch BATON_EXAMPLES_TORCH=1
    else examples baton BATON_EXAMPLES_TORCH=0; fi
  else
    note "skipped: the examples under $agent ($(left) s left)"
  fi
done

py_bench() {  # label
  for agent in baton torch; do
    LD_LIBRARY_PATH="$clean_ld" timeout -k 5 "$(bound)" "$py" "$root/bench/python/cuda_call.py" \
      --agent $agent --calls 300 --timeout 80 2>>"$logs/python_cuda_call.err" |
      tee -a "$logs/python_cuda_call.jsonl" | tee -a "$summary" || failed=1
  done
}
if [ $wheel = 0 ]; then
  note "skipped: bench/python/cuda_call.py (no wheel)"
elif [ "$(left)" -gt 60 ]; then
  step "small CUDA calls from Python, time-sliced ($(left) s left)"
  py_bench time-sliced
  if [ "$(left)" -gt 40 ] && mps_start "$build"; then
    step "small CUDA calls from Python under MPS"
    py_bench mps
    mps_stop
  fi
else
  note "skipped: bench/python/cuda_call.py ($(left) s left)"
fi
step "done (failed=$failed)"
exit $failed
