"""expr(formula, **inputs): an elementwise formula over its inputs, broadcast as NumPy broadcasts
them, with every gradient derived by SymPy.

``formula``: a string in the input names (SymPy syntax, parsed without ever being evaluated:
kilnet/policy/formula.py) or a SymPy expression over Symbols of those names. Numbers,
``+ - * / **``, ``exp log sqrt abs tanh sin cos erf sigmoid relu softplus min max`` and
``where(cond, a, b)`` (cond one comparison). The output's per-sample shape is the broadcast of
the inputs' (trailing axes aligned, size-1 axes stretched); a parameter or constant has no batch
axis and is the same for every sample; the output has a batch axis where any input has one.

Forward: one map launch (templates/elementwise.cl.j2), each input read once per element at its
broadcast index, the formula's common subexpressions shared (SymPy's cse). Backward: with g the
output gradient, input k's gradient is g·∂f/∂x_k; every input of the output's full shape gets it
from one map launch that reads each input once, and the inputs that were stretched (a bias
along rows, a parameter along the batch) get it summed over the stretched axes by one row-
reduction launch per distinct shape (kernels/reduce.py), computing the term as it sums. Where
SymPy's derivative is undefined, kilnet's definition holds: ``abs`` and ``relu`` have
derivative 0 at 0, ``max``/``min`` send a tie's gradient to the first argument, ``where``'s
condition gets none (kilnet/policy/formula.py).

The same value passed under two names is one input (its gradient the sum of both terms). A
SymPy expression's Max and Min hold their arguments in SymPy's own order (``Max(x, v)`` is
``Max(v, x)``): a tie's gradient goes to the first argument of that order; a string formula
keeps the order it is written in.

ONNX: the formula as operators (Add, Mul, Div, Pow, Exp, Log, Sqrt, Abs, Tanh, Sin, Cos, Erf,
Sigmoid, Where and comparisons), broadcast by ONNX's own (NumPy's) rule.
"""
from functools import lru_cache

from ..graph import Value
from ..kernels import broadcast as bc
from ..kernels.base import GraphError, Op, get_op, need, out, register
from ..kernels.gemm import Formula
from ..kernels.programs import map_program, reduce_program
from ..kernels.reduce import launch as reduce_launch
from ..policy import formula as formulas
from .add import map_stores


def expr(formula, name=None, **inputs):
    """An elementwise formula over ``inputs`` (see kilnet/ops/expr.py's notes for the language).

    Args:
        formula (str | sympy.Expr): the formula, in the input names.
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``expr_<n>``. So no input may be called ``name``.
        **inputs (Value): the values the formula names, of one graph; their per-sample shapes
            broadcast (NumPy's rule), parameters and constants over the batch as well.

    Returns:
        value (Value): the formula's value at every element of the broadcast shape.

    Raises:
        GraphError: no inputs, an input that is not a value, a formula that does not parse,
            names an unknown input or function, or is not allowed; or a bad ``name``.
        ShapeError: the inputs' shapes do not broadcast.
    """
    if not inputs:
        raise GraphError("expr: needs at least one input (expr('x * 2', x=value))")
    for k, v in inputs.items():
        if not isinstance(v, Value):
            raise GraphError(f"expr: input {k!r} must be a graph value, got {type(v).__name__}")
    names = list(inputs)
    distinct, sources = [], []
    for v in inputs.values():
        at = next((j for j, d in enumerate(distinct) if d.node is v.node), None)
        if at is None:
            distinct.append(v)
            at = len(distinct) - 1
        sources.append(at)
    text = formula if isinstance(formula, str) else formulas.from_sympy(formula, names)
    return distinct[0].graph.add("expr", distinct, {"formula": text, "names": names,
                                                    "sources": sources}, name)


@lru_cache(maxsize=512)
def _parsed(text, names, sources):
    """(the formula over one symbol per input: v0, v1, …, those symbols)."""
    e = formulas.parse(text, names)
    sp = formulas._sp().sp
    symbols = [sp.Symbol(f"v{k}", real=True) for k in range(max(sources) + 1)]
    e = e.xreplace({sp.Symbol(n, real=True): symbols[k] for n, k in zip(names, sources)})
    return e, tuple(symbols)


def _calls(e):
    """The functions a printed expression calls: what a derivative costs to compute."""
    sp = formulas._sp().sp
    return len(e.atoms(sp.Function)) + sum(1 for p in e.atoms(sp.Pow) if not p.exp.is_Integer)


def _of_output(d, e, y, stored):
    """Derivative ``d`` with the formula's own value ``e`` read from the output (symbol y)
    where that saves calls: tanh(z + b)'s is 1 − y², σ's y(1 − y), exp's y (as dense reads
    tanh' off its output), so backward reads y rather than computing tanh again."""
    if not stored or e.is_Symbol:
        return d
    alt = d.subs(e, y)
    return alt if _calls(alt) < _calls(d) else d


def parsed(node):
    a = node.attrs
    return _parsed(a["formula"], tuple(a["names"]), tuple(a["sources"]))


def _operands(node, batch):
    """The inputs' full shapes, aligned to the output's axes."""
    return [bc.full(i, batch, len(node.shape)) for i in node.inputs]


@register
class Expr(Op):
    kind = "expr"
    builder = expr
    open = True

    def infer(self, node):
        a = node.attrs
        names, sources = a["names"], a["sources"]
        need(isinstance(names, list) and all(isinstance(n, str) and n.isidentifier()
                                             for n in names), node,
             f"input names must be identifiers, got {names!r}", GraphError)
        need(isinstance(sources, list) and len(sources) == len(names) and
             sorted(set(sources)) == list(range(len(node.inputs))), node,
             f"sources {sources!r} do not map the names onto the inputs", GraphError)
        parsed(node)                               # a bad formula raises here
        return bc.broadcast([i.shape for i in node.inputs])

    def forward(self, node, ctx):
        e, syms = parsed(node)
        F = bc.full(node, ctx.batch)
        xs = _operands(node, ctx.batch)
        grid = bc.Grid(F, xs)
        used = e.free_symbols
        operands = [(syms[k], f"in{k}", xs[k]) for k in range(len(xs)) if syms[k] in used]
        lets, stores, run = map_program(grid, operands, [("out", e, False)])
        bufs = {f"in{k}": ctx.x(k) for k in range(len(xs)) if syms[k] in used}
        bufs["out"] = out(ctx.y)
        return [map_stores(ctx, "forward", grid.size, bufs, stores, lets, run=run)]

    def backward(self, node, ctx):
        e, syms = parsed(node)
        wanted = [k for k in range(len(node.inputs)) if ctx.dx(k)]
        if not wanted:
            return []
        F = bc.full(node, ctx.batch)
        xs = _operands(node, ctx.batch)
        sp = formulas._sp().sp
        g, y = sp.Symbol("g", real=True), sp.Symbol("y", real=True)
        stored = not node.meta.get("fused_into")      # a formula fold never stores the value
        terms = {k: g * _of_output(formulas.derivative(e, syms[k]), e, y, stored)
                 for k in wanted}
        buffers = {"dout": ctx.dy, "y": ctx.y if stored else None,
                   **{f"in{k}": ctx.x(k) for k in range(len(xs))}}

        def operands(reads):
            ops = [(g, "dout", F)] if g in reads else []
            ops += [(y, "y", F)] if y in reads else []
            return ops + [(syms[k], f"in{k}", xs[k]) for k in range(len(xs))
                          if syms[k] in reads]
        ks = []
        whole = [k for k in wanted if tuple(xs[k]) == F]
        if whole:
            reads = set().union(*(terms[k].free_symbols for k in whole))
            ops = operands(reads)
            grid = bc.Grid(F, [shape for _, _, shape in ops])
            lets, stores, run = map_program(grid, ops, [(f"din{k}", terms[k], ctx.acc(k))
                                                        for k in whole])
            bufs = {arg: buffers[arg] for _, arg, _ in ops}
            bufs.update({f"din{k}": out(ctx.dx(k), ctx.acc(k)) for k in whole})
            ks.append(map_stores(ctx, "backward_input", grid.size, bufs, stores, lets, run=run))
        shapes = []
        for k in wanted:
            if tuple(xs[k]) != F and tuple(xs[k]) not in shapes:
                shapes.append(tuple(xs[k]))
        for n, shape in enumerate(shapes):
            group = [k for k in wanted if tuple(xs[k]) == shape]
            reads = set().union(*(terms[k].free_symbols for k in group))
            ops = operands(reads)
            grid = bc.Grid(F, [s_ for _, _, s_ in ops] + [shape], reduced=bc.stretched(shape, F))
            pass_ = reduce_program(grid, ops, [(f"s{k}", terms[k]) for k in group])
            bufs = {arg: buffers[arg] for _, arg, _ in ops}
            bufs.update({f"din{k}": out(ctx.dx(k), ctx.acc(k)) for k in group})
            step = "backward_input" + (f".{n + 1}" if whole or n else "")
            ks.append(reduce_launch(ctx, step, grid, bufs, [pass_],
                                    [(f"din{k}", f"s{k}", ctx.acc(k)) for k in group]))
        return ks

    def identity_inputs(self, node, batch):
        e, syms = parsed(node)
        F = bc.full(node, batch)
        xs = _operands(node, batch)
        return [k for k in range(len(node.inputs))
                if tuple(xs[k]) == F and formulas.derivative(e, syms[k]) == 1]

    def formula(self, node):
        return parsed(node)

    def epilogue_source(self, node, batch):
        """Input k when this expr can be computed in the epilogue of the product that makes
        input k: k's value has the output's full shape, and every other input is one value per
        column (no batch axis, every axis but the last of size 1, the last the output's)."""
        F = bc.full(node, batch)
        xs = _operands(node, batch)
        for k, v in enumerate(node.inputs):
            if tuple(xs[k]) != F or not get_op(v.op).product:
                continue
            others = [x for j, x in enumerate(xs) if j != k]
            if all(d == 1 for x in others for d in x[:-1]) and \
                    all(x[-1] == F[-1] for x in others):
                return k
        return None

    def epilogue(self, node, ctx, k):
        """(out, Formula, per-column buffers): this expr as the epilogue of input k's product
        (``epilogue_source``)."""
        e, syms = parsed(node)
        others = [j for j in range(len(node.inputs)) if j != k]
        rename = {syms[k]: "x", **{syms[j]: f"c{n}" for n, j in enumerate(others)}}
        return ctx.y, Formula(formulas.to_c(e, rename)), [ctx.x(j) for j in others]

    def onnx(self, node, e):
        ex, syms = parsed(node)
        rank = len(node.shape)
        return e.formula(ex, {syms[k]: e.aligned(e.x(node, k), node.inputs[k], rank)
                            for k in range(len(node.inputs))})
