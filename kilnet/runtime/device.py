"""Choosing an OpenCL device: an explicit choice, else KILNET_DEVICE, else the first GPU that can
build a kernel, else the best CPU implementation that can.

"Can build" is learnt by a probe: a child process builds and runs a tiny kernel on the device
(a child, because a broken compiler may abort the process rather than return an error; GPU
drivers that report failures instead, IN_PROCESS, are probed in this process). The answer is
cached on disk per platform, device and driver version, so a machine pays for it once. A
compile's probe runs in a thread while the graph is lowered (``probe_soon``); on the
implementations of BUILD_CHILDREN its child process then stays to build programs (``take_kept``).

Why probe at all: PoCL 3.0 from PyPI (LLVM 14) lists every x86-64 CPU as a device but cannot
build a kernel on CPUs newer than its LLVM (AMD family 26, Zen 5: "unknown target CPU
'generic'"), while Intel's CPU runtime from PyPI builds there, on AMD too.
"""
import json
import os
import subprocess
import sys
import threading
import warnings

import numpy as np

from ..errors import CompileError
from ..settings import read as read_settings
from . import cachefile, icd
from .probe import build_and_run as probe_here, first_error_line

# The child process of a probe runs this file as a script (it imports no kilnet).
PROBE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe.py")

# CPU implementations, best first. Measured side by side on a 2-core AMD EPYC (Zen 3), W1-W3 of
# benchmarks/vs_pytorch.py: Intel's runtime ran every train step faster than PoCL (see
# benchmarks/results/cpu-intel-vs-pocl-*.txt).
CPU_PREFERENCE = ("intel", "pocl")
# Simulators: never chosen while a real device is there, and never for "gpu" or "cpu" (Oclgrind
# calls its device every type), only by name (KILNET_DEVICE=oclgrind) or as the only platform
# (under the `oclgrind` command). The test extra installs Oclgrind's platform from PyPI.
SIMULATORS = ("oclgrind",)

# What to do when an implementation cannot build, by implementation.
FIXES = {
    "pocl": "PoCL 3.0 from PyPI (LLVM 14) does not know CPUs newer than its LLVM; use Intel's CPU "
            "runtime instead (pip install intel-opencl-rt, a default dependency of kilnet on "
            "Linux x86-64)",
    "intel": "reinstall Intel's CPU runtime: pip install --force-reinstall intel-opencl-rt "
             "intel-cmplr-lib-rt",
}
DEFAULT_FIX = "update the driver, or name a device that builds with KILNET_DEVICE"

PROBE_VERSION = 2
# Two kernels: a work-group barrier, and the 16-wide vector loads and stores kilnet's kernels use
# (PoCL 3.0 on a 2-core AMD EPYC built a program of those with no kernel in it, and said nothing).
PROBE_SOURCE = """
__kernel void probe(__global float *x, __local float *tmp) {
    int i = get_global_id(0), l = get_local_id(0);
    tmp[l] = exp(x[i]) + (float)l;
    barrier(CLK_LOCAL_MEM_FENCE);
    x[i] = tmp[get_local_size(0) - 1 - l];
}
__kernel void probe_vector(__global float *x) {
    float16 v = vload16(0, x);
    vstore16(v + v, 0, x);
}
"""

NOT_ANSWERED = "the probe process failed to run"
# Implementations probed in this process, on the context kilnet uses anyway: GPU drivers that
# report a failed build rather than abort. The child process cost a cold compile on the H200 6.5
# s of its 17 (importing kilnet, a second CUDA context of 1.6 s, the probe's build).
IN_PROCESS = ("nvidia", "amd")

_contexts = {}
_probes = {}
_pending = {}      # device ident -> _Soon: a probe under way in a thread (probe_soon)
_kept = {}         # device ident -> the probe's process, kept to build programs (take_kept)
# Implementations whose compiler builds one program at a time in a process: a compile builds
# programs in child processes too (runtime/program.py), and the first is the process that probed
# the device, kept for it (its context made and its compiler started: 0.3 s of a new child's).
BUILD_CHILDREN = ("intel",)
_warned = set()

# At import (kilnet imports this module), so that Intel's runtime is registered even when the
# program makes its own first OpenCL call before compiling a model.
icd.register(read_settings().cache)


def _cl():
    import pyopencl as cl          # after icd.register (above): the loader reads its folder once
    return cl


def _platforms():
    cl = _cl()
    try:
        return cl.get_platforms()
    except cl.Error as e:  # no ICD loader or no platform at all
        raise CompileError(f"no OpenCL platform is available ({e}); install kilnet's default "
                           "dependencies (intel-opencl-rt, pocl-binary-distribution) or a GPU "
                           "driver") from None


def _pairs():
    return [(pi, di, p, d) for pi, p in enumerate(_platforms()) for di, d in enumerate(p.get_devices())]


def index_of(device):
    """``device``'s (platform, device) index pair in this process's listing, or None."""
    return next(((pi, di) for pi, di, _p, d in _pairs() if d.int_ptr == device.int_ptr), None)


def implementation(device):
    """A short name for the OpenCL implementation behind `device`: intel, pocl, nvidia, amd,
    oclgrind, or the platform vendor's first word."""
    name = device.platform.name.lower()
    vendor = device.platform.vendor.lower()
    for key, words in (("pocl", ("portable computing language", "pocl")), ("oclgrind", ("oclgrind",)),
                       ("nvidia", ("nvidia",)), ("amd", ("amd accelerated", "advanced micro"))):
        if any(w in name or w in vendor for w in words):
            return key
    if "intel" in name or "intel" in vendor:
        return "intel"
    return (vendor.split() or ["unknown"])[0]


def _is_gpu(device):
    return bool(device.type & _cl().device_type.GPU)


def _ident(device):
    return "\0".join([device.platform.name, device.platform.version, device.name,
                      device.driver_version, str(PROBE_VERSION)])


def _probe_file():
    return os.path.join(read_settings().cache, "probes.json")


def _load_probes():
    try:
        with open(_probe_file(), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _save_probe(key, result):
    """Read-modify-replace: a concurrent writer may drop an entry, which only costs a re-probe."""
    path = _probe_file()
    known = _load_probes()
    known[key] = result
    cachefile.write(path, json.dumps(known, indent=1).encode())


def build_and_run(device, source=None, shared=False):
    """Build and run the probe kernel on `device` in this process; None if it works, else why.
    ``shared``: on the context and queue every model on the device uses (``context``)."""
    return probe_here(device, PROBE_SOURCE if source is None else source,
                      context(device)[:2] if shared else None)


def _probe_in_child(pi, di, device, keep=False):
    cmd = [sys.executable, PROBE_SCRIPT, str(pi), str(di), device.name, read_settings().cache]
    if keep:
        return _probe_kept(cmd, device)
    try:
        r = subprocess.run(cmd, input=PROBE_SOURCE, capture_output=True, text=True, timeout=300,
                           env=os.environ.copy())
    except (OSError, subprocess.SubprocessError) as e:
        return NOT_ANSWERED + f" ({e})"
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)["error"]
            except (ValueError, KeyError):
                break
    tail = first_error_line(r.stderr) or f"exit status {r.returncode}"
    return f"the probe process died: {tail}"


class _Soon:
    """A call run in a daemon thread; ``result()`` waits for its value (or raises its error)."""

    def __init__(self, fn, *args):
        self._done, self._value, self._error = threading.Event(), None, None
        threading.Thread(target=self._run, args=(fn, args), daemon=True,
                         name="kilnet-probe").start()

    def _run(self, fn, args):
        try:
            self._value = fn(*args)
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            self._error = e
        finally:
            self._done.set()

    def result(self):
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


def known(device):
    """Whether `device`'s probe has answered (in this process or on disk)."""
    key = _ident(device)
    if key in _probes:
        return True
    found = _load_probes().get(key)
    if found is not None:
        _probes[key] = found["error"]
    return found is not None


def probe_soon(device, where=None):
    """Start `device`'s probe in a thread unless its answer is known; `probe` then waits for it.
    A compile lowers its graph meanwhile: the probe is a child process or a driver's build,
    which hold no Python lock (a cold compile of W1 b64 on 2 cores of an EPYC: its 0.35 s probe
    beside 0.18 s of lowering)."""
    key = _ident(device)
    if key not in _pending and not known(device):
        _pending[key] = _Soon(_probe_now, device, where, implementation(device) in BUILD_CHILDREN)


def _probe_kept(cmd, device):
    """The probe in a child process that, where the device builds, stays to build programs
    (probe.py ``keep``; ``take_kept``); within 300 s, as a plain probe."""
    try:
        child = subprocess.Popen(cmd + ["keep"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    except OSError as e:
        return NOT_ANSWERED + f" ({e})"
    timer = threading.Timer(300, child.kill)
    timer.start()
    answer = None
    try:
        child.stdin.write(json.dumps(PROBE_SOURCE) + "\n")
        child.stdin.flush()
        for line in iter(child.stdout.readline, ""):
            if line.startswith("{"):
                answer = json.loads(line)
                break
    except (OSError, ValueError):
        answer = None
    finally:
        timer.cancel()
    if isinstance(answer, dict) and "error" in answer:
        if answer["error"] is None:
            _kept[_ident(device)] = child
        else:
            release(child)
        return answer["error"]
    release(child)
    tail = first_error_line(child.stderr.read() if child.stderr else "")
    return f"the probe process died: {tail or f'exit status {child.returncode}'}"


def take_kept(device):
    """The process that probed ``device`` and stays to build programs (probe.py ``keep``): its
    standard input takes one JSON line of build jobs (build_child.py's), its output ends with
    build_child's line; None where there is none or it has ended."""
    child = _kept.pop(_ident(device), None)
    if child is not None and child.poll() is not None:
        return None
    return child


def release(child, wait=True):
    """Let a kept probe process end (its input closed) and, with ``wait``, reap it."""
    try:
        child.stdin.close()
    except OSError:
        pass
    if not wait:
        return
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def probe(device, where=None):
    """None if `device` builds and runs kernels, else a one-line reason. Cached per process and on
    disk per platform, device and driver version. `where` is its (platform, device) index pair."""
    key = _ident(device)
    soon = _pending.get(key)
    if soon is not None:
        error = soon.result()
        _pending.pop(key, None)
        return error
    return _probe_now(device, where)


def _probe_now(device, where, keep=False):
    key = _ident(device)
    if key in _probes:
        return _probes[key]
    known = _load_probes()
    if key in known:
        _probes[key] = known[key]["error"]
        return _probes[key]
    if where is None:
        where = index_of(device)
    if implementation(device) in IN_PROCESS and _is_gpu(device):
        error = build_and_run(device, shared=True)
    elif where is None or not sys.executable:
        error = build_and_run(device)
    else:
        error = _probe_in_child(where[0], where[1], device, keep)
    _probes[key] = error
    if not (error or "").startswith(NOT_ANSWERED):     # a probe that did not run may next time
        _save_probe(key, {"error": error, "implementation": implementation(device)})
    return error


def _describe(device):
    return f"{implementation(device)} ({device.platform.name.strip()}: {device.name.strip()})"


def _refusal(device, error):
    return (f"device {_describe(device)} cannot build kernels: {error}\n  fix: "
            f"{FIXES.get(implementation(device), DEFAULT_FIX)} (the answer is kept in "
            f"{_probe_file()}: delete it to probe again)")


def devices(check=False):
    """What OpenCL offers: a list of dicts with platform:device index, implementation, names, type,
    driver version and limits; with check=True also "builds" (None if kernels build, else why).

    Args:
        check (bool): also build and run a test kernel on each device (cached per process and
            on disk per platform, device and driver).

    Returns:
        devices (list[dict]): one per device: id ("P:D", what ``device=`` takes),
            implementation, platform, device, type, driver, compute_units, global_mem_mb,
            local_mem_kb, max_work_group_size, fp64 (and builds with ``check``).
    """
    cl = _cl()
    out = []
    for pi, di, p, d in _pairs():
        row = {"id": f"{pi}:{di}", "implementation": implementation(d), "platform": p.name.strip(),
               "device": d.name.strip(), "type": cl.device_type.to_string(d.type),
               "driver": d.driver_version.strip(), "compute_units": d.max_compute_units,
               "global_mem_mb": d.global_mem_size // 2 ** 20,
               "local_mem_kb": d.local_mem_size // 1024,
               "max_work_group_size": d.max_work_group_size,
               "fp64": bool(d.double_fp_config)}
        if check:
            row["builds"] = probe(d, (pi, di))
        out.append(row)
    return out


def ranked(pairs):
    """`pairs` in the order the default choice tries them: GPUs, then CPU implementations by
    CPU_PREFERENCE, then the rest; OpenCL's order breaks ties."""
    def rank(pair):
        impl = implementation(pair[3])
        if impl in SIMULATORS:
            return (2, 0)
        pref = CPU_PREFERENCE.index(impl) if impl in CPU_PREFERENCE else len(CPU_PREFERENCE)
        return (0, 0) if _is_gpu(pair[3]) else (1, pref)
    return sorted(pairs, key=rank)


def _real(pairs):
    """``pairs`` less the simulators'."""
    return [pd for pd in pairs if implementation(pd[3]) not in SIMULATORS]


def default_order(pairs):
    """The devices the default choice tries, in order: ``ranked``, less the simulators unless
    nothing else is there."""
    return ranked(_real(pairs) or pairs)


def _default(pairs, wait=True):
    """The first device in ranked order that builds; a warning for each one skipped before it.
    ``wait`` False: the first whose probe has not answered yet is taken while it runs
    (probe_soon; ``builds`` says later whether it does)."""
    refused = []
    for pi, di, _p, d in default_order(pairs):
        if not wait and not known(d):
            probe_soon(d, (pi, di))
            _warn_skipped(refused)
            return d
        error = probe(d, (pi, di))
        if error is None:
            _warn_skipped(refused)
            return d
        refused.append((d, error))
    raise CompileError("no OpenCL device can build kernels:\n" +
                       "\n".join("- " + _refusal(d, e) for d, e in refused))


def _warn_skipped(refused):
    for dev, why in refused:
        key = _ident(dev)
        if key not in _warned:
            _warned.add(key)
            warnings.warn(f"kilnet: skipping {_describe(dev)}: it cannot build kernels ({why})",
                          RuntimeWarning, stacklevel=5)


def _named(spec, pairs):
    """The device that `spec` names: 'P:D', an implementation (intel, pocl, nvidia, ...), 'gpu',
    'cpu' (the best CPU implementation), or a word of a platform or device name."""
    cl = _cl()
    s = spec.strip().lower()
    if ":" in s:
        try:
            pi, di = (int(v) for v in s.split(":"))
            return next(pd for pd in pairs if pd[:2] == (pi, di))
        except (ValueError, StopIteration):
            raise CompileError(f"device {spec!r}: no such platform:device; see kilnet.devices()") from None
    by_impl = [pd for pd in pairs if implementation(pd[3]) == s]
    if s == "cpu":
        cpus = [pd for pd in ranked(_real(pairs)) if pd[3].type & cl.device_type.CPU]
        by_impl = [pd for pd in cpus if probe(pd[3], pd[:2]) is None] or cpus   # the best that builds
    elif s == "gpu":
        by_impl = [pd for pd in _real(pairs) if _is_gpu(pd[3])]
    if by_impl:
        return by_impl[0]
    for pd in pairs:
        p, d = pd[2], pd[3]
        if s in p.name.lower() or s in p.vendor.lower() or s in d.name.lower():
            return pd
    found = ", ".join(_describe(pd[3]) for pd in pairs)
    raise CompileError(f"device {spec!r} matches no OpenCL device; found: {found}")


def select(spec=None, settings=None, wait=True):
    """The pyopencl device for ``spec``: None, 'intel', 'pocl', 'nvidia', 'gpu', 'cpu', 'P:D', or a
    pyopencl.Device (e.g. another model's ``model.device``). None takes KILNET_DEVICE (from
    ``settings``, else the environment now), else the default. A named device that cannot build
    kernels is refused with its build error and the fix. ``wait`` False: a device whose probe
    has not answered is returned while the probe runs; ``builds`` then says whether it builds,
    and ``select`` again (waiting) refuses it or takes the next."""
    cl = _cl()
    if isinstance(spec, cl.Device):
        return spec
    if spec is None:
        spec = (settings if settings is not None else read_settings()).device
    if spec is not None and not isinstance(spec, str):
        raise CompileError(f"device must be None or a string such as 'intel', 'pocl', 'nvidia' or "
                           f"'0:0', got {spec!r}")
    pairs = _pairs()
    if not pairs:
        raise CompileError("OpenCL reports no device")
    if spec is None:
        return _default(pairs, wait)
    pi, di, _p, d = _named(spec, pairs)
    if not wait and not known(d):
        probe_soon(d, (pi, di))
        return d
    error = probe(d, (pi, di))
    if error is not None:
        raise CompileError(_refusal(d, error))
    return d


def builds(device):
    """Whether `device` builds and runs kernels as far as its probe says, waited for where it is
    under way; True for a device no probe has looked at (one given as a pyopencl.Device, which
    ``select`` takes as it is)."""
    if _ident(device) in _pending or known(device):
        return probe(device) is None
    return True


def context(device):
    """One context and queue per device, shared by every model on it (so are built programs)."""
    cl = _cl()
    key = device.int_ptr
    if key not in _contexts:
        ctx = cl.Context([device])
        _contexts[key] = (ctx, cl.CommandQueue(ctx), {})
    return _contexts[key]
