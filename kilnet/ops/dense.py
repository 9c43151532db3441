"""dense: y = act(W·flatten(x) + b); weight (units, in), bias (units,) as in torch.nn.Linear.

Any per-sample shape, flattened to its ``in`` values in C order -> (units,). Parameters
``<name>.weight`` (units, in) and, with ``bias=True``, ``<name>.bias`` (units,), both uniform in
±1/√in (PyTorch's init). Backward: dz = dy·act'; dW = Σ over the batch of dz·xᵀ, db = Σ dz,
dx = Wᵀ·dz (reshaped to x's shape). Forward is a GEMM with the bias and activation in its
epilogue.

Departures from the articles (docs/ARTICLES.md §1 Dense): their weights live in the source
layer, (N_prev + 1) × N_next with the bias last in each row, start at U(±1/√(N+1))·0.5, and
are updated by adding Δ of target − output with L1/L2 terms and a ±MAX_WEIGHT clamp (V1:
1e-3). Here weight and bias are separate arrays of PyTorch's layout and init, and the
optimizer (``kn.SGD``, ``kn.Adam``) descends the loss's exact gradient, unclamped.
"""
from ..graph import graph_of
from ..kernels.base import GraphError, Op, OuterGradient, Param, int_attr, keeps_preactivation, need, register
from ..kernels.gemm import linear, linear_backward
from ..policy import symbolic
from .activation import scale_by_derivative


def dense(x, units, activation=None, bias=True, name=None):
    """Fully connected layer over the flattened sample: (any) -> (units,).

    Args:
        x (Value): the input, any per-sample shape (flattened in C order).
        units (int): output width, >= 1.
        activation (str | None): one of ``kilnet.ACTIVATIONS`` ("none", "tanh", "sigmoid",
            "relu", "leaky_relu", "softplus", "gelu", "silu", "elu"); None means "none".
        bias (bool): whether to learn ``<name>.bias`` (units,) (default True).
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``dense_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): (units,) per sample.

    Raises:
        GraphError: units not an int >= 1, an unknown activation, bias not a bool, or ``x`` is
            not a graph value, or ``name`` is not an ASCII identifier or is already used.
    """
    return graph_of(x, "dense").add("dense", [x], {"units": units, "activation": activation,
                                                   "bias": bias}, name)


@register
class Dense(Op):
    kind = "dense"
    builder = dense
    applies_input_derivative = True

    def infer(self, node):
        int_attr(node, "units", node.attrs["units"])
        node.attrs["activation"] = symbolic.check(node.attrs["activation"])
        need(isinstance(node.attrs["bias"], bool), node,
             f"bias must be True or False, got {node.attrs['bias']!r}", GraphError)
        return (node.attrs["units"],)


    def onnx(self, node, e):
        z = e.linear(e.rows(e.x(node), node.inputs[0].size, "flat"), e.param(node, "weight"),
                     e.param(node, "bias") if node.attrs["bias"] else None)
        return e.act(e.reshape(z, node.shape, "z_shaped"), node.attrs["activation"])

    def params(self, node):
        units, fan_in = node.attrs["units"], node.inputs[0].size
        ps = [Param("weight", (units, fan_in), "uniform", fan_in)]
        if node.attrs["bias"]:
            ps.append(Param("bias", (units,), "uniform", fan_in))
        return ps

    def preactivation(self, node):
        return keeps_preactivation(node, of_output=True)

    def forward(self, node, ctx):
        U, I, act = node.attrs["units"], node.inputs[0].size, node.attrs["activation"]
        return linear(ctx, "forward", rows=ctx.batch, n_in=I, n_out=U, x=ctx.x(0),
                      weight=ctx.p("weight"), out=ctx.y,
                      bias=ctx.p("bias") if node.attrs["bias"] else None, act=act,
                      z=ctx.preactivation() if ctx.training else None)

    def outer_gradients(self, node, ctx):
        # dy holds dz once backward has run (scale_by_derivative works in place), and nothing
        # writes it or the input afterwards.
        return {"weight": OuterGradient(ctx.dy, ctx.x(0), ctx.batch)}

    def backward(self, node, ctx):
        U, I, B = node.attrs["units"], node.inputs[0].size, ctx.batch
        ks = scale_by_derivative(ctx, *ctx.derivative_source(), B * U)   # dY becomes dZ
        return ks + linear_backward(ctx, rows=B, n_in=I, n_out=U, dz=ctx.dy, x=ctx.x(0),
                                    weight=ctx.p("weight"), dweight=ctx.dp("weight"),
                                    dbias=ctx.dp("bias") if node.attrs["bias"] else None,
                                    dx=ctx.dx(0), accumulate=ctx.acc(0), dx_scale=ctx.dx_scale(0))
