"""OpenCL's C entry points through ctypes, on the library pyopencl's own calls bind to: the
``ctypes`` submission path (one clEnqueueNDRangeKernel per launch with its argument list built
once), the host copies each step makes, and OpenCL's error names. submit.py chooses among the
paths; command_buffer.py builds on this one."""
import ctypes
import ctypes.util
import os

from ..errors import DeviceError
from . import icd

# Error codes of the command-buffer extension, which pyopencl's table lacks.
EXTRA_ERRORS = {-1138: "CL_INVALID_COMMAND_BUFFER_KHR",
                -1139: "CL_INVALID_SYNC_POINT_WAIT_LIST_KHR",
                -1140: "CL_INCOMPATIBLE_COMMAND_QUEUE_KHR"}

_loaded = {}


def error_name(code):
    """The OpenCL name of error ``code`` (CL_INVALID_KERNEL_ARGS, ...)."""
    import pyopencl as cl
    names = {v: "CL_" + k for k, v in vars(cl.status_code).items()
             if k.isupper() and isinstance(v, int)}
    names.update(EXTRA_ERRORS)
    return names.get(code, f"unknown OpenCL error {code}")


def check(code, call, where):
    if code != 0:
        raise DeviceError(f"{call} failed on {where}: {error_name(code)} ({code})")


def library():
    """The OpenCL entry points that pyopencl's own calls bind to: on Linux a library in the
    process's global scope first (one that LD_PRELOAD put there, as Debian's ``oclgrind`` command
    does), else the ICD loader pyopencl's wheel carries, loaded by its path
    (``icd.pyopencl_loader``: pyopencl/.libs/libOpenCL*.so*, on Windows
    pyopencl.libs/opencl-*.dll; loading a library already loaded gives the same one), else the
    system's (libOpenCL.so.1, OpenCL.dll). Returns (ctypes library, None) or (None, why not)."""
    if "lib" in _loaded:
        return _loaded["lib"]
    import pyopencl  # noqa: F401  (loads its loader: the library found below is that one)
    found = None
    if os.name == "posix":           # dlopen(NULL): the global scope; Windows has no such handle
        scope = ctypes.CDLL(None)
        if hasattr(scope, "clEnqueueNDRangeKernel"):
            found = scope
    tried = []
    for path in ([] if found is not None else
                 [icd.pyopencl_loader(), ctypes.util.find_library("OpenCL")]):
        if not path:
            continue
        try:
            found = ctypes.CDLL(path)
            break
        except OSError as e:
            tried.append(f"{path}: {e}")
    _loaded["lib"] = (found, None) if found is not None else \
        (None, "no OpenCL library (pyopencl's ICD loader, libOpenCL or OpenCL.dll) could be "
               "loaded through ctypes" + (f" ({'; '.join(tried)})" if tried else ""))
    return _loaded["lib"]


def where(device):
    return f"{device.name.strip()} ({device.platform.name.strip()})"


class CtypesSubmit:
    """Each launch's whole argument list to clEnqueueNDRangeKernel, built once: a call is then
    one ctypes call with ready ctypes objects (no argtypes, so nothing is converted)."""
    name = "ctypes"

    def __init__(self, lib, device, queue, bound):
        self.fn = lib["clEnqueueNDRangeKernel"]       # our own function object: restype c_int
        self.queue, self.bound, self.where = ctypes.c_void_p(queue.int_ptr), bound, where(device)
        self.calls = {}

    def _call(self, name):
        """(kernel, the argument tuple of its clEnqueueNDRangeKernel): the tuple holds the
        kernel's handle, so the kernel object is kept with it."""
        k, g, loc = self.bound[name]
        sizes = ctypes.c_size_t * len(g)
        call = (k, (self.queue, ctypes.c_void_p(k.int_ptr), ctypes.c_uint(len(g)), None, sizes(*g),
                    None if loc is None else sizes(*loc), ctypes.c_uint(0), None, None))
        self.calls[name] = call
        return call

    def forget(self, names):
        """Drop the argument lists kept for launches ``names`` (and so their kernels)."""
        for name in names:
            self.calls.pop(name, None)

    def run(self, launches):
        calls, fn = self.calls, self.fn
        for launch in launches:
            call = calls.get(launch.name) or self._call(launch.name)
            code = fn(*call[1])
            if code:
                check(code, f"clEnqueueNDRangeKernel (launch {launch.name})", self.where)


class HostCopies:
    """The copies every step makes (feeds, targets and the step's scalars in, the loss out), each
    one ctypes call with its argument list built once per (buffer, offset, size), the host
    pointer put in per call (a read's array is new each time):
    pyopencl's enqueue_copy checks its arguments in Python and returns an event, and a read
    waited for through that event costs a second call. On a Xeon core (Intel's runtime) a
    non-blocking 256-byte write took 7.0 us through pyopencl and 4.1 through ctypes; a read
    4.9 (blocking), 8.5 (an event waited for) and 4.1 us."""

    def __init__(self, lib, device, queue):
        self.fns = lib["clEnqueueWriteBuffer"], lib["clEnqueueReadBuffer"]
        self.queue, self.where = ctypes.c_void_p(queue.int_ptr), where(device)
        self.calls = {}

    def _do(self, read, mem, offset, nbytes, ptr):
        key = (read, mem.int_ptr, offset, nbytes)
        head = self.calls.get(key)
        if head is None:
            # a write does not block (its host memory stays unchanged until the queue has run
            # it: the caller's part); a read blocks until the data is there
            head = self.calls[key] = (self.queue, ctypes.c_void_p(mem.int_ptr),
                                      ctypes.c_uint(read), ctypes.c_size_t(offset),
                                      ctypes.c_size_t(nbytes))
        code = self.fns[read](*head, ctypes.c_void_p(ptr), ctypes.c_uint(0), None, None)
        if code:
            check(code, "clEnqueueReadBuffer" if read else "clEnqueueWriteBuffer", self.where)

    def write(self, mem, offset, nbytes, ptr):
        """Enqueue a copy of ``nbytes`` at host address ``ptr`` to byte ``offset`` of ``mem``."""
        self._do(0, mem, offset, nbytes, ptr)

    def read(self, mem, offset, nbytes, ptr):
        """Copy ``nbytes`` from byte ``offset`` of ``mem`` to host address ``ptr``, blocking."""
        self._do(1, mem, offset, nbytes, ptr)
