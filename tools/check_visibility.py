#!/usr/bin/python3
"""Checks that no internal header is exported to everyone.

A cc_library whose hdrs name an internal header (a path with an internal/
folder, or a file named *_internal.h) must say its visibility, and that
visibility must not be public nor //:baton (every package of the project):
such a header is for its package, its tests, the fuzzers and the benchmarks
(the package's ":internal" group, or narrower). See docs/architecture.md,
"Targets and visibility". Run from anywhere in the checkout; exit 1 naming
each target that breaks the rule.
"""
import os
import re
import subprocess
import sys

WIDE = ("//visibility:public", "//:baton")


def internal(path):
    return "internal/" in path or path.endswith("_internal.h")


def main():
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True).stdout.strip()
    files = subprocess.run(["git", "ls-files", "*BUILD.bazel", "*BUILD"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
    bad, checked = [], 0
    for f in files:
        if f.startswith("third_party/"):
            continue
        with open(os.path.join(root, f), encoding="utf-8") as fh:
            text = fh.read()
        for block in re.findall(r"\ncc_library\(\n(.*?)\n\)\n", text, re.S):
            name = re.search(r'name = "([^"]+)"', block).group(1)
            hdrs = re.search(r'\bhdrs = (\[.*?\]|"[^"]*")', block, re.S)
            inner = [h for h in re.findall(r'"([^"]+)"', hdrs.group(1) if hdrs else "")
                     if internal(h)]
            if not inner:
                continue
            checked += 1
            vis = re.search(r"\bvisibility = (\[.*?\])", block, re.S)
            where = f"//{os.path.dirname(f)}:{name}"
            if not vis:
                bad.append(f"{where} exports {', '.join(inner)} with its package's default "
                           "visibility: give it one (the package's :internal group)")
            elif any(w in vis.group(1) for w in WIDE):
                bad.append(f"{where} exports {', '.join(inner)} to everyone: narrow its "
                           "visibility (the package's :internal group)")
    for line in bad:
        print(line)
    print(f"check_visibility: {checked} targets export internal headers, {len(bad)} too widely",
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
