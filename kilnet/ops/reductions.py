"""Reductions over axes of the sample: sum, mean, max, min, logsumexp; and softmax and
log-softmax along one axis.

``axis``: an int (negative counts from the end of the per-sample shape), a tuple of ints, or
None (every axis of the sample; never the batch). Without ``keepdims`` the reduced axes go (a
full reduction has shape (1,)); with it each stays as size 1. A value without a batch axis gives
one without.

- ``sum``, ``mean`` (the sum over the count of reduced elements), ``max``, ``min``,
  ``logsumexp`` (m + log Σ e^(x − m), m the maximum: no overflow).
- Gradients: sum's dy to every element, mean's dy/n; max's and min's to the first extreme
  element in C order over the reduced axes (the training forward keeps its position, in the
  scratch ``arg``), the rest 0; logsumexp's dy·e^(x − y).
- ``softmax(x, axis=a)`` (ops/softmax.py's builder, ``heads`` 1): e^(x − m)/Σ e^(x − m) along
  axis a; along the last axis of a value per sample it is softmax's own kernel, with heads =
  the other axes' size, so a cross-entropy loss on it fuses as before. Backward
  dx = y·(dy − Σ y·dy).
- ``log_softmax(x, axis=-1)``: x − logsumexp(x) along the axis; backward
  dx = dy − e^y·Σ dy.

Each forward is one launch of the row-reduction skeleton (kernels/reduce.py) over the reduced
axes; each backward of a reduction is one map over the input's elements reading dy at the
output's index, and softmax's and log-softmax's one row-reduction launch.

ONNX: ReduceSum (axes as an input, opset 13), ReduceMean, ReduceMax, ReduceMin,
ReduceLogSumExp, Softmax and LogSoftmax (axis), each on the batched tensor (axes + 1).
"""
import numbers

from ..graph import graph_of
from ..kernels import broadcast as bc
from ..kernels import index
from ..kernels.base import GraphError, Op, need, out, register
from ..kernels.programs import gradient_stores, map_program, value_lets
from ..policy import formula as formulas
from ..kernels.reduce import launch as reduce_launch, load
from .add import map_stores

KINDS = ("sum", "mean", "max", "min", "logsumexp")


def _axes(node, axis, rank, single=False):
    """``axis`` as a sorted tuple of distinct axes in [0, rank), or an error naming the node."""
    if axis is None and not single:
        return tuple(range(rank))
    items = axis if isinstance(axis, (tuple, list)) and not single else (axis,)
    out = []
    for a in items:
        need(isinstance(a, numbers.Integral) and not isinstance(a, bool), node,
             f"axis must be an int{'' if single else ', a tuple of ints or None'}, got "
             f"{axis!r}", GraphError)
        need(-rank <= a < rank, node, f"axis {a} is out of range for input "
             f"{node.inputs[0].name!r} of shape {node.inputs[0].shape} ({rank} axes: "
             f"{-rank} to {rank - 1})")
        out.append(int(a) % rank)
    need(len(set(out)) == len(out), node, f"axis {axis!r} names an axis twice", GraphError)
    return tuple(sorted(out))


def _reduce(kind, x, axis, keepdims, name):
    return graph_of(x, kind).add(kind, [x], {"axis": axis, "keepdims": keepdims}, name)


def sum(x, axis=None, keepdims=False, name=None):        # noqa: A001 (kn.sum)
    """The sum over ``axis`` of the sample.

    Args:
        x (Value): any value (with or without a batch axis).
        axis (int | tuple[int, ...] | None): the axes to reduce (negative counts from the end);
            None: every axis of the sample (never the batch).
        keepdims (bool): keep each reduced axis as size 1 (default False: drop it; a full
            reduction then has shape (1,)).
        name (str | None): the node's name, an ASCII identifier; default ``sum_<n>`` (the
            op's name and a counter).

    Returns:
        value (Value): the reduced value.

    Raises:
        GraphError: a bad axis or keepdims, ``x`` is not a graph value, or a bad ``name``.
        ShapeError: an axis out of range.
    """
    return _reduce("sum", x, axis, keepdims, name)


def mean(x, axis=None, keepdims=False, name=None):
    """The mean over ``axis`` of the sample.

    Args:
        x (Value): any value (with or without a batch axis).
        axis (int | tuple[int, ...] | None): the axes to reduce (negative counts from the end);
            None: every axis of the sample (never the batch).
        keepdims (bool): keep each reduced axis as size 1 (default False: drop it; a full
            reduction then has shape (1,)).
        name (str | None): the node's name, an ASCII identifier; default ``mean_<n>``.

    Returns:
        value (Value): the reduced value.

    Raises:
        GraphError: a bad axis or keepdims, ``x`` is not a graph value, or a bad ``name``.
        ShapeError: an axis out of range.
    """
    return _reduce("mean", x, axis, keepdims, name)


def max(x, axis=None, keepdims=False, name=None):        # noqa: A001 (kn.max)
    """The largest value over ``axis`` of the sample; its gradient goes to the first largest
    element in C order.

    Args:
        x (Value): any value (with or without a batch axis).
        axis (int | tuple[int, ...] | None): the axes to reduce (negative counts from the end);
            None: every axis of the sample (never the batch).
        keepdims (bool): keep each reduced axis as size 1 (default False: drop it; a full
            reduction then has shape (1,)).
        name (str | None): the node's name, an ASCII identifier; default ``max_<n>``.

    Returns:
        value (Value): the reduced value.

    Raises:
        GraphError: a bad axis or keepdims, ``x`` is not a graph value, or a bad ``name``.
        ShapeError: an axis out of range.
    """
    return _reduce("max", x, axis, keepdims, name)


def min(x, axis=None, keepdims=False, name=None):        # noqa: A001 (kn.min)
    """The smallest value over ``axis`` of the sample; its gradient goes to the first smallest
    element in C order.

    Args:
        x (Value): any value (with or without a batch axis).
        axis (int | tuple[int, ...] | None): the axes to reduce (negative counts from the end);
            None: every axis of the sample (never the batch).
        keepdims (bool): keep each reduced axis as size 1 (default False: drop it; a full
            reduction then has shape (1,)).
        name (str | None): the node's name, an ASCII identifier; default ``min_<n>``.

    Returns:
        value (Value): the reduced value.

    Raises:
        GraphError: a bad axis or keepdims, ``x`` is not a graph value, or a bad ``name``.
        ShapeError: an axis out of range.
    """
    return _reduce("min", x, axis, keepdims, name)


def logsumexp(x, axis=None, keepdims=False, name=None):
    """log Σ e^x over ``axis`` of the sample, computed without overflow.

    Args:
        x (Value): any value (with or without a batch axis).
        axis (int | tuple[int, ...] | None): the axes to reduce (negative counts from the end);
            None: every axis of the sample (never the batch).
        keepdims (bool): keep each reduced axis as size 1 (default False: drop it; a full
            reduction then has shape (1,)).
        name (str | None): the node's name, an ASCII identifier; default ``logsumexp_<n>``.

    Returns:
        value (Value): the reduced value.

    Raises:
        GraphError: a bad axis or keepdims, ``x`` is not a graph value, or a bad ``name``.
        ShapeError: an axis out of range.
    """
    return _reduce("logsumexp", x, axis, keepdims, name)


def log_softmax(x, axis=-1, name=None):
    """x − logsumexp(x) along ``axis``, computed without overflow.

    Args:
        x (Value): any value (with or without a batch axis).
        axis (int): the axis (negative counts from the end; default the last).
        name (str | None): the node's name, an ASCII identifier; default ``log_softmax_<n>``.

    Returns:
        value (Value): of x's shape.

    Raises:
        GraphError: a bad axis, ``x`` is not a graph value, or a bad ``name``.
        ShapeError: the axis is out of range.
    """
    return graph_of(x, "log_softmax").add("log_softmax", [x], {"axis": axis}, name)


def _grid(node, batch, axes):
    """The input's full shape as a Grid: o over the kept axes (and the batch), r over
    ``axes`` (of the sample)."""
    F = bc.full(node.inputs[0], batch)
    return F, bc.Grid(F, [F], reduced=[a + 1 for a in axes])


def _kept_shape(F, axes):
    """F with the reduced axes as size 1: the output's full shape, aligned with F."""
    return tuple(1 if a - 1 in axes else d for a, d in enumerate(F))


class _Reduction(Op):
    open = True

    def infer(self, node):
        need(isinstance(node.attrs["keepdims"], bool), node,
             f"keepdims must be True or False, got {node.attrs['keepdims']!r}", GraphError)
        shape = node.inputs[0].shape
        axes = _axes(node, node.attrs["axis"], len(shape))
        node.attrs["axis"] = list(axes)
        if node.attrs["keepdims"]:
            return tuple(1 if a in axes else d for a, d in enumerate(shape))
        return tuple(d for a, d in enumerate(shape) if a not in axes) or (1,)

    def _arg(self, node, ctx):
        return ctx.scratch("arg", (ctx.batch if node.batched else 1) * node.size)

    def folds_formula(self, node, target):
        return node.op in ("sum", "mean")      # their backward reads no input

    def forward(self, node, ctx):
        kind, axes = node.op, tuple(node.attrs["axis"])
        F, grid = _grid(node, ctx.batch, axes)
        let, x, vec = load(grid, "inp", F, "j")
        R = grid.reductions
        if kind in ("sum", "mean"):
            grid, lets, bufs, vec = reading(F, [a + 1 for a in axes], ctx.x(0) if not
                                            node.meta.get("formula_input") else None,
                                            ctx.folded_formula())
            bufs["out"] = out(ctx.y)
            passes = [dict(lets=lets, accs=[("s", "+", "x")], vector=vec)]
            post = [("out", "s" if kind == "sum" else f"s / (real){R}", False)]
        else:
            bufs = {"inp": ctx.x(0), "out": out(ctx.y)}
            op = "min" if kind == "min" else "max"
            passes = [dict(lets=[let, ("T", "x", x)], accs=[("m", op, "x")], vector=vec)]
            post = [("out", "m", False)]
            if kind == "logsumexp":
                passes.append(dict(lets=[let, ("T", "x", x)], accs=[("s", "+", "exp(x - m)")],
                                   vector=vec))
                post = [("out", "m + log(s)", False)]
            elif ctx.training:         # where the extreme is, for backward
                passes.append(dict(lets=[let, ("real", "x", "inp[j]")],
                                   accs=[("a", "min", f"(x == m ? (real)r : (real){R})")]))
                bufs["arg"] = out(self._arg(node, ctx))
                post.append(("arg", "a", False))
        return [reduce_launch(ctx, "forward", grid, bufs, passes, post)]

    def backward_through_formula(self, node, target):
        return node.op in ("sum", "mean")

    def backward(self, node, ctx):
        if ctx.through:
            return [self._through(node, ctx)]
        if not ctx.dx(0):
            return []
        kind, axes = node.op, tuple(node.attrs["axis"])
        F = bc.full(node.inputs[0], ctx.batch)
        Fo = _kept_shape(F, axes)
        ranks = tuple(1 if (a == 0 or a - 1 not in axes) else d for a, d in enumerate(F))
        grid = bc.Grid(F, [Fo, ranks])
        lets = [("int", "jo", index.c(grid.index(Fo)))]
        g = "LD(dout, jo)" if grid.contiguous(Fo) == "run" else "(real)(dout[jo])"
        bufs = {"dout": ctx.dy}
        vectors = True
        if kind == "sum":
            e = g
        elif kind == "mean":
            e = f"{g} / (real){_count(F, axes)}"
        elif kind == "logsumexp":
            bufs.update(inp=ctx.x(0), out=ctx.y)
            y = "LD(out, jo)" if grid.contiguous(Fo) == "run" else "(real)(out[jo])"
            lets.append(("T", "y", y))
            e = f"{g} * exp(LD(inp, i) - y)"
        else:
            bufs["arg"] = self._arg(node, ctx)
            lets.append(("int", "jr", index.c(grid.index(ranks))))
            e = "(jr == (int)arg[jo] ? dout[jo] : (real)0)"
            vectors = False
        bufs["dinp"] = out(ctx.dx(0), ctx.acc(0))
        return [map_stores(ctx, "backward_input", grid.size, bufs,
                           [("dinp", e, ctx.acc(0))], lets, vectors=vectors, run=grid.run)]

    def _through(self, node, ctx):
        """sum's or mean's backward through its folded formula: each input of the formula gets
        dy (over the count, mean) times its derivative, at every element."""
        axes = tuple(node.attrs["axis"])
        F = bc.full(node.inputs[0], ctx.batch)
        Fo = _kept_shape(F, axes)
        expr, operands, grads = ctx.through
        sp = formulas._sp().sp
        g = sp.Symbol("g", real=True)
        scale = 1 if node.op == "sum" else sp.Rational(1, _count(F, axes))
        ops = [(g, "dout", Fo)] + [(s_, a, sh) for s_, a, sh, _ in operands]
        grid = bc.Grid(F, [sh for _, _, sh in ops])
        lets, stores, run = map_program(grid, ops, [
            (a, g * scale * formulas.derivative(expr, s_), c) for s_, a, _, c in grads])
        bufs = {"dout": ctx.dy, **{a: b for _, a, _, b in operands},
                **{a: out(b, c) for _, a, b, c in grads}}
        return map_stores(ctx, "backward_input", grid.size, bufs, stores, lets, run=run)

    def onnx(self, node, e):
        axes = [a + 1 for a in node.attrs["axis"]] if node.batched else list(node.attrs["axis"])
        keep = 1 if node.attrs["keepdims"] else 0
        x = e.x(node)
        op = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin",
              "logsumexp": "ReduceLogSumExp"}[node.op]
        if op == "ReduceSum":
            y = e.op(op, [x, e.ints(axes, "axes")], node.op, keepdims=keep)
        else:
            y = e.op(op, [x], node.op, axes=axes, keepdims=keep)
        return e.reshape(y, node.shape, "reduced") if node.batched else \
            e.op("Reshape", [y, e.ints(node.shape, "shape")], "reduced")


def _count(F, axes):
    n = 1
    for a in axes:
        n *= F[a + 1]
    return n


for _kind in KINDS:
    register(type(f"Reduce_{_kind}", (_Reduction,), dict(kind=_kind, builder=globals()[_kind])))


def reading(F, reduced, inp, formula):
    """(grid, lets that give x (the input's value) and j (its index), buffers, whether a
    vector walk can read them) of a reduction of buffer ``inp`` of full shape F over axes
    ``reduced``; with ``formula`` (Context.folded_formula) x is computed from the input's own
    inputs, the input never stored (compiler/fusion.py's formula fold)."""
    if formula is None:
        grid = bc.Grid(F, [F], reduced=reduced)
        let, x, vec = load(grid, "inp", F, "j")
        return grid, [let, ("T", "x", x)], {"inp": inp}, vec
    expr, operands = formula
    grid = bc.Grid(F, [shape for _, _, shape, _ in operands], reduced=reduced)
    lets, vec = value_lets(grid, [(sym, arg, shape) for sym, arg, shape, _ in operands], expr)
    j = ("int", "j", index.c(grid.index(F)))
    return grid, [j] + lets, {arg: buf for _, arg, _, buf in operands}, \
        vec and grid.contiguous(F) is not None


def along_axis_forward(ctx, softmax, F, axes, inp, y, formula=None):
    """The launch of softmax (or log-softmax) of buffer ``inp`` of full shape F along its axes
    ``axes`` (adjacent: one row each) into ``y``: per row, the maximum, the sum of e^(x − m), then each value. Also
    softmax's own forward on CPUs (ops/softmax.py), where a work-item per row walking vectors
    ran W5's scores 3-5x faster than a work-group per row. ``formula``: see ``reading``."""
    grid, lets, bufs, vec = reading(F, axes, inp, formula)
    first = dict(lets=lets, accs=[("m", "max", "x")], vector=vec)
    second = dict(lets=lets, accs=[("s", "+", "exp(x - m)")], vector=vec)
    value = "exp(x - m) / s" if softmax else "x - m - log(s)"
    third = dict(lets=lets, stores=[("out", "j", value, False)], vector=vec)
    return reduce_launch(ctx, "forward", grid, dict(bufs, out=out(y)), [first, second, third], [])


def along_axis_backward(ctx, softmax, F, axes, y, dy, dx, acc, through=None):
    """dx (=|+=) y·(dy − Σ y·dy) (softmax) or dy − e^y·Σ dy (log-softmax) along ``axes``, from
    the output y. ``through`` (Context.through): that value is the gradient of a folded
    formula's value, and the pass stores the formula's inputs' gradients from it instead."""
    shapes = [F] + ([shape for _, _, shape, _ in through[1]] if through else [])
    grid = bc.Grid(F, shapes, reduced=axes)
    let, yv, vec = load(grid, "out", F, "j")
    g = yv.replace("out", "dout")
    if softmax:
        first = dict(lets=[let, ("T", "y", yv), ("T", "g", g)], accs=[("d", "+", "y * g")],
                     vector=vec)
        value = "y * (g - d)"
    else:
        first = dict(lets=[let, ("T", "g", g)], accs=[("d", "+", "g")], vector=vec)
        value = "g - exp(y) * d"
    bufs = {"out": y, "dout": dy}
    lets = [let, ("T", "y", yv), ("T", "g", g)]
    if through is None:
        stores = [("dinp", "j", value, acc)]
        bufs["dinp"] = out(dx, acc)
    else:
        expr, operands, grads = through
        v = formulas._sp().sp.Symbol("v", real=True)
        more, stores, ok = gradient_stores(grid, [(s_, a, sh) for s_, a, sh, _ in operands],
                                           expr, v, [(s_, a, c) for s_, a, _, c in grads])
        lets += [("T", "v", value)] + more
        vec = vec and ok
        bufs.update({a: b for _, a, _, b in operands})
        bufs.update({a: out(b, c) for _, a, b, c in grads})
    second = dict(lets=lets, stores=stores, vector=vec)
    return reduce_launch(ctx, "backward_input", grid, bufs, [first, second], [])


class _AlongAxis(Op):
    """softmax and log-softmax along one axis: the row-reduction skeleton over that axis."""
    open = True

    def infer(self, node):
        shape = node.inputs[0].shape
        need(node.attrs.get("heads", 1) == 1, node, "heads must be 1 with axis", GraphError)
        node.attrs["axis"] = _axes(node, node.attrs["axis"], len(shape), single=True)[0]
        return shape

    def folds_formula(self, node, target):
        return True                            # backward reads the output, not the input

    def forward(self, node, ctx):
        F = bc.full(node.inputs[0], ctx.batch)
        formula = ctx.folded_formula()
        return [along_axis_forward(ctx, node.op == "softmax_axis", F, [node.attrs["axis"] + 1],
                                   None if formula else ctx.x(0), ctx.y, formula)]

    def backward_through_formula(self, node, target):
        return True

    def backward(self, node, ctx):
        if not ctx.dx(0) and not ctx.through:
            return []
        F = bc.full(node.inputs[0], ctx.batch)
        return [along_axis_backward(ctx, node.op == "softmax_axis", F, [node.attrs["axis"] + 1],
                                    ctx.y, ctx.dy, ctx.dx(0), ctx.acc(0), ctx.through)]

    def onnx(self, node, e):
        axis = node.attrs["axis"] + (1 if node.batched else 0)
        return e.op("Softmax" if node.op == "softmax_axis" else "LogSoftmax", [e.x(node)],
                    node.op, axis=axis)


@register
class SoftmaxAxis(_AlongAxis):
    kind = "softmax_axis"


@register
class LogSoftmax(_AlongAxis):
    kind = "log_softmax"
    builder = log_softmax
