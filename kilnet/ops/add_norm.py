"""add_norm: z = a + b normalised over the last axis (biased variance, eps 1e-5, no affine).

a and b of one shape (…, D) -> that shape; no parameters. Per row of D values:
y = (z − mean(z))/√(var(z) + 1e-5), var the biased variance.

The articles' SumAndNormilize averages a and b (m = 0.5) and skips the normalisation's Jacobian
in backward; here the sum is plain and the backward pass is the true derivative:
dz = inv/D·(D·g − Σg − ẑ·Σ(g·ẑ)), and da = db = dz. The row kernel (`row_launch`) is layer_norm's
too, which normalises one input and adds an affine.
"""
from ..graph import graph_of
from ..kernels.base import Op, kernel, need, out, register
from ..policy.kinds import Family
from ..policy.vectors import pow2_at_least, vector_width

EPS = 1e-5


def add_norm(a, b, name=None):
    """(a + b) normalised over the last axis.

    Args:
        a (Value): the first summand, any per-sample shape.
        b (Value): the second, of a's shape.
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``add_norm_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): ((a + b) − mean)/√(var + 1e-5) over the last axis, of a's shape.

    Raises:
        GraphError: ``a`` or ``b`` is not a value of one graph, or ``name`` is not an ASCII
            identifier or is already used.
        ShapeError: ``a`` and ``b`` have different shapes.
    """
    return graph_of(a, "add_norm").add("add_norm", [a, b], {}, name)


@register
class AddNorm(Op):
    kind = "add_norm"
    builder = add_norm

    def infer(self, node):
        a, b = node.inputs
        need(a.shape == b.shape, node, f"inputs must have the same shape, got {a.name!r} {a.shape} "
             f"and {b.name!r} {b.shape}")
        return a.shape

    def onnx(self, node, e):
        return normalised_onnx(e, e.op("Add", [e.x(node, 0), e.x(node, 1)], "sum"), EPS)

    def forward(self, node, ctx):
        return [row_launch("forward", node, ctx, "forward", EPS,
                           {"in0": ctx.x(0), "in1": ctx.x(1), "out": out(ctx.y)})]

    def backward(self, node, ctx):
        if not (ctx.dx(0) or ctx.dx(1)):
            return []
        bufs = {"in0": ctx.x(0), "in1": ctx.x(1), "out": ctx.y, "dout": ctx.dy}
        for i in (0, 1):
            if ctx.dx(i):
                bufs[f"din{i}"] = out(ctx.dx(i), ctx.acc(i))
        return [row_launch("backward_input", node, ctx, "backward", EPS, bufs,
                           grads=[(i, ctx.acc(i)) for i in (0, 1) if ctx.dx(i)])]


def normalised_onnx(e, z, eps):
    """(z − mean)·(biased var + eps)^-½ over the last axis (ReduceMean takes its axes as an
    attribute up to opset 17); layer_norm's affine follows it."""
    d = e.op("Sub", [z, e.op("ReduceMean", [z], "mean", axes=[-1], keepdims=1)], "centred")
    var = e.op("ReduceMean", [e.op("Mul", [d, d])], "var", axes=[-1], keepdims=1)
    inv = e.op("Reciprocal", [e.op("Sqrt", [e.op("Add", [var, e.scalar(eps, "eps")])])], "inv_std")
    return e.op("Mul", [d, inv], "normed")


def row_launch(step, node, ctx, mode, eps, bufs, affine=False, grads=()):
    """One launch of templates/add_norm.cl.j2 over the rows of the last axis of ``node``: the sum
    of the inputs in0, in1, … among ``bufs`` normalised (add_norm; layer_norm with ``affine``)."""
    D = node.shape[-1]
    rows = ctx.batch * node.size // D
    inputs = [n for n in bufs if n.startswith("in") and n[2:].isdigit()]
    consts = dict(mode=mode, D=D, R=rows, eps=repr(float(eps)), T=1, inputs=inputs,
                  affine=affine, grads=list(grads), VW=vector_width(ctx.target, ctx.ctype))
    if ctx.target.kind == "gpu" and D > 1:
        # a team of T lanes per row, as many rows per work-group as fit (add_norm.cl.j2)
        L = consts["L"] = ctx.schedule(step, Family.GROUP, items=rows * D).local[0]
        T = consts["T"] = pow2_at_least(D, L)
        return kernel(step, "add_norm", consts, bufs, (-(-rows // (L // T)) * L,), (L,))
    return kernel(step, "add_norm", consts, bufs, *ctx.schedule(step).cover(rows))
