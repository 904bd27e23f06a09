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
import ast
import os
import subprocess
import sys

WIDE = ("//visibility:public", "//:baton")


def internal(path):
    return "internal/" in path or path.endswith("_internal.h")


def strings(node):
    """Every string literal in an attribute's expression: a list, a glob's
    patterns, a select()'s branches, concatenations."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)] if node is not None else []


def main():
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True).stdout.strip()
    files = subprocess.run(["git", "ls-files", "*BUILD.bazel", "*BUILD"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
    bad, checked = [], 0
    for f in files:
        if f.startswith("third_party/") or not os.path.exists(os.path.join(root, f)):
            continue
        with open(os.path.join(root, f), encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=f)
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                    and call.func.id.startswith("cc_")):
                continue
            attrs = {k.arg: k.value for k in call.keywords}
            inner = [h for a in ("hdrs", "textual_hdrs") for h in strings(attrs.get(a))
                     if internal(h)]
            if not inner:
                continue
            checked += 1
            name = (strings(attrs.get("name")) or ["?"])[0]
            where = f"//{os.path.dirname(f)}:{name}"
            vis = attrs.get("visibility")
            if vis is None:
                bad.append(f"{where} exports {', '.join(inner)} with its package's default "
                           "visibility: give it one (the package's :internal group)")
            elif any(w in strings(vis) for w in WIDE):
                bad.append(f"{where} exports {', '.join(inner)} to everyone: narrow its "
                           "visibility (the package's :internal group)")
    for line in bad:
        print(line)
    print(f"check_visibility: {checked} targets export internal headers, {len(bad)} too widely",
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
