"""The OpenCL CPU implementations that build kernels on this machine (PoCL 3.0 does not on CPUs
newer than its LLVM, e.g. AMD Zen 5): what tests parametrised per implementation run on."""
import kilnet as kn
from kilnet.runtime.device import SIMULATORS

# Oclgrind's device (the test extra's) calls itself a CPU too: it is no CPU implementation.
CPU_IMPLEMENTATIONS = sorted({d["implementation"] for d in kn.devices(check=True)
                              if "CPU" in d["type"] and d["builds"] is None
                              and d["implementation"] not in SIMULATORS})
