"""Checks an installed baton wheel as a user's machine would see it.

    python3 tools/pybuild/check_wheel.py --python VENV/bin/python [-- COMMAND...]

1. Every ELF file of the installed package (the extension, bin/baton-run,
   _libs/*) loads, through `ldd` with only the imported torch's lib/ and its
   wheel's CUDA libraries (site-packages/nvidia/*/lib) on LD_LIBRARY_PATH
   (baton imports torch before its extension, so torch's libraries are the
   ones loaded), only libraries of three kinds: the package's own
   (baton/_libs), torch's (its wheel's folders in site-packages), and the C
   and C++ runtime. Anything else (Debian's
   gRPC, say) means the wheel works only on machines like the build's.
2. Then, in a private mount namespace where each system library that the
   wheel bundles is hidden (/dev/null bound over the file; not those the
   interpreter itself loads, such as zlib), the interpreter
   imports baton and COMMAND (if given) runs: the job a user would run, with
   none of the build's copies there to fall back on. Needs root (unshare -m);
   without it, step 2 is skipped, saying so, and step 1 still decides.

Exits 0 when both pass; prints what failed otherwise.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from baton_build import SYSTEM_LIBS, ldd  # noqa: E402

PROBE = """
import glob, json, os, torch, baton
site = os.path.dirname(os.path.dirname(torch.__file__))
print(json.dumps({"pkg": os.path.dirname(baton.__file__),
                  "site": site,
                  "torch_lib": os.pathsep.join(
                      [os.path.join(os.path.dirname(torch.__file__), "lib")] +
                      sorted(glob.glob(os.path.join(site, "nvidia", "**", "lib"), recursive=True))),
                  "torch": torch.__version__}))
"""


def elf_files(pkg):
    for top, _, names in os.walk(pkg):
        for n in names:
            p = os.path.join(top, n)
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    yield p


def check_links(pkg, site, torch_lib):
    """Step 1: the (file, library, resolved path) that lie outside the allowed."""
    bad = []
    pkg_real = os.path.realpath(pkg) + os.sep
    site_real = os.path.realpath(site) + os.sep
    for f in elf_files(pkg):
        for soname, resolved in ldd(f, torch_lib):
            real = os.path.realpath(resolved) if resolved != "not found" else ""
            if real.startswith(pkg_real) or SYSTEM_LIBS.match(soname):
                continue
            if real.startswith(site_real) and not real.startswith(pkg_real):
                continue  # torch's wheel and what it pulls in
            bad.append((os.path.relpath(f, pkg), soname, resolved))
    return bad


def system_copies(pkg, python):
    """The system's files of every library the wheel bundles, except those
    the interpreter itself loads (zlib, say): a machine that runs this Python
    has them, and a library already loaded is not loaded again."""
    libs = os.path.join(pkg, "_libs")
    interpreter = {os.path.realpath(p) for _, p in ldd(os.path.realpath(python), "")
                   if p != "not found"}
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    found = set()
    for soname in os.listdir(libs):
        for m in re.finditer(r"^\s*" + re.escape(soname) + r" \(.*\) => (\S+)$", cache, re.M):
            found.add(os.path.realpath(m.group(1)))
    return sorted(found - interpreter)


def run_hidden(python, hide, command):
    """Step 2 in a mount namespace with `hide` bound to /dev/null."""
    script = "set -e\n" + "".join(f"mount --bind /dev/null '{p}'\n" for p in hide)
    script += f"'{python}' -c 'import baton, baton.rpc; print(\"import baton: ok\")'\n"
    if command:
        script += "exec " + " ".join(f"'{c}'" for c in command) + "\n"
    return subprocess.run(["unshare", "-m", "bash", "-c", script]).returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", required=True, help="the interpreter the wheel is installed in")
    ap.add_argument("command", nargs="*", help="run in the namespace after the import")
    args = ap.parse_args()
    # A bare name ("python3") as the shell finds it: its libraries must be
    # known (the interpreter's own are never hidden).
    args.python = shutil.which(args.python) or args.python
    probe = subprocess.run([args.python, "-c", PROBE], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"check_wheel: FAILED: import baton failed:\n{probe.stderr}", file=sys.stderr)
        return 1
    info = json.loads(probe.stdout.strip().splitlines()[-1])
    pkg = info["pkg"]
    bad = check_links(pkg, info["site"], info["torch_lib"])
    for f, soname, resolved in bad:
        print(f"check_wheel: FAILED: {f} loads {soname} from {resolved}, outside the package "
              f"and torch", file=sys.stderr)
    if bad:
        return 1
    bundled = sorted(os.listdir(os.path.join(pkg, "_libs")))
    print(f"check_wheel: links ok: {len(list(elf_files(pkg)))} ELF files, {len(bundled)} "
          f"bundled libraries, torch {info['torch']}")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("check_wheel: step 2 skipped: hiding the system's libraries needs root and "
              "unshare", file=sys.stderr)
        return 0
    hide = system_copies(pkg, args.python)
    print(f"check_wheel: hiding {len(hide)} system copies of bundled libraries")
    rc = run_hidden(args.python, hide, args.command)
    if rc != 0:
        print(f"check_wheel: FAILED: with the system's copies hidden, exit {rc}",
              file=sys.stderr)
        return 1
    print("check_wheel: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
