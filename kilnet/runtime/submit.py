"""How a sequence of pre-bound launches reaches the queue: three interchangeable paths, one per
executor, all on the executor's in-order queue.

- ``command_buffer``: where the device offers ``cl_khr_command_buffer``, each launch sequence
  that ``run`` is given (keyed by its launch names) is recorded once, the first time, and every
  later run of it is one ``clEnqueueCommandBufferKHR``. pyopencl has no binding, so this goes
  through ctypes (command_buffer.py).
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
from ..errors import CompileError
from ..settings import ENQUEUE, enqueue
from . import command_buffer
from .cl_ctypes import CtypesSubmit, HostCopies, library, where

ENV = "KILNET_ENQUEUE"
PATHS = ENQUEUE[1:]          # "auto" aside

# -- the three paths (the ctypes one is cl_ctypes.py's, command buffers command_buffer.py's) -----
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


def host_copies(submitter, device, queue):
    """HostCopies where ``submitter`` calls the library through ctypes, else None (pyopencl's
    enqueue_copy then)."""
    if not isinstance(submitter, CtypesSubmit):
        return None
    lib, _ = library()
    return HostCopies(lib, device, queue) if lib is not None else None


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
    if want == "command_buffer":
        ext = command_buffer.CommandBufferExt(lib, device, queue, printf)
        if ext.why is not None:
            raise CompileError(f"{ENV}=command_buffer: command buffers cannot be used on "
                               f"{where(device)}: {ext.why}")
        s = command_buffer.CommandBufferSubmit(lib, device, queue, bound, ext)
        s.why = f"command buffer ({ext.describe()}), 1 enqueue per launch sequence" + forced
        return s
    s = CtypesSubmit(lib, device, queue, bound)
    s.why = "ctypes, 1 enqueue per launch" + forced
    return s
