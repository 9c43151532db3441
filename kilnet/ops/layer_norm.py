"""layer_norm: y = ẑ·gamma + beta, ẑ = (x − mean)/√(var + eps) over the last axis of D values
(biased variance), PyTorch's ``nn.LayerNorm(D)``. Parameters ``gamma`` (ones) and ``beta``
(zeros), of shape (D,). Any per-sample shape (…, D) -> the same shape.

It is add_norm's row normalisation (templates/add_norm.cl.j2, one input) with an affine. With
g = dy·gamma, the input gradient is add_norm's: dx = inv/D·(D·g − Σg − ẑ·Σ(g·ẑ)), the sums over
the row; the parameter gradients are sums over every row of the batch (every position of every
sample): dgamma = Σ dy·ẑ, dbeta = Σ dy. The backward row kernel writes dy·ẑ to scratch and two
column sums (kernels/gemm.py's ``column_sum``, as dense's bias gradient) reduce it and dy.

Where its input is an add that nothing else reads (a post-norm residual, ln(x + f(x))), the
add is folded in (compiler/fusion.py's sum fold): the row kernel reads the add's inputs and
sums them, and writes each one's gradient (dx, the add's for every input).
"""
import math

from ..graph import graph_of
from ..kernels.base import GraphError, Op, Param, need, out, register
from ..kernels.gemm import column_sum
from .add_norm import normalised_onnx, row_launch


def layer_norm(x, eps=1e-5, name=None):
    """Normalise over the last axis, then a learned scale ``gamma`` and shift ``beta`` of the
    last axis's size.

    Args:
        x (Value): the input, any per-sample shape of at least one axis.
        eps (float): a finite number > 0 added to the variance (default 1e-5).
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``layer_norm_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): of x's shape.

    Raises:
        GraphError: eps is not a finite number > 0, or ``x`` is not a graph value, or ``name``
            is not an ASCII identifier or is already used.
        ShapeError: x has no axis.
    """
    return graph_of(x, "layer_norm").add("layer_norm", [x], {"eps": eps}, name)


@register
class LayerNorm(Op):
    kind = "layer_norm"
    builder = layer_norm

    def infer(self, node):
        eps = node.attrs["eps"]
        ok = isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) \
            and eps > 0
        need(ok, node, f"eps must be a finite number > 0, got {eps!r}", GraphError)
        node.attrs["eps"] = float(eps)
        shape = node.inputs[0].shape
        need(len(shape) >= 1, node, f"input {node.inputs[0].name!r} must have an axis to "
             f"normalise over, got shape {shape}")
        return shape

    def params(self, node):
        D = node.shape[-1]
        return [Param("gamma", (D,), "ones"), Param("beta", (D,), "zeros")]

    def onnx(self, node, e):
        """add_norm's decomposition (runs on runtimes without LayerNormalization, and in
        float64), then ·gamma + beta, broadcast along the last axis."""
        z = normalised_onnx(e, e.x(node), node.attrs["eps"])
        return e.op("Add", [e.op("Mul", [z, e.param(node, "gamma")]), e.param(node, "beta")],
                    "affine")

    takes_sum = True

    def forward(self, node, ctx):
        terms = {f"in{i}": ctx.x(i) for i in range(len(ctx.inputs))}
        return [row_launch("forward", node, ctx, "forward", node.attrs["eps"],
                           {**terms, "gamma": ctx.p("gamma"), "beta": ctx.p("beta"),
                            "out": out(ctx.y)}, affine=True)]

    def backward(self, node, ctx):
        rows, D = ctx.batch * node.size // node.shape[-1], node.shape[-1]
        dyz = ctx.scratch("dy_xhat", ctx.batch * node.size)
        n = len(ctx.inputs)
        bufs = {**{f"in{i}": ctx.x(i) for i in range(n)},
                "gamma": ctx.p("gamma"), "dout": ctx.dy, "dyz": out(dyz)}
        grads = [(i, ctx.acc(i)) for i in range(n) if ctx.dx(i)]
        for i, acc in grads:
            bufs[f"din{i}"] = out(ctx.dx(i), acc)
        ks = [row_launch("backward_input", node, ctx, "backward", node.attrs["eps"], bufs,
                         affine=True, grads=grads)]
        ks += column_sum(ctx, "backward_gamma", rows=rows, cols=D, src=dyz, out=ctx.dp("gamma"))
        ks += column_sum(ctx, "backward_beta", rows=rows, cols=D, src=ctx.dy, out=ctx.dp("beta"))
        return ks
