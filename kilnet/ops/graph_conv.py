"""graph_conv: the gated per-unit map of the GTE block, y = σ(W_f·x + b_f) ⊙ leaky_relu(W_s·x + b_s).

(U, W) -> (U, width), each unit's W features mapped alone (the same weights for every unit).

Parameters (PyTorch Linear layouts, one pair per branch): ``filter.weight`` (width, W) and
``filter.bias`` (width,) for the sigmoid gate, ``state.weight`` (width, W) and ``state.bias``
(width,) for the leaky-ReLU branch (slope 0.01).

Departures from the article (CGConv in CNeuronGTE): the article's host code hands CGConv a
(W, U) shape so that only the first W inputs are mapped, and uses ``cGraphConv[1]`` where
``[0]`` belongs; here every unit is mapped with all W of its features, and the two stacked
graph_convs of a GTE block are separate nodes with their own parameters. The article's weights
carry the bias as their last column; here it is a separate vector. Gradients are the exact
derivatives of the gate product (no clamping of gradients or weights).

ONNX (``onnx``): the units as rows, (N, U, W) -> (N·U, W); one Gemm per branch with its weight
and bias, back to (N, U, width); Sigmoid of the filter branch times LeakyRelu (0.01) of the
state branch.
"""
from ..graph import graph_of
from ..kernels.base import Op, Param, inout, int_attr, need, out, register
from ..kernels.gemm import linear_backward, linears
from ..policy import symbolic
from .activation import vector_map



def graph_conv(x, width, name=None):
    """(U, W) -> (U, width): per unit σ(W_f·x + b_f) ⊙ leaky_relu(W_s·x + b_s).

    Args:
        x (Value): the input, (units U, features W) per sample.
        width (int): output features per unit, >= 1.
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``graph_conv_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): (U, width) per sample.

    Raises:
        GraphError: width not an int >= 1, or ``x`` is not a graph value, or ``name`` is not an
            ASCII identifier or is already used.
        ShapeError: x is not (units, width).
    """
    return graph_of(x, "graph_conv").add("graph_conv", [x], {"width": width}, name)


@register
class GraphConv(Op):
    kind = "graph_conv"
    builder = graph_conv

    def infer(self, node):
        width = int_attr(node, "width", node.attrs["width"])
        shape = node.inputs[0].shape
        need(len(shape) == 2, node, f"input {node.inputs[0].name!r} must be (units, width), "
             f"got shape {shape}")
        return (shape[0], width)

    def params(self, node):
        F, W = node.attrs["width"], node.inputs[0].shape[1]
        return [Param("filter.weight", (F, W), "uniform", W), Param("filter.bias", (F,), "uniform", W),
                Param("state.weight", (F, W), "uniform", W), Param("state.bias", (F,), "uniform", W)]

    def onnx(self, node, e):
        (U, W), F = node.inputs[0].shape, node.attrs["width"]
        rows = e.rows(e.x(node), W)                                        # (N·U, W)
        z = {b: e.reshape(e.linear(rows, e.param(node, f"{b}.weight"), e.param(node, f"{b}.bias"),
                                   f"z{b[0]}"), (U, F), f"z{b[0]}_units") for b in ("filter", "state")}
        return e.op("Mul", [e.act(z["filter"], "sigmoid", "gate"),
                            e.act(z["state"], "leaky_relu", "state")], "gated")

    def _dims(self, node, ctx):
        (U, W), F = node.inputs[0].shape, node.attrs["width"]
        return ctx.batch * U, W, F

    def forward(self, node, ctx):
        R, W, F = self._dims(node, ctx)
        z = {b: ctx.scratch(f"z{b[0]}", R * F) for b in ("filter", "state")}
        ks = linears(ctx, "forward_filter_state",
                     [(f"forward_{b}", ctx.p(f"{b}.weight"), z[b], ctx.p(f"{b}.bias"))
                      for b in ("filter", "state")], rows=R, n_in=W, n_out=F, x=ctx.x(0))
        ks.append(self._gate(ctx, "forward", "forward", R * F,
                             {"zf": z["filter"], "zs": z["state"], "out": out(ctx.y)}))
        return ks

    @staticmethod
    def _gate(ctx, step, mode, n, buffers):
        return vector_map(ctx, step, "graph_conv", n, buffers,
                          {"act": symbolic.forward_c("leaky_relu"),
                           "dact": symbolic.derivative_c("leaky_relu")}, mode=mode)

    def backward(self, node, ctx):
        R, W, F = self._dims(node, ctx)
        zf, zs = ctx.scratch("zf", R * F), ctx.scratch("zs", R * F)
        dzs = ctx.scratch("dzs", R * F)
        ks = [self._gate(ctx, "backward_gate", "backward", R * F,
                         {"zf": zf, "zs": zs, "dout": inout(ctx.dy), "dzs": out(dzs)})]
        dz = {"filter": ctx.dy, "state": dzs}          # dy now holds dzf
        for i, b in enumerate(("filter", "state")):
            # dX (+)= dZ_b·W_b: the second branch adds to the first
            ks += linear_backward(ctx, f"_{b}", rows=R, n_in=W, n_out=F, dz=dz[b], x=ctx.x(0),
                                  weight=ctx.p(f"{b}.weight"), dweight=ctx.dp(f"{b}.weight"),
                                  dbias=ctx.dp(f"{b}.bias"), dx=ctx.dx(0),
                                  accumulate=ctx.acc(0) or i > 0)
        return ks
