#!/usr/bin/env python3
"""Summarises a Bazel JSON profile (`bazel ... --profile=FILE`) for docs/build.md.

Usage: tools/build_profile.py PROFILE [--bin BAZEL_BIN_DIR] [--top N]

Prints the N most expensive actions, and the total time per kind of action:
compiles of files that include LibTorch (found from the compiler's .d files
under BAZEL_BIN_DIR, so the figures match what was built), other compiles,
links, test runs, and the rest. Times are each action's own wall time; on a
machine with C cores the build's wall is at least their sum over C.
"""
import argparse
import collections
import glob
import gzip
import json
import os
import re


def load_events(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == "action processing"]


def torch_objects(bin_dir):
    """Source paths whose compile (its .d file) includes a LibTorch header."""
    users = set()
    if not bin_dir:
        return users
    for d in glob.glob(os.path.join(bin_dir, "**", "_objs", "**", "*.d"), recursive=True):
        try:
            text = open(d).read()
        except OSError:
            continue
        if re.search(r"/usr/include/(ATen|torch|c10)/", text):
            m = re.match(r"^[^:]+:\s*(?:\\\s*)?(\S+)", text)
            if m:
                users.add(m.group(1))
    return users


def source_path(name):
    m = re.match(r"Compiling (\S+)", name)
    return m.group(1) if m else None


def kind_of(name, torch_sources):
    if name.startswith("Compiling"):
        src = source_path(name)
        if name.endswith(".proto") or "pb.cc" in name:
            return "compile (generated protobuf/gRPC)"
        return "compile with LibTorch" if src in torch_sources else "compile without LibTorch"
    if name.startswith("Linking"):
        return "link"
    if name.startswith("Testing"):
        return "test run"
    if name.startswith("Generating") or "proto" in name.lower():
        return "protoc"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--bin", default="")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    events = load_events(args.profile)
    torch_sources = torch_objects(args.bin)
    totals = collections.Counter()
    counts = collections.Counter()
    for e in events:
        k = kind_of(e["name"], torch_sources)
        totals[k] += e["dur"] / 1e6
        counts[k] += 1
    print(f"| kind | actions | seconds |\n| --- | ---: | ---: |")
    for k, s in totals.most_common():
        print(f"| {k} | {counts[k]} | {s:.0f} |")
    print(f"| all | {sum(counts.values())} | {sum(totals.values()):.0f} |\n")
    per_source = collections.defaultdict(list)
    for e in events:
        src = source_path(e["name"])
        if src:
            per_source[src].append(e["dur"] / 1e6)
    twice = {k: v for k, v in per_source.items() if len(v) > 1}
    extra = sum(sum(v) - max(v) for v in twice.values())
    print(f"{len(per_source)} sources compiled, {len(twice)} of them more than once "
          f"(the extra compiles: {extra:.0f} s)\n")
    print(f"| the {args.top} most expensive actions | seconds |\n| --- | ---: |")
    for e in sorted(events, key=lambda e: -e["dur"])[: args.top]:
        print(f"| {e['name']} | {e['dur'] / 1e6:.1f} |")


if __name__ == "__main__":
    main()
