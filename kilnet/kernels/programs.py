"""Elementwise programs: SymPy expressions over operands read where a ``broadcast.Grid`` puts
them, printed as the lets and stores of the map skeleton (ops/add.py's ``map_stores``,
templates/elementwise.cl.j2) or the passes of the row-reduction skeleton (kernels/reduce.py).

An operand is (SymPy symbol, kernel argument, full shape). Each is read once per element into a
let named after its argument, at an int index let; the expressions' common subexpressions
become lets too (SymPy's cse), so the gradients of several inputs computed in one kernel share
their work.
"""
from ..policy import formula
from . import index
from .reduce import load as reduce_load


def _reads(grid, operands, flat):
    """(index lets, value lets, {symbol: C name}, vectors ok) for ``operands``."""
    idx_lets, val_lets, names, ok = [], [], {}, True
    for sym, arg, x in operands:
        if flat:
            how = grid.contiguous(x)
            idx_lets.append(("int", f"j_{arg}", index.c(grid.index(x))))
            read = f"LD({arg}, j_{arg})" if how == "run" else f"(real)({arg}[j_{arg}])"
        else:
            let, read, vec = reduce_load(grid, arg, x, f"j_{arg}")
            idx_lets.append(let)
            ok = ok and vec
        val_lets.append(("T", f"x_{arg}", read))
        if sym is not None:
            names[sym] = f"x_{arg}"
    return idx_lets, val_lets, names, ok


def _printed(exprs, names):
    """(cse lets, printed exprs) of SymPy ``exprs`` with symbols ``names``."""
    lets, reduced = formula.shared(exprs)
    rename = dict(names)
    out = []
    for sym, e in lets:
        rename[sym] = str(sym)
        out.append(("T", str(sym), formula.to_c(e, rename)))
    return out, [formula.to_c(e, rename) for e in reduced]


def map_program(grid, operands, stores):
    """(lets, stores, run) for ``map_stores`` over ``grid``'s elements: ``stores`` [(argument,
    SymPy expression, accumulate)] of the ``operands`` [(symbol, argument, full shape)] (a
    symbol None: an operand the expressions read as ``x_<argument>`` themselves); ``run``
    the vector must divide."""
    idx, vals, names, _ = _reads(grid, operands, True)
    lets, printed = _printed([e for _, e, _ in stores], names)
    run = grid.run if grid.runs > 1 else None
    return idx + vals + lets, [(b, p, acc) for (b, _, acc), p in zip(stores, printed)], run


def reduce_program(grid, operands, sums):
    """A pass of kernels/reduce.py over ``grid`` summing ``sums`` [(name, SymPy expression)] of
    the ``operands`` per output: dict(lets, accs, vector)."""
    idx, vals, names, ok = _reads(grid, operands, False)
    lets, printed = _printed([e for _, e in sums], names)
    return dict(lets=idx + vals + lets, accs=[(n, "+", p) for (n, _), p in zip(sums, printed)],
                vector=ok)


def value_lets(grid, operands, expr, name="x"):
    """(lets, vector ok): the lets of a reduce.cl.j2 pass that give ``name`` the value of SymPy
    ``expr`` of ``operands`` at the pass's element: an expr computed where a reduction reads it
    (compiler/fusion.py's formula fold) instead of stored and read back."""
    idx, vals, names, ok = _reads(grid, operands, False)
    lets, (printed,) = _printed([expr], names)
    return idx + vals + lets + [("T", name, printed)], ok


def gradient_stores(grid, operands, expr, value, grads, index="j"):
    """(lets, stores, vector ok) of a reduce.cl.j2 pass whose element has ``value`` (a SymPy
    symbol a let before them binds: the gradient of a folded formula ``expr``'s value there),
    storing for each of ``grads`` [(symbol of an input of the formula's full shape, argument,
    accumulate)] its gradient, value·∂expr/∂input, at ``index``: the formula's backward done by
    the reduction that computed it (compiler/lower.py, ``Context.through``)."""
    idx, vals, names, ok = _reads(grid, operands, False)
    names[value] = str(value)
    lets, printed = _printed([value * formula.derivative(expr, sym) for sym, _, _ in grads],
                             names)
    return idx + vals + lets, [(arg, index, p, acc) for (_, arg, acc), p in zip(grads, printed)], ok
