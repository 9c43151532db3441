"""How the tests build and run the C runner (runner/kilnet_run.c), with or without system packages.

KILNET_RUNNER_SYSTEM:
- unset: each piece from the system where it is there, else from PyPI: the system's ``cc`` else
  zig's (``python -m ziglang cc``, the test extra's); <CL/cl.h> if that compiler finds it, else the
  runner's own declarations; the system's ICD loader (libOpenCL.so.1) if one loads, else
  pyopencl's (pyopencl/.libs);
- "0": everything from PyPI, as on a machine without them (zig, the runner's own declarations,
  pyopencl's loader): .ci/run's main job;
- "1": everything from the system (cc, <CL/cl.h>, libOpenCL.so.1), failing where one is missing:
  .ci/run's system-packages job.

KILNET_RUNNER_SANITIZE=1 builds it with AddressSanitizer and UndefinedBehaviorSanitizer (the
system's cc), run with their errors fatal and exit status 86, so that a test expecting the
runner's own exit status 1 fails on a memory error it would otherwise mistake for a refusal:

    KILNET_RUNNER_SANITIZE=1 python -m pytest tests/test_export.py -k runner

``windows_build`` cross-compiles it for Windows x86-64 with zig (tests/test_runner_windows.py, which
also runs it under Wine), with the same flags (FLAGS) and warnings as errors.
"""
import ctypes
import glob
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..", "runner", "kilnet_run.c")
# Every build's flags, Linux and Windows alike; a warning fails the build (Windows: -Werror; Linux:
# the check on the compiler's output below).
FLAGS = ["-std=c99", "-O2", "-Wall", "-Wextra"]
WINDOWS_TARGET = "x86_64-windows-gnu"


def _mode():
    mode = os.environ.get("KILNET_RUNNER_SYSTEM", "")
    if mode not in ("", "0", "1"):
        raise ValueError(f"KILNET_RUNNER_SYSTEM must be 0 or 1, got {mode!r}")
    return mode


def compiler():
    """(argv prefix of the C compiler, what it is)."""
    mode, cc = _mode(), shutil.which("cc")
    if mode == "1" or (mode == "" and cc):
        assert cc, "KILNET_RUNNER_SYSTEM=1 but there is no `cc` on PATH (apt-get install gcc)"
        return [cc], f"the system's cc ({cc})"
    return [sys.executable, "-m", "ziglang", "cc"], "zig's cc (python -m ziglang cc)"


def pyopencl_loader():
    import pyopencl
    found = glob.glob(os.path.join(os.path.dirname(pyopencl.__file__), ".libs", "libOpenCL*.so*"))
    assert found, "pyopencl's wheel carries no ICD loader in pyopencl/.libs"
    return found[0]


def loader():
    """The ICD loader the runner is to open: None for the system's, else a path."""
    mode = _mode()
    if mode == "0":
        return pyopencl_loader()
    try:
        ctypes.CDLL("libOpenCL.so.1")
        return None
    except OSError:
        assert mode != "1", "KILNET_RUNNER_SYSTEM=1 but libOpenCL.so.1 does not load " \
                            "(apt-get install ocl-icd-libopencl1)"
        return pyopencl_loader()


def build(out, extra=()):
    """Compile the runner to ``out`` (with the compiler flags ``extra`` too); returns what it
    was built with (its ``--about`` line)."""
    cc, _ = compiler()
    flags = (["-DKILNET_OWN_CL"] if _mode() == "0" else []) + list(extra)
    if sanitized():
        flags += ["-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer"]
    r = subprocess.run(cc + [*FLAGS, *flags, "-o", out, SOURCE, "-ldl", "-lm"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"building runner/kilnet_run.c with {' '.join(cc)} failed:\n{r.stderr}"
    assert "warning" not in r.stderr, r.stderr
    about = subprocess.run([out, "--about"], capture_output=True, text=True, timeout=60,
                           env=environment(os.environ))
    assert about.returncode == 0, about.stdout + about.stderr
    if _mode() == "1":
        assert "system's <CL/cl.h>" in about.stdout, "KILNET_RUNNER_SYSTEM=1 but the compiler " \
            "found no <CL/cl.h> (apt-get install opencl-headers)"
    return about.stdout.strip()


def windows_build(out, link=True, extra=()):
    """Cross-compile the runner for Windows x86-64 with zig's cc (MinGW-w64's headers, the UCRT)
    to ``out``: an .exe, or with ``link=False`` only an object file (a second or so: no C runtime
    to build, where the first link builds zig's MinGW runtime, a minute cold). Warnings are
    errors. Returns the compiler's command line."""
    cmd = [sys.executable, "-m", "ziglang", "cc", "-target", WINDOWS_TARGET, *FLAGS, "-Werror",
           *extra, *([] if link else ["-c"]), "-o", out, SOURCE]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"building runner/kilnet_run.c for Windows failed:\n{r.stderr}"
    assert "warning" not in r.stderr, r.stderr
    return cmd


def sanitized():
    value = os.environ.get("KILNET_RUNNER_SANITIZE", "")
    if value not in ("", "0", "1"):
        raise ValueError(f"KILNET_RUNNER_SANITIZE must be 0 or 1, got {value!r}")
    return value == "1"


def environment(env):
    """``env`` with the runner pointed at the chosen ICD loader (and, sanitized, the
    sanitizers' exit status 86; leaks are not errors: the drivers keep memory until exit)."""
    env = dict(env)
    if sanitized():
        env["ASAN_OPTIONS"] = "exitcode=86:detect_leaks=0"
        env["UBSAN_OPTIONS"] = "exitcode=86:halt_on_error=1:print_stacktrace=1"
    lib = loader()
    if lib:
        env["KILNET_OPENCL_LIBRARY"] = lib
    else:
        env.pop("KILNET_OPENCL_LIBRARY", None)
    return env


def shell_environment(env):
    """What a user's shell hands the runner, as ``env -i`` makes it: PATH and HOME, the KILNET_*
    settings, and of ``env`` (as ``environment`` made it, or not) only the runner's own (the
    loader, OCL_ICD_VENDORS, the sanitizers') — none of what ``import pyopencl`` sets in this
    process (PYOPENCL_HOME, which pyopencl's loader needs: the runner must set it itself)."""
    keep = ("KILNET_", "OCL_ICD_VENDORS", "ASAN_OPTIONS", "UBSAN_OPTIONS")
    out = {k: v for k, v in os.environ.items() if k.startswith("KILNET_")}   # the user's own
    out.update((k, v) for k, v in env.items() if k.startswith(keep))
    out.update(PATH="/usr/bin:/bin", HOME=os.environ.get("HOME", "/root"))
    return out


def describe():
    return (f"C runner built with {compiler()[1]}{' with ASan and UBSan' if sanitized() else ''}, "
            f"ICD loader: {loader() or 'the system libOpenCL.so.1'}")
