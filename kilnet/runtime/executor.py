"""Running a plan: allocate arenas, build kernels, set every argument once, then each step is
uploads, enqueues of pre-bound kernels, and reads. The executor knows buffers and launches,
never layers.

Arguments are set once, in the constructor, and never changed: a command buffer (submit.py)
captures them when it records a launch sequence."""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import CompileError, MemoryCheckError
from . import device as devmod
from . import abi, extents, staging, submit
from .extents import SENTINEL
from .plan_kernel import PlanKernelSubmit, groups_for, options as plan_kernel_options
from .program import build, build_all, missing_from, processes_for
from .progress import BuildProgress

NP_DTYPE = {"float32": np.float32, "float64": np.float64}
GUARD = 64      # elements of guard before and after each buffer with debug_buffers (keeps alignment)
# Implementations whose compiler builds the plan kernel from a second thread while this one builds
# the rest (measured to overlap there); elsewhere one at a time: Oclgrind's build crashed the
# process (SIGSEGV) once in a CI run of tests/oclgrind_plan_kernel.py so.
CONCURRENT_BUILDS = ("nvidia",)


def limits(kernel, device):
    """(local memory ``kernel`` needs, its largest work-group, the device's local memory), in
    bytes and work-items; one function so that tests can stand in a smaller device."""
    import pyopencl as cl
    info = cl.kernel_work_group_info
    return (kernel.get_work_group_info(info.LOCAL_MEM_SIZE, device),
            kernel.get_work_group_info(info.WORK_GROUP_SIZE, device), device.local_mem_size)


class Executor:
    def __init__(self, plan, device=None, poison=False):
        import pyopencl as cl
        self.cl = cl
        self.plan = plan
        # What kn.compile read of the environment (Model gives a plan made by lower() alone the
        # environment's settings as it is built)
        self.settings = settings = plan.settings
        self.device = devmod.select(device, settings)
        self.np_dtype = NP_DTYPE[plan.dtype]
        self.item = np.dtype(self.np_dtype).itemsize
        self._check_device()
        self.ctx, self.queue, _ = dc = self._dc = devmod.context(self.device)
        self.lock = threading.Lock()
        self._late, self._launch_names = threading.Lock(), None
        self._pending = []
        # filled below; the submitter reads it at run time. Kernels only the plan kernel's
        # phases use are built the first time anything asks for them (_bind_deferred).
        self.bound = _Bound(self._bind_deferred)
        self.submit = submit.choose(self.device, self.queue, self.bound,
                                    printf=any("printf" in s for s in plan.sources.values()),
                                    setting=settings.enqueue)
        # The step's own copies (stage, a blocking read_span) through ctypes where launches go
        # that way; _syncs counts the blocking reads of the queue, after which (the queue runs in
        # order) every copy enqueued before them has run.
        self._copies = submit.host_copies(self.submit, self.device, self.queue)
        self._syncs = 0
        # The fed arenas staged through one pinned mirror (staging.py), on GPUs only: a CPU
        # device reads host memory as it is (measured alike there, 0.11 ms either way for 1 MB
        # of float64).
        self._fed = None
        self._group = _Group(self)
        groups = groups_for(self.device, settings.plan_groups) if plan.plan_kernel else None
        self.build_report = {}          # build_all's counts: programs, cached, children, ...
        self._deferred = self._phase_only()
        programs = self._build_all([k for k in plan.sources if k not in self._deferred])
        now = [la for la in plan.launches if la.kernel in programs]
        kernels = self._kernels(now, programs)
        self._alloc(poison)
        for launch in now:
            self.bind(launch, kernels[launch.name])
        self.plan_kernel_why = plan.plan_kernel_why
        if plan.plan_kernel is not None:
            self._use_plan_kernel(programs[plan.plan_kernel.name], groups)
        if self.plan_kernel_why is not None:      # no plan kernel here: every launch runs alone
            self._bind_deferred()

    def _phase_only(self):
        """The kernels whose every launch is a phase of the plan kernel: a step runs them inside
        it, so they are built only when something runs one of those launches alone (a profile,
        check_finite, a test against separate launches). W1 at batch 64 on an H200 from a cold
        cache: 36 of its 38 programs, which took 2-4 s of NVIDIA's compiler besides the plan
        kernel's 2 s."""
        pk = self.plan.plan_kernel
        if pk is None:
            return set()
        alone = {la.kernel for la in self.plan.launches if la.name not in pk.index}
        return {la.kernel for la in self.plan.launches} - alone - {pk.name}

    def _kernels(self, launches, programs):
        """{launch name: its kernel} for ``launches``, made from their built ``programs`` and
        checked against the device (_check_kernels)."""
        kernels = {la.name: self.cl.Kernel(programs[la.kernel], la.kernel) for la in launches}
        self._check_kernels(launches, kernels)
        return kernels

    def _bind_deferred(self, name=None):
        """Build and bind the deferred kernels (_phase_only), all at once: the first launch run
        alone is seldom the last. ``name``: the launch asked for (a KeyError if no launch of the
        plan has that name)."""
        if name is not None and name not in self._by_name():
            raise KeyError(name)
        with self._late:
            if self._deferred:
                names, self._deferred = sorted(self._deferred), set()
                programs = self._build_all(names)
                late = [la for la in self.plan.launches if la.kernel in programs]
                kernels = self._kernels(late, programs)
                for launch in late:
                    self.bind(launch, kernels[launch.name])

    def _by_name(self):
        if self._launch_names is None:
            self._launch_names = {la.name for la in self.plan.launches}
        return self._launch_names

    def _build_all(self, names):
        """{kernel name: its built program} for kernels ``names``: each source on its own (so
        that models sharing a kernel share its program and cached binary), the plan kernel from a
        second thread meanwhile (CONCURRENT_BUILDS). NVIDIA's compiler, W1 at batch 64: 3.7 s for
        the plan kernel and 4.8 s for the other 36 one after the other; at once they overlapped
        by 1.3 s. The 36 as one program built in 3.5 s instead of 4.8; where the implementation is
        one of program.TOGETHER, build_all builds them so, each kernel still found alone in the
        cache (the tuner builds a model once per candidate, one kernel's schedule changed)."""
        plan = self.plan
        pk = plan.plan_kernel.name if plan.plan_kernel is not None else None

        def options(name):
            return plan_kernel_options(self.device) if name == pk else ()

        def one(name):
            return self.program(name, plan.sources[name], options(name))
        items = [(k, plan.sources[k], options(k)) for k in names]
        if pk not in names or devmod.implementation(self.device) not in CONCURRENT_BUILDS:
            part = {}
            out = build_all(self._dc, items,
                             cache_dir=self.settings.cache, dump=self.settings.dump_kernels,
                             where=devmod.index_of(self.device),
                             processes=processes_for(self.settings.build_processes),
                             report=part)
            for key, n in part.items():         # a deferred build adds to the first's
                self.build_report[key] = self.build_report.get(key, 0) + n
            return out
        todo = {k for k, _s, _o in missing_from(self._dc, items, self.settings.cache)}
        with BuildProgress(len(todo), self.device.name.strip()) as progress:
            def counted(name):
                program = one(name)
                if name in todo:
                    progress.built()
                return program
            with ThreadPoolExecutor(1) as pool:
                big = pool.submit(counted, pk)
                out = {k: counted(k) for k in names if k != pk}
                out[pk] = big.result()
        return out

    def bind(self, launch, k, name=None):
        """Set every argument of kernel ``k`` for ``launch`` (policy/abi.py: an arena pointer and
        element offset per buffer argument, a value per by-value one) and register it for the
        submitters under ``name`` (default the launch's)."""
        abi.bind(k, launch.args, lambda a: self._mem(a.buffer),
                 lambda a: self._offset(a.buffer) + a.start, self.np_dtype)
        self.bound[name or launch.name] = (k, launch.global_size, launch.local_size)
        return k

    def forget(self, names):
        """Unbind launches ``names`` (bound with ``bind`` under those names) and drop what the
        submitter kept for them: data kept on the device binds its own, and lets them go."""
        for name in names:
            self.bound.pop(name, None)
        self.submit.forget(names)

    def program(self, name, source, options=()):
        """The program of ``source``, built (or loaded from the cache) with the plan's settings."""
        return build(self._dc, name, source, options, cache_dir=self.settings.cache,
                     dump=self.settings.dump_kernels)

    def resident_program(self):
        """The program of the plan's gather and record launches (plan.resident), built on first
        use: a model never given device data never builds it."""
        if getattr(self, "_resident_program", None) is None:
            self._resident_program = self.program("resident", self.plan.resident.source)
        return self._resident_program

    def _use_plan_kernel(self, program, groups):
        """Submit through the plan kernel where it fits the device (else say why not)."""
        cl, name = self.cl, self.plan.plan_kernel.name
        local, group, has = limits(cl.Kernel(program, name), self.device)
        lanes = self.plan.plan_kernel.lanes
        if local > has or lanes > group:
            self.plan_kernel_why = (f"it needs {local} bytes of local memory ({has} here) and "
                                    f"work-groups of {lanes} (at most {group} here)")
            return
        self.empty = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, self.item)
        self.submit = PlanKernelSubmit(self.submit, self, lambda: cl.Kernel(program, name),
                                       groups)
        self.plan_kernel_why = None

    def _check_device(self):
        d, plan = self.device, self.plan
        where = f"{d.name.strip()} ({d.platform.name.strip()})"
        if plan.dtype == "float64" and not d.double_fp_config:
            raise CompileError(f"dtype float64 needs fp64, which device {where} lacks")
        for launch in plan.launches:
            if launch.local_size:
                n = int(np.prod(launch.local_size))
                if n > d.max_work_group_size:
                    raise CompileError(f"kernel {launch.name}: work-group of {n} exceeds the "
                                       f"device's limit of {d.max_work_group_size} on {where}")
        need = sum(plan.arenas.values()) * self.item
        if need > d.global_mem_size:
            raise CompileError(f"the plan needs {need / 2**20:.1f} MiB of device memory; {where} "
                               f"has {d.global_mem_size / 2**20:.1f} MiB")

    def _check_kernels(self, launches, kernels):
        """What each built kernel needs against what the device gives it, before it is bound."""
        d = self.device
        where = f"{d.name.strip()} ({d.platform.name.strip()})"
        for launch in launches:
            local, group, has = limits(kernels[launch.name], d)
            if local > has:
                raise CompileError(f"kernel {launch.kernel} (launch {launch.name}) needs {local} "
                                   f"bytes of local memory; {where} has {has}")
            n = int(np.prod(launch.local_size)) if launch.local_size else 0
            if n > group:
                raise CompileError(f"kernel {launch.kernel} (launch {launch.name}) is launched in "
                                   f"work-groups of {n}; {where} runs it in at most {group}")

    def _alloc(self, poison):
        cl, plan = self.cl, self.plan
        flags = cl.mem_flags.READ_WRITE
        # Under Oclgrind every buffer is exactly its size: Oclgrind checks each access against
        # its allocation, reads included, which guards would hide.
        self.guard = 0 if "oclgrind" in self.device.platform.name.lower() else GUARD
        if plan.debug_buffers:
            # Every buffer its own allocation, its data between two guards of SENTINEL: a write
            # just past either end changes a guard (checked after each launch); one further out
            # leaves the allocation.
            self.sentinel = SENTINEL[self.np_dtype]
            g = self.guard
            self.mems = {b.name: cl.Buffer(self.ctx, flags, max(b.size + 2 * g, 1) * self.item)
                         for b in plan.buffers.values()}
            for mem in self.mems.values():
                if g:
                    cl.enqueue_fill_buffer(self.queue, mem, self.sentinel, 0, mem.size)
                cl.enqueue_fill_buffer(self.queue, mem, self.np_dtype(0), g * self.item,
                                       mem.size - 2 * g * self.item)
        else:
            if self.stages(self.device):
                self._fed = staging.FedStaging(cl, self.ctx, self.queue, self.device, plan,
                                               self.np_dtype, self._copies)
                cl.enqueue_fill_buffer(self.queue, self._fed.parent, self.np_dtype(0), 0,
                                       self._fed.parent.size)
            fed = self._fed.mems if self._fed is not None else {}
            self.mems = {role: fed[role] if role in fed else
                         cl.Buffer(self.ctx, flags, max(n, 1) * self.item)
                         for role, n in plan.arenas.items() if n}
            for role, mem in self.mems.items():
                if role not in fed:
                    cl.enqueue_fill_buffer(self.queue, mem, self.np_dtype(0), 0, mem.size)
        if poison:
            for name in plan.poisonable:
                b = plan.buffers[name]
                self.write(name, np.full(b.size, np.nan, self.np_dtype))
        self.queue.finish()

    def _mem(self, name):
        b = self.plan.buffers[name]
        return self.mems[name if self.plan.debug_buffers else b.role]

    def _offset(self, name):
        return self.guard if self.plan.debug_buffers else self.plan.buffers[name].offset

    def write(self, name, array):
        b = self.plan.buffers[name]
        data = np.ascontiguousarray(array, dtype=self.np_dtype).reshape(-1)
        assert data.size == b.size, (name, data.size, b.size)
        self.cl.enqueue_copy(self.queue, self._mem(name), data,
                             dst_offset=self._offset(name) * self.item, is_blocking=False)
        self._pending.append(data)   # a non-blocking copy reads it later; keep it alive

    @staticmethod
    def stages(device):
        """Whether feeds, targets and the step's scalars go through pinned staging (GPUs)."""
        import pyopencl as cl
        return bool(device.type & cl.device_type.GPU)

    def stage(self, name, array):
        """``write``, for buffers fed every step (inputs, targets, the step's scalars): on a GPU
        converted straight into a pinned mirror of their arenas that the device reads by DMA
        (staging.py), inside ``staged()`` one copy for all of a step's. Pageable memory costs a
        conversion and then a driver copy: W2's batch of 32 (1 MB of float64 feeds and targets)
        took 0.31 ms that way and 0.20 ms staged on an H200 (float32 feeds: 0.13 and 0.12 ms)."""
        b = self.plan.buffers[name]
        if self._fed is None or not self._fed.has(b.role):
            return self.write(name, array)
        if self._fed.copied_at == self._syncs:     # its last copy may still read the mirror
            self.finish()
        self._fed.stage(b, array)
        if not self._fed.depth:
            self._fed.flush(self._syncs)

    def staged(self):
        """Group ``stage`` calls (``with executor.staged(): ...``): their copies are enqueued
        together when the group ends."""
        return self._group

    def read(self, name):
        b = self.plan.buffers[name]
        out = np.empty(b.size, self.np_dtype)
        self.cl.enqueue_copy(self.queue, out, self._mem(name),
                             src_offset=self._offset(name) * self.item, is_blocking=True)
        self._synced()
        return out

    def _synced(self):
        """The queue has run everything enqueued so far (a blocking read returned)."""
        self._pending.clear()
        self._syncs += 1

    def _spans(self, role, lo, hi):
        """(allocation, element offset in it, element range in the role's layout) covering
        elements [lo, hi) of ``role``'s arena: one piece, or with debug_buffers one per buffer
        of that role inside the range (the gaps between buffers are padding)."""
        if not self.plan.debug_buffers:
            return [(self.mems[role], lo, lo, hi)] if hi > lo else []
        return [(self.mems[b.name], self.guard, b.offset, b.offset + b.size)
                for b in self.plan.buffers.values()
                if b.role == role and b.size and lo <= b.offset and b.offset + b.size <= hi]

    def read_span(self, role, lo, hi, out, blocking=True, queue=None, wait_for=None):
        """Copy elements [lo, hi) of ``role``'s arena into ``out[lo:hi]`` (``out`` is laid out
        like the arena); returns the copies' events (each done once its data is in ``out``).
        ``queue``: another queue of the same context (then ``wait_for`` orders it)."""
        spans = self._spans(role, lo, hi)
        if blocking and queue is None and self._copies is not None:
            for mem, off, a, b in spans:
                dst = out[a:b]
                assert dst.flags.c_contiguous and dst.dtype == self.np_dtype, (dst.flags, dst.dtype)
                self._copies.read(mem, off * self.item, dst.nbytes, dst.ctypes.data)
            self._synced()
            return []
        events = [self.cl.enqueue_copy(queue or self.queue, out[a:b], mem,
                                       src_offset=off * self.item, is_blocking=False,
                                       wait_for=wait_for)
                  for mem, off, a, b in spans]
        if blocking:
            self.cl.wait_for_events(events) if events else None
            if queue is None:
                self._synced()           # the queue is in order: the writes before have run
        return events

    def write_span(self, role, lo, hi, src):
        """Enqueue copies of ``src[lo:hi]`` into elements [lo, hi) of ``role``'s arena; ``src``
        must stay unchanged until the queue has run them."""
        for mem, off, a, b in self._spans(role, lo, hi):
            self.cl.enqueue_copy(self.queue, mem, src[a:b], dst_offset=off * self.item,
                                 is_blocking=False)

    def flush(self):
        self.queue.flush()

    def run(self, launches, after=None):
        """Enqueue ``launches`` in order, through the submission path chosen for this executor;
        ``after(launch)`` (debug) runs after each one. With debug_buffers every launch is waited
        for and its buffers' guards checked; with check_extents each runs confined to the ranges
        its arguments declare (extents.py). Launches waited for one at a time go through
        pyopencl: the wait costs far more than the enqueue."""
        if self.plan.debug_buffers and self.guard:
            then = after

            def after(launch):
                self._check_guards(launch)
                if then is not None:
                    then(launch)
        if after is None and not self.plan.check_extents:
            self.submit.run(launches)
            return
        enqueue = self.cl.enqueue_nd_range_kernel
        for launch in launches:
            if self.plan.check_extents:
                extents.run(self, [launch])
            else:
                k, g, loc = self.bound[launch.name]
                enqueue(self.queue, k, g, loc)
                self.queue.finish()
            if after is not None:
                after(launch)

    def _check_guards(self, launch):
        cl, n, item = self.cl, self.guard, self.item
        guards = []
        for arg, name in launch.buffers.items():
            mem = self.mems[name]
            for side, at in (("before", 0), ("after", mem.size // item - n)):
                g = np.empty(n, self.sentinel.dtype)
                cl.enqueue_copy(self.queue, g, mem, src_offset=at * item, is_blocking=False)
                guards.append((arg, name, side, at, g))
        self.queue.finish()
        damaged = [(arg, name, side, at, np.flatnonzero(g != self.sentinel))
                   for arg, name, side, at, g in guards if (g != self.sentinel).any()]
        if damaged:
            for _, name, _, at, _ in damaged:     # so that a later call reports only its own
                cl.enqueue_fill_buffer(self.queue, self.mems[name], self.sentinel, at * item,
                                       n * item)
            self.queue.finish()
            arg, name, side, _, changed = damaged[0]
            reach = n - changed[0] if side == "before" else changed[-1] + 1
            raise MemoryCheckError(
                f"Invalid write by kernel {launch.kernel} (launch {launch.name}): {changed.size} "
                f"of the {n} guard elements {side} buffer {name!r} (argument {arg}) were "
                f"overwritten, reaching {reach} element(s) {side} its data")

    def finish(self):
        self.queue.finish()
        self._synced()


class _Group:
    """``Executor.staged()``: a context that holds the fed copies until it ends (nested: the
    outermost end)."""

    def __init__(self, ex):
        self.ex = ex

    def __enter__(self):
        if self.ex._fed is not None:
            self.ex._fed.depth += 1

    def __exit__(self, *exc):
        fed = self.ex._fed
        if fed is not None:
            fed.depth -= 1
            if not fed.depth:
                fed.flush(self.ex._syncs)
        return False


class _Bound(dict):
    """The executor's bound launches: {name: (kernel, global size, local size)}. A name missing
    is first handed to ``late`` (which binds the deferred kernels, or raises KeyError)."""

    def __init__(self, late):
        super().__init__()
        self._late = late

    def __missing__(self, name):
        self._late(name)
        return dict.__getitem__(self, name)
