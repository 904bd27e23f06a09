"""baton's PEP 517 build backend: the wheel, built with CMake against the
torch of the Python that builds it.

    python -m venv .venv && .venv/bin/pip install torch
    .venv/bin/pip install --no-build-isolation .      # or: pip wheel --no-build-isolation .

pip runs this module in the installing interpreter (pyproject.toml names it
with backend-path, so it needs nothing from PyPI). It
  1. imports that interpreter's torch and configures CMakeLists.txt with
     BATON_PYTHON=ON against it (torch.utils.cmake_prefix_path); CMake refuses
     a torch whose version or C++ ABI baton does not support;
     With a CUDA torch and a CUDA toolkit (nvcc on PATH, or under
     $CUDA_HOME or /usr/local/cuda) it builds the CUDA configuration:
     CUDA tensors then travel between the processes of one host through
     CUDA IPC (docs/cuda.md). BATON_CUDA=0 or 1 overrides the choice;
     CMAKE_ARGS (as scikit-build reads it) adds configure arguments, such as
     -DBATON_DEPS_PREFIX=<root> for dependencies unpacked outside the system;
  2. builds baton._C and baton-run in build/pip-<torch>-<python>/ (kept, so
     that a second install compiles only what changed; BATON_BUILD_DIR or the
     config setting build-dir names another folder);
  3. stages the package: python/baton's modules, the extension, the build's
     _build_info.py, bin/baton-run, and in baton/_libs/ every shared library
     they load that is neither torch's (the user's torch provides it) nor the
     C and C++ runtime, each with its run path set to $ORIGIN so that the
     bundled libraries find one another and nothing of the build machine;
  4. writes the wheel (tag cpXY-cpXY-linux_x86_64, version +torchX.Y, and a
     dependency on that torch release).

tools/pybuild/check_wheel.py checks an installed wheel the same way a user's
machine would see it.
"""
import base64
import csv
import functools
import glob
import hashlib
import io
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What a Linux system always provides: the C library and its parts, the C++
# runtime and the loader. Everything else the extension loads either is
# torch's or travels in the wheel.
SYSTEM_LIBS = re.compile(
    r"^(linux-vdso|ld-linux[-\w]*|libc|libm|libdl|librt|libpthread|libresolv|libutil|"
    r"libnsl|libstdc\+\+|libgcc_s)\.so")


class BuildError(Exception):
    """A build that cannot go on, with what to do about it."""


# --- metadata -----------------------------------------------------------------


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _torch():
    """The torch of this interpreter: version, CMake prefix, library folder."""
    try:
        import torch
        import torch.utils
    except ImportError as e:
        raise BuildError(
            f"baton builds against the torch of the Python that builds it ({sys.executable}), "
            f"and that Python cannot import torch ({e}). Install torch first, then build "
            f"without build isolation: pip install torch && "
            f"pip install --no-build-isolation <baton>") from e
    return {
        "version": torch.__version__,
        "release": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
        "cmake_prefix": torch.utils.cmake_prefix_path,
        "dir": os.path.dirname(os.path.abspath(torch.__file__)),
        "cuda": torch.version.cuda,
    }


def _norm_name(name):
    return re.sub(r"[-_.]+", "_", name).lower()


def _wheel_version(project, torch):
    return f"{project['version']}+torch{torch['release']}"


def _requires_torch(torch):
    """Requires-Dist on the torch release it was built for. The lower bound
    admits that release's pre-releases: Debian's python3-torch calls itself
    1.13.0a0 in the egg-info pip reads."""
    major, minor = (int(x) for x in torch["release"].split("."))
    return f"torch>={major}.{minor}.0a0,<{major}.{minor + 1}"


def _metadata(project, version, torch):
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {version}",
        f"Summary: {project.get('description', '')}",
        f"Requires-Python: {project.get('requires-python', '>=3')}",
        f"Requires-Dist: {_requires_torch(torch)}",
    ]
    lic = project.get("license", {})
    if isinstance(lic, dict) and "text" in lic:
        lines.append(f"License: {lic['text']}")
    readme = project.get("readme")
    body = ""
    if isinstance(readme, str):
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = f.read()
        lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + body


def _entry_points(project):
    scripts = project.get("scripts", {})
    if not scripts:
        return ""
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())


def _tag():
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{py}-{py}-{plat}"


# --- the CMake build ------------------------------------------------------------


def _run(cmd, **kw):
    print("baton_build:", " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, **kw)
    if r.returncode != 0:
        raise BuildError(f"{cmd[0]} failed (exit {r.returncode}): {' '.join(cmd)}")
    return r


def _build_dir(torch, config_settings):
    d = (config_settings or {}).get("build-dir") or os.environ.get("BATON_BUILD_DIR")
    if not d:
        py = f"cp{sys.version_info.major}{sys.version_info.minor}"
        d = os.path.join(ROOT, "build", f"pip-torch{torch['version']}-{py}")
    return os.path.abspath(d)


def _nvcc():
    """The CUDA compiler this build would use, or None."""
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc")
    return None


def _cuda_args(torch):
    """The CUDA configuration's arguments, or [] for the CPU one. A CUDA torch
    gets it where a toolkit is found; BATON_CUDA=1 insists, BATON_CUDA=0
    declines."""
    want = os.environ.get("BATON_CUDA", "auto").lower()
    if want not in ("auto", "0", "1"):
        raise BuildError(f"BATON_CUDA={want!r}: expected 0, 1 or unset (auto)")
    if want == "0":
        return []
    nvcc = _nvcc()
    if torch["cuda"] is None or nvcc is None:
        if want == "1":
            raise BuildError(
                "BATON_CUDA=1, but " + ("this torch is a CPU build" if torch["cuda"] is None
                                        else "no CUDA toolkit was found (nvcc on PATH, "
                                        "$CUDA_HOME or /usr/local/cuda)"))
        why = "a CPU torch" if torch["cuda"] is None else "no CUDA toolkit (nvcc) found"
        print(f"baton_build: the CPU configuration ({why}); CUDA tensors, if any, travel "
              "through host memory", file=sys.stderr)
        return []
    # The NCCL that this torch loads (pip's nvidia-nccl beside it), whose
    # header the CUDA configuration compiles against.
    site = os.path.dirname(torch["dir"])
    headers = sorted(glob.glob(os.path.join(site, "nvidia", "**", "include", "nccl.h"),
                               recursive=True))
    args = ["-DBATON_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={nvcc}", f"-DTORCH_SITE={torch['dir']}"]
    if headers:
        args.append(f"-DNCCL_ROOT={os.path.dirname(os.path.dirname(headers[0]))}")
    print(f"baton_build: the CUDA configuration (torch CUDA {torch['cuda']}, {nvcc})",
          file=sys.stderr)
    return args


def _cmake_build(torch, build):
    for tool in ("cmake", "ninja", "patchelf"):
        if shutil.which(tool) is None:
            raise BuildError(f"baton's build needs {tool} on PATH (Debian: apt-get install "
                             f"{'ninja-build' if tool == 'ninja' else tool})")
    if not os.path.exists(os.path.join(build, "build.ninja")):
        _run(["cmake", "-G", "Ninja", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
              "-DBATON_PYTHON=ON", "-DBATON_GLOO=OFF",
              f"-DPython3_EXECUTABLE={sys.executable}",
              f"-DCMAKE_PREFIX_PATH={torch['cmake_prefix']}",
              *_cuda_args(torch), *shlex.split(os.environ.get("CMAKE_ARGS", ""))])
    jobs = os.environ.get("BATON_BUILD_JOBS", str(os.cpu_count() or 1))
    _run(["ninja", "-C", build, f"-j{jobs}", "baton_python", "baton-run"])


# --- staging and bundling ---------------------------------------------------------


def ldd(path, library_path):
    """(soname, resolved path or "not found") of every library `path` loads,
    with `library_path` as LD_LIBRARY_PATH (check_wheel.py uses it too)."""
    env = dict(os.environ, LD_LIBRARY_PATH=library_path)
    out = subprocess.run(["ldd", path], env=env, capture_output=True, text=True)
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"^\s*(\S+)\s+=>\s+(.*?)(?:\s+\(0x[0-9a-f]+\))?$", out.stdout, re.M)]


# The GPU driver's library: the machine's, never bundled, and absent from a
# build machine without a GPU.
DRIVER_LIBS = re.compile(r"^libcuda\.so")


@functools.lru_cache(maxsize=None)
def _torch_wheel_libs(site):
    """{soname: folder} of the libraries torch's wheel brings along in
    `site` (pip's nvidia-* packages: site-packages/nvidia/*/lib), read once."""
    found = {}
    for lib_dir in sorted(glob.glob(os.path.join(site, "nvidia", "**", "lib"), recursive=True)):
        for name in sorted(os.listdir(lib_dir)):
            found.setdefault(name, lib_dir)
    return found


def _torch_wheel_lib(soname, torch):
    """The folder in site-packages where torch's wheel keeps `soname` (the
    CUDA runtime of pip's nvidia-* packages, say), or None."""
    return _torch_wheel_libs(os.path.dirname(torch["dir"])).get(soname)


def _needed(path):
    """The libraries `path` names itself (DT_NEEDED), not what they load."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out.stdout)


def _ldd(path, torch):
    """ldd with torch's libraries found where torch keeps them; a library
    this machine lacks stops the build (but the GPU driver's, and what
    torch's wheel provides)."""
    search = os.pathsep.join(p for p in (os.path.join(torch["dir"], "lib"),
                                         os.environ.get("LD_LIBRARY_PATH")) if p)
    libs = ldd(path, search)
    for soname, resolved in libs:
        if resolved == "not found" and not DRIVER_LIBS.match(soname) and \
                _torch_wheel_lib(soname, torch) is None:
            raise BuildError(f"{os.path.basename(path)} needs {soname}, which this "
                             f"machine does not have")
    return libs


def _is_torch_lib(path, torch):
    """torch's own libraries and what its wheel pulls in (nvidia-*, triton)
    beside it in site-packages."""
    site = os.path.dirname(torch["dir"])
    real = os.path.realpath(path)
    return real.startswith(os.path.realpath(site) + os.sep) or os.path.dirname(
        real) == os.path.realpath(os.path.join(torch["dir"], "lib"))


def _bundle(stage, binaries, torch):
    """Copies into baton/_libs what `binaries` load besides torch and the
    system runtime, and sets every run path. Returns the bundled names."""
    libs = os.path.join(stage, "baton", "_libs")
    os.makedirs(libs, exist_ok=True)
    bundled = {}
    for binary in binaries:
        for soname, path in _ldd(binary, torch):
            if (SYSTEM_LIBS.match(soname) or DRIVER_LIBS.match(soname) or
                    _is_torch_lib(path, torch) or _torch_wheel_lib(soname, torch)):
                continue
            bundled[soname] = path
    for soname, path in sorted(bundled.items()):
        dest = os.path.join(libs, soname)
        shutil.copyfile(path, dest)
        os.chmod(dest, 0o755)
        _run(["patchelf", "--set-rpath", "$ORIGIN", dest])
    return sorted(bundled)


def _stage(torch, build, stage):
    pkg_src = os.path.join(ROOT, "python", "baton")
    pkg = os.path.join(stage, "baton")
    shutil.copytree(pkg_src, pkg, ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "*.so", "*.in"))
    ext = [f for f in os.listdir(os.path.join(build, "python", "baton")) if f.endswith(".so")]
    if len(ext) != 1:
        raise BuildError(f"expected one extension module in {build}/python/baton, found {ext}")
    shutil.copyfile(os.path.join(build, "python", "baton", ext[0]), os.path.join(pkg, ext[0]))
    shutil.copyfile(os.path.join(build, "python", "baton", "_build_info.py"),
                    os.path.join(pkg, "_build_info.py"))
    os.makedirs(os.path.join(pkg, "bin"))
    launcher = os.path.join(pkg, "bin", "baton-run")
    shutil.copyfile(os.path.join(build, "bin", "baton-run"), launcher)
    os.chmod(launcher, 0o755)
    module = os.path.join(pkg, ext[0])
    _run(["strip", "--strip-unneeded", module, launcher])
    bundled = _bundle(stage, [module, launcher], torch)
    # The extension finds the bundled libraries, then torch's beside it in
    # site-packages (torch, imported first, has loaded them already), and
    # what it loads from torch's wheel (the CUDA runtime) where that keeps it.
    site = os.path.dirname(torch["dir"])
    rpath = ["$ORIGIN/_libs", "$ORIGIN/../torch/lib"]
    for soname in _needed(module):
        wheel_dir = _torch_wheel_lib(soname, torch)
        if wheel_dir is not None:
            entry = "$ORIGIN/../" + os.path.relpath(wheel_dir, site)
            if entry not in rpath:
                rpath.append(entry)
    _run(["patchelf", "--set-rpath", ":".join(rpath), module])
    _run(["patchelf", "--set-rpath", "$ORIGIN/../_libs", launcher])
    print(f"baton_build: bundled {len(bundled)} libraries: {' '.join(bundled)}",
          file=sys.stderr)


# --- the wheel file -----------------------------------------------------------------


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def _write_wheel(stage, wheel_directory, name, version, metadata, entry_points):
    dist_info = f"{_norm_name(name)}-{version}.dist-info"
    os.makedirs(os.path.join(stage, dist_info), exist_ok=True)
    files = {
        "METADATA": metadata,
        "WHEEL": ("Wheel-Version: 1.0\nGenerator: baton_build\nRoot-Is-Purelib: false\n"
                  f"Tag: {_tag()}\n"),
    }
    if entry_points:
        files["entry_points.txt"] = entry_points
    for fname, text in files.items():
        with open(os.path.join(stage, dist_info, fname), "w", encoding="utf-8") as f:
            f.write(text)
    wheel_name = f"{_norm_name(name)}-{version}-{_tag()}.whl"
    path = os.path.join(wheel_directory, wheel_name)
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for top, dirs, names in os.walk(stage):
            dirs.sort()
            for fname in sorted(names):
                full = os.path.join(top, fname)
                arc = os.path.relpath(full, stage)
                with open(full, "rb") as f:
                    data = f.read()
                info = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
                info.external_attr = (stat.S_IMODE(os.stat(full).st_mode) | stat.S_IFREG) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, data)
                writer.writerow([arc, _record_hash(data), len(data)])
        record_arc = f"{dist_info}/RECORD"
        writer.writerow([record_arc, "", ""])
        z.writestr(zipfile.ZipInfo(record_arc, date_time=(2020, 1, 1, 0, 0, 0)),
                   record.getvalue())
    return wheel_name


# --- PEP 517 hooks --------------------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    project, torch = _project(), _torch()
    version = _wheel_version(project, torch)
    dist_info = f"{_norm_name(project['name'])}-{version}.dist-info"
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    with open(os.path.join(metadata_directory, dist_info, "METADATA"), "w") as f:
        f.write(_metadata(project, version, torch))
    entry_points = _entry_points(project)
    if entry_points:
        with open(os.path.join(metadata_directory, dist_info, "entry_points.txt"), "w") as f:
            f.write(entry_points)
    return dist_info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    project, torch = _project(), _torch()
    build = _build_dir(torch, config_settings)
    _cmake_build(torch, build)
    stage = os.path.join(build, "wheel-stage")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    _stage(torch, build, stage)
    version = _wheel_version(project, torch)
    return _write_wheel(stage, wheel_directory, project["name"], version,
                        _metadata(project, version, torch), _entry_points(project))


def build_sdist(sdist_directory, config_settings=None):
    """The tracked source files (git ls-files) and PKG-INFO."""
    project = _project()
    base = f"{_norm_name(project['name'])}-{project['version']}"
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for f in sorted(x for x in files if x):
            if os.path.isfile(os.path.join(ROOT, f)):
                tar.add(os.path.join(ROOT, f), arcname=f"{base}/{f}", recursive=False)
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        pkg_info = (f"Metadata-Version: 2.1\nName: {project['name']}\n"
                    f"Version: {project['version']}\n").encode()
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    return name
