"""How a sequence of pre-bound launches reaches the queue: three interchangeable paths, one per
executor, all on the executor's in-order queue.

- ``command_buffer``: where the device offers ``cl_khr_command_buffer``, each launch sequence
  that ``run`` is given (keyed by its launch names) is recorded once, the first time, and every
  later run of it is one ``clEnqueueCommandBufferKHR``. pyopencl has no binding, so this goes
  through ctypes.
- ``ctypes``: one ``clEnqueueNDRangeKernel`` per launch, called straight from the ICD loader
  that pyopencl uses, with the size arrays built once per launch and no event.
- ``pyopencl``: one ``pyopencl.enqueue_nd_range_kernel`` per launch (builds the size arrays and
  an event object on every call).

``auto`` (the default) takes ctypes where the ICD loader can be reached, else pyopencl;
``KILNET_ENQUEUE`` forces one, and a forced path the device cannot do is a CompileError saying
why. Command buffers are used only when asked for, because they bought nothing where they exist
(below): a recorded sequence is one more piece of state for no measured gain.

Measured host time per enqueue on NVIDIA's OpenCL (H200): ~8.2 us through pyopencl, ~7.4 us
through ctypes with no event; NVIDIA offers no command buffers. Intel's CPU runtime (2026.2)
offers them, but its clEnqueueCommandBufferKHR costs the host as much CPU time as the enqueues it
replaces (~5 us per recorded launch), so there the three paths run alike
(benchmarks/results/cpu-submit-paths-2026-11-30.txt).

A command buffer captures each kernel's arguments when it is recorded. The executor sets every
argument once, before any run, and never again, so a replay sees what a fresh enqueue would.
Data (parameters, feeds) lives in the arenas, which the kernels read at run time: writing new
values into a buffer needs no re-recording.
"""
import ctypes
import ctypes.util
import os
import weakref

from ..errors import CompileError, DeviceError
from ..settings import ENQUEUE, enqueue

ENV = "KILNET_ENQUEUE"
PATHS = ENQUEUE[1:]          # "auto" aside

# cl_khr_command_buffer enums (Khronos cl_ext.h)
CL_DEVICE_COMMAND_BUFFER_CAPABILITIES_KHR = 0x12A9
CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES_KHR = 0x12AA
CL_DEVICE_COMMAND_BUFFER_SUPPORTED_QUEUE_PROPERTIES_KHR = 0x129A    # from version 0.9.6
CL_COMMAND_BUFFER_CAPABILITY_KERNEL_PRINTF_KHR = 1 << 0
CL_COMMAND_BUFFER_CAPABILITY_SIMULTANEOUS_USE_KHR = 1 << 2
CL_COMMAND_BUFFER_FLAGS_KHR = 0x1293
CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR = 1 << 0
EXTENSION = "cl_khr_command_buffer"
# The extension's entry points kilnet uses have had one C signature from 0.9.0 to 1.0.0 (0.9.5
# gave every other recording call the properties argument clCommandNDRangeKernelKHR always had;
# 0.9.7 only renamed its type). What changed is simultaneous use: up to 0.9.7 a buffer that is
# not simultaneous-use must not be enqueued while a previous enqueue of it is pending (else
# CL_INVALID_OPERATION); from 0.9.8 (1.0.0 is 0.9.8 made final) only overlapping *execution*
# needs the capability, and submissions serialised by an in-order queue are always valid
# (KhronosGroup/OpenCL-Docs#1411).
SERIALISED_BY_QUEUE = (0, 9, 8)
NEWEST_KNOWN_MAJOR = 1

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
    """The OpenCL entry points that pyopencl's own calls bind to: a library in the process's
    global scope first (one that LD_PRELOAD put there, as Oclgrind does), else the ICD loader
    pyopencl's extension module links against (its wheel carries one), else the system's.
    Returns (ctypes library, None) or (None, why not)."""
    if "lib" in _loaded:
        return _loaded["lib"]
    import pyopencl  # noqa: F401  (loads the loader whose mapping we look for)
    found = None
    glob = ctypes.CDLL(None)
    if hasattr(glob, "clEnqueueNDRangeKernel"):
        found = glob
    else:
        for path in _mapped("libOpenCL") + [ctypes.util.find_library("OpenCL")]:
            if not path:
                continue
            try:
                found = ctypes.CDLL(path)
                break
            except OSError:
                continue
    _loaded["lib"] = (found, None) if found is not None else \
        (None, "no OpenCL library (libOpenCL) could be loaded through ctypes")
    return _loaded["lib"]


def _mapped(word):
    """Paths of the shared libraries mapped into this process whose file name contains ``word``."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if word in line}
    except OSError:
        return []
    return sorted(p for p in paths if word in os.path.basename(p))


def where(device):
    return f"{device.name.strip()} ({device.platform.name.strip()})"


# -- the three paths ------------------------------------------------------------------------------
class PyopenclSubmit:
    name = "pyopencl"

    def __init__(self, queue, bound):
        import pyopencl as cl
        self.enqueue, self.queue, self.bound = cl.enqueue_nd_range_kernel, queue, bound

    def run(self, launches):
        for launch in launches:
            k, g, loc = self.bound[launch.name]
            self.enqueue(self.queue, k, g, loc)

    def forget(self, names):
        """Drop what was kept for launches ``names`` (nothing here)."""


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


def host_copies(submitter, device, queue):
    """HostCopies where ``submitter`` calls the library through ctypes, else None (pyopencl's
    enqueue_copy then)."""
    if not isinstance(submitter, CtypesSubmit):
        return None
    lib, _ = library()
    return HostCopies(lib, device, queue) if lib is not None else None


class CommandBufferSubmit(CtypesSubmit):
    """Each distinct launch sequence recorded once into a command buffer, then replayed."""
    name = "command_buffer"

    def __init__(self, lib, device, queue, bound, ext):
        super().__init__(lib, device, queue, bound)
        self.ext = ext
        self.buffers = {}           # tuple of launch names -> cl_command_buffer_khr
        self.last = {}              # the same key -> event of its last replay (wait policy only)
        self.wait_events = lib["clWaitForEvents"]
        self.release_event = lib["clReleaseEvent"]
        handles = []
        self._handles = handles
        weakref.finalize(self, _release_all, ext.release, handles, self.last, self.release_event)

    def run(self, launches):
        if not launches:
            return
        key = tuple(launch.name for launch in launches)
        cb = self.buffers.get(key)
        if cb is None:
            cb = self._record(key)
        if self.ext.wait:
            self._replay_after_previous(key, cb)
            return
        code = self.ext.enqueue(0, None, cb, 0, None, None)
        if code:
            check(code, _replay_call(key), self.where)

    def forget(self, names):
        """Release the recordings of sequences that hold any of launches ``names``."""
        for key in [k for k in self.buffers if any(n in k for n in names)]:
            cb = self.buffers.pop(key)
            event = self.last.pop(key, None)
            if event is not None:
                self.release_event(event)
            self._handles.remove(cb)
            self.ext.release(cb)
        super().forget(names)

    def _replay_after_previous(self, key, cb):
        """Before 0.9.8, without simultaneous use: the previous replay must have finished."""
        prev = self.last.pop(key, None)
        if prev is not None:
            code = self.wait_events(ctypes.c_uint(1), ctypes.byref(prev))
            self.release_event(prev)
            check(code, "clWaitForEvents (the previous replay of a command buffer)", self.where)
        event = ctypes.c_void_p()
        check(self.ext.enqueue(0, None, cb, 0, None, ctypes.byref(event)),
              _replay_call(key), self.where)
        self.last[key] = event

    def _record(self, key):
        ext, err = self.ext, ctypes.c_int(0)
        queues = (ctypes.c_void_p * 1)(self.queue)
        props = (ctypes.c_uint64 * 3)(CL_COMMAND_BUFFER_FLAGS_KHR,
                                      CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR, 0) \
            if ext.simultaneous_flag else None
        cb = ext.create(1, queues, props, ctypes.byref(err))
        check(err.value, "clCreateCommandBufferKHR", self.where)
        self._handles.append(cb)
        # Each command waits for the one before: the order of an in-order queue, said explicitly
        # rather than left to how a version reads "recorded to an in-order queue".
        prev = ctypes.c_uint(0)
        for i, name in enumerate(key):
            _, (_, kernel, dim, _, g, loc, _, _, _) = self.calls.get(name) or self._call(name)
            point = ctypes.c_uint(0)
            code = ext.ndrange(cb, None, None, kernel, dim, None, g, loc,
                               1 if i else 0, ctypes.byref(prev) if i else None,
                               ctypes.byref(point), None)
            check(code, f"clCommandNDRangeKernelKHR (recording launch {name})", self.where)
            prev = point
        check(ext.finalize(cb), "clFinalizeCommandBufferKHR", self.where)
        self.buffers[key] = cb
        return cb


def _replay_call(key):
    span = key[0] if len(key) == 1 else f"{len(key)} launches, {key[0]} to {key[-1]}"
    return f"clEnqueueCommandBufferKHR (the recording of {span})"


def _release_all(release, handles, last, release_event):
    for event in last.values():
        release_event(event)
    for cb in handles:
        release(cb)


# -- what the device offers -----------------------------------------------------------------------
class CommandBufferExt:
    """The extension's entry points and the policy for one device, or ``why`` it cannot be used."""

    def __init__(self, lib, device, queue, printf=False):
        self.why = None
        self.version = self.caps = None
        try:
            self._probe(lib, device, queue, printf)
        except _Refused as e:
            self.why = str(e)

    def _probe(self, lib, device, queue, printf):
        if EXTENSION not in device.extensions.split():
            raise _Refused(f"the device does not offer {EXTENSION}")
        self.version = _extension_version(device, EXTENSION)
        if self.version is not None and self.version[0] > NEWEST_KNOWN_MAJOR:
            raise _Refused(f"{EXTENSION} {_dotted(self.version)} is newer than the 1.x kilnet "
                           f"knows")
        self.caps = _device_bits(lib, device, CL_DEVICE_COMMAND_BUFFER_CAPABILITIES_KHR)
        required = _device_bits(lib, device,
                                CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES_KHR)
        if self.caps is None or required is None:
            raise _Refused("the device did not answer the command-buffer capability queries")
        have = int(queue.properties)
        if required & ~have:
            raise _Refused(f"command buffers need queue properties {required:#x}; kilnet's queue "
                           f"has {have:#x}")
        supported = _device_bits(lib, device,
                                 CL_DEVICE_COMMAND_BUFFER_SUPPORTED_QUEUE_PROPERTIES_KHR)
        if supported is not None and have & ~supported:
            raise _Refused(f"command buffers support queue properties {supported:#x}; kilnet's "
                           f"queue has {have:#x}")
        if printf and not self.caps & CL_COMMAND_BUFFER_CAPABILITY_KERNEL_PRINTF_KHR:
            raise _Refused("a kernel calls printf, which the device's command buffers cannot "
                           "record")
        self.simultaneous_flag, self.wait = replay_policy(self.version, self.caps)
        get = lib["clGetExtensionFunctionAddressForPlatform"]
        get.restype = ctypes.c_void_p
        get.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        platform = device.platform.int_ptr
        p, u, i = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
        protos = {
            "create": ("clCreateCommandBufferKHR",
                       ctypes.CFUNCTYPE(p, u, p, p, ctypes.POINTER(i))),
            "ndrange": ("clCommandNDRangeKernelKHR",
                        ctypes.CFUNCTYPE(i, p, p, p, p, u, p, p, p, u, p, p, p)),
            "finalize": ("clFinalizeCommandBufferKHR", ctypes.CFUNCTYPE(i, p)),
            "enqueue": ("clEnqueueCommandBufferKHR", ctypes.CFUNCTYPE(i, u, p, p, u, p, p)),
            "release": ("clReleaseCommandBufferKHR", ctypes.CFUNCTYPE(i, p)),
        }
        for attr, (name, proto) in protos.items():
            address = get(platform, name.encode())
            if not address:
                raise _Refused(f"the platform lists {EXTENSION} but gives no address for {name}")
            setattr(self, attr, proto(address))

    def describe(self):
        return EXTENSION + (f" {_dotted(self.version)}" if self.version else "")


def replay_policy(version, caps):
    """(create buffers with CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR, wait for a buffer's previous
    replay before the next) for extension ``version`` and capability bits ``caps``, replays
    going to one in-order queue. From 0.9.8 the queue's order suffices; before it a pending
    buffer may be enqueued again only if created simultaneous-use, which needs the capability,
    else the host waits. A version the device does not state is taken as the oldest."""
    if version is not None and version >= SERIALISED_BY_QUEUE:
        return False, False
    simultaneous = bool(caps & CL_COMMAND_BUFFER_CAPABILITY_SIMULTANEOUS_USE_KHR)
    return simultaneous, not simultaneous


class _Refused(Exception):
    pass


def _extension_version(device, name):
    """(major, minor, patch) of extension ``name`` as the device states it (OpenCL 3.0), or None."""
    import pyopencl as cl
    try:
        versions = device.extensions_with_version
    except (AttributeError, cl.Error):       # an older pyopencl, or a device before OpenCL 3.0
        return None
    for nv in versions:
        if nv.name == name:
            v = nv.version
            return (v >> 22, (v >> 12) & 0x3FF, v & 0xFFF)
    return None


def _dotted(version):
    return ".".join(map(str, version))


def _device_bits(lib, device, param):
    value, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    code = lib["clGetDeviceInfo"](ctypes.c_void_p(device.int_ptr), ctypes.c_uint(param),
                                  ctypes.c_size_t(8), ctypes.byref(value), ctypes.byref(size))
    return int(value.value) if code == 0 and size.value == 8 else None


# -- choosing -------------------------------------------------------------------------------------
def requested(value=None, setting=None):
    """``value``, else ``setting`` (KILNET_ENQUEUE as read into the plan's settings), else auto;
    one of auto, command_buffer, ctypes, pyopencl."""
    return enqueue(ENV, value if value is not None else (setting or "auto"))


def choose(device, queue, bound, printf=False, request=None, setting=None):
    """The submitter for an executor on ``device`` whose launches are ``bound`` ({launch name:
    (kernel, global size, local size)}): ``request``, else ``setting`` (KILNET_ENQUEUE, read
    into the plan's settings), else auto. Its ``why`` says which path runs and why; a forced
    path the device cannot do is a CompileError. ``printf``: some kernel calls printf (a
    command buffer needs a capability for that)."""
    want = requested(request, setting)
    if want == "auto":
        forced = ""
    else:
        forced = f" (forced: {ENV}={want})" if request is None else " (requested)"
    lib, no_lib = library()
    if want == "pyopencl" or (lib is None and want == "auto"):
        s = PyopenclSubmit(queue, bound)
        s.why = "pyopencl, 1 enqueue per launch" + (forced or f" (ctypes: {no_lib})")
        return s
    if lib is None:
        raise CompileError(f"{ENV}={want}: cannot submit through ctypes on {where(device)}: "
                           f"{no_lib}")
    ext = CommandBufferExt(lib, device, queue, printf) if want == "command_buffer" else None
    if ext is not None and ext.why is None:
        s = CommandBufferSubmit(lib, device, queue, bound, ext)
        s.why = f"command buffer ({ext.describe()}), 1 enqueue per launch sequence" + forced
        return s
    if want == "command_buffer":
        raise CompileError(f"{ENV}=command_buffer: command buffers cannot be used on "
                           f"{where(device)}: {ext.why}")
    s = CtypesSubmit(lib, device, queue, bound)
    s.why = "ctypes, 1 enqueue per launch" + forced
    return s
