# Sourced by the GPU scripts (tools/gpu/build_and_test.sh, python_on_gpu.sh):
# an MPS daemon of the script's own, so that the processes that share the
# GPU run their work in one context (docs/cuda.md, "Two processes on one
# GPU"). mps_start DIR starts it with its pipe and log folders under DIR and
# exports what clients need, BATON_BENCH_GPU_SHARING=mps included (the
# benchmarks label their lines with it); it fails where the machine has no
# nvidia-cuda-mps-control. mps_stop stops it (the caller's EXIT trap too).
mps_control="$(command -v nvidia-cuda-mps-control ||
  ls /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null | head -1)"
mps_on=0
mps_start() {  # dir
  [ -n "$mps_control" ] || return 1
  export CUDA_MPS_PIPE_DIRECTORY="$1/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$1/mps/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  "$mps_control" -d && mps_on=1 && export BATON_BENCH_GPU_SHARING=mps
}
mps_stop() {
  if [ $mps_on -eq 1 ]; then echo quit | "$mps_control"; mps_on=0; fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY BATON_BENCH_GPU_SHARING
}
