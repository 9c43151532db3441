"""What the compiler needs to know of the device it specialises for (no OpenCL objects)."""
import os
from dataclasses import dataclass

from ..errors import CompileError


@dataclass(frozen=True)
class Target:
    kind: str                  # "cpu": barrier-free vector kernels; "gpu": local-memory tiles
    max_work_group: int = 256
    compute_units: int = 16
    local_mem: int = 32768     # bytes
    name: str = ""

    @classmethod
    def of(cls, device):
        """The device's target; KILNET_TARGET=cpu|gpu forces a kernel form (to test both forms
        on one device, e.g. under Oclgrind)."""
        import pyopencl as cl
        kind = os.environ.get("KILNET_TARGET") or ("cpu" if device.type & cl.device_type.CPU else "gpu")
        if kind not in ("cpu", "gpu"):
            raise CompileError(f"KILNET_TARGET must be 'cpu' or 'gpu', got {kind!r}")
        return cls(kind, device.max_work_group_size, device.max_compute_units, device.local_mem_size,
                   device.name.strip())


GPU = Target("gpu")
