"""Registering the CPU OpenCL implementations that pip installs with the ICD loader.

Linux. Intel's CPU runtime from PyPI (`intel-opencl-rt`) installs its library into the
environment's lib/ folder and an `etc/OpenCL/vendors/intel-cpu.icd` whose path is a placeholder
(/opt/anaconda1anaconda2anaconda3/...) that a conda post-link script would fix and pip never
does; the ICD loader reads /etc/OpenCL/vendors and knows nothing of a venv anyway. So kilnet
writes a vendors folder of its own, holding every .icd file the loader would have read plus one
that names the installed library by its real path, and points OCL_ICD_VENDORS at it. This must
happen before the process's first OpenCL call (the loader reads the variable once): `import
kilnet` does it. The variable is inherited by child processes, so a C program started from
Python sees the same implementations.

Windows. The same package puts `intelocl64.dll` into `<prefix>\\Library\\bin`, beside `tbb12.dll`
(from `tbb`, which it requires). The Khronos loader that pyopencl's wheel carries
(`pyopencl.libs\\opencl-*.dll`) reads the `;`-separated OCL_ICD_FILENAMES and the registry
(`HKLM\\SOFTWARE\\Khronos\\OpenCL\\Vendors`, where GPU drivers register themselves), so kilnet
prepends the dll's path to OCL_ICD_FILENAMES, makes the folder findable for the libraries it
loads (``os.add_dll_directory``, PATH for child processes) and loads tbb12.dll by its path, so
that a missing Visual C++ runtime is an error that says so. An elevated process (run as
administrator) is different: the loader ignores the variable there, and only the registry counts;
``register_system`` (``kilnet devices --register``, as administrator) writes the key.

PoCL from PyPI needs none of this: pyopencl's wheel carries a loader that also reads the .icd
files beside itself, where `pocl-binary-distribution` puts PoCL's (Linux only).

The C runner (runner/kilnet_run.c) needs a loader too, and a machine with only pip's OpenCL has
no system libOpenCL.so.1 (or OpenCL.dll): `import kilnet` writes the path of pyopencl's loader
to <cache>/opencl-loader (``record_loader``), which the runner opens where the system has none.

Child processes (probe.py, build_child.py) import this file as a plain module, without the kilnet
package: it imports only the standard library and this folder's cachefile.py.
"""
import ctypes
import glob
import hashlib
import importlib.metadata as metadata
import importlib.util
import os
import sys
import tempfile
import warnings

try:
    from . import cachefile
except ImportError:                  # a plain module of this folder (probe.py, build_child.py)
    import cachefile

SYSTEM_VENDORS = "/etc/OpenCL/vendors"
# The compiler runtime the Intel library links against (intel-cmplr-lib-rt). Its RUNPATH is
# $ORIGIN, which finds them only when both packages landed in one lib/ folder; loading them first
# by full path makes the library's own lookup find them already loaded wherever they are.
LINUX_RUNTIME_LIBS = ("libintlc.so.5", "libimf.so", "libsvml.so", "libirng.so")

# Windows: the dll of Intel's CPU runtime, the TBB it loads at run time, the Khronos loader's
# variable and registry key.
WINDOWS_DLL = "intelocl64.dll"
WINDOWS_TBB = "tbb12.dll"
FILENAMES = "OCL_ICD_FILENAMES"
VENDORS_KEY = r"SOFTWARE\Khronos\OpenCL\Vendors"
VC_RUNTIME = ("the Microsoft Visual C++ Redistributable for Visual Studio 2015-2022 (x64, "
              "https://aka.ms/vs/17/release/vc_redist.x64.exe), which provides the MSVCP140.dll "
              "and VCRUNTIME140.dll that tbb12.dll needs")

_state = {}


def _installed(dist, name):
    """The absolute path of file `name` that distribution `dist` installed, or None."""
    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name.lower() == name.lower():
            path = os.path.realpath(f.locate())
            if os.path.isfile(path):
                return path
    return None


def intel_library():
    """Where pip put Intel's CPU OpenCL library (libintelocl.so; intelocl64.dll on Windows), or
    None."""
    if sys.platform == "win32":
        return _installed("intel-opencl-rt", WINDOWS_DLL)
    else:
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
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
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
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
            f.write(lib + "\n")
    try:
        cachefile.replace(tmp, folder)     # another process may have won the race: theirs is the same
    except OSError:
        for name in entries:
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)
    return folder


LOADER_RECORD = "opencl-loader"


def pyopencl_loader(platform=None):
    """The ICD loader pyopencl's wheel carries, found without importing pyopencl, or None: on
    Linux pyopencl/.libs/libOpenCL*.so* (auditwheel; newer ones use pyopencl.libs/ beside the
    package), on Windows pyopencl.libs/opencl-*.dll (delvewheel). submit.py loads this file."""
    try:
        spec = importlib.util.find_spec("pyopencl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    pkg = os.path.dirname(spec.origin)
    beside = os.path.join(os.path.dirname(pkg), "pyopencl.libs")
    if (platform or sys.platform) == "win32":
        patterns = [os.path.join(beside, "opencl-*.dll"), os.path.join(beside, "OpenCL-*.dll")]
    else:
        patterns = [os.path.join(pkg, ".libs", "libOpenCL*.so*"),
                    os.path.join(beside, "libOpenCL*.so*")]
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def record_loader(cache_root):
    """Write pyopencl's loader's path to <cache_root>/opencl-loader (where it changed) for the
    C runner; returns the path recorded, or None. Never fails the caller."""
    lib = pyopencl_loader()
    if lib is None:
        return None
    path = os.path.join(cache_root, LOADER_RECORD)
    if _read(path) == lib:
        return lib
    return lib if cachefile.write(path, (lib + "\n").encode("utf-8")) else None


def register(cache_root):
    """Make Intel's CPU runtime visible to the ICD loader, once per process; returns what was done
    (also kept for `kilnet devices`): {"intel": path or None, "vendors": folder or None (Linux),
    "filenames": OCL_ICD_FILENAMES as set or None (Windows), "error": why not, or None,
    "loader": pyopencl's loader as recorded for the runner}."""
    if _state:
        return _state
    _state.update(intel=intel_library(), vendors=None, filenames=None, error=None,
                  loader=record_loader(cache_root))
    if _state["intel"] is None:
        return _state
    if sys.platform == "win32":
        _register_windows(_state)
    else:
        _register_linux(_state, cache_root)
    return _state


def _register_linux(state, cache_root):
    """An OCL_ICD_VENDORS folder: the .icd files the loader would read, plus Intel's."""
    lib = state["intel"]
    entries = {os.path.basename(p): _read(p) for p in _vendor_sources()}
    entries = {n: p for n, p in entries.items() if p}
    if any(os.path.basename(p).startswith("libintelocl.so") and os.path.isabs(p)
           and os.path.exists(p) for p in entries.values()):
        return                             # the system already registers a working copy
    entries["kilnet-intel-cpu.icd"] = lib
    for name in LINUX_RUNTIME_LIBS:
        path = _installed("intel-cmplr-lib-rt", name)
        if path:
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                state["error"] = f"could not load {path}: {e}"
    try:
        state["vendors"] = _write_vendors(entries, cache_root)
    except OSError as e:
        state["error"] = f"could not write an ICD vendors folder under {cache_root}: {e}"
        return
    os.environ["OCL_ICD_VENDORS"] = state["vendors"]


# -- Windows ---------------------------------------------------------------------------------------
def dll_folders(lib):
    """The folders whose dlls Intel's runtime loads: its own (intelocl64.dll, common_clang64.dll,
    the svml builds), tbb's (tbb12.dll) and the compiler runtime's; each once, in that order."""
    out = [os.path.dirname(lib)]
    for dist, name in (("tbb", WINDOWS_TBB), ("intel-cmplr-lib-rt", "libmmd.dll")):
        path = _installed(dist, name)
        if path and os.path.dirname(path) not in out:
            out.append(os.path.dirname(path))
    return out


def _register_windows(state):
    """OCL_ICD_FILENAMES names intelocl64.dll first (prepended to what the user set), its folders
    are findable, tbb12.dll is loaded; in an elevated process, where the loader reads only the
    registry, a warning says how to register it unless the registry has it already."""
    lib = state["intel"]
    folders = dll_folders(lib)
    keep = state.setdefault("dll_directories", [])
    for folder in folders:
        if hasattr(os, "add_dll_directory"):
            try:
                keep.append(os.add_dll_directory(folder))
            except OSError:
                pass
    path = os.environ.get("PATH", "")
    parts = [p for p in path.split(os.pathsep) if p]
    os.environ["PATH"] = os.pathsep.join([f for f in folders if f not in parts] + parts)
    tbb = os.path.join(os.path.dirname(lib), WINDOWS_TBB)
    tbb = tbb if os.path.isfile(tbb) else _installed("tbb", WINDOWS_TBB)
    if tbb is None:
        state["error"] = (f"{WINDOWS_TBB}, which Intel's CPU runtime needs, is not installed "
                          f"(pip install tbb)")
    else:
        try:
            ctypes.WinDLL(tbb)
        except (OSError, AttributeError) as e:
            state["error"] = f"could not load {tbb} ({e}): install {VC_RUNTIME}"
    given = [p for p in os.environ.get(FILENAMES, "").split(";") if p]
    if os.path.normcase(lib) not in [os.path.normcase(p) for p in given]:
        given.insert(0, lib)
    os.environ[FILENAMES] = state["filenames"] = ";".join(given)
    if elevated() and not registered(lib):
        state["error"] = elevated_message(lib)
    if state["error"]:
        warnings.warn(f"kilnet: Intel's CPU OpenCL runtime: {state['error']}", RuntimeWarning,
                      stacklevel=2)


def elevated():
    """Whether this Windows process runs elevated (as administrator), where the Khronos loader
    ignores OCL_ICD_FILENAMES; False elsewhere or where it cannot be told."""
    if sys.platform != "win32":
        return False
    try:
        return bool(ctypes.windll.shell32.IsUserAnAdmin())
    except (AttributeError, OSError):
        return False


def elevated_message(lib):
    return (f"this process runs elevated (as administrator), and the Khronos OpenCL loader "
            f"ignores {FILENAMES} there, so it does not see {lib}. Register it once under "
            f"HKLM\\{VENDORS_KEY}: run `kilnet devices --register` from an administrator "
            f"terminal (or `reg add HKLM\\{VENDORS_KEY} /v \"{lib}\" /t REG_DWORD /d 0 /f`), or "
            f"run this program unelevated")


def _winreg():
    import winreg           # Windows only: importable there alone
    return winreg


def registered(lib):
    """Whether HKLM\\SOFTWARE\\Khronos\\OpenCL\\Vendors holds `lib` (a DWORD value 0 named by the
    dll's path, as drivers register themselves); False where it cannot be read."""
    try:
        winreg = _winreg()
        with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, VENDORS_KEY, 0,
                            winreg.KEY_READ | winreg.KEY_WOW64_64KEY) as key:
            value, kind = winreg.QueryValueEx(key, lib)
    except (ImportError, OSError):
        return False
    return kind == winreg.REG_DWORD and value == 0


def register_system():
    """``kilnet devices --register``: write Intel's CPU runtime into
    HKLM\\SOFTWARE\\Khronos\\OpenCL\\Vendors, which elevated processes (and programs that do not
    go through kilnet, MetaTrader's own OpenCL among them) read. Returns (exit status, what was
    done or why not)."""
    if sys.platform != "win32":
        return 0, ("kilnet devices --register is for Windows. Here the OpenCL loader needs no "
                   "registration: `import kilnet` points OCL_ICD_VENDORS at a vendors folder in "
                   "its cache that names Intel's CPU runtime")
    lib = intel_library()
    if lib is None:
        return 1, ("Intel's CPU OpenCL runtime (intel-opencl-rt) is not installed in this "
                   "environment; `pip install kilnet` brings it on Windows x86-64")
    where = f"HKLM\\{VENDORS_KEY}"
    if registered(lib):
        return 0, f"{where} already lists {lib}: nothing to do"
    if not elevated():
        return 1, (f"writing {where} needs an administrator: open a terminal with 'Run as "
                   f"administrator' and run `kilnet devices --register` there (or `reg add "
                   f"{where} /v \"{lib}\" /t REG_DWORD /d 0 /f`). Processes that are not "
                   f"elevated need none of this: kilnet sets {FILENAMES} for them itself")
    winreg = _winreg()
    try:
        with winreg.CreateKeyEx(winreg.HKEY_LOCAL_MACHINE, VENDORS_KEY, 0,
                                winreg.KEY_WRITE | winreg.KEY_WOW64_64KEY) as key:
            winreg.SetValueEx(key, lib, 0, winreg.REG_DWORD, 0)
    except OSError as e:
        return 1, f"could not write {where}: {e}"
    return 0, (f"registered {lib} under {where}; every OpenCL program of this machine, elevated "
               f"or not, now sees Intel's CPU runtime (`kilnet devices` lists it). It loads "
               f"{WINDOWS_TBB} from {os.path.dirname(lib)}, which a program outside Python finds "
               f"where that folder is on its PATH")
