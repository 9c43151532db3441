"""Every KILNET_* environment variable, read in one place: ``read()`` checks them all and returns
a ``Settings``. ``kn.compile`` reads them once, before it chooses the device; the target the
kernels are specialised for records the compile-time ones and the plan the whole set, so that
nothing reads the environment after that, and ``summary()`` and an export bundle say which
differ from their defaults. Other entry points (``kilnet devices``, ``kilnet tune``) read them
where they start."""
import os
from dataclasses import dataclass, fields

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


# field: (variable, parse, what it does). Unset or empty means the default (None).
VARIABLES = {
    "device": ("KILNET_DEVICE", _text, "the device when none is given: intel, pocl, nvidia, gpu, "
                                       "cpu, P:D or a word of its name"),
    "target": ("KILNET_TARGET", _choice("cpu", "gpu"), "the kernel form, whatever the device"),
    "plan_kernel": ("KILNET_PLAN_KERNEL", _choice("0", "1"),
                    "run launch sequences as one plan kernel (1) or not (0)"),
    "plan_merge": ("KILNET_PLAN_MERGE", _choice("0", "1"),
                   "independent phases of a plan kernel share a stage (1, default) or not (0)"),
    "plan_groups": ("KILNET_PLAN_GROUPS", _count, "work-groups of a plan kernel"),
    "vector_bytes": ("KILNET_VECTOR_BYTES", _choice("16", "32", "64"),
                     "the CPU forms' explicit vector, in bytes"),
    "cpu_products": ("KILNET_CPU_PRODUCTS", _text,     # checked against the table by the target
                     "the CPU products' blocking of another implementation"),
    "schedules": ("KILNET_SCHEDULES", _text, "the schedule table (default: the device's, in the "
                                             "cache folder)"),
    "enqueue": ("KILNET_ENQUEUE", enqueue, "how launches are submitted: auto, command_buffer, "
                                            "ctypes, pyopencl"),
    "dump_kernels": ("KILNET_DUMP_KERNELS", _text, "a folder to write every kernel source built"),
    "cache_dir": ("KILNET_CACHE_DIR", _text, "the cache folder (default $XDG_CACHE_HOME/kilnet "
                                             "or ~/.cache/kilnet)"),
    "mpi_timeout": ("KILNET_MPI_TIMEOUT", _seconds, "seconds a rank waits for the others (0: "
                                                    "forever; default 600)"),
}


@dataclass(frozen=True)
class Settings:
    """The KILNET_* variables as read: None where unset. ``cache`` is the cache folder in force."""
    device: str = None
    target: str = None
    plan_kernel: str = None
    plan_merge: str = None
    plan_groups: int = None
    vector_bytes: str = None
    cpu_products: str = None
    schedules: str = None
    enqueue: str = None
    dump_kernels: str = None
    cache_dir: str = None
    mpi_timeout: float = None
    xdg_cache_home: str = None     # not kilnet's: where the default cache folder goes

    @property
    def cache(self):
        base = self.xdg_cache_home or os.path.join(os.path.expanduser("~"), ".cache")
        return self.cache_dir or os.path.join(base, "kilnet")

    def changed(self):
        """{variable: value} of those set, in VARIABLES' order."""
        return {VARIABLES[f.name][0]: getattr(self, f.name) for f in fields(self)
                if f.name in VARIABLES and getattr(self, f.name) is not None}

    def describe(self):
        """One line for ``summary()``."""
        set_ = self.changed()
        return ("settings: " + ", ".join(f"{k}={v}" for k, v in set_.items()) if set_
                else "settings: every KILNET_* variable at its default")


def read(environ=None):
    """The settings in ``environ`` (default ``os.environ``), each checked: a bad value is a
    CompileError naming the variable, before any device work."""
    environ = os.environ if environ is None else environ
    values = {}
    for key, (name, parse, _what) in VARIABLES.items():
        raw = environ.get(name)
        if raw:
            values[key] = parse(name, raw)
    return Settings(xdg_cache_home=environ.get("XDG_CACHE_HOME") or None, **values)
