#!/usr/bin/python3
"""Checks the protocol guarantee labels, and keeps their index current.

Each protocol numbers its guarantees with a prefix that names it (PROTOCOLS
below), and tests are named after them (`TEST(RRefProtocol, G3_...)`). A
label defined in two places (two protocols numbering with one prefix) makes
a test name or a comment ambiguous, so this fails naming both places.

A definition is a label at the start of a header comment line ("// G1 ...",
"// - E1 ...", "// S1. ..."), of a Markdown table row ("| F1 ...") or of a
bold paragraph ("**P7. ...**").

docs/guarantees.md, the index, lists every protocol's labels with the first
sentence of each, where it is defined and the tests named after it. It is
generated: this fails when it is not what the sources give now, and
`--write` rewrites it.

Run from anywhere in the checkout; exit 1 on a label defined twice or a
stale index.
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
# The protocol each prefix numbers, in the index's order.
PROTOCOLS = [
    ("G", "RRefs: forks, deletion and confirmation"),
    ("D", "Distributed autograd"),
    ("P", "Peer failures and restarts"),
    ("Q", "Partitions"),
    ("M", "Dynamic groups: joining and leaving"),
    ("GC", "Group calls"),
    ("SV", "Group supervision"),
    ("LR", "Workers' requests to baton-run"),
    ("F", "Flow control"),
    ("W", "Stream identities"),
    ("E", "The executor"),
    ("B", "The bulk TCP channel"),
    ("S", "The shared-memory channel"),
    ("T", "The shared-memory transport"),
    ("I", "The CUDA IPC channel"),
    ("A", "The shared-memory allreduce"),
    ("PS", "The parameter server"),
    ("SD", "The parameter server's shared tables"),
    ("PP", "The pipeline's stages"),
    ("PL", "The pipeline's driver"),
    ("R", "Reinforcement learning"),
    ("N", "The node agents' rendezvous"),
    ("H", "Hang reports"),
    ("TL", "The timeline"),
]
INDEX = "docs/guarantees.md"
TEST_NAME = re.compile(r"\bTEST(?:_F|_P)?\(\s*(\w+),\s*(\w+)")


def git_files(root, *patterns):
    """The checkout's files (tracked, and new ones not ignored) that exist."""
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                            *patterns], cwd=root, capture_output=True, text=True,
                           check=True).stdout.split()
    return sorted({n for n in names if os.path.isfile(os.path.join(root, n))})


def first_sentence(lines):
    """The definition's text without the label, up to the end of its first
    sentence (of the first two, when the first is a short title)."""
    text = " ".join(lines)
    text = re.sub(r"^(//\s+(-\s+)?|\|\s*|\*\*)?" + LABEL + r"\.?\s*", "", text)
    title = ""
    if lines[0].startswith("|"):
        cells = [c.strip() for c in text.split("|") if c.strip()]
        title, text = cells[0] + ": ", (cells[1] if len(cells) > 1 else "")
    text = text.replace("**", "")
    sentence = ""
    for part in re.split(r"(?<=[.;])\s+", text):
        sentence = f"{sentence} {part}".strip()
        if len(sentence) >= 40:
            break
    sentence = title + sentence.rstrip(";")
    if len(sentence) > 220:
        sentence = sentence[:217].rsplit(" ", 1)[0] + " ..."
    return sentence.replace("|", "\\|")


def definitions(root):
    """label -> [(file, line number, first sentence)]."""
    where = collections.defaultdict(list)
    for f in git_files(root, "*.h", "*.md"):
        if f.startswith("third_party/") or f == INDEX:
            continue
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            lines = fh.read().split("\n")
        for n, line in enumerate(lines):
            for p in PATTERNS:
                m = p.match(line)
                if not m:
                    continue
                body = [line.strip()]
                if line.startswith("//"):
                    # Continuation lines: comment lines that start no label.
                    for nxt in lines[n + 1:n + 8]:
                        if not nxt.startswith("//") or any(q.match(nxt) for q in PATTERNS):
                            break
                        body.append(nxt[2:].strip())
                elif line.startswith("**"):
                    # The bold title, which may go on over the next lines.
                    title = line.strip()
                    for nxt in lines[n + 1:n + 4]:
                        if title.count("**") >= 2:
                            break
                        title += " " + nxt.strip()
                    body = [title.split("**")[1]]
                where[m.group(1)].append((f, n + 1, first_sentence(body)))
                break
    return where


def tests_named_after(root, labels):
    """label -> ["`Suite.Name`", ...] for tests whose suite or name starts
    with it."""
    named = collections.defaultdict(list)
    for f in git_files(root, "*.cc"):
        if f.startswith("third_party/"):
            continue
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            for suite, name in TEST_NAME.findall(fh.read()):
                # Every label the suite or the name starts with:
                # G1_G3_G4_... counts for three.
                starts = [re.match(r"((?:[A-Z]{1,2}[0-9]+_)+)", x) for x in (suite, name)]
                for label in {lbl for m in starts if m for lbl in m.group(1).split("_")[:-1]}:
                    if label in labels:
                        named[label].append(f"`{suite}.{name}`")
    return named


def index(where, named):
    def number(label):
        return int(re.search(r"[0-9]+", label).group(0))

    by_prefix = collections.defaultdict(list)
    for label in where:
        by_prefix[re.match(r"[A-Z]+", label).group(0)].append(label)
    out = [
        "# Guarantees, by protocol",
        "",
        "Generated by `tools/check_labels.py --write` from the definitions in the",
        "sources; `tools/test.sh` fails when it is out of date. Each label is",
        "stated in full where it is defined (the file named), next to the code",
        "that enforces it; this index gives its first sentence and the tests",
        "named after it.",
        "",
    ]
    known = [p for p, _ in PROTOCOLS]
    for prefix, title in PROTOCOLS + [(p, "Unnamed protocol " + p)
                                      for p in sorted(by_prefix) if p not in known]:
        labels = sorted(by_prefix.get(prefix, []), key=number)
        if not labels:
            continue
        files = sorted({f for label in labels for f, _, _ in where[label]})
        out += [f"## {prefix}: {title}", "",
                "Defined in " + ", ".join(f"[{f}](../{f})" for f in files) + ".", "",
                "| label | guarantee | tests named after it |", "| --- | --- | --- |"]
        for label in labels:
            tests = sorted(set(named.get(label, [])))
            out.append(f"| {label} | {where[label][0][2]} | {', '.join(tests) or '-'} |")
        out.append("")
    return "\n".join(out)


def main():
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True).stdout.strip()
    where = definitions(root)
    twice = {k: v for k, v in where.items() if len({f for f, _, _ in v}) > 1}
    for label, places in sorted(twice.items()):
        print(f"guarantee {label} is defined in more than one place: "
              f"{', '.join(f'{f}:{n}' for f, n, _ in places)}")
    text = index(where, tests_named_after(root, set(where)))
    path = os.path.join(root, INDEX)
    stale = False
    if "--write" in sys.argv[1:]:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        try:
            with open(path, encoding="utf-8") as fh:
                stale = fh.read() != text
        except FileNotFoundError:
            stale = True
        if stale:
            print(f"{INDEX} is out of date: run /usr/bin/python3 tools/check_labels.py --write")
    print(f"check_labels: {len(where)} labels, {len(twice)} defined twice"
          f"{', index out of date' if stale else ''}", file=sys.stderr)
    return 1 if twice or stale else 0


if __name__ == "__main__":
    sys.exit(main())
