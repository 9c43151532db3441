"""What the compiler needs to know of the device it specialises for (no OpenCL objects), and
every KILNET_* setting that shapes a kernel (kilnet/settings.py), so that a plan says why it is
as it is."""
from dataclasses import dataclass, field, replace

from ..errors import CompileError
from ..runtime.device import implementation
from ..settings import read as read_settings
from . import schedule as sched

# The kernel form per implementation; other devices take theirs from their type. Measured with
# benchmarks/kernel_forms.py (median time of the cpu form / the gpu form, alternating calls, on a
# 2-core AMD EPYC, Zen 3, 2026-11-30; benchmarks/results/cpu-forms-and-implementations-*.txt):
#   intel: W1 train b1 0.24, b64 0.73, b256 0.88; W2 train b1 0.64, b32 0.44; W3 train b16 0.14;
#          forward b1 W1 0.07, W2 0.70. Its vectoriser does well with explicit vectors and no
#          barriers too, and the gpu form's barriers cost it more than they cost a GPU.
#   pocl:  the cpu form was tuned on it (it runs a work-group as a loop split at each barrier).
FORMS = {"intel": "cpu", "pocl": "cpu"}
# Implementations whose steps run as one plan kernel (compiler/persistent.py) by default; with
# KILNET_PLAN_KERNEL=1|0 it is on or off. On an H200 (benchmarks/results/nvidia-h200-plan-kernel-
# stages-2026-11-30.txt), with independent phases sharing a stage and launches of many
# work-groups apart, it made every W1-W3 train step as fast as separate launches or faster (W1
# b1 1.43x, b64 1.19x, b256 1.06x, b1024 1.00x; W2 b1 1.47x, b32 1.34x; W3 1.01x) and the
# forward passes at batch 1 1.23-1.37x, except W1's (8 launches): 0.89x.
PLAN_KERNEL = ("nvidia",)
# ... and those that cannot run one.
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
    plan_kernel: bool = False  # run launch sequences as one plan kernel (compiler/persistent.py)
    plan_merge: bool = True    # independent phases of it share a stage (persistent.stages)
    # train_step's optimizer sums gradients that plain column sums would store
    # (compiler/summed_updates.py). Off unless KILNET_UPDATE_SUMS=1: on an H200 it ran W2 b32's
    # train sequence in 0.282 ms against 0.260 stored (its 20 updates as phases of their own),
    # W2 b16 and W5 level (benchmarks/results/nvidia-h200-summed-updates-2026-12-04.txt).
    update_sums: bool = False
    vector_bytes: int = 32     # a CPU form's explicit vector: one register (vector_bytes_of)
    cpu_products: str = None   # KILNET_CPU_PRODUCTS: a CPU_PRODUCTS key to use instead of its own
    table: str = None          # the schedule table laid over the policy (its path), or None
    # {launch name or kernel family: Schedule}: overrides laid over the policy (policy/schedule.py)
    schedules: dict = field(default=None, hash=False, repr=False)

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
        table ``schedule.table_path`` names."""
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
        path = sched.table_path(target, settings)
        return target if path is None else replace(target, schedules=sched.load_table(path),
                                                   table=path)


def check(settings):
    """The settings whose values the compiler's own tables decide (a CompileError naming the
    variable, before any device work)."""
    if settings.cpu_products and settings.cpu_products not in sched.CPU_PRODUCTS:
        raise CompileError(f"KILNET_CPU_PRODUCTS must be one of {sorted(sched.CPU_PRODUCTS)}, "
                           f"got {settings.cpu_products!r}")


# The explicit vector of the CPU forms is the device's native float vector: 32 bytes with AVX2,
# 64 with AVX-512. Measured on a 2-core AMD EPYC, Zen 5 (AVX-512, native width 16), Intel's
# runtime, 2026-12-01, train steps 64 against 32 bytes (in one process, alternating calls, medians
# of 30): W1 b64 0.79x, b256 0.75x, W2 b32 0.88x, W3 b16 0.69x; at batch 1 level within the noise.
# The FMA peak (benchmarks/fma_peak.py) is 501 GFLOP/s there in 16-lane vectors, 204 in 8-lane.
VECTOR_BYTES = (16, 64)    # the range taken: SSE to AVX-512


def vector_bytes_of(device, forced=None):
    """``forced`` (KILNET_VECTOR_BYTES, 16, 32 or 64: to check one width's kernels on any device,
    e.g. under Oclgrind, whose device reports 1 float), else the device's native float vector."""
    if forced:
        return int(forced)
    lo, hi = VECTOR_BYTES
    return max(lo, min(hi, 4 * device.native_vector_width_float))


GPU = Target("gpu")
