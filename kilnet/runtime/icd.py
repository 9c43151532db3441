"""Registering the CPU OpenCL implementations that pip installs with the ICD loader.

Intel's CPU runtime from PyPI (`intel-opencl-rt`) installs its library into the environment's
lib/ folder and an `etc/OpenCL/vendors/intel-cpu.icd` whose path is a placeholder
(/opt/anaconda1anaconda2anaconda3/...) that a conda post-link script would fix and pip never
does; the ICD loader reads /etc/OpenCL/vendors and knows nothing of a venv anyway. So kilnet
writes a vendors folder of its own, holding every .icd file the loader would have read plus one
that names the installed library by its real path, and points OCL_ICD_VENDORS at it. This must
happen before the process's first OpenCL call (the loader reads the variable once): `import
kilnet` does it. The variable is inherited by child processes, so a C program started from
Python sees the same implementations.

PoCL from PyPI needs none of this: pyopencl's wheel carries a loader that also reads the .icd
files beside itself, where `pocl-binary-distribution` puts PoCL's.

The C runner (runner/kilnet_run.c) needs a loader too, and a machine with only pip's OpenCL has
no system libOpenCL.so.1: `import kilnet` writes the path of pyopencl's loader to
<cache>/opencl-loader (``record_loader``), which the runner opens where the system has none.
"""
import ctypes
import glob
import hashlib
import importlib.metadata as metadata
import importlib.util
import os
import tempfile

SYSTEM_VENDORS = "/etc/OpenCL/vendors"
# The compiler runtime the Intel library links against (intel-cmplr-lib-rt). Its RUNPATH is
# $ORIGIN, which finds them only when both packages landed in one lib/ folder; loading them first
# by full path makes the library's own lookup find them already loaded wherever they are.
RUNTIME_LIBS = ("libintlc.so.5", "libimf.so", "libsvml.so", "libirng.so")

_state = {}


def _installed(dist, name):
    """The absolute path of file `name` that distribution `dist` installed, or None."""
    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == name:
            path = os.path.realpath(f.locate())
            if os.path.isfile(path):
                return path
    return None


def intel_library():
    """Where pip put Intel's CPU OpenCL library, or None."""
    return _installed("intel-opencl-rt", "libintelocl.so")


def _vendor_sources():
    """The .icd files the loader would read without us: OCL_ICD_VENDORS (a folder or one file) if
    the user set it, else OPENCL_VENDOR_PATH, else /etc/OpenCL/vendors."""
    given = os.environ.get("OCL_ICD_VENDORS") or os.environ.get("OPENCL_VENDOR_PATH") or SYSTEM_VENDORS
    if os.path.isfile(given):
        return [given]
    try:
        return sorted(os.path.join(given, n) for n in os.listdir(given) if n.endswith(".icd"))
    except OSError:
        return []


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _write_vendors(entries, root):
    """A folder under `root` holding `entries` ({file name: library path}); named by a hash of its
    contents, so a changed set gets a new folder and a finished one is never rewritten."""
    text = "\n".join(f"{n}={p}" for n, p in sorted(entries.items()))
    folder = os.path.join(root, "icd", hashlib.sha256(text.encode()).hexdigest()[:16])
    if os.path.isdir(folder):
        return folder
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(folder), prefix=".tmp")
    for name, lib in entries.items():
        with open(os.path.join(tmp, name), "w") as f:
            f.write(lib + "\n")
    try:
        os.rename(tmp, folder)             # another process may have won the race: theirs is the same
    except OSError:
        for name in entries:
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)
    return folder


LOADER_RECORD = "opencl-loader"


def pyopencl_loader():
    """The ICD loader pyopencl's wheel carries (pyopencl/.libs/libOpenCL*.so*), found without
    importing pyopencl, or None."""
    try:
        spec = importlib.util.find_spec("pyopencl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    found = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), ".libs",
                                          "libOpenCL*.so*")))
    return found[0] if found else None


def record_loader(cache_root):
    """Write pyopencl's loader's path to <cache_root>/opencl-loader (where it changed) for the
    C runner; returns the path recorded, or None. Never fails the caller."""
    lib = pyopencl_loader()
    if lib is None:
        return None
    path = os.path.join(cache_root, LOADER_RECORD)
    if _read(path) == lib:
        return lib
    tmp = None
    try:
        os.makedirs(cache_root, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_root, prefix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(lib + "\n")
        os.replace(tmp, path)          # whole or not at all
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        return None
    return lib


def register(cache_root):
    """Make Intel's CPU runtime visible to the ICD loader, once per process; returns what was done
    (also kept for `kilnet devices`): {"intel": path or None, "vendors": folder or None,
    "error": why not, or None, "loader": pyopencl's loader as recorded for the runner}."""
    if _state:
        return _state
    _state.update(intel=intel_library(), vendors=None, error=None,
                  loader=record_loader(cache_root))
    lib = _state["intel"]
    if lib is None:
        return _state
    entries = {os.path.basename(p): _read(p) for p in _vendor_sources()}
    entries = {n: p for n, p in entries.items() if p}
    if any(os.path.basename(p).startswith("libintelocl.so") and os.path.isabs(p)
           and os.path.exists(p) for p in entries.values()):
        return _state                      # the system already registers a working copy
    entries["kilnet-intel-cpu.icd"] = lib
    for name in RUNTIME_LIBS:
        path = _installed("intel-cmplr-lib-rt", name)
        if path:
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                _state["error"] = f"could not load {path}: {e}"
    try:
        _state["vendors"] = _write_vendors(entries, cache_root)
    except OSError as e:
        _state["error"] = f"could not write an ICD vendors folder under {cache_root}: {e}"
        return _state
    os.environ["OCL_ICD_VENDORS"] = _state["vendors"]
    return _state
