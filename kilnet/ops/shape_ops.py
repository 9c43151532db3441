"""input and reshape: nodes that move no data."""
import math

from ..graph import graph_of
from ..kernels.base import GraphError, Op, need, register


def reshape(x, shape, name=None):
    """A view with another per-sample shape of the same size (-1 allowed once). No kernel, no copy."""
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
