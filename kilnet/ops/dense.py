"""dense: y = act(W·flatten(x) + b); weight (units, in), bias (units,) as in torch.nn.Linear."""
from ..compiler import symbolic
from ..graph import graph_of
from .base import Op, Param, int_attr, register
from .activation import scale_by_derivative
from .gemm import column_sum, gemm


def dense(x, units, activation=None, bias=True, name=None):
    """Fully connected layer over the flattened sample: (any) -> (units,)."""
    return graph_of(x, "dense").add("dense", [x], {"units": units, "activation": activation,
                                                   "bias": bias}, name)


@register
class Dense(Op):
    kind = "dense"

    def infer(self, node):
        int_attr(node, "units", node.attrs["units"])
        node.attrs["activation"] = symbolic.check(node.attrs["activation"])
        node.attrs["bias"] = bool(node.attrs["bias"])
        return (node.attrs["units"],)

    def params(self, node):
        units, fan_in = node.attrs["units"], node.inputs[0].size
        ps = [Param("weight", (units, fan_in), "uniform", fan_in)]
        if node.attrs["bias"]:
            ps.append(Param("bias", (units,), "uniform", fan_in))
        return ps

    def _z(self, node, ctx):
        """Pre-activation kept for the backward pass (training plans with an activation)."""
        if node.attrs["activation"] == "none":
            return None
        return ctx.scratch("z", ctx.batch * node.attrs["units"])

    def forward(self, node, ctx):
        U, I, act = node.attrs["units"], node.inputs[0].size, node.attrs["activation"]
        return gemm(ctx, "forward", M=ctx.batch, N=U, K=I, a=ctx.x(0), w=ctx.p("weight"), out=ctx.y,
                    a_idx=f"m*{I} + k", b_idx=f"n*{I} + k", c_idx=f"m*{U} + n",
                    a_kfast=True, b_nfast=False,
                    bias=ctx.p("bias") if node.attrs["bias"] else None, act=act,
                    z=self._z(node, ctx) if ctx.training else None)

    def backward(self, node, ctx):
        U, I, act, B = node.attrs["units"], node.inputs[0].size, node.attrs["activation"], ctx.batch
        ks = scale_by_derivative(ctx, act, self._z(node, ctx), B * U)   # dY becomes dZ
        if ctx.dx(0):   # dX = dZ·W
            ks += gemm(ctx, "backward_input", M=B, N=I, K=U, a=ctx.dy, w=ctx.p("weight"),
                       out=ctx.dx(0), a_idx=f"m*{U} + k", b_idx=f"k*{I} + n",
                       c_idx=f"m*{I} + n", a_kfast=True, b_nfast=True,
                       accumulate=ctx.acc(0))
        # dW = dZᵀ·X
        ks += gemm(ctx, "backward_weight", M=U, N=I, K=B, a=ctx.dy, w=ctx.x(0), out=ctx.dp("weight"),
                   a_idx=f"k*{U} + m", b_idx=f"k*{I} + n", c_idx=f"m*{I} + n",
                   a_kfast=False, b_nfast=True)
        if node.attrs["bias"]:
            ks += column_sum(ctx, "backward_bias", rows=B, cols=U, src=ctx.dy, out=ctx.dp("bias"))
        return ks
