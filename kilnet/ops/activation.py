"""activation: y = act(x) elementwise, with act and act' printed from sympy.

Any per-sample shape -> the same shape; no parameters. The kinds (``kilnet.ACTIVATIONS``,
kilnet/policy/symbolic.py), each also the ``activation=`` of dense, conv1d, multi_window_conv
and batchnorm:

- ``none``: x; ``tanh``; ``sigmoid``: 1/(1 + e^−x); ``relu``: max(x, 0);
  ``leaky_relu``: x for x > 0, else 0.01·x;
- ``softplus``: log(1 + eˣ), computed without overflow (x + log1p(e^−x) for x > 0);
- ``gelu``: the exact erf form x/2·(1 + erf(x/√2)); ``silu``: x·σ(x);
  ``elu``: x for x > 0, else eˣ − 1.

Backward: dx = dy·act'(x), act' being sympy's derivative of the same expression. dense and
conv1d read act' off their output y where it can be (tanh: 1 − y², sigmoid: y(1 − y), relu,
leaky_relu) and otherwise from the pre-activation they keep in training.

Departures from the articles (docs/ARTICLES.md §1 Activations, §2 bugs 3-4): their forward
clamps the argument to ±20 (so their SoftPlus returns 1, not x, for x ≥ 20) and their GELU is
x·σ(1.702x); their derivatives are heuristics of the output y (a clamp trick for tanh and
sigmoid, σ(y) for SoftPlus, σ(5y) below 0.9 for GELU), and V1 clips every backpropagated
value to ±MAX_GRAD = 1e-3. Here the functions are as above, with no clamp, and their true
derivatives.
"""
import math

import numpy as np

from ..graph import graph_of
from ..kernels.base import Op, inout, kernel, out, register
from ..policy import symbolic
from ..policy.kinds import DerivKind



def activation(x, kind, name=None):
    """Apply an activation: none, tanh, sigmoid, relu, leaky_relu, softplus, gelu, silu, elu.

    Args:
        x (Value): the input, any per-sample shape.
        kind (str | None): one of ``kilnet.ACTIVATIONS`` ("none", "tanh", "sigmoid", "relu",
            "leaky_relu", "softplus", "gelu", "silu", "elu"); None means "none".
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``activation_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): ``act(x)`` elementwise, of x's shape.

    Raises:
        GraphError: ``kind`` is not a known activation, or ``x`` is not a graph value, or
            ``name`` is not an ASCII identifier or is already used.
    """
    return graph_of(x, "activation").add("activation", [x], {"kind": kind}, name)




def vector_map(ctx, step, template, n, buffers, exprs, **consts):
    """One kernel of ``template`` over n elements. On CPUs each work-item takes a vector of V
    elements (PoCL's scalar exp/log are several times slower than its vector ones; Intel's
    runtime ran graph_conv's gates 2.3-3.4x slower one element each); the ragged end runs as
    narrower vectors (common.cl.j2's map).
    ``exprs``: {name: C expression}, each passed as name and, vectorised, as "v" + name."""
    s = ctx.schedule(step, vectors=True)
    for name, e in exprs.items():
        consts.update({name: e, "v" + name: symbolic.vectorised(e)})
    return kernel(step, template, dict(N=n, V=s.vector, **consts), buffers,
                  *s.cover(-(-n // s.vector)))


def elementwise(ctx, step, n, buffers, expr, **consts):
    """An activation.cl.j2 kernel over n elements (vector_map)."""
    return vector_map(ctx, step, "activation", n, buffers, {"expr": expr}, **consts)


def scale_by_derivative(ctx, kind, z, n):
    """dy ·= act'(z) in place (a layer's own output gradient is read by nothing else after its
    backward pass), z being the kept pre-activation, or the output for a DerivKind ``of_output``
    ("<act>@y"; Context.derivative_source); ``kind`` a DerivKind or an activation's name. An
    empty list when there is no activation, or when the one product that wrote dy already applied
    act' (Context.dy_prescaled)."""
    if DerivKind.of(kind).none or ctx.dy_prescaled:
        return []
    return [elementwise(ctx, "backward_activation", n, {"inp": z, "dout": inout(ctx.dy)},
                        symbolic.derivative_c(kind), mode="scale")]


def onnx_activation(e, x, kind, hint="act"):
    """``kind`` applied to tensor ``x`` as ONNX operators (kilnet.deploy.onnx.Emitter ``e``), each as
    symbolic.py defines it: leaky_relu's slope 0.01, elu's alpha 1, gelu in its exact erf form
    (the Gelu operator is opset 20), softplus as max(x, 0) + log(1 + exp(-|x|)) (no overflow).
    In float64, ONNX Runtime has no Erf kernel (gelu; 1.32 and 1.15): such a file is valid ONNX
    that onnxruntime refuses to load."""
    if kind in (None, "none"):
        return x
    one = lambda: e.scalar(1.0, "one")       # noqa: E731
    if kind in ("tanh", "sigmoid", "relu"):
        return e.op(kind.capitalize(), [x], hint)
    if kind == "leaky_relu":      # max(x, 0.01x) with 0.01 of the model's dtype (alpha is a float)
        return e.op("Max", [x, e.op("Mul", [x, e.scalar(0.01, "slope")])], hint)
    if kind == "elu":
        if e.dtype == np.float32:
            return e.op("Elu", [x], hint, alpha=1.0)
        # ONNX Runtime has no double Elu kernel: the same, spelled out
        below = e.op("Sub", [e.op("Exp", [x]), one()])
        return e.op("Where", [e.op("Greater", [x, e.scalar(0.0, "zero")]), x, below], hint)
    if kind == "silu":
        if e.dtype == np.float32:
            return e.op("Mul", [x, e.op("Sigmoid", [x])], hint)
        # x / (1 + exp(-x)): onnxruntime (1.14, 1.15) fuses x * Sigmoid(x) into a float32-only
        # QuickGelu, which a float64 model then fails to load with
        return e.op("Div", [x, e.op("Add", [one(), e.op("Exp", [e.op("Neg", [x])])])], hint)
    if kind == "softplus":
        tail = e.op("Log", [e.op("Add", [one(), e.op("Exp", [e.op("Neg", [e.op("Abs", [x])])])])])
        return e.op("Add", [e.op("Relu", [x]), tail], hint)
    if kind == "gelu":
        erf = e.op("Erf", [e.op("Mul", [x, e.scalar(1.0 / math.sqrt(2.0), "rsqrt2")])])
        return e.op("Mul", [e.op("Mul", [x, e.scalar(0.5, "half")]), e.op("Add", [erf, one()])], hint)
    raise AssertionError(f"onnx_activation: no ONNX form for activation {kind!r}")


@register
class Activation(Op):
    kind = "activation"
    builder = activation

    def infer(self, node):
        node.attrs["kind"] = symbolic.check(node.attrs["kind"])
        return node.inputs[0].shape


    def onnx(self, node, e):
        return e.act(e.x(node), node.attrs["kind"])

    def forward(self, node, ctx):
        return [elementwise(ctx, "forward", ctx.batch * node.size, {"inp": ctx.x(0), "out": out(ctx.y)},
                            symbolic.forward_c(node.attrs["kind"]), mode="forward")]

    def backward(self, node, ctx):
        if not ctx.dx(0):
            return []
        return [elementwise(ctx, "backward_input", ctx.batch * node.size,
                            {"inp": ctx.x(0), "dout": ctx.dy,
                             "dinp": out(ctx.dx(0), ctx.acc(0))},
                            symbolic.derivative_c(node.attrs["kind"]), mode="backward",
                            accumulate=ctx.acc(0))]
