"""Running launches with every pointer argument confined to the range it declares.

Whatever runs launches in another order or together (the plan kernel's merged stages, fusion,
buffer reuse, export's bounds checks) trusts each launch's declared arguments: arena, offset,
extent and access (``Arg``; kernels.base.Use). This runs a launch so that a wrong declaration shows:

- each pointer argument gets a buffer of its own holding exactly the ``extent`` elements it
  declares (copied from the arena), its offset argument pointing at them. Under Oclgrind (no
  guard) any access outside that range is an invalid access; elsewhere the buffer has GUARD
  elements of a signalling NaN on both sides, checked after the launch (a write outside) and
  read as NaN by any read outside;
- an ``out`` range starts as that NaN too: a kernel that reads it before writing it, or leaves
  an element of it unwritten, is caught (``out`` promises every element written, none read);
- an ``in`` range must come back unchanged;
- two arguments of one launch whose ranges overlap, one of them written, alias on purpose (an
  elementwise kernel whose two input gradients are one buffer): they stay bound to the arena,
  unconfined, and the launch's other arguments are confined as above.

Written ranges are copied back into the arena, so a sequence run this way must give the same
bits as the plain run: tests compare the two (tests/plan_checks.py).
"""
import numpy as np

from ..errors import MemoryCheckError
from . import abi

GUARD = 64
# Signalling NaNs with a fixed payload: arithmetic only ever makes quiet NaNs, so a kernel cannot
# write this pattern by accident, and a kernel reading a guard gets a NaN that shows in results
# (a kernel that only copies it passes the pattern on). SENTINEL fills guards, UNWRITTEN the
# ranges declared "out" before the launch.
SENTINEL = {np.float32: np.uint32(0x7F8A5A5A), np.float64: np.uint64(0x7FF4A5A5A5A5A5A5)}
UNWRITTEN = {np.float32: np.uint32(0x7F8B5B5B), np.float64: np.uint64(0x7FF5B5B5B5B5B5B5)}


def overlapping(launch, offset_of):
    """Pairs of pointer arguments of ``launch`` whose declared arena ranges overlap where one of
    them is written. ``offset_of(buffer)``: a buffer's offset in its arena."""
    spans = [(a, a.role, offset_of(a.buffer) + a.start, offset_of(a.buffer) + a.start + a.extent)
             for a in launch.buffer_args]
    return [(a.name, b.name) for i, (a, ra, lo, hi) in enumerate(spans)
            for b, rb, lo2, hi2 in spans[i + 1:]
            if ra == rb and lo < hi2 and lo2 < hi and "out" in a.access + b.access]


def run(ex, launches):
    """Run ``launches`` of executor ``ex`` one at a time, each confined to its declarations."""
    cl, queue, dtype = ex.cl, ex.queue, ex.np_dtype
    guard = 0 if "oclgrind" in ex.device.platform.name.lower() else GUARD
    sentinel, unwritten = SENTINEL[dtype], UNWRITTEN[dtype]
    for launch in launches:
        # Arguments whose ranges overlap, one written (add_norm(x, x): both input gradients are
        # x's), alias on purpose: they stay bound to the arena together, unconfined.
        aliased = {name for pair in overlapping(launch, lambda b: ex.plan.buffers[b].offset)
                   for name in pair}
        k, glob, loc = ex.bound[launch.name]
        temps = []
        for ptr in launch.buffer_args:
            if ptr.name in aliased:
                continue
            n = ptr.extent
            data = np.empty(n, dtype)
            cl.enqueue_copy(queue, data, ex._mem(ptr.buffer),
                            src_offset=(ex._offset(ptr.buffer) + ptr.start) * ex.item, is_blocking=True)
            host = np.full(n + 2 * guard, np.nan, dtype)
            host.view(sentinel.dtype)[:] = sentinel
            if ptr.access == "out":
                host.view(sentinel.dtype)[guard:guard + n] = unwritten
            else:
                host[guard:guard + n] = data
            mem = cl.Buffer(ex.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                            hostbuf=host)
            abi.bind_buffer(k, ptr, mem, guard)
            temps.append((ptr, mem, host, data))
        try:
            cl.enqueue_nd_range_kernel(queue, k, glob, loc)
            queue.finish()
            results = []
            for ptr, mem, host, data in temps:
                after = np.empty_like(host)
                cl.enqueue_copy(queue, after, mem, is_blocking=True)
                results.append(after)
            for (ptr, mem, host, data), after in zip(temps, results):
                _check(launch, ptr, guard, sentinel, unwritten, after, data)
            for (ptr, mem, host, data), after in zip(temps, results):
                if ptr.access != "in":
                    cl.enqueue_copy(queue, ex._mem(ptr.buffer), after[guard:guard + ptr.extent],
                                    dst_offset=(ex._offset(ptr.buffer) + ptr.start) * ex.item,
                                    is_blocking=True)
        finally:
            for ptr, mem, host, data in temps:      # the launch's own arguments again
                abi.bind_buffer(k, ptr, ex._mem(ptr.buffer), ex._offset(ptr.buffer) + ptr.start)


def _check(launch, ptr, guard, sentinel, unwritten, after, data):
    where = f"kernel {launch.kernel} (launch {launch.name}), argument {ptr.pointer_name} " \
            f"({ptr.access}, {ptr.extent} elements of {ptr.buffer})"
    bits = after.view(sentinel.dtype)
    for side, part in (("before", bits[:guard]), ("after", bits[guard + ptr.extent:])):
        changed = np.flatnonzero(part != sentinel)
        if changed.size:
            raise MemoryCheckError(f"{where}: wrote {changed.size} element(s) {side} its "
                                   f"declared range")
    inside = bits[guard:guard + ptr.extent]
    if ptr.access != "in" and (inside == sentinel).any():
        raise MemoryCheckError(f"{where}: {int((inside == sentinel).sum())} element(s) written "
                               f"with a value read from outside some argument's declared range "
                               f"(a guard's pattern), the first at "
                               f"{np.flatnonzero(inside == sentinel)[0]}")
    if ptr.access == "in" and inside.tobytes() != data.tobytes():
        changed = np.flatnonzero(inside != data.view(sentinel.dtype))
        raise MemoryCheckError(f"{where}: declared read-only, but the kernel changed "
                               f"{changed.size} element(s), the first at {changed[0]}")
    if ptr.access == "out" and (inside == unwritten).any():
        missed = np.flatnonzero(inside == unwritten)
        raise MemoryCheckError(f"{where}: declared written whole, but {missed.size} element(s) "
                               f"were not written (or were read before written), the first at "
                               f"{missed[0]}")
