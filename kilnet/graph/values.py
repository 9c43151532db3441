"""The graph's plain records and checks of what a user hands it: a shape, an array attribute,
a number from NumPy, a loss record (kilnet/graph/__init__.py builds on them)."""
import numbers

import numpy as np

from ..errors import GraphError, ShapeError


def _shape(shape, what):
    raw = shape
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    try:
        if isinstance(shape, (str, bytes)):
            raise TypeError
        shape = tuple(_plain(d) for d in shape)
    except TypeError:
        raise ShapeError(f"{what}: shape must be a tuple of positive ints, got {raw!r}") from None
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ShapeError(f"{what}: shape must be a non-empty tuple of positive ints, got {raw!r}")
    return shape


def _plain(v):
    """numpy scalars (np.int64(3), np.float32(0.1)) as the Python numbers ops check for and JSON
    can store; lists and tuples element by element."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if hasattr(v, "dtype") and getattr(v, "shape", None) == ():   # numpy scalar or 0-d array
        v = v.item()
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    return v


class Loss:
    """One term of the training objective (``Graph.loss``): ``weight`` times the batch mean of
    the sum over ``node``'s elements; ``params``: the blocks it trains (None: every trainable
    parameter)."""

    __slots__ = ("node", "weight", "params")

    def __init__(self, node, weight, params=None):
        self.node, self.weight, self.params = node, weight, params

    def __repr__(self):
        extra = f", params={self.params!r}" if self.params is not None else ""
        return f"Loss({self.node.name}, weight={self.weight!r}{extra})"


def _array_attr(array, what):
    """``array`` as nested lists of floats (what a node's attributes hold, and JSON stores):
    a GraphError unless it is an array of finite real numbers."""
    try:
        arr = np.asarray(array)
    except Exception as e:
        raise GraphError(f"{what}: cannot be read as an array ({e})") from None
    if arr.dtype.kind not in "biuf":
        raise GraphError(f"{what}: needs real numbers, got an array of {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        raise GraphError(f"{what}: holds a NaN or an infinity")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.size == 0:
        raise GraphError(f"{what}: is empty (shape {arr.shape})")
    return arr.tolist()


