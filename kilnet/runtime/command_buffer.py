"""The ``command_buffer`` submission path (submit.py): where the device offers
``cl_khr_command_buffer``, each launch sequence that ``run`` is given (keyed by its launch names)
is recorded once, the first time, and every later run of it is one ``clEnqueueCommandBufferKHR``.
pyopencl has no binding, so this goes through ctypes, on the library submit.py loads.

submit.py takes this path only when it is asked for (KILNET_ENQUEUE=command_buffer or
``request=``), because it bought nothing where it exists (submit.py's measurements). A command buffer captures each kernel's arguments when it is recorded; the
executor sets every argument once, before any run, and never again, so a replay sees what a fresh
enqueue would.
"""
import ctypes
import weakref

from .cl_ctypes import CtypesSubmit, check

EXTENSION = "cl_khr_command_buffer"       # what the command_buffer path needs

# cl_khr_command_buffer enums (Khronos cl_ext.h)
CL_DEVICE_COMMAND_BUFFER_CAPABILITIES_KHR = 0x12A9
CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES_KHR = 0x12AA
CL_DEVICE_COMMAND_BUFFER_SUPPORTED_QUEUE_PROPERTIES_KHR = 0x129A    # from version 0.9.6
CL_COMMAND_BUFFER_CAPABILITY_KERNEL_PRINTF_KHR = 1 << 0
CL_COMMAND_BUFFER_CAPABILITY_SIMULTANEOUS_USE_KHR = 1 << 2
CL_COMMAND_BUFFER_FLAGS_KHR = 0x1293
CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR = 1 << 0
# The extension's entry points kilnet uses have had one C signature from 0.9.0 to 1.0.0 (0.9.5
# gave every other recording call the properties argument clCommandNDRangeKernelKHR always had;
# 0.9.7 only renamed its type). What changed is simultaneous use: up to 0.9.7 a buffer that is
# not simultaneous-use must not be enqueued while a previous enqueue of it is pending (else
# CL_INVALID_OPERATION); from 0.9.8 (1.0.0 is 0.9.8 made final) only overlapping *execution*
# needs the capability, and submissions serialised by an in-order queue are always valid
# (KhronosGroup/OpenCL-Docs#1411).
SERIALISED_BY_QUEUE = (0, 9, 8)
NEWEST_KNOWN_MAJOR = 1


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
