#!/bin/sh
echo "baton: coverage tools are not available in this offline build (Debian's Bazel ships none)." >&2
exit 1
