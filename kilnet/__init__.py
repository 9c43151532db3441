"""kilnet: neural networks as dataflow graphs, compiled into plans of specialised OpenCL kernels."""
from .errors import CheckpointError, CompileError, FeedError, GraphError, KilnetError, ShapeError
from .graph import Graph, Value
from .ops import activation, add_norm, batchnorm, concat, conv1d, dense, reshape, softmax
from .ops import graph_attention, graph_conv, gte_block
from .ops.optimizers import SGD, Adam
from .compiler import compile
from .runtime.device import devices
from .runtime.checkpoint import load
from .compiler.symbolic import ACTIVATIONS

__version__ = "0.1.0"
__all__ = ["Graph", "Value", "compile", "load", "devices", "SGD", "Adam",
           "activation", "add_norm", "batchnorm", "concat", "conv1d", "dense", "reshape", "softmax",
           "KilnetError", "GraphError", "ShapeError", "CompileError", "FeedError", "CheckpointError",
           "ACTIVATIONS"]
__all__ += ["graph_attention", "graph_conv", "gte_block"]
from .ops import time_encoding  # noqa: E402
__all__ += ["time_encoding"]
from .ops import mamba4cast_embedding  # noqa: E402
__all__ += ["mamba4cast_embedding"]

from .ops import multi_window_conv  # noqa: E402
__all__ += ["multi_window_conv"]
