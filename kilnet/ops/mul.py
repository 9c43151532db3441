"""mul(a, b): y = a·b elementwise, a and b of one shape (the output's), any per-sample
shape; no parameters.

Gradients: ∂L/∂a = dy·b and ∂L/∂b = dy·a; mul(x, x) gets both, dy·x + dy·x = 2·x·dy. One map
launch forward and one backward, which writes (or adds to) every wanted input gradient.

ONNX: Mul.
"""
from ..graph import graph_of
from ..kernels.base import Op, out, register
from .add import gradient_stores, map_stores, same_shapes


def mul(a, b, name=None):
    """a·b elementwise; a and b of one shape.

    Args:
        a (Value): the first factor, any per-sample shape.
        b (Value): the second, of a's shape (may be a itself).
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``mul_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): the product, of a's shape.

    Raises:
        GraphError: ``a`` or ``b`` is not a value of one graph, or ``name`` is not an ASCII
            identifier or is already used.
        ShapeError: a and b have different shapes.
    """
    return graph_of(a, "mul").add("mul", [a, b], {}, name)


@register
class Mul(Op):
    kind = "mul"
    builder = mul

    def infer(self, node):
        return same_shapes(node)

    def onnx(self, node, e):
        return e.op("Mul", [e.x(node, 0), e.x(node, 1)], "product")

    def forward(self, node, ctx):
        return [map_stores(ctx, "forward", ctx.batch * node.size,
                           {"in0": ctx.x(0), "in1": ctx.x(1), "out": out(ctx.y)},
                           [("out", "LD(in0, i) * LD(in1, i)", False)])]

    def backward(self, node, ctx):
        grads, stores = gradient_stores(ctx, 2, lambda i: f"g * LD(in{1 - i}, i)")
        if not stores:
            return []
        bufs = {"dout": ctx.dy}
        for i in (0, 1):
            if ctx.dx(i):                 # input i's gradient reads the other input
                bufs[f"in{1 - i}"] = ctx.x(1 - i)
        return [map_stores(ctx, "backward_input", ctx.batch * node.size, {**bufs, **grads},
                           stores, [("T", "g", "LD(dout, i)")])]
