#!/usr/bin/python3
"""Checks that every protocol guarantee label is defined in one place.

Each protocol numbers its guarantees with a prefix that names it (G for the
RRef protocol, D distributed autograd, P peer failures, PS the parameter
server, PP/PL the pipeline, R reinforcement learning, F flow control, W
stream identities, E the executor, S the shared-memory channel, T the
shared-memory transport, N the node agents' rendezvous), and tests are named
after them. A label defined in two places (two protocols numbering with one prefix) makes a test name
or a comment ambiguous, so this fails naming both places.

A definition is a label at the start of a header comment line ("// G1 ...",
"// - E1 ...", "// S1. ..."), of a Markdown table row ("| F1 ...") or of a
bold paragraph ("**P7. ...**"). Run from anywhere in the checkout; exit 1 on
a label defined twice.
"""
import collections
import os
import re
import subprocess
import sys

LABEL = r"([A-Z]{1,2}[0-9]+)"
PATTERNS = [
    re.compile(r"^//\s+(?:-\s+)?" + LABEL + r"\.?\s+[A-Z(]"),
    re.compile(r"^\|\s*" + LABEL + r"\s"),
    re.compile(r"^\*\*" + LABEL + r"\.\s"),
]


def main():
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True).stdout.strip()
    files = subprocess.run(["git", "ls-files", "*.h", "*.md"], cwd=root, capture_output=True,
                           text=True, check=True).stdout.split()
    where = collections.defaultdict(list)
    for f in files:
        if f.startswith("third_party/"):
            continue
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                for p in PATTERNS:
                    m = p.match(line)
                    if m:
                        where[m.group(1)].append(f"{f}:{n}")
                        break
    twice = {k: v for k, v in where.items() if len({x.split(":")[0] for x in v}) > 1}
    for label, places in sorted(twice.items()):
        print(f"guarantee {label} is defined in more than one place: {', '.join(places)}")
    print(f"check_labels: {len(where)} labels, {len(twice)} defined twice", file=sys.stderr)
    return 1 if twice else 0


if __name__ == "__main__":
    sys.exit(main())
