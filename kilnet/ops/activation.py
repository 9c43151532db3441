"""activation: y = act(x) elementwise, with act and act' printed from sympy."""
from ..compiler import symbolic
from ..graph import graph_of
from .base import Op, kernel, register, round_up

LOCAL = 64


def activation(x, kind, name=None):
    """Apply an activation: none, tanh, sigmoid, relu, leaky_relu, softplus, gelu, silu, elu."""
    return graph_of(x, "activation").add("activation", [x], {"kind": kind}, name)


def elementwise(step, n, buffers, **consts):
    return kernel(step, "activation", dict(N=n, **consts), buffers, (round_up(n, LOCAL),), (LOCAL,))


def scale_by_derivative(ctx, kind, z, n):
    """dy ·= act'(z) in place (a layer's own output gradient is read by nothing else after its
    backward pass); an empty list when there is no activation."""
    if kind == "none":
        return []
    return [elementwise("backward_activation", n, {"inp": z, "dout": ctx.dy},
                        expr=symbolic.derivative_c(kind), mode="scale")]


@register
class Activation(Op):
    kind = "activation"

    def infer(self, node):
        node.attrs["kind"] = symbolic.check(node.attrs["kind"])
        return node.inputs[0].shape

    def forward(self, node, ctx):
        return [elementwise("forward", ctx.batch * node.size, {"inp": ctx.x(0), "out": ctx.y},
                            expr=symbolic.forward_c(node.attrs["kind"]), mode="forward")]

    def backward(self, node, ctx):
        if not ctx.dx(0):
            return []
        return [elementwise("backward_input", ctx.batch * node.size,
                            {"inp": ctx.x(0), "dout": ctx.dy, "dinp": ctx.dx(0)},
                            expr=symbolic.derivative_c(node.attrs["kind"]), mode="backward",
                            accumulate=ctx.acc(0))]
