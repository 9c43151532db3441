"""Every KILNET_* environment variable, read in one place: ``read()`` checks them all and returns
a ``Settings``. ``kn.compile`` reads them once, before it chooses the device; the target the
kernels are specialised for records the compile-time ones and the plan the whole set, so that
nothing reads the environment after that, and ``summary()`` and an export bundle say which
differ from their defaults. Other entry points (``kilnet devices``, ``kilnet tune``) read them
where they start."""
import ntpath
import os
import posixpath
import sys
from dataclasses import dataclass, field, fields

from .errors import CompileError


def _choice(*allowed):
    def parse(name, v):
        if v not in allowed:
            if len(allowed) == 2:
                raise CompileError(f"{name} must be {allowed[0]!r} or {allowed[1]!r}, got {v!r}")
            raise CompileError(f"{name} must be one of {', '.join(allowed)}; got {v!r}")
        return v
    return parse


def _text(name, v):
    return v


def _count(name, v):
    if not v.isdigit() or int(v) < 1:
        raise CompileError(f"{name} must be an int >= 1, got {v!r}")
    return int(v)


def _seconds(name, v):
    try:
        return float(v)
    except ValueError:
        raise CompileError(f"{name} must be a number of seconds, got {v!r}") from None


ENQUEUE = ("auto", "command_buffer", "ctypes", "pyopencl")     # runtime/submit.py's paths


def enqueue(name, v):
    """KILNET_ENQUEUE's value (and submit's ``request=``) as a path name, or a CompileError."""
    v = str(v).strip().lower().replace("-", "_")
    return _choice(*ENQUEUE)(name, v)


def _variable(name, parse, what):
    """A field of Settings read from environment variable ``name``: None while it is unset or
    empty, else ``parse(name, text)`` (which refuses a bad value by name)."""
    return field(default=None, metadata={"variable": name, "parse": parse, "what": what})


@dataclass(frozen=True)
class Settings:
    """The KILNET_* variables as read: None where unset. ``cache`` is the cache folder in force."""
    device: str = _variable("KILNET_DEVICE", _text, "the device when none is given: intel, pocl, "
                            "nvidia, gpu, cpu, P:D or a word of its name")
    target: str = _variable("KILNET_TARGET", _choice("cpu", "gpu"),
                            "the kernel form, whatever the device")
    plan_kernel: str = _variable("KILNET_PLAN_KERNEL", _choice("0", "1"),
                                 "run launch sequences as one plan kernel (1) or not (0)")
    plan_merge: str = _variable("KILNET_PLAN_MERGE", _choice("0", "1"), "independent phases of "
                                "a plan kernel share a stage (1, default) or not (0)")
    update_sums: str = _variable("KILNET_UPDATE_SUMS", _choice("0", "1"), "train_step's "
                                 "optimizer sums the gradients that column sums of few rows "
                                 "would store (1) or reads them stored (0, default)")
    plan_groups: int = _variable("KILNET_PLAN_GROUPS", _count, "work-groups of a plan kernel")
    vector_bytes: str = _variable("KILNET_VECTOR_BYTES", _choice("16", "32", "64"),
                                  "the CPU forms' explicit vector, in bytes")
    cpu_products: str = _variable("KILNET_CPU_PRODUCTS", _text,   # the target checks the key
                                  "the CPU products' blocking of another implementation")
    schedules: str = _variable("KILNET_SCHEDULES", _text, "the schedule table (default: the "
                               "device's, in the cache folder)")
    enqueue: str = _variable("KILNET_ENQUEUE", enqueue, "how launches are submitted: auto, "
                             "command_buffer, ctypes, pyopencl")
    dump_kernels: str = _variable("KILNET_DUMP_KERNELS", _text,
                                  "a folder to write every kernel source built")
    build_processes: int = _variable("KILNET_BUILD_PROCESSES", _count, "processes that build a "
                                     "model's programs at once, on Intel's CPU runtime (default: "
                                     "the cores this process may use; 1: this one alone)")
    cache_dir: str = _variable("KILNET_CACHE_DIR", _text, "the cache folder (default "
                               "$XDG_CACHE_HOME/kilnet, else on Windows %LOCALAPPDATA%\\kilnet, "
                               "else ~/.cache/kilnet)")
    mpi_timeout: float = _variable("KILNET_MPI_TIMEOUT", _seconds, "seconds a rank waits for "
                                   "the others (0: forever; default 600)")
    xdg_cache_home: str = None     # not kilnet's: where the default cache folder goes
    default_cache: str = None      # the cache folder where KILNET_CACHE_DIR is unset (read())

    @property
    def cache(self):
        return self.cache_dir or self.default_cache or default_cache_dir(
            {"XDG_CACHE_HOME": self.xdg_cache_home} if self.xdg_cache_home else {})

    def changed(self):
        """{variable: value} of those set, in VARIABLES' order."""
        return {VARIABLES[key][0]: getattr(self, key) for key in VARIABLES
                if getattr(self, key) is not None}

    def describe(self):
        """One line for ``summary()``."""
        set_ = self.changed()
        return ("settings: " + ", ".join(f"{k}={v}" for k, v in set_.items()) if set_
                else "settings: every KILNET_* variable at its default")


def default_cache_dir(environ=None, platform=None):
    """The cache folder where KILNET_CACHE_DIR is unset: $XDG_CACHE_HOME/kilnet, else on Windows
    %LOCALAPPDATA%\\kilnet, else ~/.cache/kilnet (~ being %USERPROFILE% on Windows, $HOME
    elsewhere). The C runner (runner/kilnet_run.c) finds it by the same rule."""
    environ = os.environ if environ is None else environ
    windows = (platform or sys.platform) == "win32"
    path = ntpath if windows else posixpath
    if environ.get("XDG_CACHE_HOME"):
        return path.join(environ["XDG_CACHE_HOME"], "kilnet")
    if windows and environ.get("LOCALAPPDATA"):
        return path.join(environ["LOCALAPPDATA"], "kilnet")
    home = environ.get("USERPROFILE" if windows else "HOME") or os.path.expanduser("~")
    return path.join(home, ".cache", "kilnet")


# field: (variable, parse, what it does), for every field read from the environment.
VARIABLES = {f.name: (f.metadata["variable"], f.metadata["parse"], f.metadata["what"])
             for f in fields(Settings) if f.metadata}


def read(environ=None):
    """The settings in ``environ`` (default ``os.environ``), each checked: a bad value is a
    CompileError naming the variable, before any device work."""
    environ = os.environ if environ is None else environ
    values = {}
    for key, (name, parse, _what) in VARIABLES.items():
        raw = environ.get(name)
        if raw:
            values[key] = parse(name, raw)
    return Settings(xdg_cache_home=environ.get("XDG_CACHE_HOME") or None,
                    default_cache=default_cache_dir(environ), **values)
