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


@register
class Activation(Op):
    kind = "activation"

    def infer(self, node):
        node.attrs["kind"] = symbolic.check(node.attrs["kind"])
        return node.inputs[0].shape

    def forward(self, node, ctx):
        return [elementwise("forward", ctx.batch * node.size, {"inp": ctx.x(0), "out": ctx.y},
                            expr=symbolic.forward_c(node.attrs["kind"]), backward=False)]

    def backward(self, node, ctx):
        if not ctx.dx(0):
            return []
        return [elementwise("backward_input", ctx.batch * node.size,
                            {"inp": ctx.x(0), "dout": ctx.dy, "dinp": ctx.dx(0)},
                            expr=symbolic.derivative_c(node.attrs["kind"]), backward=True,
                            accumulate=ctx.acc(0))]
