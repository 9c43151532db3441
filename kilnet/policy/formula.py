"""``kn.expr``'s formulas: parsed into SymPy expressions, differentiated by SymPy, printed into
OpenCL C.

A formula is a string in the names of the expr's inputs, or a SymPy expression over Symbols of
those names. A string is never evaluated: Python's ``ast`` parses it, and each node it allows
becomes the SymPy expression it stands for. Allowed: numbers, the input names, ``+ - * / **``,
unary minus, and the calls below; ``where``'s first argument is one comparison
(``< <= > >= == !=``). Anything else (an attribute, a subscript, a keyword argument, another
name or function) is refused with a GraphError that says what and where.

The functions and the derivatives they get (where SymPy's is undefined, kilnet's definition):

- ``exp log sqrt tanh sin cos erf``: SymPy's;
- ``abs``: |x|, derivative sign(x), 0 at 0;
- ``sigmoid``: 1/(1 + e^−x), derivative σ(1 − σ) (never overflows);
- ``relu``: x for x > 0 else 0, derivative 1 for x > 0 else 0 (0 at 0);
- ``softplus``: log(1 + eˣ) without overflow, derivative σ(x);
- ``max(a, b)``, ``min(a, b)`` (or more arguments, folded left): a where a ≥ b (a ≤ b) else b,
  so a tie sends its whole gradient to the first argument;
- ``where(cond, a, b)``: a where cond holds else b; cond gets no gradient.
"""
import ast
import math
from functools import lru_cache

from ..errors import CompileError, GraphError
from . import symbolic

FUNCTIONS = ("exp", "log", "sqrt", "abs", "tanh", "sin", "cos", "erf", "sigmoid", "relu",
             "softplus", "min", "max", "where")
ARITY = {"where": (3, 3), "min": (2, None), "max": (2, None)}
_COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def _sp():
    return symbolic._made()


def _function(name, args):
    """The SymPy expression of allowed function ``name`` applied to ``args``."""
    made = _sp()
    sp = made.sp
    from sympy.codegen.cfunctions import log1p
    if name == "where":
        return sp.Piecewise((args[1], args[0]), (args[2], True))
    if name in ("max", "min"):
        # the first argument that attains the extreme: argument i where it is >= (max) every
        # later one, tried in order (an earlier one that failed is below some later one, so
        # below this one): the left fold max(max(a, b), c) with ties to the first
        rel = sp.Ge if name == "max" else sp.Le
        branches = [(x, sp.And(*[rel(x, y) for y in args[i + 1:]]))
                    for i, x in enumerate(args[:-1])]
        return sp.Piecewise(*branches, (args[-1], True))
    (x,) = args
    if name == "relu":
        return sp.Piecewise((x, x > 0), (0, True))
    if name == "softplus":
        return sp.Piecewise((x + log1p(sp.exp(-x)), x > 0), (log1p(sp.exp(x)), True))
    if name == "sigmoid":
        return made.Sigmoid(x)
    return {"exp": sp.exp, "log": sp.log, "sqrt": sp.sqrt, "abs": sp.Abs, "tanh": sp.tanh,
            "sin": sp.sin, "cos": sp.cos, "erf": sp.erf}[name](x)


class _Builder:
    """An ``ast`` walk that builds the SymPy expression of an allowed formula."""

    def __init__(self, text, names):
        self.text, self.names = text, names
        self.symbols = {n: _sp().sp.Symbol(n, real=True) for n in names}

    def fail(self, node, what):
        col = getattr(node, "col_offset", None)
        where = f" at column {col + 1}" if col is not None else ""
        raise GraphError(f"formula {self.text!r}: {what}{where}")

    def build(self, node, condition=False):
        sp = _sp().sp
        if isinstance(node, ast.Expression):
            return self.build(node.body)
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                self.fail(node, f"{v!r} is not a number")
            if not math.isfinite(v):
                self.fail(node, f"{v!r} is not a finite number")
            return sp.Integer(v) if isinstance(v, int) else sp.Float(v)
        if isinstance(node, ast.Name):
            if node.id in self.symbols:
                return self.symbols[node.id]
            if node.id in FUNCTIONS:
                self.fail(node, f"{node.id} is a function: call it, {node.id}(...)")
            self.fail(node, f"names {node.id!r}, which is not an input of this expr (inputs: "
                            f"{', '.join(self.names) or 'none'})")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            x = self.build(node.operand)
            return -x if isinstance(node.op, ast.USub) else x
        if isinstance(node, ast.BinOp):
            ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
                   ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
                   ast.Pow: lambda a, b: a ** b}
            f = ops.get(type(node.op))
            if f is None:
                self.fail(node, f"operator {type(node.op).__name__} is not allowed (allowed: "
                                f"+ - * / **)")
            return f(self.build(node.left), self.build(node.right))
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name):
                self.fail(node, "only the functions "
                                f"{', '.join(FUNCTIONS)} may be called")
            name = node.func.id
            if name not in FUNCTIONS:
                self.fail(node, f"unknown function {name!r}; allowed: {', '.join(FUNCTIONS)}")
            if node.keywords:
                self.fail(node, f"{name}() takes no keyword arguments")
            lo, hi = ARITY.get(name, (1, 1))
            n = len(node.args)
            if n < lo or (hi is not None and n > hi):
                want = f"{lo}" if lo == hi else f"at least {lo}"
                self.fail(node, f"{name}() takes {want} argument(s), got {n}")
            args = [self.build(a, condition=(name == "where" and i == 0))
                    for i, a in enumerate(node.args)]
            if name == "where" and not isinstance(args[0], (sp.core.relational.Relational,
                                                             sp.logic.boolalg.BooleanAtom)):
                self.fail(node, "where's first argument must be a comparison, e.g. x > 0")
            return _function(name, args)
        if isinstance(node, ast.Compare):
            if not condition:
                self.fail(node, "a comparison may only be where's first argument")
            if len(node.ops) != 1:
                self.fail(node, "write one comparison (a < b), not a chain")
            op = _COMPARE[type(node.ops[0])]
            a, b = self.build(node.left), self.build(node.comparators[0])
            # evaluated: a comparison of two numbers is true or false, and where() then keeps
            # one branch (SymPy cannot order such a comparison left unevaluated)
            return {"<": sp.Lt, "<=": sp.Le, ">": sp.Gt, ">=": sp.Ge, "==": sp.Eq,
                    "!=": sp.Ne}[op](a, b)
        self.fail(node, f"{type(node).__name__} is not allowed in a formula")


@lru_cache(maxsize=512)
def parse(text, names):
    """The SymPy expression of formula ``text`` over inputs ``names`` (a tuple of str); a
    GraphError for a formula that does not parse or uses what is not allowed."""
    if not isinstance(text, str) or not text.strip():
        raise GraphError(f"formula must be a non-empty string, got {text!r}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise GraphError(f"formula {text!r} does not parse: {e.msg} (column {e.offset})") \
            from None
    return _Builder(text, names).build(tree)


def from_sympy(expr, names):
    """A SymPy expression handed to ``kn.expr``: the formula string it is stored as (so that a
    saved graph never holds code), after checking that it uses only allowed functions and the
    input names."""
    sp = _sp().sp
    if not isinstance(expr, sp.Basic):
        raise GraphError(f"formula must be a string or a SymPy expression, got "
                         f"{type(expr).__name__}")
    stray = sorted(str(s) for s in expr.free_symbols if str(s) not in names)
    if stray:
        raise GraphError(f"formula {expr} uses {', '.join(stray)}, which "
                         f"{'is not an input' if len(stray) == 1 else 'are not inputs'} of this "
                         f"expr (inputs: {', '.join(names) or 'none'})")
    return _Writer().text(expr)


class _Writer:
    """SymPy back to a formula string of the allowed language."""

    def text(self, e):
        sp = _sp().sp
        Sigmoid = _sp().Sigmoid
        if isinstance(e, sp.Symbol):
            return e.name
        if isinstance(e, sp.Number):
            if e.is_Integer:
                return str(int(e))
            if e.is_Rational:
                return f"({int(e.p)}/{int(e.q)})"
            if e in (sp.oo, -sp.oo, sp.nan, sp.zoo):
                raise GraphError(f"formula: {e} is not a finite number")
            return repr(float(e))
        if isinstance(e, sp.NumberSymbol):
            return repr(float(e))
        if isinstance(e, sp.Add):
            return "(" + " + ".join(self.text(a) for a in e.args) + ")"
        if isinstance(e, sp.Mul):
            return "(" + " * ".join(self.text(a) for a in e.args) + ")"
        if isinstance(e, sp.Pow):
            return f"({self.text(e.base)})**({self.text(e.exp)})"
        if isinstance(e, sp.Piecewise):
            *branches, (last, cond) = e.args
            if cond != True:  # noqa: E712  (sympy's true)
                raise GraphError(f"formula: a Piecewise needs a final True branch: {e}")
            out = self.text(last)
            for value, c in reversed(branches):
                terms = c.args if isinstance(c, sp.And) else (c,)
                inner = self.text(value)
                for term in reversed(terms):
                    inner = f"where({self.relation(term)}, {inner}, {out})"
                out = inner
            return out
        if isinstance(e, (sp.Max, sp.Min)):
            return f"{'max' if isinstance(e, sp.Max) else 'min'}(" + \
                ", ".join(self.text(a) for a in e.args) + ")"
        names = {sp.exp: "exp", sp.log: "log", sp.Abs: "abs", sp.tanh: "tanh", sp.sin: "sin",
                 sp.cos: "cos", sp.erf: "erf", Sigmoid: "sigmoid"}
        for cls, name in names.items():
            if isinstance(e, cls) and len(e.args) == 1:
                return f"{name}({self.text(e.args[0])})"
        raise GraphError(f"formula: {type(e).__name__} ({e}) is not one of the allowed "
                         f"functions: {', '.join(FUNCTIONS)}")

    def relation(self, c):
        sp = _sp().sp
        if not isinstance(c, sp.core.relational.Relational):
            raise GraphError(f"formula: a condition must be one comparison, got {c}")
        return f"{self.text(c.lhs)} {c.rel_op} {self.text(c.rhs)}"


def derivative(expr, symbol):
    """d expr / d symbol, with kilnet's definitions where SymPy's is undefined (see the module's
    notes); a CompileError where what remains cannot be printed."""
    sp = _sp().sp
    d = sp.diff(expr, symbol)
    bad = d.atoms(sp.Derivative, sp.Subs, sp.DiracDelta, sp.Heaviside)
    if bad or d.has(sp.zoo, sp.nan):
        raise CompileError(f"the derivative of {expr} by {symbol} is {d}, which kilnet cannot "
                           f"print")
    return d


@lru_cache(maxsize=None)
def _printer():
    """The formulas' printer: the activations' (every literal cast to real), with sign, square
    roots and small integer powers written out."""
    made = _sp()
    sp = made.sp

    class Printer(made.Printer):
        def _print_sign(self, expr):
            x = self._print(expr.args[0])
            return f"(({x}) > ((real)0) ? ((real)1) : (({x}) < ((real)0) ? ((real)-1) : ((real)0)))"

        def _print_Pow(self, expr):
            b, e = expr.base, expr.exp
            if e.is_Number and float(e) == 0.5:
                return "sqrt(%s)" % self._print(b)
            if e.is_Number and float(e) == -0.5:
                return "rsqrt(%s)" % self._print(b)
            if e.is_Number and float(e).is_integer() and 2 <= abs(float(e)) <= 4:
                e = sp.Integer(int(float(e)))
                prod = "*".join(["(%s)" % self._print(b)] * abs(int(e)))
                return f"({prod})" if e > 0 else f"(((real)1)/({prod}))"
            return super()._print_Pow(expr)

        def _print_Relational(self, expr):
            return "(%s %s %s)" % (self._print(expr.lhs), expr.rel_op, self._print(expr.rhs))

    return Printer


def plain_conditions(expr):
    """``expr`` with every ITE (SymPy's if-then-else of conditions, which a comparison of a
    Piecewise turns into) written as and/or/not of its parts, and the literal true and false
    that leaves simplified away: the printed C then holds no boolean literal, which a vector
    ternary would read as false (its condition's lanes must be all bits set, -1, for true)."""
    sp = _sp().sp
    ITE = sp.logic.boolalg.ITE
    if not expr.has(ITE):
        return expr
    return expr.replace(lambda e: isinstance(e, ITE),
                        lambda e: sp.Or(sp.And(e.args[0], e.args[1]),
                                        sp.And(sp.Not(e.args[0]), e.args[2])))


def to_c(expr, rename):
    """``expr`` as C, its symbols renamed by ``rename`` ({Symbol: C name}); numbers that are
    not integers folded into single literals (sqrt(2) and the like)."""
    sp = _sp().sp
    expr = plain_conditions(expr)
    expr = expr.xreplace({s: sp.Symbol(n, real=True) for s, n in rename.items()})
    expr = expr.replace(lambda e: e.is_number and not e.is_Rational and not e.is_Float,
                        lambda e: sp.Float(sp.N(e, 17)))
    return _printer()().doprint(expr)


def shared(exprs, prefix="t"):
    """(lets, exprs): ``exprs`` with their common subexpressions taken out (SymPy's cse) as
    [(Symbol, expression)] in order, each used by what follows it."""
    sp = _sp().sp
    lets, reduced = sp.cse(list(exprs), symbols=sp.numbered_symbols(prefix, real=True),
                           optimizations="basic")
    # a shared condition stays in place: a let is a real (or a vector of them), and a
    # comparison's value in C is an int (an int vector, with -1 for true, in a vector form)
    conditions, kept = {}, []
    for sym, e in lets:
        e = e.xreplace(conditions)
        if isinstance(e, sp.logic.boolalg.Boolean):
            conditions[sym] = e
        else:
            kept.append((sym, e))
    return kept, [e.xreplace(conditions) for e in reduced]
