#!/usr/bin/env bash
# Downloads the Debian packages the GPU machine lacks (abseil, gRPC, protobuf
# with protoc and the gRPC plugin, GoogleTest, OpenSSL's headers) into a
# git-ignored folder of this checkout, for tools/gpu/build_and_test.sh to
# unpack there into a private prefix (never into /). Needs apt's package
# lists, not root.
#
#   bash tools/gpu/fetch_debs.sh [folder]      # default: .gpu/debs
#
# Then carry the folder to the GPU machine (the device tool's `carry: [".gpu"]`)
# and run `bash tools/gpu/build_and_test.sh` there.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest="${1:-.gpu/debs}"
# The -dev packages give headers and link symlinks; the others the shared
# objects they point at and what those need beyond Ubuntu 24.04's base
# (c-ares and RE2 for gRPC), and patchelf, which the wheel's build uses
# (tools/pybuild/baton_build.py). Gloo is not here on purpose: the pip LibTorch
# there exports its own gloo:: symbols (see comm/README.md).
packages=(
  libabsl-dev libabsl20220623
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler-grpc
  libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler
  libgtest-dev libgmock-dev
  libssl-dev libssl3
  libc-ares2 libre2-9
  patchelf
)
mkdir -p "$dest"
cd "$dest"
rm -f ./*.deb
apt-get download "${packages[@]}"
count=$(ls ./*.deb | wc -l)
if [ "$count" -ne "${#packages[@]}" ]; then
  echo "fetch_debs: expected ${#packages[@]} packages, got $count" >&2
  exit 1
fi
echo "fetch_debs: $count packages, $(du -sh . | cut -f1), in $dest"
