"""Launch sequences through the plan kernel (compiler/plan_kernel.py): each run of consecutive
launches that are phases of it becomes one enqueue of the plan kernel, with a bitset buffer
naming those phases; a launch apart stays its own enqueue. Both go through the executor's
submission path (submit.py), so the plan kernel is one more pre-bound launch to it.

Work-groups: the grid barrier needs every work-group of the plan kernel running at once, which
OpenCL does not promise. On a GPU one work-group per compute unit fits (its local memory is that
of the largest phase, and a work-group of 256 always fits one unit's registers); CPU runtimes
may run work-groups one after another on a thread, so there the plan kernel takes one
work-group. KILNET_PLAN_GROUPS sets another count (for measurements). A wait at the barrier
that gives up flags the plan kernel (see compiler.plan_kernel.SPINS); the first run of each sequence is
checked, and a flag raises a DeviceError rather than returning wrong numbers.
"""
from collections import namedtuple

import numpy as np

from ..errors import DeviceError

GROUPS_ENV = "KILNET_PLAN_GROUPS"
# Spins of a work-group waiting at the grid barrier before it gives up and flags the plan kernel
# as not co-resident. A GPU spin is an L2 read (~0.5-1 us): 2^22 is seconds, far above any phase
# of a step; a CPU spins in nanoseconds.
SPINS_GPU, SPINS_CPU = 1 << 22, 1 << 31
Run = namedtuple("Run", "name")       # what a submitter needs of a launch: the name it is bound by


def options(device):
    """Build options of the plan kernel.

    - The newest OpenCL C from 2.0 on that the device takes, for its device-scope fences
      (compiler.plan_kernel.PRELUDE). OpenCL C 1.2 has only mem_fence, whose scope is the work-group:
      NVIDIA compiles it to membar.cta, which orders nothing between compute units (the plan
      kernel then read stale data on an H200), while an OpenCL C 2.0+ fence of device scope is
      membar.gl. NVIDIA's driver reports OpenCL C 1.2 but lists 3.0 among those it compiles.
    """
    if "oclgrind" in device.platform.name.lower():
        return []                # lists 3.0 but refuses -cl-std=CL3.0; runs one work-group
    try:
        versions = [v.version >> 22 for v in device.opencl_c_all_versions]   # CL_VERSION_MAJOR
    except Exception:            # before OpenCL 3.0 (pyopencl raises its own errors here)
        versions = []
    if 3 in versions:
        return ["-cl-std=CL3.0"]
    text = device.opencl_c_version.split()                  # "OpenCL C 2.0 ..."
    if len(text) > 2 and text[2] >= "2.0":
        return ["-cl-std=CL" + text[2]]
    return []


def groups_for(device, forced=None):
    """Work-groups of the plan kernel: ``forced`` (KILNET_PLAN_GROUPS, as the plan's settings
    read it), else one per compute unit of a GPU, else 1."""
    import pyopencl as cl
    if forced:
        return forced
    return device.max_compute_units if device.type & cl.device_type.GPU else 1


class PlanKernelSubmit:
    name = "plan kernel"

    def __init__(self, inner, executor, kernel_of, groups):
        import pyopencl as cl
        self.cl, self.inner, self.executor = cl, inner, executor
        self.pk = executor.plan.plan_kernel
        self.kernel_of, self.groups = kernel_of, groups
        self.spins = SPINS_GPU if executor.device.type & cl.device_type.GPU else SPINS_CPU
        flags = cl.mem_flags
        self.bar = cl.Buffer(executor.ctx, flags.READ_WRITE | flags.COPY_HOST_PTR,
                             hostbuf=np.zeros(4, np.uint32))
        self.items = {}            # tuple of launch names -> items for the inner submitter
        self.checked = set()
        self.bits = []             # keeps the bitset buffers alive with the kernels using them
        apart = f"; {len(self.pk.apart)} apart" if self.pk.apart else ""
        self.why = (f"plan kernel: {groups} work-group(s) of {self.pk.lanes}, 1 enqueue per run of "
                    f"its {len(self.pk.members)} phases in {len(self.pk.stages)} stages{apart}; launches apart and the plan kernel "
                    f"through {inner.why}")

    def run(self, launches):
        key = tuple(launch.name for launch in launches)
        items = self.items.get(key)
        if items is None:
            items = self.items[key] = self._split(launches)
        self.inner.run(items)
        if key not in self.checked:
            self._check(key)
            self.checked.add(key)

    def forget(self, names):
        """Drop the splits of sequences that hold any of launches ``names``."""
        for key in [k for k in self.items if any(n in k for n in names)]:
            del self.items[key]
            self.checked.discard(key)
        self.inner.forget(names)

    def _split(self, launches):
        """Items for the inner submitter: each stretch of plan-kernel phases as one bound plan
        kernel, the rest as they are. A run of the plan kernel takes its phases in plan order,
        each once (a bitset), so a phase that repeats, or comes before one already in the
        stretch, starts another run."""
        items, run = [], []
        index = self.pk.index
        for launch in launches:
            if launch.name in index:
                if run and index[launch.name] <= index[run[-1]]:
                    items.append(self._bind(run))
                    run = []
                run.append(launch.name)
                continue
            if run:
                items.append(self._bind(run))
                run = []
            items.append(launch)
        if run:
            items.append(self._bind(run))
        return items

    def _bind(self, names):
        """A kernel object of the plan kernel bound to run phases ``names``."""
        cl, ex = self.cl, self.executor
        k = self.kernel_of()
        for i, role in enumerate(self.pk.roles):
            k.set_arg(i, ex.mems.get(role) or ex.empty)
        bits = cl.Buffer(ex.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                         hostbuf=np.array(self.pk.bits(names), np.uint32))
        self.bits.append(bits)
        k.set_arg(len(self.pk.roles), bits)
        k.set_arg(len(self.pk.roles) + 1, self.bar)
        k.set_arg(len(self.pk.roles) + 2, np.uint32(self.spins))
        # Numbered: two runs may start and end alike (training's and inference's forward differ
        # only in batch norm's phase).
        span = f"{names[0]} .. {names[-1]}" if names else "no phase"
        name = f"{self.pk.name}#{len(self.bits)}[{span}]"
        lanes = self.pk.lanes
        ex.bound[name] = (k, (self.groups * lanes,), (lanes,))
        return Run(name)

    def _check(self, key):
        flag = np.zeros(4, np.uint32)
        self.cl.enqueue_copy(self.executor.queue, flag, self.bar, is_blocking=True)
        if flag[2]:
            raise DeviceError(
                f"the plan kernel's {self.groups} work-groups did not all run at once on "
                f"{self.executor.device.name.strip()} (a grid barrier wait gave up, running "
                f"{key[0]} .. {key[-1]}): its results are wrong. Set {GROUPS_ENV} lower, or "
                f"KILNET_PLAN_KERNEL=0 for separate launches")
