"""The buffers fed every step (inputs, targets, the step's scalars) on a GPU: their three arenas
are sub-buffers of one allocation, mirrored by one pinned host buffer, so that a step's uploads
are conversions into pinned memory and then one copy the device reads by DMA.

A step staged three arenas with three copies before (an enqueue each, ~4-7 us of host time, and
each copy's own latency on the device before the plan kernel could start). ``Executor.staged``
groups a step's ``stage`` calls; the copy covers every buffer staged in the group and the gaps
between them where no other buffer lies (alignment padding), and splits where one does, so that
a buffer the device wrote (``step:ok``, a resident gather's batch) is never overwritten with the
mirror's stale bytes.
"""
import numpy as np

FED = ("input", "target", "scalar")


def copy_runs(dirty, buffers):
    """The element ranges to copy for ``dirty`` ranges (staged buffers, in the parent's
    elements): sorted, each run extended over a gap only where no range of ``buffers`` (every
    buffer of the fed arenas) lies in it."""
    runs = []
    for lo, hi in sorted(dirty):
        if runs and not any(a < lo and b > runs[-1][1] for a, b in buffers):
            runs[-1][1] = max(runs[-1][1], hi)
        else:
            runs.append([lo, hi])
    return [tuple(r) for r in runs]


class FedStaging:
    """The fed arenas of ``plan`` as sub-buffers of one parent allocation, and its pinned mirror.
    ``mems``: {role: sub-buffer} for the executor's arenas."""

    def __init__(self, cl, ctx, queue, device, plan, np_dtype, copies):
        item = np.dtype(np_dtype).itemsize
        align = max(device.mem_base_addr_align // 8, item)     # a sub-buffer's origin
        self.at, end = {}, 0                                    # role: first element
        for role in FED:
            if plan.arenas.get(role):
                end = -(-end * item // align) * align // item
                self.at[role] = end
                end += plan.arenas[role]
        self.cl, self.queue, self.item, self.copies = cl, queue, item, copies
        self.size = max(end, 1)
        self.parent = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, self.size * item)
        self.mems = {role: self.parent.get_sub_region(at * item, plan.arenas[role] * item)
                     for role, at in self.at.items()}
        pinned = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.ALLOC_HOST_PTR,
                           self.size * item)
        self.host, _ = cl.enqueue_map_buffer(queue, pinned, cl.map_flags.WRITE, 0, (self.size,),
                                             np_dtype, is_blocking=True)
        self._pinned = pinned
        self.buffers = [(self.at[b.role] + b.offset, self.at[b.role] + b.offset + b.size)
                        for b in plan.buffers.values() if b.role in self.at and b.size]
        self.dirty = []
        self.runs = {}            # copy_runs of each tuple of dirty ranges seen (a step's recur)
        self.depth = 0            # open Executor.staged groups
        self.copied_at = None     # the executor's sync count when the last copy was enqueued
        self.copies_enqueued = 0

    def has(self, role):
        return role in self.at

    def stage(self, buffer, array):
        """Convert ``array`` into the mirror at ``buffer``'s place (the executor first waits
        where a copy out of the mirror may not have run: no sync since ``copied_at``)."""
        lo = self.at[buffer.role] + buffer.offset
        src = np.asarray(array).reshape(-1)
        assert src.size == buffer.size, (buffer.name, src.size, buffer.size)
        np.copyto(self.host[lo:lo + buffer.size], src, casting="unsafe")   # as astype rounds
        self.dirty.append((lo, lo + buffer.size))

    def flush(self, syncs):
        """Enqueue the copies of what was staged since the last flush; ``syncs``: the executor's
        count of queue syncs now (kept in ``copied_at`` when a copy is enqueued)."""
        key = tuple(self.dirty)
        runs = self.runs.get(key)
        if runs is None:
            runs = self.runs[key] = copy_runs(self.dirty, self.buffers)
        for lo, hi in runs:
            if self.copies is not None:
                self.copies.write(self.parent, lo * self.item, (hi - lo) * self.item,
                                  self.host[lo:].ctypes.data)
            else:
                self.cl.enqueue_copy(self.queue, self.parent, self.host[lo:hi],
                                     dst_offset=lo * self.item, is_blocking=False)
            self.copies_enqueued += 1
            self.copied_at = syncs
        self.dirty = []
