"""input, reshape and stop_gradient: nodes that move no data.

``reshape(x, shape)``: the same per-sample values, in C order, viewed with another shape of
the same size (one -1 takes the size left over); the batch axis is not part of ``shape``. No
kernel and no copy: the output is x's buffer, and its gradient is dy as it is. No parameters.

``stop_gradient(x)``: x itself (a view), through which no gradient flows back: nothing upstream
of it receives a gradient from what reads it.

``input``: the node of ``Graph.input(name, shape)``, a graph input that the model's calls feed
under ``name``; it has no builder here.
"""
import math

from ..graph import graph_of
from ..kernels.base import GraphError, Op, need, register


def reshape(x, shape, name=None):
    """A view with another per-sample shape of the same size (-1 allowed once). No kernel, no copy.

    Args:
        x (Value): the input, any per-sample shape.
        shape (tuple[int, ...] | list[int] | int): the new per-sample shape (without the batch):
            positive ints and at most one -1, which takes the size left over.
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``reshape_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): the same values in C order, of the new shape.

    Raises:
        GraphError: shape is not an int, tuple or list, or ``x`` is not a graph value, or
            ``name`` is not an ASCII identifier or is already used.
        ShapeError: shape holds something other than positive ints and one -1, or its size is
            not x's.
    """
    g = graph_of(x, "reshape")
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise GraphError(f"reshape of {x.name!r}: shape must be a tuple of ints, got {shape!r}")
    return g.add("reshape", [x], {"shape": list(shape)}, name)


@register
class Input(Op):
    kind = "input"

    def infer(self, node):
        return tuple(node.attrs["shape"])


@register
class Reshape(Op):
    kind = "reshape"
    builder = reshape
    is_view = True
    open = True

    def infer(self, node):
        raw, size = node.attrs["shape"], node.inputs[0].size
        ok = len(raw) > 0 and all(isinstance(d, int) and not isinstance(d, bool) and (d > 0 or d == -1)
                                  for d in raw) and sum(d == -1 for d in raw) <= 1
        need(ok, node, f"shape must be positive ints with at most one -1, got {tuple(raw)}")
        known = math.prod(d for d in raw if d != -1)
        if -1 in raw:
            need(size % known == 0, node, f"cannot reshape {node.inputs[0].shape} (size {size}) "
                 f"into {tuple(raw)}")
            raw = [size // known if d == -1 else d for d in raw]
        need(math.prod(raw) == size, node, f"cannot reshape {node.inputs[0].shape} (size {size}) "
             f"into {tuple(raw)} (size {math.prod(raw)})")
        node.attrs["shape"] = list(raw)
        return tuple(raw)

    def onnx(self, node, e):
        return e.reshape(e.x(node), node.shape)


def stop_gradient(x, name=None):
    """The identity forward; no gradient flows into ``x`` (a view: no kernel, no copy).

    Args:
        x (Value): any value (with or without a batch axis).
        name (str | None): the node's name, an ASCII identifier; default ``stop_gradient_<n>``.

    Returns:
        value (Value): x itself, as a value through which training's gradient does not pass.

    Raises:
        GraphError: ``x`` is not a graph value, or ``name`` is not an ASCII identifier or is
            already used.
    """
    return graph_of(x, "stop_gradient").add("stop_gradient", [x], {}, name)


@register
class StopGradient(Op):
    """stop_gradient(x): x forward; nothing upstream of it receives a gradient through it (a
    target built from the model's own outputs, a frozen path)."""
    kind = "stop_gradient"
    builder = stop_gradient
    is_view = True
    open = True
    passes_gradient = False

    def infer(self, node):
        return node.inputs[0].shape

    def onnx(self, node, e):
        return e.x(node)
