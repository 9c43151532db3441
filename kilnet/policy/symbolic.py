"""Activation functions as sympy expressions, printed into OpenCL C.

Each activation is written once, as a function of the pre-activation ``x``; its derivative is
obtained with ``sympy.diff`` and printed the same way, so the backward code is never hand-kept.
Adding an activation is its name in ``ACTIVATION_NAMES`` and its expression in ``_made``.
"""
import re
from collections.abc import Mapping
from functools import lru_cache
from types import SimpleNamespace

from ..errors import GraphError
from .kinds import DerivKind

# The activations' names, known without sympy: ``import kilnet`` imports no sympy (0.22 s of its
# 0.40 on a 2-core EPYC); a compile imports it as it lowers, while the device's probe runs.
ACTIVATION_NAMES = ("none", "tanh", "sigmoid", "relu", "leaky_relu", "softplus", "gelu", "silu",
                    "elu")
# act'(x) as a function of the output y = act(x), for the activations where that is the same
# number: a layer with one of these keeps no pre-activation, and its backward reads its own output
# instead (no z written in forward, no transcendental recomputed in backward: W1's tanh'(z) in
# its input-gradient products had cost 0.12-0.19 ms of a ~0.85 ms product at batch 64).
# tests/test_gradients.py checks each against sympy.diff.
OUTPUT_DERIVATIVE_NAMES = ("tanh", "sigmoid", "relu", "leaky_relu")


@lru_cache(maxsize=None)
def _made():
    """The sympy side, made on first use: the symbols x and y, Sigmoid, every activation and
    output derivative as an expression, and the printer."""
    import sympy as sp
    from sympy.codegen.cfunctions import log1p

    x = sp.Symbol("x", real=True)

    class Sigmoid(sp.Function):
        """σ(x), printed as a numerically safe helper; its derivative stays in terms of σ, which
        never overflows (exp(-x)/(1+exp(-x))² would give inf/inf for large negative x)."""

        def fdiff(self, argindex=1):
            s = Sigmoid(self.args[0])
            return s * (1 - s)

        @classmethod
        def eval(cls, arg):
            if arg.is_Number:          # σ of a number is a number (kn.expr's formulas)
                return 1 / (1 + sp.exp(-arg))

    activations = {
        "none": x,
        "tanh": sp.tanh(x),
        "sigmoid": Sigmoid(x),
        "relu": sp.Piecewise((x, x > 0), (0, True)),
        "leaky_relu": sp.Piecewise((x, x > 0), (sp.Rational(1, 100) * x, True)),
        # log(1 + e^x) without overflow: each branch exponentiates a non-positive number.
        "softplus": sp.Piecewise((x + log1p(sp.exp(-x)), x > 0), (log1p(sp.exp(x)), True)),
        "gelu": x / 2 * (1 + sp.erf(x / sp.sqrt(2))),
        "silu": x * Sigmoid(x),
        "elu": sp.Piecewise((x, x > 0), (sp.exp(x) - 1, True)),
    }
    y = sp.Symbol("y", real=True)
    output_derivatives = {
        "tanh": 1 - y ** 2,
        "sigmoid": y * (1 - y),
        "relu": sp.Piecewise((1, y > 0), (0, True)),
        "leaky_relu": sp.Piecewise((1, y > 0), (sp.Rational(1, 100), True)),
    }
    if tuple(activations) != ACTIVATION_NAMES or tuple(output_derivatives) != OUTPUT_DERIVATIVE_NAMES:
        raise AssertionError("symbolic: the names and the expressions disagree")

    return SimpleNamespace(sp=sp, x=x, y=y, Sigmoid=Sigmoid, activations=activations,
                           output_derivatives=output_derivatives, Printer=_printer(sp, Sigmoid))


def _printer(sp, Sigmoid):
    """The printer class of activations' C (made with the rest of ``_made``)."""
    from sympy.printing.c import C99CodePrinter

    class _Printer(C99CodePrinter):
        """C99 printing with every literal cast to the kernel's `real` type, so float kernels never
        promote to double (which would fail on devices without fp64)."""

        def _print_Float(self, expr):
            return "((real)%s)" % sp.printing.repr.srepr(float(expr)).strip("'")

        def _print_Integer(self, expr):
            return "((real)%d)" % int(expr)

        def _print_Rational(self, expr):
            return "((real)%d/(real)%d)" % (expr.p, expr.q)

        def _print_Pow(self, expr):
            if expr.exp == 2:
                b = self._print(expr.base)
                return "((%s)*(%s))" % (b, b)
            if expr.exp == -1:
                return "(((real)1)/(%s))" % self._print(expr.base)
            return "pow(%s, %s)" % (self._print(expr.base), self._print(expr.exp))

        def _print_Function(self, expr):
            if isinstance(expr, Sigmoid):
                return "kn_sigmoid(%s)" % self._print(expr.args[0])
            return super()._print_Function(expr)

        def _print_Piecewise(self, expr):
            *branches, (last, cond) = expr.args
            if cond != True:  # noqa: E712  (sympy's true)
                raise ValueError("activation Piecewise needs a final True branch")
            out = self._print(last)
            for e, c in reversed(branches):
                out = "(%s ? %s : %s)" % (self._print(c), self._print(e), out)
            return out

        def _print_Relational(self, expr):
            return "(%s %s %s)" % (self._print(expr.lhs), expr.rel_op, self._print(expr.rhs))

    return _Printer


class _Expressions(Mapping):
    """{name: sympy expression} whose names are known without sympy, and whose expressions are
    made on first use."""

    def __init__(self, names, field):
        self._names, self._field = names, field

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(name)
        return getattr(_made(), self._field)[name]

    def __contains__(self, name):
        return name in self._names

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)

    def __repr__(self):
        return repr(dict(self))


ACTIVATIONS = _Expressions(ACTIVATION_NAMES, "activations")
OUTPUT_DERIVATIVES = _Expressions(OUTPUT_DERIVATIVE_NAMES, "output_derivatives")


def __getattr__(name):
    """``x``, ``y`` and ``Sigmoid`` as module attributes, made on first use."""
    if name in ("x", "y", "Sigmoid"):
        return getattr(_made(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check(kind):
    if kind is None:
        return "none"
    if not isinstance(kind, str) or kind not in ACTIVATIONS:
        raise GraphError(f"activation {kind!r} is unknown; known: {', '.join(sorted(ACTIVATIONS))}")
    return kind


def _print(expr, var):
    made = _made()
    sp = made.sp
    expr = expr.subs(made.x, sp.Symbol(var, real=True))
    # Fold constant subexpressions (sqrt(2), 1/2, 1/sqrt(2*pi)) into single literals.
    expr = expr.replace(lambda e: e.is_number and not e.is_Integer, lambda e: sp.Float(sp.N(e, 17)))
    return made.Printer().doprint(expr)


@lru_cache(maxsize=None)
def forward_c(kind, var="x"):
    """C expression of act(var)."""
    return _print(ACTIVATIONS[check(kind)], var)


# A number in printed C: not part of a name, not after another digit or a point.
_LITERAL = re.compile(r"(?<![\w.])\d+(?:\.\d*)?(?:[eE][-+]?\d+)?")


def vectorised(expr):
    """A printed expression for V-wide vectors of type ``vec``: every literal is cast to ``vec``,
    so that a ternary between constants becomes a componentwise select. The printer writes every
    literal ``(real)…``; one that is not would stay a scalar of another type in a vector
    expression (a double in a float vector), so it is refused here."""
    bare = [m.group(0) for m in _LITERAL.finditer(expr)
            if not expr[:m.start()].endswith(("(real)", "(real)-"))]
    if bare:
        raise AssertionError(f"symbolic.vectorised: literal(s) {', '.join(bare)} of {expr!r} are "
                             f"not written (real)...: the printer must cast every literal")
    return expr.replace("(real)", "(vec)")


def of_output(kind):
    """The DerivKind of activation ``kind`` differentiated from its output where it can be
    (``OUTPUT_DERIVATIVES``: "tanh@y"), else from its pre-activation ("gelu")."""
    return DerivKind(kind, kind in OUTPUT_DERIVATIVES)


def derivative_c(kind, var="x"):
    """C expression of act'(var), from sympy.diff; for a DerivKind ``of_output`` ("<act>@y"),
    of act' in terms of the output, var being the output. ``kind``: a DerivKind, or an
    activation's name (its derivative in the pre-activation)."""
    return _derivative_c(DerivKind.of(kind), var)


@lru_cache(maxsize=None)
def _derivative_c(kind, var):
    made = _made()
    if kind.of_output:
        return _print(OUTPUT_DERIVATIVES[kind.act].subs(made.y, made.x), var)
    return _print(made.sp.diff(ACTIVATIONS[check(kind.act)], made.x), var)
