"""The precompiled headers that baton's targets use (third_party/pch/pch.bzl)."""

load(":pch.bzl", "pch_copts")

ATEN_PCH = "//third_party/pch:aten"

# GCC leaves a precompiled header out of the dependency file it writes, so
# Bazel does not know that the files compiled with it depend on it: after
# editing aten_headers.h, bump the revision here, which recompiles them.
ATEN_PCH_COPTS = pch_copts(ATEN_PCH) + ["-DBATON_ATEN_PCH_REVISION=1"]
