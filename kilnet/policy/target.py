"""What the compiler needs to know of the device it specialises for (no OpenCL objects), and
every KILNET_* setting that shapes a kernel (kilnet/settings.py), so that a plan says why it is
as it is."""
from dataclasses import dataclass, field, replace

from ..errors import CompileError
from ..runtime.device import implementation
from ..settings import read as read_settings
from . import schedule as sched
from .cpu_gemm import CPU_PRODUCTS
from .schedule_table import load_table, table_path

# Why these tables are what they are: docs/concepts/tuning-notes.md, the section on each line.
FORMS = {"intel": "cpu", "pocl": "cpu"}   # the kernel form per implementation; others by device
#                                          type. tuning-notes.md#forms
PLAN_KERNEL = ("nvidia",)   # implementations whose steps run as one plan kernel by default
#                             (KILNET_PLAN_KERNEL=1|0). tuning-notes.md#plan_kernel
VECTOR_HINTS = ("intel",)   # implementations whose CPU-form kernels on vectors say so
#                             (vec_type_hint). tuning-notes.md#vector_hints
# ... and those that cannot run one (tuning-notes.md#no_plan_kernel).
NO_PLAN_KERNEL = {"pocl": "PoCL had not compiled a 15-phase plan kernel after 2 minutes (it "
                          "turns a work-group into loops split at every barrier)",
                  "intel": "Intel's CPU compiler (2026.22) crashed in about half of the builds of "
                           "a plan kernel (a segfault in its ReduceCrossBarrierValuesPass)"}

@dataclass(frozen=True)
class Target:
    kind: str                  # "cpu": barrier-free vector kernels; "gpu": local-memory tiles
    max_work_group: int = 256
    compute_units: int = 16
    local_mem: int = 32768     # bytes
    name: str = ""
    implementation: str = ""   # intel, pocl, nvidia, ... (runtime.device.implementation)
    driver: str = ""           # the driver version: part of the key of a tuned schedule table
    plan_kernel: bool = False  # run launch sequences as one plan kernel (compiler/plan_kernel.py)
    plan_merge: bool = True    # independent phases of it share a stage (plan_kernel.stages)
    # train_step's optimizer sums gradients that plain column sums would store
    # (compiler/summed_updates.py); off unless KILNET_UPDATE_SUMS=1 (tuning-notes.md#update_sums)
    update_sums: bool = False
    vector_bytes: int = 32     # a CPU form's explicit vector: one register (vector_bytes_of)
    cpu_products: str = None   # KILNET_CPU_PRODUCTS: a CPU_PRODUCTS key to use instead of its own
    table: str = None          # the schedule table laid over the policy (its path), or None
    # {launch name or kernel family: Schedule}: overrides laid over the policy (policy/schedule.py)
    schedules: dict = field(default=None, hash=False, repr=False)

    @property
    def vector_hints(self):
        """Whether kernels of the CPU form that compute on vectors say so (VECTOR_HINTS)."""
        return self.kind == "cpu" and self.implementation in VECTOR_HINTS

    @property
    def lanes(self):
        """With a plan kernel, the one work-group size of every launch whose body requires one
        (a plan kernel has one work-group size; a launch that needs another runs apart); else
        None, and each launch's schedule chooses its own."""
        return min(sched.GROUP_LANES, self.max_work_group) if self.plan_kernel else None

    def schedule(self, kind, name, ctype="float", **shape):
        """The schedule of launch ``name`` of family ``kind``: the one policy's, overridden by this
        target's table (policy/schedule.py)."""
        return sched.choose(self, kind, name, ctype, **shape)

    @classmethod
    def of(cls, device, settings=None):
        """The device's target: the form FORMS gives its implementation, else the one its type
        suggests. ``settings`` (kilnet/settings.py; default: read now) may force a form
        (KILNET_TARGET=cpu|gpu: to test both on one device, e.g. under Oclgrind), the plan
        kernel, the vector width and the CPU products. Its schedule overrides come from the
        table ``schedule_table.table_path`` names."""
        import pyopencl as cl
        settings = settings if settings is not None else read_settings()
        check(settings)
        impl = implementation(device)
        kind = (settings.target or FORMS.get(impl)
                or ("cpu" if device.type & cl.device_type.CPU else "gpu"))
        one = settings.plan_kernel
        if one == "1" and impl in NO_PLAN_KERNEL:
            raise CompileError(f"KILNET_PLAN_KERNEL=1 on {device.name.strip()}: "
                               f"{NO_PLAN_KERNEL[impl]}")
        target = cls(kind, device.max_work_group_size, device.max_compute_units,
                     device.local_mem_size, device.name.strip(), impl,
                     device.driver_version.strip(),
                     one == "1" if one else impl in PLAN_KERNEL, settings.plan_merge != "0",
                     settings.update_sums == "1", vector_bytes_of(device, settings.vector_bytes),
                     settings.cpu_products)
        path = table_path(target, settings)
        return target if path is None else replace(target, schedules=load_table(path),
                                                   table=path)


def check(settings):
    """The settings whose values the compiler's own tables decide (a CompileError naming the
    variable, before any device work)."""
    if settings.cpu_products and settings.cpu_products not in CPU_PRODUCTS:
        raise CompileError(f"KILNET_CPU_PRODUCTS must be one of {sorted(CPU_PRODUCTS)}, "
                           f"got {settings.cpu_products!r}")


# The explicit vector of the CPU forms is the device's native float vector: 32 bytes with AVX2,
# 64 with AVX-512 (tuning-notes.md#vector_bytes).
VECTOR_BYTES = (16, 64)    # the range taken: SSE to AVX-512


def vector_bytes_of(device, forced=None):
    """``forced`` (KILNET_VECTOR_BYTES, 16, 32 or 64: to check one width's kernels on any device,
    e.g. under Oclgrind, whose device reports 1 float), else the device's native float vector."""
    if forced:
        return int(forced)
    lo, hi = VECTOR_BYTES
    return max(lo, min(hi, 4 * device.native_vector_width_float))


GPU = Target("gpu")
