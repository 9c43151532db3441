"""Data kept on the device: the arrays of one upload and runs of steps on them, each step the
plan's gather launch, a launch sequence and the record launch (plan.resident; rendered by
compiler/resident.py), enqueued with no host work between steps. The host writes a run's batch
order (and, for training, the optimizer's scalars per step number) once, and reads its losses
once at the end."""
import itertools
import weakref

import numpy as np

from . import abi
from .plan_kernel import Run

_tags = itertools.count()
# Steps enqueued between flushes of the queue, so that the device starts on a long run at once.
FLUSH_EVERY = 8


class DeviceArrays:
    """The device half of ``model.upload``: one buffer per fed buffer of the plan (all samples),
    the run's order, counters, scalar table and loss history (room for ``capacity`` steps), and
    the gather and record kernels bound to them."""

    def __init__(self, executor, arrays, capacity):
        cl, ex = executor.cl, executor
        res = ex.plan.resident
        self.ex, self.res, self.capacity = ex, res, capacity
        self.samples = len(arrays[0])
        flags = cl.mem_flags
        batch, item = ex.plan.batch, ex.item
        buffers = {f"src{i}": cl.Buffer(ex.ctx, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=a)
                   for i, a in enumerate(arrays)}
        buffers["order"] = cl.Buffer(ex.ctx, flags.READ_ONLY, capacity * batch * 4)
        buffers["counters"] = cl.Buffer(ex.ctx, flags.READ_WRITE, 16)
        buffers["history"] = cl.Buffer(ex.ctx, flags.READ_WRITE, capacity * res.width * item)
        if res.train:
            buffers["table"] = cl.Buffer(ex.ctx, flags.READ_ONLY, capacity * res.scalars * item)
        self.buffers = buffers
        program = ex.resident_program()
        tag = next(_tags)
        self.gather, self.record = Run(f"{res.gather.name}#{tag}"), Run(f"{res.record.name}#{tag}")
        for launch, run in ((res.gather, self.gather), (res.record, self.record)):
            k = ex.bind(launch, cl.Kernel(program, launch.kernel), run.name)
            for j, name in enumerate(res.extra[launch.kernel]):
                k.set_arg(abi.width(launch.args) + j, buffers[name])
        weakref.finalize(self, ex.forget, (self.gather.name, self.record.name))
        ex.queue.finish()           # the arrays are on the device; the caller may change its own

    @property
    def nbytes(self):
        return sum(b.size for b in self.buffers.values())

    def begin(self, order, table=None):
        """Start a run of ``len(order)`` steps: ``order`` (steps, batch) sample indices, ``table``
        (steps, the plan's scalar count) the scalars of the run's 1st, 2nd, ... finite step."""
        cl, ex = self.ex.cl, self.ex
        assert len(order) <= self.capacity
        order = np.ascontiguousarray(order, np.uint32)
        cl.enqueue_copy(ex.queue, self.buffers["order"], order, is_blocking=False)
        ex._pending.append(order)
        if table is not None:
            table = np.ascontiguousarray(table, ex.np_dtype)
            cl.enqueue_copy(ex.queue, self.buffers["table"], table, is_blocking=False)
            ex._pending.append(table)
        cl.enqueue_fill_buffer(ex.queue, self.buffers["counters"], np.uint32(0), 0, 16)
        if self.res.halt:
            ex.write(self.res.halt, np.zeros(1))

    def steps(self, seq, n):
        """Enqueue ``n`` steps of launch sequence ``seq``, through the executor's submitter."""
        items = [self.gather, *seq, self.record]
        run, flush = self.ex.submit.run, self.ex.queue.flush
        for i in range(n):
            run(items)
            if i % FLUSH_EVERY == 0:
                flush()

    def step_checked(self, run_seq, seq):
        """One step with ``run_seq(seq)`` running the plan's launches (check_finite,
        check_extents, debug_buffers: a launch at a time, which may raise)."""
        cl, ex = self.ex.cl, self.ex
        for run in (self.gather, None, self.record):
            if run is None:
                run_seq(seq)
                continue
            k, g, loc = ex.bound[run.name]
            cl.enqueue_nd_range_kernel(ex.queue, k, g, loc)
            ex.queue.finish()

    def end(self, steps):
        """(history (steps, width) of the run, counters [step, finite steps, ...]); clears the
        halt so that train_step is unaffected."""
        cl, ex = self.ex.cl, self.ex
        if self.res.halt:
            ex.write(self.res.halt, np.zeros(1))
        history = np.empty((steps, self.res.width), ex.np_dtype)
        counters = np.empty(4, np.uint32)
        if steps:
            cl.enqueue_copy(ex.queue, history, self.buffers["history"], is_blocking=False)
        cl.enqueue_copy(ex.queue, counters, self.buffers["counters"], is_blocking=True)
        ex._synced()
        return history, counters

    def read_samples(self, index):
        """Host copies of samples ``index`` of every fed buffer (a diagnosis reads them)."""
        cl, ex = self.ex.cl, self.ex
        out = []
        for i, (_, row) in enumerate(self.res.fed):
            a = np.empty((len(index), row), ex.np_dtype)
            for j, s in enumerate(index):
                cl.enqueue_copy(ex.queue, a[j], self.buffers[f"src{i}"],
                                src_offset=int(s) * row * ex.item, is_blocking=False)
            out.append(a)
        ex.queue.finish()
        return out
