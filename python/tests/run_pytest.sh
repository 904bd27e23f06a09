#!/usr/bin/env bash
# Bazel's entry to the pytest suite: assembles the package (the Python
# modules beside the extension built by this build) in the test's temporary
# directory and runs pytest with /usr/bin/python3, the interpreter that has
# torch.
set -euo pipefail
root="${TEST_SRCDIR:?}/${TEST_WORKSPACE:-baton}"
pkg="${TEST_TMPDIR:?}/pkg"
rm -rf "$pkg"
mkdir -p "$pkg"
cp -r "$root/python/baton" "$pkg/baton"
chmod -R u+w "$pkg"
cp "$root/python/_C.so" "$pkg/baton/_C.so"
export BATON_PYTHONPATH="$pkg"
export PYTHONPATH="$pkg:$root/python/tests"
export BATON_RUN="$root/launcher/baton-run"
export BATON_CPP_PEER="$root/python/cpp_peer"
export PYTHONDONTWRITEBYTECODE=1
cd "$root/python/tests"
exec /usr/bin/python3 -m pytest -p no:cacheprovider -q -ra --durations=8 "$@" .
