#!/usr/bin/env bash
# The one command on a GPU machine: unpacks the Debian packages that
# tools/gpu/fetch_debs.sh fetched into a private prefix (never into /),
# builds the CUDA configuration of CMakeLists.txt (NCCL backend, no Gloo:
# the pip LibTorch exports its own gloo:: symbols), runs the comm/ suite
# with its NCCL world-size-1 cases and DDP over NCCL, then the latency
# benchmark beside torch's own NCCL group, three rounds each.
#
#   bash tools/gpu/build_and_test.sh [build-dir]
#
# Expects: python3 with a CUDA PyTorch (its LibTorch and pip NCCL are used),
# CMake, ninja, g++, the CUDA toolkit; the .debs in .gpu/debs (BATON_DEBS).
# Then, as time allows (BATON_GPU_BUDGET_S, default 400 s from the start),
# it builds every other library and test against this LibTorch and runs the
# CPU tests (ctest). Logs go to <build>/logs, and into $OUT/gpu-logs.tar.gz
# when OUT is set (the device tool's folder).
# Exit status: non-zero if the build or any test failed.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-/tmp/baton-gpu}"
debs="${BATON_DEBS:-$root/.gpu/debs}"
prefix="${BATON_DEPS_PREFIX:-/tmp/baton-deps}"
out="$build/logs"
py="${PYTHON:-python3}"
budget="${BATON_GPU_BUDGET_S:-400}"
# Which steps run after the build (default: all): suites (the GPU tests;
# BATON_GPU_SUITES picks some), nccl_bench, cuda_rpc_bench (time-sliced,
# then under MPS: BATON_CUDA_RPC_ROUNDS and BATON_CUDA_RPC_MPS_ROUNDS
# rounds), ps_bench (the dense PS with its trainers on the GPU beside
# single-process GPU training; BATON_PS_ROUNDS, BATON_PS_MPS_ROUNDS),
# pipeline_bench (the stages on the GPU beside single-process GPU training,
# under MPS where there is one), probe (torch's figures), all (every other
# library and test).
#
# GPU sharing: processes that share one GPU each have a CUDA context, and
# the GPU time-slices between contexts: every hand-over between processes
# waits for a context switch. NVIDIA's Multi-Process Service (MPS) runs the
# processes' work in one context. Where nvidia-cuda-mps-control is found,
# the benchmarks also run under MPS (a daemon of this script's own, with
# its pipe and log directories under the build directory, stopped at exit),
# and their lines say which ("gpu_sharing").
steps=" ${BATON_GPU_STEPS:-suites nccl_bench cuda_rpc_bench ps_bench probe all} "
want() { [[ "$steps" == *" $1 "* ]]; }
orig_ld="${LD_LIBRARY_PATH:-}"
mkdir -p "$out" "$prefix"
step() { echo "== $(date +%T) +${SECONDS}s $*"; }
# shellcheck source=tools/gpu/mps.sh
source "$root/tools/gpu/mps.sh"
pack() {
  mps_stop
  if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu-logs.tar.gz" -C "$build" logs; fi
}
trap pack EXIT
trap "exit 143" TERM INT  # so that a timeout still packs the logs
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

step "unpacking $(ls "$debs"/*.deb | wc -l) packages into $prefix"
for f in "$debs"/*.deb; do dpkg -x "$f" "$prefix" || exit 1; done
deplib="$prefix/usr/lib/x86_64-linux-gnu"

step "machine"
nvidia-smi -L || true
eval "$("$py" - <<'PY'
import glob, os, torch, torch.utils
site = os.path.dirname(torch.__file__)
assert torch.cuda.is_available(), "PyTorch sees no CUDA device"
# The pip NCCL that this PyTorch loads: its nccl.h and its library together.
headers = sorted(glob.glob(os.path.join(os.path.dirname(site), "nvidia", "**", "include", "nccl.h"), recursive=True))
nccl = os.path.dirname(os.path.dirname(headers[0])) if headers else ""
print(f"torch_prefix={torch.utils.cmake_prefix_path}")
print(f"torch_site={site}")
print(f"nccl_root={nccl}")
print(f"torch_version={torch.__version__}")
print(f"echo torch {torch.__version__} cuda {torch.version.cuda} nccl {'.'.join(map(str, torch.cuda.nccl.version()))} gpus {torch.cuda.device_count()} {torch.cuda.get_device_name(0)!r}")
PY
)" || exit 1
echo "g++ $(g++ -dumpversion), $(cmake --version | head -1), nproc $(nproc)"

# The C++ standard LibTorch's headers accept (newer LibTorch needs C++20).
std=17
echo '#include <ATen/ATen.h>' > /tmp/baton-std.cc
if ! g++ -std=c++17 -fsyntax-only -I"$torch_site/include" /tmp/baton-std.cc 2>/dev/null; then
  std=20
fi
echo "C++$std"

step "configure"
cmake -G Ninja -S "$root" -B "$build" -DBATON_CUDA=ON -DBATON_GLOO=OFF \
  -DBATON_DEPS_PREFIX="$prefix" -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DTORCH_SITE="$torch_site" -DNCCL_ROOT="$nccl_root" \
  -DCMAKE_CXX_STANDARD="$std" -DCMAKE_CUDA_ARCHITECTURES=90 \
  >"$out/configure.log" 2>&1
status=$?
tail -5 "$out/configure.log"; grep -E "NCCL:|Torch" "$out/configure.log"
[ $status -eq 0 ] || { cat "$out/configure.log"; exit 1; }

step "build (only what the GPU steps need; -k 0, so that one run shows every error)"
targets=(cuda_rpc_bench)
suites=(${BATON_GPU_SUITES:-cm_process_group_test cm_ddp_test cm_cuda_rpc_test cm_data_parallel_test})
want suites && targets+=("${suites[@]}")
want nccl_bench && targets+=(nccl_latency_bench)
want ps_bench && targets+=(ps_bench)
want pipeline_bench && targets+=(pipeline_bench)
failed=0
if ! ninja -C "$build" -k 0 -j"$(nproc)" "${targets[@]}" >"$out/build.log" 2>&1; then
  failed=1
  grep -E -A12 "error:|FAILED:" "$out/build.log" | head -150
fi
tail -1 "$out/build.log"
have() { [ -x "$build/$1" ] || { echo "not built: $1"; failed=1; return 1; }; }

export LD_LIBRARY_PATH="$deplib:$torch_site/lib${nccl_root:+:$nccl_root/lib}:${LD_LIBRARY_PATH:-}"
# For commands run after this script on the same machine.
echo "export LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >"$build/env.sh"
want suites && for t in "${suites[@]}"; do
  step "$t"
  have $t || continue
  if ! timeout "${BATON_GPU_TEST_TIMEOUT_S:-180}" "$build/$t" --gtest_color=no >"$out/$t.log" 2>&1; then failed=1; fi
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|PASSED|FAILED|skipped:|NCCL's error" "$out/$t.log" | head -80
done
if [ $failed -ne 0 ]; then
  step "failures"
  grep -E -A40 "\[  FAILED  \]|Failure" "$out"/cm_*.log | head -150
fi

if want nccl_bench && have nccl_latency_bench; then
step "latency: baton vs torch, NCCL world size 1, three rounds"
for round in 1 2 3; do
  "$build/nccl_latency_bench" >"$out/bench_baton_$round.jsonl" 2>>"$out/bench.err" || failed=1
  LD_LIBRARY_PATH="$orig_ld" "$py" "$root/comm/bench/nccl_latency_peer.py" \
    >"$out/bench_torch_$round.jsonl" 2>>"$out/bench.err" || failed=1
done
tail -5 "$out/bench.err" 2>/dev/null
"$py" - "$out" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
def load(system):
    rounds = []
    for path in sorted(glob.glob(os.path.join(out, f"bench_{system}_*.jsonl"))):
        rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
        rounds.append({r["metric"]: r["value"] for r in rows})
    return rounds
ours, theirs = load("baton"), load("torch")
metrics = ["op_wait_us", "queued_us_per_op", "plain_step_us", "ddp_step_us", "ddp_overhead",
           "gpus", "dp_step_us", "dp_overhead"]
print(f"{'metric':18} {'baton (3 rounds)':>26} {'torch (3 rounds)':>26} {'ratio b/t':>18}")
for m in metrics:
    b = [r.get(m) for r in ours if m in r]
    t = [r.get(m) for r in theirs if m in r]
    ratios = [x / y for x, y in zip(b, t) if y]
    fmt = lambda v: " ".join(f"{x:.3g}" for x in v)
    print(f"{m:18} {fmt(b):>26} {fmt(t):>26} {fmt(ratios):>18}")
PY
fi

# One benchmark process group per line of output; "$@" after the label.
bench_rounds() {  # label rounds command...
  local label=$1 rounds=$2; shift 2
  for round in $(seq "$rounds"); do
    echo "-- $label round $round"
    "$@" || failed=1
  done
}
cuda_rpc() {  # path: host, cuda_ipc or cuda_ipc_host_wait (the receive before stream ordering)
  local ipc=0 host_wait=0
  [ "$1" != host ] && ipc=1
  [ "$1" = cuda_ipc_host_wait ] && host_wait=1
  BATON_BENCH_CUDA_IPC=$ipc BATON_BENCH_CUDA_IPC_HOST_WAIT=$host_wait timeout 120 \
    "$build/cuda_rpc_bench" 2>>"$out/cuda_rpc_bench.err" |
    tee -a "$out/cuda_rpc_bench.jsonl" |
    grep -E '"(d2d_copy_64MB_GBps|cuda_echo_64MB_GBps|small_cuda_call_us|small_cpu_call_us|cuda_over_cpu_call)"'
}
ps_run() {  # label
  for mode in local sync async; do
    MASTER_PORT=$((20000 + RANDOM % 20000)) timeout 120 "$build/ps_bench" --mode $mode --device cuda \
      --steps 300 2>>"$out/ps_bench.err" | sed "s/^{/{\"gpu_sharing\": \"$1\", /" |
      tee -a "$out/ps_bench.jsonl" | grep -E "throughput|final_loss" || return 1
  done
}
pipeline_run() {  # label
  MASTER_PORT=$((20000 + RANDOM % 20000)) timeout 150 "$build/pipeline_bench" --device cuda \
    --batch "${BATON_PIPELINE_BATCH:-4096}" --stages 2,4 --micro 1,4,8 --steps 20 --warmup 3 \
    --trace-dir "$out" 2>>"$out/pipeline_bench.err" | sed "s/^{/{\"gpu_sharing\": \"$1\", /" |
    tee -a "$out/pipeline_bench.jsonl" |
    grep -E "samples_per_s|bubble|bound_fraction|final_loss" | sed -E 's/"loss_curve": "[^"]*", //'
}

if want cuda_rpc_bench && have cuda_rpc_bench; then
  step "CUDA tensors through RPC, time-sliced (a context per process)"
  for path in ${BATON_CUDA_RPC_PATHS:-host cuda_ipc cuda_ipc_host_wait}; do
    bench_rounds "$path" "${BATON_CUDA_RPC_ROUNDS:-3}" cuda_rpc $path
  done
  if mps_start "$build"; then
    step "CUDA tensors through RPC under MPS"
    for path in ${BATON_CUDA_RPC_MPS_PATHS:-cuda_ipc cuda_ipc_host_wait host}; do
      bench_rounds "$path" "${BATON_CUDA_RPC_MPS_ROUNDS:-3}" cuda_rpc $path
    done
    mps_stop
  fi
fi

if want pipeline_bench && have pipeline_bench; then
  if mps_start "$build"; then sharing=mps; else sharing=time-sliced; fi
  step "pipeline_bench on the GPU ($sharing): single-process baselines, then 2 and 4 stages"
  pipeline_run $sharing || failed=1
  mps_stop
fi

if want ps_bench && have ps_bench; then
  step "ps_bench on the GPU: single-process training (local), then 4 trainers through one server (sync, async)"
  bench_rounds time-sliced "${BATON_PS_ROUNDS:-3}" ps_run time-sliced
  if mps_start "$build"; then
    bench_rounds mps "${BATON_PS_MPS_ROUNDS:-1}" ps_run mps
    mps_stop
  fi
  tail -5 "$out/ps_bench.err"
fi

if want probe; then
  step "CUDA RPC probe: IPC, device-to-device bandwidth, torch.distributed.rpc with a device map"
  LD_LIBRARY_PATH="$orig_ld" timeout 120 "$py" "$root/tools/gpu/probe_cuda_rpc.py" \
    2>"$out/probe.err" | tee "$out/probe.jsonl"
  tail -3 "$out/probe.err"
  if [ "${BATON_PROBE_MPS:-1}" = 1 ] && mps_start "$build"; then
    step "the probe under MPS"
    LD_LIBRARY_PATH="$orig_ld" timeout 120 "$py" "$root/tools/gpu/probe_cuda_rpc.py" \
      2>>"$out/probe.err" | sed 's/^{/{"gpu_sharing": "mps", /' | tee -a "$out/probe.jsonl"
    mps_stop
  fi
fi

left=$((budget - SECONDS))
if ! want all; then
  step "skipping the other libraries (BATON_GPU_STEPS)"
elif [ $left -gt 60 ]; then
  step "every library and test against this LibTorch ($left s left)"
  if timeout $((left - 10)) ninja -C "$build" -k 0 -j"$(nproc)" >"$out/build_all.log" 2>&1; then
    tail -1 "$out/build_all.log"
    left=$((budget - SECONDS))
    if [ $left -gt 30 ]; then
      (cd "$build" && timeout $((left - 5)) ctest -j8 --timeout 120 \
         -E 'cm_process_group_test|cm_ddp_test|cm_cuda_rpc_test' >"$out/ctest.log" 2>&1)
      echo "ctest exit $?"; grep -E "tests passed|\*\*\*|Failed|Timeout" "$out/ctest.log" | head -20
    fi
  else
    echo "build of everything failed or ran out of time:"
    grep -E "error:|FAILED" "$out/build_all.log" | head -40
  fi
else
  step "no time left for the other libraries ($left s)"
fi
step "done (failed=$failed)"
exit $failed
