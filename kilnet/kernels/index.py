"""Where a product reads and writes: index expressions as integer sympy expressions.

An op states a product's indexing (kernels/gemm.py) with the symbols below: ``m`` (a row of the
output), ``n`` (its column), ``k`` (the summed index) and ``b`` (the batch entry, the launch's
z-index), e.g. ``a_idx=m * n_in + k``. ``//`` and ``%`` are the integer quotient and remainder,
printed as C's ``/`` and ``%``: C truncates where sympy floors, so a quotient must only be
evaluated where its dividend is not negative (the indices never are; a predicate such as conv1d's
``a_pred`` guards the rest). The compiler prints expressions to C, substitutes into them and
reads strides off them symbolically, never by editing text.
"""
import math
from functools import lru_cache
from types import SimpleNamespace

from ..errors import CompileError


@lru_cache(maxsize=None)
def _made():
    """The symbols and PARAMS, made on first use: ``import kilnet`` imports no sympy (0.22 s of
    its 0.40 on a 2-core EPYC), so that a cold compile imports it while the device's probe runs."""
    import sympy as sp
    m, n, k, b = sp.symbols("m n k b", integer=True, nonnegative=True)
    return SimpleNamespace(m=m, n=n, k=k, b=b, PARAMS={
        "a_idx": (m, k, b), "b_idx": (k, n, b), "c_idx": (m, n, b), "a_pred": (m, k, b)})


def symbols():
    """(m, n, k, b): the symbols of index expressions."""
    s = _made()
    return s.m, s.n, s.k, s.b


def __getattr__(name):
    """``m``, ``n``, ``k``, ``b`` and ``PARAMS`` as module attributes (``from kilnet.kernels.index
    import m, n, k, b``), made on first use."""
    if name in ("m", "n", "k", "b", "PARAMS"):
        return getattr(_made(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check(name, expr):
    """``expr`` as a sympy expression of the symbols ``name`` may use (PARAMS), integer-valued
    (a predicate: a relation or a conjunction of them); a CompileError names the argument."""
    import sympy as sp
    allowed = _made().PARAMS[name]
    try:
        expr = sp.sympify(expr, strict=True)
    except sp.SympifyError:
        raise CompileError(f"{name} must be a sympy expression of {_names(allowed)} "
                           f"(kilnet.kernels.index), got {expr!r}") from None
    stray = expr.free_symbols - set(allowed)
    if stray:
        raise CompileError(f"{name} = {expr} uses {_names(stray)}; it may use {_names(allowed)}")
    if name == "a_pred":
        if not isinstance(expr, sp.logic.boolalg.Boolean):
            raise CompileError(f"{name} must be a condition (a relation or sympy.And of them), "
                               f"got {expr}")
    elif not expr.is_integer:
        raise CompileError(f"{name} = {expr} is not integer-valued: write a quotient as // "
                           f"(integer division), not /")
    return expr


def c(expr, params=()):
    """``expr`` as integer C; each symbol of ``params`` parenthesised, for the body of a macro
    whose arguments may be expressions (``A_IDX(n0 + j, k, b)``)."""
    return _printer()(params).doprint(expr)


def strides(expr, syms):
    """{symbol: coefficient} of each of ``syms`` when ``expr`` is affine in them (a constant
    stride each, the rest free of them), else None (a quotient or remainder of one, a product)."""
    import sympy as sp
    coeffs = {}
    for term in sp.Add.make_args(sp.expand(expr)):
        if not term.free_symbols & set(syms):
            continue
        coeff, sym = term.as_coeff_Mul()
        if sym not in syms or sym in coeffs:
            return None
        coeffs[sym] = int(coeff)
    return {s: coeffs.get(s, 0) for s in syms}


def extent(expr, counts, most=1 << 20):
    """1 + the largest value ``expr`` takes with each symbol s of ``counts`` in [0, counts[s]):
    the elements from a buffer's start that an index may reach (a launch's declared extent).
    Affine expressions are read off their strides; others are evaluated over every point when
    there are at most ``most``; None when neither works (the caller declares the whole buffer)."""
    import sympy as sp
    syms = tuple(counts)
    st = strides(expr, syms)
    if st is not None:
        rest = sp.expand(expr - sum(c * s for s, c in st.items()))
        if not rest.free_symbols:
            return int(rest) + sum(max(0, c * (counts[s] - 1)) for s, c in st.items()) + 1
    if expr.free_symbols - set(syms) or math.prod(counts.values()) > most:
        return None
    import numpy as np
    grid = np.meshgrid(*(np.arange(counts[s]) for s in syms), indexing="ij")
    values = np.broadcast_to(sp.lambdify(syms, expr, "numpy")(*grid), grid[0].shape)
    return int(values.max()) + 1


def is_rows_of(expr, N):
    """True when ``expr`` (of m, n, b) places entry (m, n) at m·N + n for batch entry 0: one
    contiguous M×N block from element 0, which a column sum can walk as ``out[i]``."""
    import sympy as sp
    m, n, _k, b = symbols()
    return sp.expand(expr.subs(b, 0) - (m * N + n)) == 0


def _names(syms):
    return ", ".join(sorted(map(str, syms)))


@lru_cache(maxsize=None)
def _printer():
    """The printer class (made on first use, as sympy is imported)."""
    import sympy as sp
    from sympy.printing.c import C99CodePrinter
    from sympy.printing.precedence import PRECEDENCE

    class _Printer(C99CodePrinter):
        """Integer C: floor(p/q) as C's quotient, Mod as ``%``, powers as products; terms of a sum
        by falling stride (``1280*(b) + 32*(m) + (k)``), so the outermost index reads first."""

        def __init__(self, params):
            super().__init__({"order": "none"})
            self._params = set(params)

        def _print_Symbol(self, expr):
            name = super()._print_Symbol(expr)
            return f"({name})" if expr in self._params else name

        def _print_Add(self, expr, order=None):
            def key(term):
                coeff, rest = term.as_coeff_Mul()
                return (not term.free_symbols, -abs(coeff), bool(coeff.is_negative), sp.default_sort_key(rest))
            return super()._print_Add(sp.Add(*sorted(expr.args, key=key), evaluate=False))

        def _print_floor(self, expr):
            num, den = sp.fraction(sp.together(expr.args[0]))
            if not (den.is_Integer and den > 0 and num.is_integer):
                raise CompileError(f"index expression: cannot print {expr} as an integer quotient")
            return f"({self.parenthesize(num, PRECEDENCE['Mul'])}/{den})"

        def _print_Mod(self, expr):
            num, den = expr.args
            return (f"{self.parenthesize(num, PRECEDENCE['Mul'])}%"
                    f"{self.parenthesize(den, PRECEDENCE['Atom'], strict=True)}")

        def _print_Pow(self, expr):
            if not (expr.exp.is_Integer and expr.exp > 0):
                raise CompileError(f"index expression: cannot print {expr} in integer C")
            return "*".join([self.parenthesize(expr.base, PRECEDENCE["Mul"])] * int(expr.exp))

        def _print_Rational(self, expr):
            raise CompileError(f"index expression: the fraction {expr} has no integer C form")

    return _Printer
