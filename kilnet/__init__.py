"""kilnet: neural networks as dataflow graphs, compiled into plans of specialised OpenCL kernels."""
import builtins as _builtins
from .errors import (BundleError, CheckpointError, CompileError, DeadBranchWarning, DeviceError,
                     FeedError,
                     GraphError, KilnetError, MemoryCheckError, NonFiniteLoss, RankTimeout,
                     ShapeError)
from .graph import Graph, Value
from .ops import *  # noqa: F401,F403  (the builders: kilnet.ops.BUILDERS, from the op registry)
from .ops import BUILDERS
from .kernels.optimizers import SGD, Adam
from .kernels.polyak import polyak
from .build import compile, load
from .device_data import DeviceData
from .fit import History, fit
from .runtime.device import devices
from .policy.symbolic import ACTIVATIONS

__version__ = "0.1.0"


def __getattr__(name):
    """A missing attribute of the package: one that looks like an op names the ops there are,
    as ``Graph.add`` does for an unknown op kind."""
    message = f"module 'kilnet' has no attribute {name!r}"
    if name.isidentifier() and name.islower() and not name.startswith("_"):
        message += f"; kilnet has no op {name}(): the ops are {', '.join(BUILDERS)}"
    raise AttributeError(message)
__all__ = ["Graph", "Value", "compile", "load", "devices", "SGD", "Adam", "polyak", "ACTIVATIONS",
           "KilnetError", "GraphError", "ShapeError", "CompileError", "FeedError",
           "CheckpointError", "BundleError", "DeviceError", "MemoryCheckError", "fit", "History",
           "NonFiniteLoss", "RankTimeout", "DeadBranchWarning", "DeviceData"] + [
    b for b in BUILDERS if not hasattr(_builtins, b)]   # kn.sum, kn.max, ...: never by import *
