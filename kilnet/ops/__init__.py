"""The op catalogue: importing this package registers every op."""
from .base import Kernel, Op, Param, get_op  # noqa: F401
from .shape_ops import reshape
from .activation import activation
from .dense import dense
from .conv1d import conv1d
from .batchnorm import batchnorm
from .softmax import softmax
from .concat import concat
from .add_norm import add_norm
from .graph_attention import graph_attention
from .graph_conv import graph_conv
from .gte_block import gte_block

__all__ = ["reshape", "activation", "dense", "conv1d", "batchnorm", "softmax", "concat", "add_norm"]
from .time_encoding import time_encoding  # noqa: E402
__all__ += ["time_encoding"]
from .mamba4cast import mamba4cast_embedding  # noqa: E402
__all__ += ["mamba4cast_embedding"]
__all__ += ["graph_attention", "graph_conv", "gte_block"]

from .multi_window_conv import multi_window_conv  # noqa: E402
__all__ += ["multi_window_conv"]
