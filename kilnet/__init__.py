"""kilnet: neural networks as dataflow graphs, compiled into plans of specialised OpenCL kernels."""
from .errors import (BundleError, CheckpointError, CompileError, DeadBranchWarning, DeviceError,
                     FeedError,
                     GraphError, KilnetError, MemoryCheckError, NonFiniteLoss, RankTimeout,
                     ShapeError)
from .graph import Graph, Value
from .ops import *  # noqa: F401,F403  (the builders: kilnet.ops.BUILDERS, from the op registry)
from .ops import BUILDERS
from .kernels.optimizers import SGD, Adam
from .build import compile, load
from .device_data import DeviceData
from .fit import History, fit
from .runtime.device import devices
from .policy.symbolic import ACTIVATIONS

__version__ = "0.1.0"
__all__ = ["Graph", "Value", "compile", "load", "devices", "SGD", "Adam", "ACTIVATIONS",
           "KilnetError", "GraphError", "ShapeError", "CompileError", "FeedError",
           "CheckpointError", "BundleError", "DeviceError", "MemoryCheckError", "fit", "History",
           "NonFiniteLoss", "RankTimeout", "DeadBranchWarning", "DeviceData"] + BUILDERS
