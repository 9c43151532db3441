"""transpose(x): (A, B) -> (B, A), y[j, i] = x[i, j] per sample. No parameters.

Gradient: dx = dyᵀ, the same gather with the axes swapped. Each launch is a map with one
work-item per element it writes, reading its source through an index expression (sympy, printed
by kilnet.kernels.index): element o of a batch of (C, R) transposes of (R, C) samples reads the
sample's element (r mod R)·C + r div R, r = o mod R·C.

ONNX: Transpose (perm 0, 2, 1).
"""
from ..graph import graph_of
from ..kernels import index
from ..kernels.base import Op, need, out, register
from .add import map_stores

def transpose(x, name=None):
    """(A, B) -> (B, A) per sample.

    Args:
        x (Value): the input, two axes (A, B) per sample; a value without a batch axis (a
            parameter, a constant) is transposed by ``permute(x, (1, 0))``.
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``transpose_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): (B, A) per sample, y[j, i] = x[i, j].

    Raises:
        GraphError: ``x`` is not a graph value, or ``name`` is not an ASCII identifier or is
            already used.
        ShapeError: x does not have two axes.
    """
    g = graph_of(x, "transpose")
    if not x.batched:        # a parameter or a constant: the primitive's permute (DESIGN 2.1)
        return g.add("permute", [x], {"axes": [1, 0]}, name)
    return g.add("transpose", [x], {}, name)


def transposed(R, C):
    """The index, as C, into a batch of (R, C) samples of element i of their (C, R) transposes."""
    import sympy as sp
    i = sp.Symbol("i", integer=True, nonnegative=True)
    r = i % (R * C)
    return index.c(i // (R * C) * (R * C) + r % R * C + r // R)


@register
class Transpose(Op):
    kind = "transpose"
    builder = transpose

    def infer(self, node):
        s = node.inputs[0].shape
        need(len(s) == 2, node, f"x ({node.inputs[0].name!r}) must have 2 axes (A, B), got "
             f"shape {s}")
        return (s[1], s[0])

    def onnx(self, node, e):
        return e.op("Transpose", [e.x(node)], "transposed", perm=[0, 2, 1])

    def forward(self, node, ctx):
        A, B = node.inputs[0].shape
        return [map_stores(ctx, "forward", ctx.batch * node.size,
                           {"inp": ctx.x(0), "out": out(ctx.y)},
                           [("out", f"inp[{transposed(A, B)}]", False)], vectors=False)]

    def backward(self, node, ctx):
        if not ctx.dx(0):
            return []
        A, B = node.inputs[0].shape
        return [map_stores(ctx, "backward_input", ctx.batch * node.size,
                           {"dout": ctx.dy, "dinp": out(ctx.dx(0), ctx.acc(0))},
                           [("dinp", f"dout[{transposed(B, A)}]", ctx.acc(0))], vectors=False)]
