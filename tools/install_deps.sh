#!/usr/bin/env bash
# Installs every Debian package that baton's build, tests and benchmarks need,
# skipping what is already present. Idempotent; safe to run on every start.
set -euo pipefail

PACKAGES=(
  g++ git python3
  bazel-bootstrap bazel-rules-java bazel-platforms
  libtorch-dev python3-torch
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev libgloo-dev libbenchmark-dev
  # X25519 and HMAC for the workers' stream identities (base/identity.h).
  libssl-dev
  iproute2 procps
  # zlib reads the gzipped IDX files; Fashion-MNIST (MIT) is the examples' real
  # data, installed under /usr/share/datasets/fashion-mnist/.
  zlib1g-dev dataset-fashion-mnist
  # clang checks the lock annotations (tools/thread_safety.sh, in .ci/run);
  # libFuzzer's runtime is in libclang-rt (tools/fuzz.sh); clang-format keeps
  # the C++ formatted (tools/format.sh, checked in .ci/run).
  clang clang-format libclang-rt-14-dev
  # An optimized BLAS behind Debian's libblas.so.3 alternative. LibTorch
  # (baton's and the peer's) otherwise runs matmuls on the reference BLAS,
  # 10-20x slower; the OpenMP build follows at::set_num_threads.
  libopenblas0-openmp
  # The Python front end (python/): pybind11 (Debian's shares torch's
  # internals version; never vendor another), its tests, and torchvision for
  # the pytorch/examples compatibility runs.
  pybind11-dev python3-pytest python3-torchvision python3-venv
  # pip, for the one PyPI package below.
  python3-pip
  # The CMake build (CMakeLists.txt): the same libraries for machines without
  # Bazel, the GPU machine first; CI builds it in CPU mode (tools/cmake_ci.sh).
  cmake ninja-build
  # The wheel (tools/pybuild/baton_build.py) carries the libraries it needs
  # besides torch, their run paths set to find each other there.
  patchelf
  # tools/cmake_ci.sh keeps its compiled objects between runs with ccache.
  ccache
  # etcd as the job's store and rendezvous (store/etcd_store.h,
  # --rdzv_backend etcd); its tests start a real etcd (testing/etcd_server.h).
  etcd-server etcd-client
  # promtool checks every metrics page the tests scrape (testing/promtool.h).
  prometheus
  # A multi-process test that times out shows each live worker's thread
  # stacks (testing/multiprocess.cc), taken with gdb.
  gdb
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# PyTorch's own RPC test suites (python/tests/torch_conformance) import
# expecttest, which Debian does not package: pinned, from PyPI, into a
# directory of baton's cache that the conformance runner puts on
# PYTHONPATH (never into the system's site-packages).
PYDEPS="${HOME}/.cache/baton/pydeps"
install_pydeps() {
  if [ ! -f "${PYDEPS}/expecttest/__init__.py" ]; then
    echo "install_deps: pip install expecttest==0.2.1 into ${PYDEPS}" >&2
    /usr/bin/python3 -m pip install -q --no-deps --disable-pip-version-check \
      --target "${PYDEPS}" expecttest==0.2.1 >&2
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present" >&2
  install_pydeps
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "install_deps: missing packages (${missing[*]}) and not root; run as root or install them" >&2
    exit 1
  fi
fi
echo "install_deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
install_pydeps
