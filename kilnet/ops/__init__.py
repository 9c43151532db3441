"""The op catalogue: importing this package registers every op."""
from .base import Kernel, Op, Param, get_op  # noqa: F401
from .shape_ops import reshape
from .activation import activation
from .dense import dense
from .conv1d import conv1d
from .multi_window_conv import multi_window_conv
from .batchnorm import batchnorm
from .softmax import softmax
from .concat import concat
from .add_norm import add_norm
from .time_encoding import time_encoding
from .graph_attention import graph_attention
from .graph_conv import graph_conv
from .gte_block import gte_block
from .mamba4cast import mamba4cast_embedding

BUILDERS = ["reshape", "activation", "dense", "conv1d", "multi_window_conv", "batchnorm", "softmax",
            "concat", "add_norm", "time_encoding", "graph_attention", "graph_conv", "gte_block",
            "mamba4cast_embedding"]
__all__ = list(BUILDERS)
