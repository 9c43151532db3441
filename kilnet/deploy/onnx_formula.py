"""An expr's formula (a SymPy expression, kilnet/policy/formula.py) as ONNX operators, for
ops/expr.py's ``onnx``: each node of the expression one operator, broadcast by ONNX's own rule
(NumPy's), which is the expr's on tensors whose batch axis leads.

Numbers are scalars of the model's dtype; ``where`` (and the Piecewise forms of relu, max, min
and softplus) is Where over the comparison operators; sqrt, 1/x and x² are Sqrt, Reciprocal
and Mul. float64: ONNX Runtime has no double Erf, so a float64 formula with erf is refused by
onnxruntime when it loads the file (as gelu is: kilnet/ops/activation.py).
"""
import math

import numpy as np

from ..errors import BundleError
from ..policy import formula

_UNARY = {"exp": "Exp", "log": "Log", "tanh": "Tanh", "sin": "Sin", "cos": "Cos", "erf": "Erf",
          "Abs": "Abs", "sign": "Sign"}
_COMPARE = {"<": "Less", "<=": "LessOrEqual", ">": "Greater", ">=": "GreaterOrEqual",
            "==": "Equal"}


def emit(e, expr, tensors):
    """The tensor of SymPy ``expr`` written with Emitter ``e``; ``tensors`` maps its symbols to
    tensor names."""
    sp = formula._sp().sp
    Sigmoid = formula._sp().Sigmoid
    memo = {}
    # if-then-else of conditions (a comparison of a Piecewise makes them) as and/or/not
    expr = formula.plain_conditions(expr)

    def go(x):
        if x in memo:
            return memo[x]
        memo[x] = out = build(x)
        return out

    def chain(op, args):
        out = go(args[0])
        for a in args[1:]:
            out = e.op(op, [out, go(a)])
        return out

    def build(x):
        if isinstance(x, sp.Symbol):
            return tensors[x]
        if x.is_number:
            return e.scalar(float(x), "k")
        if isinstance(x, sp.Add):
            return chain("Add", x.args)
        if isinstance(x, sp.Mul):
            return chain("Mul", x.args)
        if isinstance(x, sp.Pow):
            b, p = x.base, x.exp
            if p.is_number and float(p) == -1:
                return e.op("Reciprocal", [go(b)])
            if p.is_number and float(p) == 2:
                return e.op("Mul", [go(b), go(b)])
            if p.is_number and float(p) == 0.5:
                return e.op("Sqrt", [go(b)])
            if p.is_number and float(p) == -0.5:
                return e.op("Reciprocal", [e.op("Sqrt", [go(b)])])
            return e.op("Pow", [go(b), go(p)])
        if isinstance(x, Sigmoid):
            return e.op("Sigmoid", [go(x.args[0])])
        if type(x).__name__ == "log1p":
            return e.op("Log", [e.op("Add", [e.scalar(1.0, "one"), go(x.args[0])])])
        name = type(x).__name__
        if name == "cos" and e.dtype == np.float64:     # onnxruntime 1.14 has no double Cos
            return e.op("Sin", [e.op("Add", [go(x.args[0]), e.scalar(math.pi / 2, "half_pi")])])
        if name in _UNARY:
            return e.op(_UNARY[name], [go(x.args[0])])
        if isinstance(x, sp.Piecewise):
            *branches, (last, cond) = x.args
            out = go(last)
            for value, c in reversed(branches):
                out = e.op("Where", [condition(c), go(value), out])
            return out
        raise BundleError(f"export_onnx: no ONNX form for {x} in a formula")

    def condition(c):
        if isinstance(c, sp.And):
            return chain_bool("And", c.args)
        if isinstance(c, sp.Or):
            return chain_bool("Or", c.args)
        if isinstance(c, sp.Not):
            return e.op("Not", [condition(c.args[0])])
        if c in (sp.true, sp.false):           # what simplifying a condition may leave
            one = e.scalar(1.0, "one")
            return e.op("Equal" if c == sp.true else "Less", [one, one])
        if c.rel_op == "!=":
            return e.op("Not", [e.op("Equal", [go(c.lhs), go(c.rhs)])])
        return e.op(_COMPARE[c.rel_op], [go(c.lhs), go(c.rhs)])

    def chain_bool(op, args):
        out = condition(args[0])
        for a in args[1:]:
            out = e.op(op, [out, condition(a)])
        return out

    return go(expr)
